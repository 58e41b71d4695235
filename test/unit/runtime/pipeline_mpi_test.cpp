//===- pipeline_mpi_test.cpp - Pipeline stages on 2 ranks -----------------===//
//
// Run as `mpirun -np 2 runtime_pipeline_mpi_test`: rank s is stage s of a
// two-stage pipeline (host backend, the MPI world as the pipeline group).
//   - ap_pipeline_send / ap_pipeline_recv interleaved as 1F1B issues them
//     (stage 0: send, send, recv, send, recv, recv; stage 1: recv, send,
//     recv, send, recv, send) with messages large enough that MPI_Send
//     waits for its receiver: a send that blocked the comm stream would
//     deadlock here; every message arrives whole and in order.
//   - AP_REDUCE_PIPELINE sums over the stages in stage order.
//   - A tied weight's gradient and the grad norm of the two-stage step are
//     bitwise those of one stage (tied_grad_offset on one stage, the
//     stage-order sum of pipeline_tied grads and the norm's running sum
//     continued from stage to stage on two).
//   - A pipelined checkpoint: one file per stage plus an index; each stage
//     reads its tensors back, and so does a one-stage reader.
//
//===----------------------------------------------------------------------===//
#include "runtime/abi.h"
#include "runtime/checkpoint.h"
#include "runtime/collectives.h"
#include "runtime/device.h"
#include "runtime/offload.h"
#include "runtime/pinned_pool.h"
#include "runtime/trainer.h"

#include "mpi_gtest_main.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace ap::rt;

namespace {

constexpr uint64_t kArena = 16u << 20, kScratch = kArena - 4096;
/// Where finalizeStep stages a microbatch's loss sum and token count.
constexpr uint64_t kStaging = 12u << 20;

/// A host-backend StepRunner for `program` (its arena, pool and engine).
struct Runner {
  explicit Runner(Program &p) : program(p) {
    DeviceOptions options;
    options.device = DeviceKind::Host;
    options.quiet = true;
    device = std::make_unique<Device>(options);
    device->allocateArena(kArena);
    std::memset(device->at(0, kArena), 0, kArena);
    PinnedLayout layout;
    layout.totalBytes = 256;
    pool = std::make_unique<PinnedPool>(*device, layout);
    engine = std::make_unique<OffloadEngine>(*device, *pool);
    p.arenaBytes = kArena;
    p.persistentBytes = kArena;
    p.scratchOffset = kScratch;
    p.scratchBytes = 4096;
    p.state.lossSum = kScratch - 512;
    p.state.tokenCount = kScratch - 256;
    runner = std::make_unique<StepRunner>(p, *device, *pool, *engine, false);
  }
  ~Runner() {
    runner.reset();
    engine.reset();
    pool.reset();
  }
  ap_step *handle() { return reinterpret_cast<ap_step *>(runner.get()); }
  float *f32(uint64_t offset) {
    return static_cast<float *>(ap_at(handle(), offset));
  }

  Program &program;
  std::unique_ptr<Device> device;
  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<OffloadEngine> engine;
  std::unique_ptr<StepRunner> runner;
};

class Pipeline : public ::testing::Test {
protected:
  void SetUp() override {
    world = createWorldCommunicator(ap::kernels::Backend::Host, detectLaunch());
    ASSERT_EQ(world->size(), 2);
    stage = world->rank();
  }
  /// A two-stage program of this rank's stage.
  Program stageProgram() {
    Program p;
    p.microBatches = 1;
    p.pipelineSize = 2;
    p.pipelineStage = stage;
    return p;
  }
  std::unique_ptr<Communicator> world;
  int stage = 0;
};

/// Message m's word i: distinct per direction, message and position.
uint32_t word(int from, int m, size_t i) {
  return uint32_t(from) << 30 ^ uint32_t(m) << 24 ^ uint32_t(i * 2654435761u);
}

// 4 MiB messages: far past MPI's eager limit, so each MPI_Send returns only
// once the receiver posted its receive.
TEST_F(Pipeline, OneFOneBInterleavingDeliversInOrder) {
  Program p = stageProgram();
  Runner r(p);
  r.runner->attachPipeline(world.get());
  constexpr uint64_t kBytes = 4u << 20;
  constexpr size_t kWords = kBytes / 4;
  const uint64_t sendAt = 0, recvAt = kBytes;
  std::vector<std::vector<uint32_t>> got;
  auto fill = [&](int m) {
    auto *w = static_cast<uint32_t *>(ap_at(r.handle(), sendAt));
    for (size_t i = 0; i < kWords; ++i)
      w[i] = word(stage, m, i);
  };
  auto send = [&](int m) {
    // The comm stream copies the bytes out when it reaches the send, so
    // the buffer is refilled only after the comm stream passed it.
    r.device->synchronize(Stream::Comm);
    fill(m);
    ap_pipeline_send(r.handle(), sendAt, kBytes,
                     stage == 0 ? AP_PEER_NEXT : AP_PEER_PREV, AP_STREAM_COMM);
  };
  auto recv = [&] {
    ap_pipeline_recv(r.handle(), recvAt, kBytes,
                     stage == 0 ? AP_PEER_NEXT : AP_PEER_PREV, AP_STREAM_COMM);
    r.device->synchronize(Stream::Comm);
    auto *w = static_cast<const uint32_t *>(ap_at(r.handle(), recvAt));
    got.emplace_back(w, w + kWords);
  };
  if (stage == 0) {
    send(0);
    send(1);
    recv();
    send(2);
    recv();
    recv();
  } else {
    recv();
    send(0);
    recv();
    send(1);
    recv();
    send(2);
  }
  ap_end_loop(r.handle());
  ASSERT_EQ(got.size(), 3u);
  for (int m = 0; m < 3; ++m)
    for (size_t i = 0; i < kWords; ++i)
      ASSERT_EQ(got[size_t(m)][i], word(1 - stage, m, i))
          << "message " << m << " word " << i;
}

// The comm stream runs ahead of the host: three sends queued back to back
// without waiting, then the receives; the sender thread keeps their order.
TEST_F(Pipeline, QueuedSendsKeepTheirOrder) {
  Program p = stageProgram();
  Runner r(p);
  r.runner->attachPipeline(world.get());
  constexpr uint64_t kBytes = 1u << 20;
  for (int m = 0; m < 3; ++m) {
    auto *w = static_cast<uint32_t *>(ap_at(r.handle(), uint64_t(m) * kBytes));
    for (size_t i = 0; i < kBytes / 4; ++i)
      w[i] = word(stage, m, i);
  }
  int peer = stage == 0 ? AP_PEER_NEXT : AP_PEER_PREV;
  for (int m = 0; m < 3; ++m)
    ap_pipeline_send(r.handle(), uint64_t(m) * kBytes, kBytes, peer,
                     AP_STREAM_COMM);
  for (int m = 0; m < 3; ++m)
    ap_pipeline_recv(r.handle(), uint64_t(3 + m) * kBytes, kBytes, peer,
                     AP_STREAM_COMM);
  ap_end_loop(r.handle());
  for (int m = 0; m < 3; ++m) {
    auto *w = static_cast<const uint32_t *>(
        ap_at(r.handle(), uint64_t(3 + m) * kBytes));
    for (size_t i = 0; i < kBytes / 4; ++i)
      ASSERT_EQ(w[i], word(1 - stage, m, i)) << m << " " << i;
  }
  // Stage 0 has no previous stage, stage 1 no next one.
  EXPECT_THROW(ap_pipeline_send(r.handle(), 0, 64,
                                stage == 0 ? AP_PEER_PREV : AP_PEER_NEXT,
                                AP_STREAM_COMM),
               std::exception);
}

TEST_F(Pipeline, PipelineReductionSumsInStageOrder) {
  Program p = stageProgram();
  Runner r(p);
  r.runner->attachPipeline(world.get());
  auto value = [](int s, int i) {
    return 0.1f * float(i + 1) + (s ? 1e7f : 1e-3f) * float(i % 3);
  };
  for (int i = 0; i < 64; ++i)
    r.f32(0)[i] = value(stage, i);
  ap_all_reduce(r.handle(), 0, 256, AP_DTYPE_F32, AP_STREAM_COMM,
                AP_REDUCE_PIPELINE);
  r.device->synchronize();
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(r.f32(0)[i], value(0, i) + value(1, i)) << i;
}

/// A trainable f32 parameter of n elements with its main grad at `grad`.
ParamEntry gradParam(const char *name, int64_t n, uint64_t grad) {
  ParamEntry e{};
  e.name = name;
  e.dtype = ap::kernels::DType::F32;
  e.rank = 1;
  e.shape[0] = n;
  e.shape[1] = e.shape[2] = e.shape[3] = 1;
  e.numel = n;
  e.init = InitKind::Zeros;
  e.frozen = false;
  e.weight = e.master = e.adamM = e.adamV = kNoOffset;
  e.grad = grad;
  return e;
}

/// Gradient values of tensor `t` over a wide range, so that the order of
/// the additions shows in the bits.
float gradValue(int t, int64_t i) {
  uint32_t h = uint32_t(i) * 2246822519u ^ uint32_t(t) * 3266489917u;
  float mant = float(h % 100003) / 100003.f - 0.5f;
  return mant * std::ldexp(1.f, int(h >> 27) - 12);
}

void fill(float *p, int t, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    p[i] = gradValue(t, i);
}

/// Runs the loop's bookkeeping (one microbatch, `tokens` counted on this
/// program) and finalize_grads; the token count is summed over the stages
/// as the compiled step does after the loop.
void finalizeStep(Runner &r, int32_t tokens, bool pipelined) {
  float loss = 1.5f;
  std::memcpy(ap_at(r.handle(), kStaging), &loss, 4);
  std::memcpy(ap_at(r.handle(), kStaging + 256), &tokens, 4);
  ap_begin_microbatch(r.handle(), 0);
  if (tokens > 0)
    ap_yield(r.handle(), kStaging, kStaging + 256);
  ap_end_loop(r.handle());
  if (pipelined) {
    ap_all_reduce(r.handle(), r.program.state.lossSum, 4, AP_DTYPE_F32,
                  AP_STREAM_COMPUTE, AP_REDUCE_PIPELINE);
    ap_all_reduce(r.handle(), r.program.state.tokenCount, 4, AP_DTYPE_I32,
                  AP_STREAM_COMPUTE, AP_REDUCE_PIPELINE);
  }
  ap_finalize_grads(r.handle(), 1.0);
}

// Model: tied T (embedding + LM head), A, B (more than one 65536-element
// block each), C. One stage: [T, A, B, C] with T's LM-head part in a
// tied_grad_offset buffer. Two stages: [T, A] and [B, C, T], T
// pipeline_tied, its LM-head part on stage 1. Same tied grad, same norm.
TEST_F(Pipeline, TiedGradAndChainedNormAreOneStagesBits) {
  constexpr int64_t nT = 3000, nA = 70000, nB = 140001, nC = 77;
  constexpr uint64_t oT = 0, oA = 1u << 20, oB = 2u << 20, oC = 3u << 20,
                     oTied = 4u << 20;
  // One stage, on each rank alone (a self communicator).
  Program one;
  one.microBatches = 1;
  one.params = {gradParam("t", nT, oT), gradParam("a", nA, oA),
                gradParam("b", nB, oB), gradParam("c", nC, oC)};
  one.params[0].tiedGrad = oTied;
  Runner r1(one);
  auto self = createSelfCommunicator();
  r1.runner->dataParallel = self.get();
  fill(r1.f32(oT), 0, nT);
  fill(r1.f32(oTied), 1, nT);
  fill(r1.f32(oA), 2, nA);
  fill(r1.f32(oB), 3, nB);
  fill(r1.f32(oC), 4, nC);
  finalizeStep(r1, 40, false);
  std::vector<float> tiedOne(r1.f32(oT), r1.f32(oT) + nT);
  for (int64_t i = 0; i < nT; ++i)
    ASSERT_EQ(r1.f32(oTied)[i], 0.f) << "the tied buffer is zeroed: " << i;
  const float normOne = r1.runner->gradNorm;

  // Two stages.
  Program p = stageProgram();
  if (stage == 0)
    p.params = {gradParam("t", nT, oT), gradParam("a", nA, oA)};
  else
    p.params = {gradParam("b", nB, oB), gradParam("c", nC, oC),
                gradParam("t", nT, oT)};
  for (ParamEntry &e : p.params)
    e.pipelineTied = std::string(e.name) == "t";
  Runner r2(p);
  r2.runner->dataParallel = self.get();
  r2.runner->attachPipeline(world.get());
  fill(r2.f32(oT), stage == 0 ? 0 : 1, nT);
  if (stage == 0) {
    fill(r2.f32(oA), 2, nA);
  } else {
    fill(r2.f32(oB), 3, nB);
    fill(r2.f32(oC), 4, nC);
  }
  // The loss and tokens come from the last stage.
  finalizeStep(r2, stage == 1 ? 40 : 0, true);
  for (int64_t i = 0; i < nT; ++i)
    ASSERT_EQ(r2.f32(oT)[i], tiedOne[size_t(i)]) << "tied grad element " << i;
  uint32_t a, b;
  std::memcpy(&a, &normOne, 4);
  std::memcpy(&b, &r2.runner->gradNorm, 4);
  EXPECT_EQ(a, b) << "one stage " << normOne << ", two stages "
                  << r2.runner->gradNorm;
  // The driver scratch holds the whole model's norm on every stage.
  float s1, s2;
  std::memcpy(&s1, ap_scratch(r1.handle(), AP_SCRATCH_GRAD_NORM), 4);
  std::memcpy(&s2, ap_scratch(r2.handle(), AP_SCRATCH_GRAD_NORM), 4);
  EXPECT_EQ(s1, s2);
  // The clip coefficient AdamW applies follows from the norm alike.
  float c1, c2;
  std::memcpy(&c1, ap_scratch(r1.handle(), AP_SCRATCH_CLIP_COEF), 4);
  std::memcpy(&c2, ap_scratch(r2.handle(), AP_SCRATCH_CLIP_COEF), 4);
  EXPECT_EQ(c1, c2);
}

// A pipelined save: each stage's writer puts its tensors in its own file,
// stage 0 adds the index naming every tensor's file; each stage reads its
// tensors back (the tied one from stage 0's file), and a one-stage reader
// reads them all.
TEST_F(Pipeline, CheckpointHasAFilePerStageAndAnIndex) {
  std::string dir;
  if (stage == 0) {
    char tmpl[] = "/tmp/ap_pipeline_ckpt_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  char name[64] = {};
  std::strncpy(name, dir.c_str(), sizeof name - 1);
  world->broadcast(name, sizeof name / 4, ap::kernels::DType::I32, 0, nullptr);
  dir = name;
  auto tensor = [](const std::string &name, std::vector<float> &v) {
    CheckpointTensor t;
    t.name = name;
    t.dtype = StDType::F32;
    t.shape = {int64_t(v.size())};
    t.data = v.data();
    t.bytes = v.size() * 4;
    return t;
  };
  auto values = [](int t, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = gradValue(t, int64_t(i));
    return v;
  };
  std::vector<float> tied = values(0, 10), a = values(1, 6), b = values(2, 8);
  std::vector<std::pair<CheckpointTensor, int>> placed = {
      {tensor("t", tied), 0}, {tensor("a", a), 0}, {tensor("b", b), 1}};
  std::vector<CheckpointTensor> mine;
  if (stage == 0)
    mine = {tensor("t", tied), tensor("a", a)};
  else
    mine = {tensor("b", b)};
  TrainingState st;
  st.step = 3;
  st.rng.seed = 7;
  ShardInfo save = ShardInfo::of(*world);
  save.rank = stage;
  save.worldSize = 2;
  save.placedTensors = placed;
  saveCheckpoint(dir, mine, st, save);

  // Stage 1 holds the tied tensor too: read from stage 0's file.
  std::vector<float> t2(10), a2(6), b2(8);
  std::vector<CheckpointTensor> want;
  if (stage == 0)
    want = {tensor("t", t2), tensor("a", a2)};
  else
    want = {tensor("b", b2), tensor("t", t2)};
  LoadOptions subset;
  subset.subset = true;
  TrainingState back =
      loadCheckpoint(resolveCheckpoint(dir), want, ShardInfo{}, subset);
  EXPECT_EQ(back.step, 3u);
  EXPECT_EQ(t2, tied);
  if (stage == 0)
    EXPECT_EQ(a2, a);
  else
    EXPECT_EQ(b2, b);
  // One stage reads the whole model.
  std::vector<float> t3(10), a3(6), b3(8);
  loadCheckpoint(resolveCheckpoint(dir),
                 {tensor("t", t3), tensor("a", a3), tensor("b", b3)},
                 ShardInfo{});
  EXPECT_EQ(t3, tied);
  EXPECT_EQ(a3, a);
  EXPECT_EQ(b3, b);
  world->barrier();
  if (stage == 0)
    std::system(("rm -rf '" + dir + "'").c_str());
}

} // namespace

AP_MPI_GTEST_MAIN()
