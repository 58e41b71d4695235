//===- step_collectives_mpi_test.cpp - The step's collectives, 2 ranks ----===//
//
// Run as `mpirun -np 2 runtime_step_collectives_mpi_test`. The calls a
// generated data-parallel step makes (ap_all_reduce, ap_all_gather,
// ap_reduce_scatter), through the C ABI on a host-backend StepRunner whose
// data-parallel group is the MPI world: each runs on the stream it names,
// in that stream's order, and gives exact rank-order sums. A
// last-microbatch reduction runs only in the last microbatch. A bf16 shard
// takes the f32 block sum with one rounding. A group of gathers gives the
// blocks of its gathers and holds back records on its stream to its end.
//
//===----------------------------------------------------------------------===//
#include "runtime/abi.h"
#include "runtime/collectives.h"
#include "runtime/device.h"
#include "runtime/offload.h"
#include "runtime/pinned_pool.h"
#include "runtime/trainer.h"

#include "mpi_gtest_main.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace ap::rt;

namespace {

class StepCollectives : public ::testing::Test {
protected:
  void SetUp() override {
    LaunchInfo li = detectLaunch();
    world = createWorldCommunicator(ap::kernels::Backend::Host, li);
    ASSERT_EQ(world->size(), 2);
    rank = world->rank();
    DeviceOptions options;
    options.device = DeviceKind::Host;
    options.quiet = true;
    device = std::make_unique<Device>(options);
    device->allocateArena(8192);
    PinnedLayout layout;
    layout.totalBytes = 256;
    pool = std::make_unique<PinnedPool>(*device, layout);
    engine = std::make_unique<OffloadEngine>(*device, *pool);
    program.arenaBytes = 8192;
    program.scratchOffset = 7680;
    program.scratchBytes = 512;
    program.microBatches = 2;
    program.dataParallelSize = 2;
    runner =
        std::make_unique<StepRunner>(program, *device, *pool, *engine, false);
    runner->dataParallel = world.get();
  }
  void TearDown() override {
    runner.reset();
    engine.reset();
    pool.reset();
  }
  ap_step *handle() { return reinterpret_cast<ap_step *>(runner.get()); }
  float *f32(uint64_t offset) {
    return static_cast<float *>(ap_at(handle(), offset));
  }
  /// Rank r's value i: not exactly representable sums unless added in a
  /// fixed order.
  static float value(int r, int i) {
    return 0.1f * float(i + 1) + (r ? 1e7f : 1e-3f) * float(i % 3);
  }

  std::unique_ptr<Communicator> world;
  int rank = 0;
  Program program;
  std::unique_ptr<Device> device;
  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<OffloadEngine> engine;
  std::unique_ptr<StepRunner> runner;
};

TEST_F(StepCollectives, AllReduceOnCommIsARankOrderSum) {
  for (int i = 0; i < 64; ++i)
    f32(0)[i] = value(rank, i);
  ap_all_reduce(handle(), 0, 256, AP_DTYPE_F32, AP_STREAM_COMM, 0);
  device->synchronize();
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(f32(0)[i], value(0, i) + value(1, i)) << i;
}

TEST_F(StepCollectives, LastMicrobatchReductionRunsOnceInTheLastOne) {
  for (int i = 0; i < 64; ++i)
    f32(0)[i] = value(rank, i);
  runner->microbatch = 0;
  ap_all_reduce(handle(), 0, 256, AP_DTYPE_F32, AP_STREAM_COMM,
                AP_REDUCE_LAST_MICROBATCH);
  device->synchronize();
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(f32(0)[i], value(rank, i)) << "summed in microbatch 0: " << i;
  runner->microbatch = 1;
  ap_all_reduce(handle(), 0, 256, AP_DTYPE_F32, AP_STREAM_COMM,
                AP_REDUCE_LAST_MICROBATCH);
  device->synchronize();
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(f32(0)[i], value(0, i) + value(1, i)) << i;
}

TEST_F(StepCollectives, AllGatherPutsRankRAtBlockR) {
  for (int i = 0; i < 32; ++i)
    f32(0)[i] = value(rank, i);
  ap_all_gather(handle(), 0, 256, 128, AP_DTYPE_F32, AP_STREAM_COMM, 0);
  device->synchronize();
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 32; ++i)
      ASSERT_EQ(f32(256)[r * 32 + i], value(r, i)) << r << " " << i;
}

TEST_F(StepCollectives, ReduceScatterKeepsThisRanksBlockOfTheSum) {
  for (int i = 0; i < 64; ++i)
    f32(0)[i] = value(rank, i);
  ap_reduce_scatter(handle(), 0, 512, 128, AP_DTYPE_F32, AP_STREAM_COMM, 0);
  device->synchronize();
  for (int i = 0; i < 32; ++i) {
    int e = rank * 32 + i;
    ASSERT_EQ(f32(512)[i], value(0, e) + value(1, e)) << i;
  }
}

// AP_REDUCE_ACCUMULATE: the rank-order sum of this rank's block, then added
// to what the shard held (a sharded main grad over microbatches); bf16
// rounds the sum, then the add.
TEST_F(StepCollectives, ReduceScatterAccumulateAddsTheBlockSum) {
  for (int i = 0; i < 64; ++i)
    f32(0)[i] = value(rank, i);
  for (int i = 0; i < 32; ++i)
    f32(512)[i] = 0.25f * float(i) + float(rank);
  ap_reduce_scatter(handle(), 0, 512, 128, AP_DTYPE_F32, AP_STREAM_COMM,
                    AP_REDUCE_ACCUMULATE);
  device->synchronize();
  for (int i = 0; i < 32; ++i) {
    int e = rank * 32 + i;
    float sum = value(0, e) + value(1, e);
    ASSERT_EQ(f32(512)[i], (0.25f * float(i) + float(rank)) + sum) << i;
  }
  using ap::kernels::bf16;
  auto *full = static_cast<bf16 *>(ap_at(handle(), 1024));
  auto *shard = static_cast<bf16 *>(ap_at(handle(), 2048));
  for (int i = 0; i < 64; ++i)
    full[i] = bf16(value(rank, i));
  for (int i = 0; i < 32; ++i)
    shard[i] = bf16(1.f + 0.125f * float(i));
  ap_reduce_scatter(handle(), 1024, 2048, 64, AP_DTYPE_BF16, AP_STREAM_COMPUTE,
                    AP_REDUCE_ACCUMULATE);
  device->synchronize();
  for (int i = 0; i < 32; ++i) {
    int e = rank * 32 + i;
    bf16 sum = bf16(float(bf16(value(0, e))) + float(bf16(value(1, e))));
    bf16 want = bf16(float(bf16(1.f + 0.125f * float(i))) + float(sum));
    ASSERT_EQ(float(shard[i]), float(want)) << i;
  }
}

// AP_REDUCE_SHARD_BF16: the f32 rank-order sum of this rank's block added
// to the bf16 shard in float and rounded once (not the sum rounded to bf16
// first); shard_bytes are the f32 block's, the shard holds half of them and
// nothing past it changes.
TEST_F(StepCollectives, ReduceScatterIntoABf16ShardRoundsOnce) {
  using ap::kernels::bf16;
  // Rank 0 gives half a bf16 ulp of [1, 2) (2^-8), rank 1 a little more:
  // one rounding of held + sum goes up; rounding the sum to bf16 first
  // would leave an exact tie that stays at the even `held`.
  auto part = [](int r, int e) {
    return r == 0 ? 0x1p-8f : 0x1p-20f * float(1 + e % 5);
  };
  auto heldAt = [](int i) { return 1.f + 0.125f * float(i % 8); };
  for (int i = 0; i < 64; ++i)
    f32(0)[i] = part(rank, i);
  auto *shard = static_cast<bf16 *>(ap_at(handle(), 512));
  for (int i = 0; i < 40; ++i)
    shard[i] = bf16(heldAt(i));
  ap_reduce_scatter(handle(), 0, 512, 128, AP_DTYPE_F32, AP_STREAM_COMM,
                    AP_REDUCE_ACCUMULATE | AP_REDUCE_SHARD_BF16);
  device->synchronize();
  for (int i = 0; i < 32; ++i) {
    int e = rank * 32 + i;
    float sum = part(0, e) + part(1, e);
    ASSERT_EQ(shard[i].bits, bf16(heldAt(i) + sum).bits) << i;
    ASSERT_EQ(float(shard[i]), heldAt(i) + 0x1p-7f) << i;
    ASSERT_NE(shard[i].bits, bf16(heldAt(i) + float(bf16(sum))).bits) << i;
  }
  for (int i = 32; i < 40; ++i)
    ASSERT_EQ(float(shard[i]), heldAt(i)) << "past the shard: " << i;
}

// Stream order: a compute kernel's write that the comm stream waits for
// (an event, as the compiled schedule records it) is what the sum sees.
TEST_F(StepCollectives, CommWaitsForTheComputeRecord) {
  EventId ev = device->createEvent();
  std::vector<float> mine(64);
  for (int i = 0; i < 64; ++i)
    mine[i] = value(rank, i);
  device->copyAsync(f32(0), mine.data(), 256, CopyKind::HostToDevice,
                    Stream::Compute);
  device->record(ev, Stream::Compute);
  device->wait(Stream::Comm, ev);
  ap_all_reduce(handle(), 0, 256, AP_DTYPE_F32, AP_STREAM_COMM, 0);
  device->synchronize();
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(f32(0)[i], value(0, i) + value(1, i)) << i;
}

// A group of gathers (a ZeRO-3 window): the same blocks as one by one, and
// a record on the group's stream takes effect at the end, so a stream that
// waits for it sees every gather of the group.
TEST_F(StepCollectives, GatherGroupGivesTheSameBlocksAndRecordsAtTheEnd) {
  for (int i = 0; i < 32; ++i) {
    f32(0)[i] = value(rank, i);
    f32(128)[i] = value(rank, i + 32);
  }
  EventId ev = device->createEvent();
  ap_comm_group_begin(handle(), AP_STREAM_COMM);
  ap_all_gather(handle(), 0, 256, 128, AP_DTYPE_F32, AP_STREAM_COMM, 0);
  runner->record(ev, Stream::Comm);
  ap_all_gather(handle(), 128, 512, 128, AP_DTYPE_F32, AP_STREAM_COMM, 0);
  ap_comm_group_end(handle(), AP_STREAM_COMM);
  device->wait(Stream::Compute, ev);
  std::vector<float> seen(128);
  device->copyAsync(seen.data(), f32(256), 512, CopyKind::DeviceToHost,
                    Stream::Compute);
  device->synchronize();
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(seen[r * 32 + i], value(r, i)) << r << " " << i;
      ASSERT_EQ(f32(512)[r * 32 + i], value(r, i + 32)) << r << " " << i;
    }
}

TEST_F(StepCollectives, GatherGroupHoldsAllGathersOnly) {
  auto errorOf = [&](const std::function<void()> &f) {
    try {
      f();
    } catch (const std::exception &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ap_comm_group_begin(handle(), AP_STREAM_COMM);
  EXPECT_NE(errorOf([&] {
              ap_comm_group_begin(handle(), AP_STREAM_COMM);
            }).find("a group is already open on the comm stream"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_reduce_scatter(handle(), 0, 512, 128, AP_DTYPE_F32,
                                AP_STREAM_COMM, 0);
            }).find("reduce_scatter: inside a group of all-gathers"),
            std::string::npos);
  EXPECT_NE(errorOf([&] {
              ap_all_reduce(handle(), 0, 256, AP_DTYPE_F32, AP_STREAM_COMM, 0);
            }).find("all_reduce: inside a group of all-gathers"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { ap_comm_group_end(handle(), AP_STREAM_COMPUTE); })
                .find("an end on the compute stream while the open group is "
                      "on the comm stream"),
            std::string::npos);
  ap_comm_group_end(handle(), AP_STREAM_COMM);
  EXPECT_NE(errorOf([&] {
              ap_comm_group_end(handle(), AP_STREAM_COMM);
            }).find("an end on the comm stream without a begin"),
            std::string::npos);
  device->synchronize();
}

TEST_F(StepCollectives, ShardOfPartialElementsIsRefused) {
  try {
    ap_all_gather(handle(), 0, 256, 6, AP_DTYPE_F32, AP_STREAM_COMM, 0);
    FAIL() << "a 6-byte f32 shard was accepted";
  } catch (const std::exception &e) {
    EXPECT_NE(std::string(e.what()).find("all_gather: shard of 6 bytes is not "
                                         "a whole number of 4-byte elements"),
              std::string::npos)
        << e.what();
  }
}

} // namespace

AP_MPI_GTEST_MAIN()
