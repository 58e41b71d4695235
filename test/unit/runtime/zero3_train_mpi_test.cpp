//===- zero3_train_mpi_test.cpp - ZeRO-3 training against replicate -------===//
//
// Run as `mpirun -np 2 runtime_zero3_train_mpi_test` (and with -np 1): the
// whole training binary (trainMain) on a hand-made program whose step does
// what a compiled data-parallel step does with a toy gradient: all-gathers
// each ZeRO-3 weight shard, writes the rank's gradient of the whole
// parameter, reduce-scatters it into the main-grad shard (replicate:
// accumulates into the whole main grad and all-reduces it in the last
// microbatch), sums loss and token count over the ranks, then finalises
// the grads, runs AdamW and the loss mean. With one microbatch the summed
// grads have the same bits in both modes (0 + a + b either way), so:
//   - zero3 and replicate on the same ranks train to bitwise equal
//     parameters, masters and Adam moments (checked tensor by tensor on
//     their checkpoints: zero3 flat shards and an index, replicate one
//     file), from the Philox init and from --init-weights; the loss is
//     equal, the grad norm equal at one rank and within 1e-6 relative at
//     two (each rank's norm of its shards, squared and summed in rank
//     order); --dump-grads writes the same gradients;
//   - with clipping the grad norm stays within that bound;
//   - a zero3 resume at the same world size continues bitwise (two
//     microbatches: the reduce-scatter accumulates), and checkpoints cross
//     layouts: a zero3 checkpoint resumed by replicate and a replicate one
//     by zero3 (each rank reads its elements) continue the same training;
//   - bf16 main grads (ParamEntry::mainGradBf16, the reduce-scatter into a
//     bf16 shard) train: the ranks agree on loss and grad norm, and against
//     the f32 main-grad run the grad norm, loss, masters and dumped grads
//     stay within bf16 bounds while the norms are not bitwise equal.
// The toy loss is a sum over the tokens plus a weighted sum of the weights,
// so it follows the parameters.
//
//===----------------------------------------------------------------------===//
#include "runtime/checkpoint.h"
#include "runtime/trainer.h"
#include "runtime/weights.h"

#include "mpi_gtest_main.h"
#include "train_run_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
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

/// The toy model's parameters.
struct ParamSpec {
  const char *name;
  DType dtype;
  std::vector<int64_t> shape;
  InitKind init;
  double a, b;
  bool frozen;
};
const ParamSpec kParams[] = {
    {"layers.0.w", DType::BF16, {5, 3}, InitKind::Normal, 0, 0.5, false},
    {"layers.0.b", DType::F32, {7}, InitKind::Uniform, -1, 1, false},
    // One element: on two ranks, rank 1's shard is all padding.
    {"scale", DType::F32, {1}, InitKind::Ones, 0, 0, false},
    {"norm.weight", DType::BF16, {3}, InitKind::Ones, 0, 0, true},
};
constexpr size_t kNumParams = sizeof(kParams) / sizeof(kParams[0]);

/// The step's own buffers besides the program's (gathered weights, the
/// whole-parameter grads) and its settings: the step is a plain function.
struct StepLayout {
  uint64_t gathered[kNumParams], full[kNumParams];
  uint64_t lossBuf = 0, countBuf = 0;
  double maxNorm = 0;
} layout;

float weightAt(const void *w, DType dt, int64_t k) {
  if (dt == DType::BF16)
    return float(static_cast<const ap::kernels::bf16 *>(w)[k]);
  return static_cast<const float *>(w)[k];
}

void toyStep(StepRunner &r) {
  const Program &p = r.program();
  const bool zero3 = p.dataParallelMode == DataParallelMode::Zero3;
  const int64_t ranks = p.dataParallelSize, tokens = p.batch * p.seq;
  for (int64_t mb = 0; mb < p.microBatches; ++mb) {
    r.microbatch = mb;
    const int32_t *tok = r.tokens.data() + mb * tokens;
    // The whole weights this microbatch reads: the loss depends on them.
    struct WeightView {
      const void *at;
      DType dtype;
      int64_t n;
    };
    std::vector<WeightView> weights;
    for (size_t i = 0; i < kNumParams; ++i) {
      const ParamEntry &e = p.params[i];
      int64_t eb = int64_t(dtypeBytes(e.dtype));
      uint64_t w = e.weight;
      if (zero3) {
        r.allGather(e.weight, layout.gathered[i], uint64_t(e.shardNumel * eb),
                    e.dtype, Stream::Compute);
        w = layout.gathered[i];
      }
      weights.push_back({r.at(w), e.dtype, e.numel});
      if (e.frozen)
        continue;
      // This rank's gradient of the whole parameter; ZeRO-3 writes it into
      // a whole (padded) buffer each microbatch and accumulates the summed
      // shard, replicate accumulates into the main grad.
      float *g = static_cast<float *>(r.at(zero3 ? layout.full[i] : e.grad));
      const void *wp = r.at(w);
      int64_t n = e.numel, total = zero3 ? ranks * e.shardNumel : n;
      DType dt = e.dtype;
      r.dev.hostCallback(Stream::Compute, [=] {
        for (int64_t k = 0; k < total; ++k) {
          float v = k < n ? weightAt(wp, dt, k) * 0.25f +
                                float(tok[k % tokens] % 7) * 0.01f
                          : 0.f;
          g[k] = zero3 ? v : g[k] + v;
        }
      });
      if (zero3)
        r.reduceScatter(layout.full[i], e.grad, uint64_t(e.shardNumel) * 4,
                        DType::F32, Stream::Compute, /*accumulate=*/true,
                        /*shardBf16=*/e.mainGradBf16);
      else
        r.allReduce(e.grad, uint64_t(n) * 4, DType::F32, Stream::Compute,
                    /*lastMicrobatchOnly=*/true);
    }
    auto *loss = static_cast<float *>(r.at(layout.lossBuf));
    auto *count = static_cast<int32_t *>(r.at(layout.countBuf));
    r.dev.hostCallback(Stream::Compute, [=] {
      float s = 0;
      for (int64_t t = 0; t < tokens; ++t)
        s += float(tok[t]) * 1e-3f;
      for (const WeightView &w : weights)
        for (int64_t k = 0; k < w.n; ++k)
          s += weightAt(w.at, w.dtype, k) * 0.01f;
      *loss = s;
      *count = int32_t(tokens);
    });
    r.yield(layout.lossBuf, layout.countBuf);
  }
  r.endLoop();
  r.allReduce(p.state.lossSum, 4, DType::F32, Stream::Compute);
  r.allReduce(p.state.tokenCount, 4, DType::I32, Stream::Compute);
  r.finalizeGrads(layout.maxNorm);
  r.lrSchedule(p.maxLr, p.optimizer.minLr, p.optimizer.warmupSteps,
               p.optimizer.totalSteps);
  for (size_t i = 0; i < kNumParams; ++i)
    r.adamw(i, 0.9, 0.95, 1e-8, 0.1);
  r.lossMean();
}

/// The toy program for `ranks` ranks in `mode`, its arena laid out here.
Program toyProgram(DataParallelMode mode, int ranks, int64_t microBatches,
                   double maxNorm, bool bf16Grads = false) {
  Program p;
  p.model = "zero3-toy";
  p.microBatches = microBatches;
  p.batch = 1;
  p.seq = 8;
  p.vocab = 256;
  p.dataParallelSize = ranks;
  p.dataParallelMode = mode;
  p.maxLr = 0.05;
  p.optimizer.minLr = 0.005;
  p.optimizer.warmupSteps = 1;
  p.optimizer.totalSteps = 10;
  uint64_t off = 0;
  auto alloc = [&](uint64_t bytes) {
    uint64_t at = off;
    off = alignUp(off + bytes, 256);
    return at;
  };
  bool zero3 = mode == DataParallelMode::Zero3;
  for (size_t i = 0; i < kNumParams; ++i) {
    const ParamSpec &s = kParams[i];
    ParamEntry e{};
    e.name = s.name;
    e.dtype = s.dtype;
    e.rank = int32_t(s.shape.size());
    e.numel = 1;
    for (int d = 0; d < 4; ++d) {
      e.shape[d] = d < e.rank ? s.shape[size_t(d)] : 1;
      e.numel *= e.shape[d];
    }
    e.init = s.init;
    e.initA = s.a;
    e.initB = s.b;
    e.frozen = s.frozen;
    e.shardNumel = zero3 ? (e.numel + ranks - 1) / ranks : 0;
    e.mainGradBf16 = bf16Grads && !s.frozen;
    int64_t elems = zero3 ? e.shardNumel : e.numel;
    uint64_t eb = dtypeBytes(s.dtype);
    e.weight = alloc(uint64_t(elems) * eb);
    e.master = e.grad = e.adamM = e.adamV = kNoOffset;
    if (!s.frozen) {
      e.master = alloc(uint64_t(elems) * 4);
      e.grad = alloc(uint64_t(elems) * (e.mainGradBf16 ? 2 : 4));
      e.adamM = alloc(uint64_t(elems) * 4);
      e.adamV = alloc(uint64_t(elems) * 4);
    }
    int64_t whole = zero3 ? elems * ranks : elems;
    layout.gathered[i] = alloc(uint64_t(whole) * eb);
    layout.full[i] = alloc(uint64_t(whole) * 4);
    p.params.push_back(e);
  }
  p.state.lossSum = alloc(4);
  p.state.tokenCount = alloc(4);
  p.state.gradNorm = alloc(4);
  p.state.lr = alloc(4);
  p.state.loss = alloc(4);
  layout.lossBuf = alloc(4);
  layout.countBuf = alloc(4);
  layout.maxNorm = maxNorm;
  p.scratchOffset = alloc(512);
  p.scratchBytes = 512;
  p.persistentBytes = off;
  p.arenaBytes = off;
  p.step = toyStep;
  return p;
}

DataParallelMode modeOf(const std::string &name) {
  return name == "z3" ? DataParallelMode::Zero3 : DataParallelMode::Replicate;
}

class Zero3Train : public ::testing::Test {
protected:
  void SetUp() override {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    work = sharedWorkDir("ap-zero3");
    ASSERT_FALSE(work.empty()) << "mkdtemp under " << ::testing::TempDir();
  }
  void TearDown() override { removeSharedWorkDir(work); }

  /// trainMain on the toy program (its step's layout set for it) with
  /// `flags` on the host backend; every rank must pass.
  void train(DataParallelMode mode, int64_t microBatches, double maxNorm,
             std::vector<std::string> flags, bool bf16Grads = false) {
    Program p = toyProgram(mode, ranks, microBatches, maxNorm, bf16Grads);
    flags.insert(flags.begin(), {"train", "--device", "host"});
    std::vector<char *> argv;
    for (std::string &f : flags)
      argv.push_back(f.data());
    argv.push_back(nullptr);
    int rc = trainMain(int(flags.size()), argv.data(), p);
    ASSERT_EQ(rc, 0) << "trainMain failed on rank " << rank;
    MPI_Barrier(MPI_COMM_WORLD);
  }

  /// Asserts that two checkpoints hold the same tensors, bit for bit.
  static void expectSameTensors(const std::string &a, const std::string &b) {
    auto ta = wholeTensors(a), tb = wholeTensors(b);
    ASSERT_EQ(ta.size(), tb.size()) << a << " vs " << b;
    for (const auto &[name, bytes] : ta) {
      ASSERT_TRUE(tb.count(name)) << name << " missing in " << b;
      EXPECT_TRUE(bytes == tb[name])
          << "tensor '" << name << "' differs between " << a << " and " << b;
    }
  }

  static std::string stepDir(const std::string &dir, int step) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "/step-%08d", step);
    return dir + buf;
  }

  int rank = 0, ranks = 1;
  std::string work;
};

TEST_F(Zero3Train, TrainsLikeReplicateTensorByTensor) {
  for (const std::string &mode : {"rep", "z3"})
    train(modeOf(mode), 1, 0,
          {"--steps", "3", "--save", work + "/" + mode, "--save-every", "1",
           "--metrics", work + "/" + mode + ".jsonl", "--dump-grads",
           work + "/" + mode + "-grads.safetensors"});
  // The layouts: replicate one file; zero3 on several ranks one shard per
  // rank and an index that maps every tensor.
  EXPECT_TRUE(std::filesystem::exists(stepDir(work + "/rep", 3) +
                                      "/model.safetensors"));
  EXPECT_EQ(std::filesystem::exists(stepDir(work + "/z3", 3) + "/index.json"),
            ranks > 1);
  for (int s = 1; s <= 3; ++s)
    expectSameTensors(stepDir(work + "/rep", s), stepDir(work + "/z3", s));
  auto mr = metricsOf(work + "/rep.jsonl"), mz = metricsOf(work + "/z3.jsonl");
  ASSERT_EQ(mr.size(), 3u);
  ASSERT_EQ(mz.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(mr[s].first, mz[s].first) << "loss of step " << s + 1;
    if (ranks == 1)
      EXPECT_EQ(mr[s].second, mz[s].second) << "grad norm of step " << s + 1;
    else
      EXPECT_NEAR(mz[s].second / mr[s].second, 1.0, 1e-6)
          << "grad norm of step " << s + 1;
  }
  // --dump-grads: rank 0 writes the whole gradients in both modes.
  SafetensorsFile gr = SafetensorsFile::open(work + "/rep-grads.safetensors");
  SafetensorsFile gz = SafetensorsFile::open(work + "/z3-grads.safetensors");
  for (const ParamSpec &s : kParams) {
    if (s.frozen)
      continue;
    const StTensorInfo *a = gr.find(s.name), *b = gz.find(s.name);
    ASSERT_TRUE(a && b) << s.name;
    ASSERT_EQ(a->shape, b->shape) << s.name;
    EXPECT_EQ(std::memcmp(gr.data(*a), gz.data(*b), a->bytes()), 0)
        << "dumped grads of " << s.name;
  }
}

TEST_F(Zero3Train, InitWeightsAreSlicedAlike) {
  // Whole tensors by name, as a PyTorch peer would write them.
  std::string path = work + "/init.safetensors";
  if (rank == 0) {
    std::vector<WeightSpec> specs;
    std::vector<std::vector<float>> values;
    for (const ParamSpec &s : kParams) {
      specs.push_back({s.name, StDType::F32, s.shape});
      int64_t n = 1;
      for (int64_t d : s.shape)
        n *= d;
      std::vector<float> v(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k)
        v[size_t(k)] = 0.125f * float(k + 1) - 0.3f * float(k % 3);
      values.push_back(v);
    }
    writeTensorsF32(path, specs, values);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (const std::string &mode : {"rep", "z3"})
    train(
        modeOf(mode), 1, 0,
        {"--steps", "1", "--save", work + "/" + mode, "--init-weights", path});
  expectSameTensors(stepDir(work + "/rep", 1), stepDir(work + "/z3", 1));
}

TEST_F(Zero3Train, ClippedGradNormCombinesTheRanks) {
  for (const std::string &mode : {"rep", "z3"})
    train(modeOf(mode), 1, /*maxNorm=*/0.05,
          {"--steps", "2", "--metrics", work + "/" + mode + ".jsonl"});
  auto mr = metricsOf(work + "/rep.jsonl"), mz = metricsOf(work + "/z3.jsonl");
  ASSERT_EQ(mz.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    ASSERT_GT(mr[s].second, 0.05) << "the clip must act";
    EXPECT_NEAR(mz[s].second / mr[s].second, 1.0, 1e-6) << s + 1;
    if (ranks == 1)
      EXPECT_EQ(mz[s].second, mr[s].second) << s + 1;
  }
}

TEST_F(Zero3Train, ResumeIsBitwiseAndCrossesLayouts) {
  // Two microbatches: the main-grad shards accumulate over them.
  const DataParallelMode rep = DataParallelMode::Replicate,
                         z3 = DataParallelMode::Zero3;
  train(z3, 2, 0,
        {"--steps", "3", "--save", work + "/z3", "--save-every", "1"});
  train(z3, 2, 0,
        {"--steps", "3", "--save", work + "/z3-resumed", "--resume",
         stepDir(work + "/z3", 1)});
  expectSameTensors(stepDir(work + "/z3", 3), stepDir(work + "/z3-resumed", 3));

  // One microbatch, where the layouts train alike: each resumes the
  // other's checkpoint of step 1 and reaches the same step 3.
  train(rep, 1, 0,
        {"--steps", "3", "--save", work + "/rep1", "--save-every", "1"});
  train(z3, 1, 0,
        {"--steps", "3", "--save", work + "/z31", "--save-every", "1"});
  train(rep, 1, 0,
        {"--steps", "3", "--save", work + "/rep-from-z3", "--resume",
         stepDir(work + "/z31", 1)});
  train(z3, 1, 0,
        {"--steps", "3", "--save", work + "/z3-from-rep", "--resume",
         stepDir(work + "/rep1", 1)});
  expectSameTensors(stepDir(work + "/rep1", 3),
                    stepDir(work + "/rep-from-z3", 3));
  expectSameTensors(stepDir(work + "/rep1", 3),
                    stepDir(work + "/z3-from-rep", 3));
}

// bf16 main grads (the Megatron-FSDP setting): the shards take each
// microbatch's f32 block sum with one rounding to bf16, the norm and AdamW
// read bf16. Every rank reports the same loss and grad norm; the fp32
// masters stay f32. Against the f32 main-grad run over 4 steps of 2
// microbatches: each main-grad element is rounded twice (relative error
// at most 2 x 2^-9), so the grad norm agrees within 2^-7 relative; AdamW's
// update m / sqrt(v) moves by about that relative amount times lr, so the
// masters move by at most lr x steps x 2^-6 and the loss (a weighted sum
// of the weights) by far less than 1e-3 relative. The norms must differ
// somewhere: the rounding shows.
TEST_F(Zero3Train, Bf16MainGradsTrainWithinTheirBound) {
  const DataParallelMode z3 = DataParallelMode::Zero3;
  for (bool bf16 : {false, true}) {
    std::string name = bf16 ? "bf16" : "f32";
    train(z3, 2, /*maxNorm=*/0.05,
          {"--steps", "4", "--save", work + "/" + name, "--save-every", "4",
           "--metrics", work + "/" + name + ".jsonl", "--dump-grads",
           work + "/" + name + "-grads.safetensors"},
          bf16);
  }
  auto mf = metricsOf(work + "/f32.jsonl"),
       mb = metricsOf(work + "/bf16.jsonl");
  ASSERT_EQ(mf.size(), 4u);
  ASSERT_EQ(mb.size(), 4u);
  for (int r = 1; r < ranks; ++r) {
    auto other = metricsOf(work + "/bf16.jsonl.rank" + std::to_string(r));
    ASSERT_EQ(other.size(), 4u) << "rank " << r;
    for (size_t s = 0; s < 4; ++s) {
      EXPECT_EQ(other[s].first, mb[s].first) << "loss, rank " << r;
      EXPECT_EQ(other[s].second, mb[s].second) << "grad norm, rank " << r;
    }
  }
  bool normsDiffer = false;
  for (size_t s = 0; s < 4; ++s) {
    ASSERT_GT(mf[s].second, 0.05) << "the clip must act";
    EXPECT_NEAR(mb[s].second / mf[s].second, 1.0, 0x1p-7) << "step " << s + 1;
    EXPECT_NEAR(mb[s].first, mf[s].first, 1e-3 * std::fabs(mf[s].first))
        << "loss of step " << s + 1;
    normsDiffer |= mb[s].second != mf[s].second;
  }
  EXPECT_TRUE(normsDiffer) << "bf16 main grads left every grad norm "
                              "unchanged: were they rounded at all?";
  // The masters stay f32 and within lr x steps x 2^-6 of the f32 run.
  auto tf = wholeTensors(stepDir(work + "/f32", 4)),
       tb = wholeTensors(stepDir(work + "/bf16", 4));
  ASSERT_EQ(tf.size(), tb.size());
  for (const auto &[name, bytes] : tf) {
    if (name.rfind(masterTensorName(""), 0) != 0)
      continue;
    const std::vector<uint8_t> &other = tb[name];
    ASSERT_EQ(other.size(), bytes.size()) << name << " (f32 in both)";
    const float *a = reinterpret_cast<const float *>(bytes.data()),
                *b = reinterpret_cast<const float *>(other.data());
    for (size_t k = 0; k < bytes.size() / 4; ++k)
      EXPECT_NEAR(b[k], a[k], 0.05 * 4 * 0x1p-6) << name << "[" << k << "]";
  }
  // --dump-grads writes the bf16 grads widened to f32, within two bf16
  // roundings of the f32 ones.
  SafetensorsFile gf = SafetensorsFile::open(work + "/f32-grads.safetensors");
  SafetensorsFile gb = SafetensorsFile::open(work + "/bf16-grads.safetensors");
  for (const ParamSpec &s : kParams) {
    if (s.frozen)
      continue;
    const StTensorInfo *a = gf.find(s.name), *b = gb.find(s.name);
    ASSERT_TRUE(a && b) << s.name;
    ASSERT_EQ(a->bytes(), b->bytes()) << s.name;
    const float *x = reinterpret_cast<const float *>(gf.data(*a)),
                *y = reinterpret_cast<const float *>(gb.data(*b));
    for (size_t k = 0; k < a->bytes() / 4; ++k)
      EXPECT_NEAR(y[k], x[k], 0x1p-7 * std::fabs(x[k]) + 1e-7)
          << s.name << "[" << k << "]";
  }
}

} // namespace

AP_MPI_GTEST_MAIN()
