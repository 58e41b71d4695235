//===- pipeline_train_mpi_test.cpp - A two-stage training binary ----------===//
//
// Run as `mpirun -np 2 runtime_pipeline_train_mpi_test`: the whole training
// binary (trainMainStages) on two hand-made stage programs, rank s running
// stage s. The toy model has a tied weight `embed` (stage 0 reads it at the
// input, stage 1 at the output), `a` on stage 0 and `b` on stage 1; stage 0
// sends each microbatch's activations to stage 1 (all forwards first, so
// several sends are in flight), stage 1 computes the loss, its grads and
// the activations' gradient and sends that back. Checked:
//   - both stages report the same loss and grad norm every step (the loss
//     and token count summed over the stages, the norm chained);
//   - a pipelined checkpoint has one file per stage and an index, and a
//     resume from it continues bitwise (the tied weight's state is saved
//     once and read back by both stages, so their tied grads must agree);
//   - a world that is not data-parallel size x stages is refused.
//
//===----------------------------------------------------------------------===//
#include "runtime/checkpoint.h"
#include "runtime/trainer.h"

#include "mpi_gtest_main.h"
#include "train_run_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

using namespace ap::rt;
using ap::kernels::DType;
using ap::rt::test::metricsOf;
using ap::rt::test::removeSharedWorkDir;
using ap::rt::test::sharedWorkDir;
using ap::rt::test::wholeTensors;

namespace {

constexpr int64_t kEmbed = 4, kA = 6, kB = 5, kAct = 8, kMicro = 3;

/// Each stage's own buffers besides the program's.
struct StageLayout {
  uint64_t act[kMicro] = {}, dact = 0, lossBuf = 0, countBuf = 0;
} layout[2];

void stage0(StepRunner &r) {
  const Program &p = r.program();
  const StageLayout &l = layout[0];
  const int64_t tokens = p.batch * p.seq;
  auto *embed = static_cast<const float *>(r.at(p.params[0].weight));
  auto *a = static_cast<const float *>(r.at(p.params[1].weight));
  auto *gEmbed = static_cast<float *>(r.at(p.params[0].grad));
  auto *gA = static_cast<float *>(r.at(p.params[1].grad));
  for (int64_t mb = 0; mb < kMicro; ++mb) {
    r.microbatch = mb;
    const int32_t *tok = r.tokens.data() + mb * tokens;
    auto *x = static_cast<float *>(r.at(l.act[mb]));
    r.dev.hostCallback(Stream::Compute, [=] {
      for (int64_t i = 0; i < kAct; ++i)
        x[i] =
            embed[i % kEmbed] * float(tok[i % tokens] % 11) * 0.1f + a[i % kA];
    });
    r.dev.synchronize(Stream::Compute);
    r.pipelineSend(l.act[mb], kAct * 4, /*next=*/true);
  }
  for (int64_t mb = 0; mb < kMicro; ++mb) {
    r.pipelineRecv(l.dact, kAct * 4, /*next=*/true);
    r.dev.synchronize(Stream::Comm);
    const int32_t *tok = r.tokens.data() + mb * tokens;
    auto *dx = static_cast<const float *>(r.at(l.dact));
    r.dev.hostCallback(Stream::Compute, [=] {
      for (int64_t i = 0; i < kAct; ++i) {
        gEmbed[i % kEmbed] += dx[i] * float(tok[i % tokens] % 11) * 0.1f;
        gA[i % kA] += dx[i];
      }
    });
    r.dev.synchronize(Stream::Compute);
  }
}

void stage1(StepRunner &r) {
  const Program &p = r.program();
  const StageLayout &l = layout[1];
  const int64_t tokens = p.batch * p.seq;
  auto *b = static_cast<const float *>(r.at(p.params[0].weight));
  auto *embed = static_cast<const float *>(r.at(p.params[1].weight));
  auto *gB = static_cast<float *>(r.at(p.params[0].grad));
  auto *gEmbed = static_cast<float *>(r.at(p.params[1].grad));
  for (int64_t mb = 0; mb < kMicro; ++mb) {
    r.microbatch = mb;
    r.pipelineRecv(l.act[0], kAct * 4, /*next=*/false);
    r.dev.synchronize(Stream::Comm);
    const int32_t *lab = r.labels.data() + mb * tokens;
    auto *x = static_cast<const float *>(r.at(l.act[0]));
    auto *dx = static_cast<float *>(r.at(l.dact));
    auto *loss = static_cast<float *>(r.at(l.lossBuf));
    auto *count = static_cast<int32_t *>(r.at(l.countBuf));
    // loss = sum_i (x_i * b_i * embed_i - lab_i / 256)^2 / 2
    r.dev.hostCallback(Stream::Compute, [=] {
      float s = 0;
      for (int64_t i = 0; i < kAct; ++i) {
        float w = b[i % kB] * embed[i % kEmbed];
        float e = x[i] * w - float(lab[i % tokens]) / 256.f;
        s += 0.5f * e * e;
        dx[i] = e * w;
        gB[i % kB] += e * x[i] * embed[i % kEmbed];
        gEmbed[i % kEmbed] += e * x[i] * b[i % kB];
      }
      *loss = s;
      *count = int32_t(kAct);
    });
    r.yield(l.lossBuf, l.countBuf);
    r.dev.synchronize(Stream::Compute);
    r.pipelineSend(l.dact, kAct * 4, /*next=*/false);
  }
}

void toyStep(StepRunner &r) {
  const Program &p = r.program();
  if (r.stage() == 0)
    stage0(r);
  else
    stage1(r);
  r.endLoop();
  r.allReduce(p.state.lossSum, 4, DType::F32, Stream::Compute, false, true);
  r.allReduce(p.state.tokenCount, 4, DType::I32, Stream::Compute, false, true);
  r.finalizeGrads(1.0);
  r.lrSchedule(p.maxLr, p.optimizer.minLr, p.optimizer.warmupSteps,
               p.optimizer.totalSteps);
  for (size_t i = 0; i < p.params.size(); ++i)
    r.adamw(i, 0.9, 0.95, 1e-8, 0.1);
  r.lossMean();
}

ParamEntry param(const char *name, int64_t n, double initB,
                 const std::function<uint64_t(uint64_t)> &alloc) {
  ParamEntry e{};
  e.name = name;
  e.dtype = DType::F32;
  e.rank = 1;
  e.shape[0] = n;
  e.shape[1] = e.shape[2] = e.shape[3] = 1;
  e.numel = n;
  e.init = InitKind::Uniform;
  e.initA = -initB;
  e.initB = initB;
  e.weight = alloc(uint64_t(n) * 4);
  e.master = alloc(uint64_t(n) * 4);
  e.grad = alloc(uint64_t(n) * 4);
  e.adamM = alloc(uint64_t(n) * 4);
  e.adamV = alloc(uint64_t(n) * 4);
  return e;
}

Program stageProgram(int stage) {
  Program p;
  p.model = "pipeline-toy";
  p.microBatches = kMicro;
  p.batch = 1;
  p.seq = 4;
  p.vocab = 256;
  p.maxLr = 0.05;
  p.optimizer.minLr = 0.005;
  p.optimizer.warmupSteps = 1;
  p.optimizer.totalSteps = 10;
  p.pipelineSize = 2;
  p.pipelineStage = stage;
  uint64_t off = 0;
  std::function<uint64_t(uint64_t)> alloc = [&](uint64_t bytes) {
    uint64_t at = off;
    off = alignUp(off + bytes, 256);
    return at;
  };
  // Different offsets on the two stages: the tied weight is found by name.
  if (stage == 0) {
    p.params = {param("embed", kEmbed, 0.5, alloc), param("a", kA, 1, alloc)};
    p.params[0].pipelineTied = true;
  } else {
    alloc(256);
    p.params = {param("b", kB, 1, alloc), param("embed", kEmbed, 0.5, alloc)};
    p.params[1].pipelineTied = true;
  }
  StageLayout &l = layout[stage];
  for (int64_t mb = 0; mb < kMicro; ++mb)
    l.act[mb] = alloc(kAct * 4);
  l.dact = alloc(kAct * 4);
  l.lossBuf = alloc(4);
  l.countBuf = alloc(4);
  p.state.lossSum = alloc(4);
  p.state.tokenCount = alloc(4);
  p.state.gradNorm = alloc(4);
  p.state.lr = alloc(4);
  p.state.loss = alloc(4);
  p.scratchOffset = alloc(512);
  p.scratchBytes = 512;
  p.persistentBytes = off;
  p.arenaBytes = off;
  p.step = toyStep;
  return p;
}

class PipelineTrain : public ::testing::Test {
protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    work = sharedWorkDir("ap-pipeline");
    ASSERT_FALSE(work.empty()) << "mkdtemp under " << ::testing::TempDir();
  }
  void TearDown() override { removeSharedWorkDir(work); }

  int train(std::vector<Program> stages, std::vector<std::string> flags) {
    flags.insert(flags.begin(), {"train", "--device", "host"});
    std::vector<char *> argv;
    for (std::string &f : flags)
      argv.push_back(f.data());
    argv.push_back(nullptr);
    int rc = trainMainStages(int(flags.size()), argv.data(), stages);
    MPI_Barrier(MPI_COMM_WORLD);
    return rc;
  }

  int rank = 0;
  std::string work;
};

TEST_F(PipelineTrain, StagesAgreeAndResumeIsBitwise) {
  const std::string a = work + "/a", b = work + "/b";
  ASSERT_EQ(train({stageProgram(0), stageProgram(1)},
                  {"--steps", "4", "--save", a, "--save-every", "1",
                   "--metrics", work + "/m.jsonl"}),
            0);
  if (rank == 0) {
    auto m0 = metricsOf(work + "/m.jsonl"),
         m1 = metricsOf(work + "/m.jsonl.rank1");
    ASSERT_EQ(m0.size(), 4u);
    ASSERT_EQ(m1.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(std::isfinite(m0[i].first) && m0[i].first > 0) << i;
      EXPECT_TRUE(std::isfinite(m0[i].second) && m0[i].second > 0) << i;
      EXPECT_EQ(m0[i], m1[i]) << "stage 0 and stage 1 at step " << i + 1;
    }
    EXPECT_NE(m0[0].first, m0[3].first) << "the loss follows the weights";
    for (const char *f : {"/step-00000004/model-rank00000-of-00002.safetensors",
                          "/step-00000004/model-rank00001-of-00002.safetensors",
                          "/step-00000004/index.json"})
      EXPECT_TRUE(std::filesystem::exists(a + f)) << a + f;
    // The whole model's state, the tied weight's once.
    auto t = wholeTensors(a + "/step-00000004");
    EXPECT_EQ(t.size(), 12u);
  }
  // Resume at step 2 and run to 4: the same bits as the straight run.
  ASSERT_EQ(train({stageProgram(0), stageProgram(1)},
                  {"--steps", "4", "--resume", a + "/step-00000002", "--save",
                   b, "--metrics", work + "/r.jsonl"}),
            0);
  if (rank == 0) {
    auto ta = wholeTensors(a + "/step-00000004"),
         tb = wholeTensors(b + "/step-00000004");
    ASSERT_EQ(ta.size(), tb.size());
    for (const auto &[name, bytes] : ta)
      EXPECT_TRUE(bytes == tb[name]) << "tensor '" << name << "' differs";
    auto straight = metricsOf(work + "/m.jsonl"),
         resumed = metricsOf(work + "/r.jsonl");
    ASSERT_EQ(resumed.size(), 2u);
    EXPECT_EQ(resumed[0], straight[2]);
    EXPECT_EQ(resumed[1], straight[3]);
  }
}

TEST_F(PipelineTrain, WorldOfAnotherSizeIsRefused) {
  // Three stages on two ranks.
  Program s2 = stageProgram(1);
  std::vector<Program> stages = {stageProgram(0), stageProgram(1), s2};
  for (int s = 0; s < 3; ++s) {
    stages[size_t(s)].pipelineSize = 3;
    stages[size_t(s)].pipelineStage = s;
  }
  testing::internal::CaptureStderr();
  int rc = train(stages, {"--steps", "1"});
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("started 2 rank(s) but this binary was compiled for 1 "
                     "data-parallel rank(s) x 3 pipeline stages = 3 rank(s)"),
            std::string::npos)
      << err;
}

} // namespace

AP_MPI_GTEST_MAIN()
