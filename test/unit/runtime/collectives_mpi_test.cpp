//===- collectives_mpi_test.cpp - Host collectives with 2 MPI ranks -------===//
//
// Run as `mpirun -np 2 runtime_collectives_mpi_test`. Every assertion checks
// exact bits: reductions are defined as rank-order sums.
//
//===----------------------------------------------------------------------===//
#include "runtime/checkpoint.h"
#include "runtime/collectives.h"
#include "runtime/error.h"
#include "runtime/rng.h"

#include "mpi_gtest_main.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

using namespace ap::rt;
using ap::kernels::Backend;
using ap::kernels::bf16;
using ap::kernels::DType;

namespace {

std::unique_ptr<Communicator> world(size_t segmentBytes = 0) {
  LaunchInfo li = detectLaunch();
  CommOptions options;
  options.mpiSegmentBytes = segmentBytes;
  return createWorldCommunicator(Backend::Host, li, options);
}

/// Rank r's input: Philox values that make float sums order-sensitive.
std::vector<float> input(int rank, size_t n) {
  std::vector<float> v(n);
  PhiloxStream(RngKey{5, 0, 0, uint32_t(rank), 1})
      .fillNormal(v.data(), n, 0, 1000);
  return v;
}

TEST(MpiCollectives, LaunchAndWorld) {
  LaunchInfo li = detectLaunch();
  EXPECT_EQ(li.launcher, Launcher::Mpirun);
  EXPECT_EQ(li.worldSize, 2);
  auto w = world();
  EXPECT_STREQ(w->kind(), "mpi");
  EXPECT_EQ(w->size(), 2);
  EXPECT_EQ(w->rank(), li.rank);
}

TEST(MpiCollectives, AllReduceAllDtypesRankOrder) {
  auto w = world();
  const size_t n = 1001; // odd: uneven chunks
  std::vector<float> a = input(0, n), b = input(1, n);
  std::vector<float> mine = w->rank() == 0 ? a : b, out(n);
  w->allReduceSum(mine.data(), out.data(), n, DType::F32, nullptr);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(out[i], a[i] + b[i]) << i;
  // In place.
  w->allReduceSum(mine.data(), mine.data(), n, DType::F32, nullptr);
  EXPECT_EQ(mine, out);

  std::vector<bf16> ha(n), hb(n), hout(n);
  for (size_t i = 0; i < n; ++i) {
    ha[i] = bf16(a[i]);
    hb[i] = bf16(b[i]);
  }
  w->allReduceSum(w->rank() ? hb.data() : ha.data(), hout.data(), n,
                  DType::BF16, nullptr);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(hout[i].bits, bf16(float(ha[i]) + float(hb[i])).bits) << i;

  std::vector<double> d(n), dout(n);
  for (size_t i = 0; i < n; ++i)
    d[i] = double(w->rank() ? b[i] : a[i]) * 1e-3;
  w->allReduceSum(d.data(), dout.data(), n, DType::F64, nullptr);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(dout[i], double(a[i]) * 1e-3 + double(b[i]) * 1e-3);

  std::vector<int32_t> iv(n, w->rank() ? 0x7fffffff : 1), iout(n);
  w->allReduceSum(iv.data(), iout.data(), n, DType::I32, nullptr);
  for (int32_t x : iout)
    ASSERT_EQ(x, int32_t(0x80000000u)); // wraps, never UB
  // Tiny counts (fewer elements than ranks) and zero.
  float one = float(w->rank() + 1), oneOut = 0;
  w->allReduceSum(&one, &oneOut, 1, DType::F32, nullptr);
  EXPECT_EQ(oneOut, 3.0f);
  w->allReduceSum(nullptr, nullptr, 0, DType::F32, nullptr);
}

TEST(MpiCollectives, ReduceScatterAllGatherBroadcast) {
  auto w = world();
  const size_t n = 37;
  std::vector<float> a = input(0, 2 * n), b = input(1, 2 * n);
  std::vector<float> out(n);
  w->reduceScatterSum(w->rank() ? b.data() : a.data(), out.data(), n,
                      DType::F32, nullptr);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(out[i], a[w->rank() * n + i] + b[w->rank() * n + i]);

  std::vector<float> gathered(2 * n);
  std::vector<float> part(w->rank() ? b.begin() : a.begin(),
                          (w->rank() ? b.begin() : a.begin()) + n);
  w->allGather(part.data(), gathered.data(), n, DType::F32, nullptr);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(gathered[i], a[i]);
    ASSERT_EQ(gathered[n + i], b[i]);
  }
  std::vector<float> buf = w->rank() == 1 ? b : std::vector<float>(2 * n, 0.0f);
  w->broadcast(buf.data(), buf.size(), DType::F32, 1, nullptr);
  EXPECT_EQ(buf, b);
  EXPECT_THROW(w->broadcast(buf.data(), 1, DType::F32, 2, nullptr), Error);
  EXPECT_THROW(w->allGather(buf.data(), buf.data(), 1, DType::F32, nullptr),
               Error);
}

TEST(MpiCollectives, SendRecvAndErrors) {
  auto w = world();
  std::vector<double> msg(1000);
  if (w->rank() == 0) {
    for (size_t i = 0; i < msg.size(); ++i)
      msg[i] = double(i) * 0.5;
    w->send(msg.data(), msg.size(), DType::F64, 1, nullptr);
    std::vector<double> back(1000);
    w->recv(back.data(), back.size(), DType::F64, 1, nullptr);
    for (size_t i = 0; i < back.size(); ++i)
      ASSERT_EQ(back[i], double(i) * 0.5 + 1.0);
  } else {
    w->recv(msg.data(), msg.size(), DType::F64, 0, nullptr);
    for (double &x : msg)
      x += 1.0;
    w->send(msg.data(), msg.size(), DType::F64, 0, nullptr);
  }
  EXPECT_THROW(w->send(msg.data(), 1, DType::F64, w->rank(), nullptr), Error);
  EXPECT_THROW(w->recv(msg.data(), 1, DType::F64, 5, nullptr), Error);
  w->barrier();
  EXPECT_TRUE(w->allTrue(true));
  EXPECT_FALSE(w->allTrue(w->rank() == 0));
  EXPECT_FALSE(w->allTrue(false));
}

TEST(MpiCollectives, SegmentedMessages) {
  // 1000-byte segments: every call below is split into many MPI messages.
  auto w = world(1000);
  const size_t n = 10007;
  std::vector<float> a = input(0, n), b = input(1, n), out(n);
  w->allReduceSum(w->rank() ? b.data() : a.data(), out.data(), n, DType::F32,
                  nullptr);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(out[i], a[i] + b[i]) << i;
  std::vector<bf16> h(n), hout(n);
  for (size_t i = 0; i < n; ++i)
    h[i] = bf16(w->rank() ? b[i] : a[i]);
  w->allReduceSum(h.data(), hout.data(), n, DType::BF16, nullptr);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(hout[i].bits, bf16(float(bf16(a[i])) + float(bf16(b[i]))).bits);
  std::vector<float> buf = w->rank() == 0 ? a : std::vector<float>(n, 0.0f);
  w->broadcast(buf.data(), n, DType::F32, 0, nullptr);
  EXPECT_EQ(buf, a);
  std::vector<float> msg(n);
  if (w->rank() == 1) {
    w->send(b.data(), n, DType::F32, 0, nullptr);
  } else {
    w->recv(msg.data(), n, DType::F32, 1, nullptr);
    EXPECT_EQ(msg, b);
  }
  // Sub-communicators keep the segment size.
  auto sub = w->split(0, w->rank());
  sub->allReduceSum(w->rank() ? b.data() : a.data(), out.data(), n, DType::F32,
                    nullptr);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(out[i], a[i] + b[i]) << i;
  try {
    world(12);
    ADD_FAILURE() << "a 12-byte segment was accepted";
  } catch (const Error &e) {
    EXPECT_NE(std::string(e.what()).find(
                  "segment of 12 bytes (CommOptions::mpiSegmentBytes) must be "
                  "in [64, "),
              std::string::npos)
        << e.what();
  }
}

TEST(MpiCollectives, ParallelGroups) {
  auto w = world();
  // dp = 2: the dp group is the world; tp and pp groups are singletons.
  ParallelGroups g = makeParallelGroups(*w, 1, 1);
  EXPECT_EQ(g.dpSize, 2);
  EXPECT_EQ(g.dp->size(), 2);
  EXPECT_EQ(g.tp->size(), 1);
  EXPECT_EQ(g.ppPrev, -1);
  EXPECT_EQ(g.ppNext, -1);
  float x = float(w->rank() + 1), y = 0;
  g.dp->allReduceSum(&x, &y, 1, DType::F32, nullptr);
  EXPECT_EQ(y, 3.0f);
  g.tp->allReduceSum(&x, &y, 1, DType::F32, nullptr);
  EXPECT_EQ(y, x);
  // tp = 2: the tp group is the world.
  ParallelGroups t = makeParallelGroups(*w, 2, 1);
  EXPECT_EQ(t.tp->size(), 2);
  EXPECT_EQ(t.tpRank, w->rank());
  EXPECT_EQ(t.dp->size(), 1);
  // pp = 2: stage 0 and 1 are neighbours, point to point over the pp group.
  ParallelGroups p = makeParallelGroups(*w, 1, 2);
  EXPECT_EQ(p.ppRank, w->rank());
  if (p.ppRank == 0) {
    EXPECT_EQ(p.ppNext, 1);
    float act = 42.5f;
    p.pp->send(&act, 1, DType::F32, p.ppNext, nullptr);
  } else {
    EXPECT_EQ(p.ppPrev, 0);
    float act = 0;
    p.pp->recv(&act, 1, DType::F32, p.ppPrev, nullptr);
    EXPECT_EQ(act, 42.5f);
  }
  EXPECT_THROW(makeParallelGroups(*w, 3, 1), Error);
}

TEST(MpiCollectives, ShardedCheckpointWithMpiBarrier) {
  auto w = world();
  std::string dir = "/tmp/ap_ckpt_mpi_" + std::to_string(getppid());
  if (w->rank() == 0)
    std::system(("rm -rf '" + dir + "'").c_str());
  w->barrier();
  std::vector<float> master(10);
  initParameter(InitSpec::normal(0, 1), RngKey{1, 0, 0, uint32_t(w->rank()), 3},
                DType::F32, master.data(), master.size());
  TrainingState st;
  st.step = 3;
  ShardInfo info = ShardInfo::of(*w);
  std::vector<CheckpointTensor> t = {
      {"master/w", StDType::F32, {10}, master.data(), 40}};
  saveCheckpoint(dir, t, st, info);
  std::vector<float> back(10);
  std::vector<CheckpointTensor> d = {
      {"master/w", StDType::F32, {10}, back.data(), 40}};
  auto latest = latestCheckpoint(dir);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(loadCheckpoint(*latest, d, info).step, 3u);
  EXPECT_EQ(back, master);
  w->barrier();
  if (w->rank() == 0)
    std::system(("rm -rf '" + dir + "'").c_str());
}

} // namespace

AP_MPI_GTEST_MAIN()
