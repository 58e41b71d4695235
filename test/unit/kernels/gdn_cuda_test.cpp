//===- gdn_cuda_test.cpp - GDN cuda kernels vs host reference ---*- C++ -*-===//
//
// On a GPU (skipped without one): every GDN cuda kernel against the float64
// host reference run on the same bf16 inputs, with outputs poisoned (NaN)
// before each run, and two runs bitwise equal. The chunked rule is checked at
// the Qwen3.5-0.8B shape (T=4096, Hk=Hv=16, dk=dv=128, B=1 and 4; every
// (sequence, head) slice against the reference, and every output element
// finite), at grouped (Hv = 2 Hk) and 256-wide heads, and with many heads
// (the register-state passes then take eight warps per CTA).
//
// Bounds (max |err| / max |ref| per tensor): bf16 storage of inputs and
// outputs plus bf16 tensor-core operands (T, W, U, states, Vnew, dS, dP)
// with fp32 accumulation. Outputs of the forward: 2e-2; gradients, which go
// through more bf16 operand roundings (T^T dT T^T): 4e-2.
//
//===----------------------------------------------------------------------===//
#include "gdn_conv_reference.h"
#include "kernels/kernels.h"
#include "long_shapes.h"
#include "packed_documents.h"
#include "random_data.h"

#include <gtest/gtest.h>

#if ACTPLACE_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace ap::kernels::gdncuda {
bool linked();
} // namespace ap::kernels::gdncuda

using namespace ap::kernels;

namespace {

#if ACTPLACE_HAVE_CUDA
bool haveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call

using ap::test::randn;
using ap::test::uniform;
using ap::test::Vec;
/// Round to bf16 in place; returns the bf16 copy.
std::vector<bf16> toBf(Vec &v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    r[i] = bf16(float(v[i]));
    v[i] = double(toFloat(r[i]));
  }
  return r;
}
std::vector<float> toF(Vec &v) {
  std::vector<float> r(v.begin(), v.end());
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = r[i];
  return r;
}
double relErr(const Vec &a, const Vec &b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]))
      return INFINITY;
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return num / std::max(den, 1e-300);
}

/// A device buffer that can be poisoned (all bytes 0xff: NaN in bf16/f32).
struct Dev {
  void *p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t b) : bytes(b) {
    if (cudaMalloc(&p, b ? b : 1) != cudaSuccess)
      p = nullptr;
  }
  template <typename T>
  Dev(const std::vector<T> &h) : Dev(h.size() * sizeof(T)) {
    cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice);
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev &) = delete;
  void poison() { cudaMemset(p, 0xff, bytes); }
  std::vector<unsigned char> raw() const {
    std::vector<unsigned char> r(bytes);
    cudaMemcpy(r.data(), p, bytes, cudaMemcpyDeviceToHost);
    return r;
  }
  Vec bf() const {
    std::vector<bf16> h(bytes / 2);
    cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
    Vec r(h.size());
    for (size_t i = 0; i < h.size(); ++i)
      r[i] = toFloat(h[i]);
    return r;
  }
  Vec f32() const {
    std::vector<float> h(bytes / 4);
    cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
    return Vec(h.begin(), h.end());
  }
};

KernelContext gpuCtx(void *ws, size_t wsBytes) {
  KernelContext c;
  c.backend = Backend::Cuda;
  c.workspace = ws;
  c.workspaceBytes = wsBytes;
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&c.smCount, cudaDevAttrMultiProcessorCount, dev);
  return c;
}

class GdnCuda : public ::testing::Test {
protected:
  void SetUp() override {
    if (!haveGpu())
      GTEST_SKIP() << "no CUDA device";
    ASSERT_TRUE(gdncuda::linked());
  }
};

//===----------------------------------------------------------------------===//
// Chunked gated delta rule
//===----------------------------------------------------------------------===//

struct Shape {
  int B, T, Hk, Hv, dk, dv;
};

/// Args of one chunked-rule problem (one sequence per batch row); the
/// pointers in GdnChunkArgs order: inputs q, k, v, g, beta, initialState,
/// dO, dFinalState, then outputs o, finalState, gCum, tMat, dq, dk, dv, dg,
/// dbeta, dInitialState.
GdnChunkArgs chunkArgs(DType dtype, Shape s, float scale,
                       std::array<const void *, 8> in,
                       std::array<void *, 10> out) {
  GdnChunkArgs a;
  a.dtype = dtype;
  a.batch = s.B;
  a.seqLen = s.T;
  a.keyHeads = s.Hk;
  a.valueHeads = s.Hv;
  a.keyDim = s.dk;
  a.valueDim = s.dv;
  a.scale = scale;
  a.q = in[0];
  a.k = in[1];
  a.v = in[2];
  a.g = in[3];
  a.beta = in[4];
  a.initialState = in[5];
  a.dO = in[6];
  a.dFinalState = in[7];
  a.o = out[0];
  a.finalState = out[1];
  a.gCum = out[2];
  a.tMat = out[3];
  a.dq = out[4];
  a.dk = out[5];
  a.dv = out[6];
  a.dg = out[7];
  a.dbeta = out[8];
  a.dInitialState = out[9];
  return a;
}

/// One chunked-rule problem on the device, every buffer in GdnChunkArgs
/// order: bf16 q, k (unit rows: the kernel sees L2-normalised inputs), v,
/// dO; fp32 g, beta, an initial state and a final-state gradient; all outputs.
/// The host copies hold the values as stored (rounded to bf16 / f32).
struct ChunkProblem {
  Vec q, k, v, g, beta, h0, dO, dF;
  std::vector<std::unique_ptr<Dev>> in, out;
  GdnChunkArgs a;
  ChunkProblem(Shape s, uint64_t seed) {
    const size_t N = size_t(s.B) * s.T;
    q = randn(N * s.Hk * s.dk, seed + 1);
    k = randn(N * s.Hk * s.dk, seed + 2);
    for (Vec *x : {&q, &k})
      for (size_t r = 0; r < N * s.Hk; ++r) {
        double ss = 0;
        for (int i = 0; i < s.dk; ++i)
          ss += (*x)[r * s.dk + i] * (*x)[r * s.dk + i];
        for (int i = 0; i < s.dk; ++i)
          (*x)[r * s.dk + i] /= std::sqrt(ss);
      }
    v = randn(N * s.Hv * s.dv, seed + 3);
    g = uniform(N * s.Hv, seed + 4, -0.3, -0.005);
    beta = uniform(N * s.Hv, seed + 5, 0.05, 0.95);
    h0 = randn(size_t(s.B) * s.Hv * s.dk * s.dv, seed + 6, 0.2);
    dO = randn(N * s.Hv * s.dv, seed + 7);
    dF = randn(h0.size(), seed + 8, 0.2);
    auto bf16In = [&](Vec &x) { in.push_back(std::make_unique<Dev>(toBf(x))); };
    auto f32In = [&](Vec &x) { in.push_back(std::make_unique<Dev>(toF(x))); };
    bf16In(q);
    bf16In(k);
    bf16In(v);
    f32In(g);
    f32In(beta);
    f32In(h0);
    bf16In(dO);
    f32In(dF);
    const size_t sizes[] = {N * s.Hv * s.dv * 2, h0.size() * 4, N * s.Hv * 4,
                            N * s.Hv * 64 * 2,   q.size() * 2,  k.size() * 2,
                            v.size() * 2,        N * s.Hv * 4,  N * s.Hv * 4,
                            h0.size() * 4};
    for (size_t b : sizes)
      out.push_back(std::make_unique<Dev>(b));
    std::array<const void *, 8> ip;
    std::array<void *, 10> op;
    for (size_t i = 0; i < ip.size(); ++i)
      ip[i] = in[i]->p;
    for (size_t i = 0; i < op.size(); ++i)
      op[i] = out[i]->p;
    a = chunkArgs(DType::BF16, s, float(1.0 / std::sqrt(double(s.dk))), ip, op);
  }
  size_t workspaceBytes() const {
    return std::max(gdnChunkForwardWorkspaceBytes(a),
                    gdnChunkBackwardWorkspaceBytes(a));
  }
};

void checkChunk(Shape s, uint64_t seed) {
  SCOPED_TRACE(testing::Message()
               << "B=" << s.B << " T=" << s.T << " Hk=" << s.Hk
               << " Hv=" << s.Hv << " dk=" << s.dk << " dv=" << s.dv);
  ChunkProblem pb(s, seed);
  const Vec &q = pb.q, &k = pb.k, &v = pb.v, &g = pb.g, &beta = pb.beta,
            &h0 = pb.h0, &dO = pb.dO, &dF = pb.dF;
  Dev &o = *pb.out[0], &fin = *pb.out[1], &gc = *pb.out[2], &tm = *pb.out[3],
      &gq = *pb.out[4], &gk = *pb.out[5], &gv = *pb.out[6], &gg = *pb.out[7],
      &gb = *pb.out[8], &gh0 = *pb.out[9];
  GdnChunkArgs a = pb.a;
  const size_t wsBytes = pb.workspaceBytes();
  Dev ws(wsBytes);
  ASSERT_NE(ws.p, nullptr);
  KernelContext ctx = gpuCtx(ws.p, wsBytes);
  Dev *outs[] = {&o, &fin, &gc, &tm, &gq, &gk, &gv, &gg, &gb, &gh0};
  std::vector<std::vector<unsigned char>> first;
  // The second run hands the backward an event to record after its first
  // launch (KernelContext::firstLaunchDone): it must be recorded between the
  // backward's start and end, and change no bit.
  cudaEvent_t start = nullptr, firstDone = nullptr, end = nullptr;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&firstDone));
  CK(cudaEventCreate(&end));
  for (int run = 0; run < 2; ++run) {
    for (Dev *d : outs)
      d->poison();
    ws.poison();
    ASSERT_EQ(gdnChunkForward(ctx, a), Status::Ok);
    ws.poison();
    KernelContext bwd = ctx;
    if (run == 1) {
      bwd.firstLaunchDone = firstDone;
      CK(cudaEventRecord(start, (cudaStream_t)ctx.stream));
    }
    ASSERT_EQ(gdnChunkBackward(bwd, a), Status::Ok);
    if (run == 1)
      CK(cudaEventRecord(end, (cudaStream_t)ctx.stream));
    CK(cudaDeviceSynchronize());
    std::vector<std::vector<unsigned char>> cur;
    for (Dev *d : outs)
      cur.push_back(d->raw());
    if (run == 0)
      first = cur;
    else
      for (size_t i = 0; i < cur.size(); ++i)
        EXPECT_TRUE(cur[i] == first[i])
            << "output " << i << " differs between runs";
  }
  float toFirst = -1, toEnd = -1;
  CK(cudaEventElapsedTime(&toFirst, start, firstDone)); // fails unrecorded
  CK(cudaEventElapsedTime(&toEnd, firstDone, end));
  EXPECT_GT(toFirst, 0.f); // after the W/U pass ...
  EXPECT_GT(toEnd, 0.f);   // ... before the state passes
  for (cudaEvent_t e : {start, firstDone, end})
    CK(cudaEventDestroy(e));
  // Every output element was poisoned (NaN) before the runs: each must have
  // been written with a finite value, in every sequence and head.
  Vec go = o.bf(), gfin = fin.f32(), ggq = gq.bf(), ggk = gk.bf(),
      ggv = gv.bf(), ggg = gg.f32(), ggb = gb.f32(), ggh0 = gh0.f32();
  {
    const char *names[] = {"o",  "finalState", "dq",    "dk",
                           "dv", "dg",         "dbeta", "dInitialState"};
    const Vec *all[] = {&go, &gfin, &ggq, &ggk, &ggv, &ggg, &ggb, &ggh0};
    for (size_t t = 0; t < std::size(all); ++t) {
      size_t bad = 0, firstBad = 0;
      for (size_t i = 0; i < all[t]->size(); ++i)
        if (!std::isfinite((*all[t])[i]) && bad++ == 0)
          firstBad = i;
      EXPECT_EQ(bad, 0u) << names[t] << ": " << bad << " of " << all[t]->size()
                         << " elements not finite, the first at " << firstBad;
    }
  }
  // The float64 reference on every (sequence, value head) slice, on the same
  // inputs. Heads and sequences are independent, so each slice is a
  // one-sequence, one-head problem; slices of one key head's group run in
  // one task, whose dq and dk are summed over the group as the GPU sums
  // them. Tasks run on all host threads (the Qwen shapes have 64 slices).
  const size_t T = size_t(s.T);
  const int group = s.Hv / s.Hk;
  enum { kO, kFinal, kDv, kDg, kDbeta, kDh0, kDq, kDk, kNumErrs };
  const char *errNames[kNumErrs] = {"o",     "final", "dv", "dg",
                                    "dbeta", "dh0",   "dq", "dk"};
  struct TaskResult {
    double err[kNumErrs] = {};
    bool ok = true;
  };
  std::vector<TaskResult> results(size_t(s.B) * s.Hk);
  auto sliceH = [&](const Vec &x, int b, int H, int d, int head) {
    Vec out(T * d);
    for (size_t t = 0; t < T; ++t)
      for (int i = 0; i < d; ++i)
        out[t * d + i] = x[((size_t(b) * T + t) * H + head) * d + i];
    return out;
  };
  auto runTask = [&](int b, int hk, TaskResult &res) {
    Vec sumDq(T * s.dk, 0.0), sumDk(T * s.dk, 0.0);
    for (int h = hk * group; h < (hk + 1) * group; ++h) {
      Vec sq = sliceH(q, b, s.Hk, s.dk, hk), sk = sliceH(k, b, s.Hk, s.dk, hk),
          sv = sliceH(v, b, s.Hv, s.dv, h), sdO = sliceH(dO, b, s.Hv, s.dv, h),
          sg = sliceH(g, b, s.Hv, 1, h), sb = sliceH(beta, b, s.Hv, 1, h);
      size_t st0 = (size_t(b) * s.Hv + h) * s.dk * s.dv;
      size_t stN = size_t(s.dk) * s.dv;
      Vec sh0(h0.begin() + st0, h0.begin() + st0 + stN),
          sdF(dF.begin() + st0, dF.begin() + st0 + stN);
      Vec ro(T * s.dv), rf(stN), rgc(T), rtm(T * 64), rdq(sq.size()),
          rdk(sk.size()), rdv(sv.size()), rdg(T), rdb(T), rdh0(stN);
      GdnChunkArgs r = chunkArgs(
          DType::F64, {1, s.T, 1, 1, s.dk, s.dv}, a.scale,
          {sq.data(), sk.data(), sv.data(), sg.data(), sb.data(), sh0.data(),
           sdO.data(), sdF.data()},
          {ro.data(), rf.data(), rgc.data(), rtm.data(), rdq.data(), rdk.data(),
           rdv.data(), rdg.data(), rdb.data(), rdh0.data()});
      if (gdnChunkForward(KernelContext{}, r) != Status::Ok ||
          gdnChunkBackward(KernelContext{}, r) != Status::Ok) {
        res.ok = false;
        return;
      }
      auto sliceS = [&](const Vec &x) {
        return Vec(x.begin() + st0, x.begin() + st0 + stN);
      };
      auto worst = [&](int which, double e) {
        res.err[which] = std::max(res.err[which], e);
      };
      worst(kO, relErr(sliceH(go, b, s.Hv, s.dv, h), ro));
      worst(kFinal, relErr(sliceS(gfin), rf));
      worst(kDv, relErr(sliceH(ggv, b, s.Hv, s.dv, h), rdv));
      worst(kDg, relErr(sliceH(ggg, b, s.Hv, 1, h), rdg));
      worst(kDbeta, relErr(sliceH(ggb, b, s.Hv, 1, h), rdb));
      worst(kDh0, relErr(sliceS(ggh0), rdh0));
      for (size_t i = 0; i < sumDq.size(); ++i) {
        sumDq[i] += rdq[i];
        sumDk[i] += rdk[i];
      }
    }
    res.err[kDq] = relErr(sliceH(ggq, b, s.Hk, s.dk, hk), sumDq);
    res.err[kDk] = relErr(sliceH(ggk, b, s.Hk, s.dk, hk), sumDk);
  };
  ap::test::parallelFor(results.size(), [&](size_t i) {
    runTask(int(i / s.Hk), int(i % s.Hk), results[i]);
  });
  // Per tensor, the worst slice (max |err| / max |ref| within a slice).
  double maxErr[kNumErrs] = {};
  size_t worstTask[kNumErrs] = {};
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_TRUE(results[i].ok) << "reference failed on (sequence " << i / s.Hk
                               << ", key head " << i % s.Hk << ")";
    for (int e = 0; e < kNumErrs; ++e)
      if (results[i].err[e] > maxErr[e] || std::isnan(results[i].err[e])) {
        maxErr[e] =
            std::isnan(results[i].err[e]) ? INFINITY : results[i].err[e];
        worstTask[e] = i;
      }
  }
  std::printf("[gdn chunk] B=%d T=%d Hk=%d Hv=%d dk=%d dv=%d  worst rel err "
              "over %zu (sequence, key head group) tasks:",
              s.B, s.T, s.Hk, s.Hv, s.dk, s.dv, results.size());
  for (int e = 0; e < kNumErrs; ++e) {
    std::printf(" %s %.2e", errNames[e], maxErr[e]);
    // Forward outputs 2e-2, gradients 4e-2 (the header's bounds).
    double bound = (e == kO || e == kFinal) ? 2e-2 : 4e-2;
    EXPECT_LT(maxErr[e], bound)
        << errNames[e] << " worst at sequence " << worstTask[e] / s.Hk
        << ", key head " << worstTask[e] % s.Hk;
  }
  std::printf("\n");
}

TEST_F(GdnCuda, ChunkSmallTailAndGrouped) {
  checkChunk({2, 200, 2, 4, 64, 32}, 1);
}
TEST_F(GdnCuda, ChunkWideHeads) {
  checkChunk({1, 150, 1, 1, 256, 64}, 2);
  checkChunk({1, 130, 2, 2, 32, 256}, 3);
}
TEST_F(GdnCuda, ChunkQwenShapeB1) {
  checkChunk({1, 4096, 16, 16, 128, 128}, 4);
}
TEST_F(GdnCuda, ChunkQwenShapeB4) {
  checkChunk({4, 4096, 16, 16, 128, 128}, 5);
}
TEST_F(GdnCuda, ChunkGroupedQwenWidth) {
  checkChunk({1, 1024, 8, 16, 128, 128}, 6);
}
/// Enough (sequence, head) pairs that the register-state passes take eight
/// warps per CTA; a tail chunk of 44.
TEST_F(GdnCuda, ChunkManyHeads) { checkChunk({2, 300, 48, 48, 64, 128}, 7); }

/// Every work split of the sequential state passes (GdnChunkArgs::stateSplit
/// x stateSlicesPerCta) gives the bits of the unsplit passes, in every output
/// (states and their gradients included); splits the passes do not have are
/// refused with InvalidArgument before anything runs.
void checkStateSplits(Shape s, uint64_t seed) {
  SCOPED_TRACE(testing::Message()
               << "B=" << s.B << " T=" << s.T << " Hk=" << s.Hk
               << " Hv=" << s.Hv << " dk=" << s.dk << " dv=" << s.dv);
  ChunkProblem pb(s, seed);
  GdnChunkArgs &a = pb.a;
  Dev ws(pb.workspaceBytes());
  ASSERT_NE(ws.p, nullptr);
  KernelContext ctx = gpuCtx(ws.p, ws.bytes);
  Dev &o = *pb.out[0];
  const char *names[] = {"o",  "finalState", "gCum", "tMat",  "dq",
                         "dk", "dv",         "dg",   "dbeta", "dInitialState"};
  using Bytes = std::vector<std::vector<unsigned char>>;
  auto run = [&](int split, int slices) -> Bytes {
    a.stateSplit = split;
    a.stateSlicesPerCta = slices;
    for (auto &d : pb.out)
      d->poison();
    ws.poison();
    EXPECT_EQ(gdnChunkForward(ctx, a), Status::Ok);
    ws.poison();
    EXPECT_EQ(gdnChunkBackward(ctx, a), Status::Ok);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Bytes r;
    for (auto &d : pb.out)
      r.push_back(d->raw());
    return r;
  };
  const auto base = run(1, 1);
  const int combos[][2] = {{0, 0}, {1, 4}, {1, 8}, {2, 1},
                           {2, 2}, {2, 4}, {4, 1}, {4, 2}};
  for (auto [split, slices] : combos) {
    const auto r = run(split, slices);
    for (size_t i = 0; i < r.size(); ++i)
      EXPECT_TRUE(r[i] == base[i])
          << names[i] << " with split " << split << " x " << slices
          << " slices differs from the unsplit passes";
  }
  // Splits the passes do not have: nothing runs, the outputs stay poisoned.
  const int bad[][2] = {{3, 0}, {8, 0}, {-1, 0}, {0, 9}, {4, 4}, {2, -1}};
  for (auto [split, slices] : bad) {
    a.stateSplit = split;
    a.stateSlicesPerCta = slices;
    o.poison();
    EXPECT_EQ(gdnChunkForward(ctx, a), Status::InvalidArgument)
        << split << " x " << slices;
    EXPECT_EQ(gdnChunkBackward(ctx, a), Status::InvalidArgument)
        << split << " x " << slices;
    CK(cudaDeviceSynchronize());
    const Vec ov = o.bf();
    EXPECT_TRUE(std::all_of(ov.begin(), ov.end(), [](double x) {
      return std::isnan(x);
    })) << "a refused split wrote o";
  }
}

// A grouped Qwen-width head pair with a tail chunk (300 = 4 x 64 + 44), and
// dk = 64 with three 16-column slices (a CTA of two slices has an idle one).
TEST_F(GdnCuda, ChunkStateSplitsGiveTheSameBits) {
  checkStateSplits({1, 300, 1, 2, 128, 128}, 11);
  checkStateSplits({2, 200, 2, 2, 64, 48}, 12);
}

// A split needs dk 64 or 128 (the compile-time key widths).
TEST_F(GdnCuda, ChunkStateSplitRefusedForOtherKeyWidths) {
  for (Shape s : {Shape{1, 100, 1, 1, 32, 64}, Shape{1, 100, 1, 1, 256, 64}}) {
    const size_t N = size_t(s.B) * s.T;
    Dev q(N * s.dk * 2), k(N * s.dk * 2), v(N * s.dv * 2), g(N * 4), b(N * 4);
    Dev o(N * s.dv * 2), gc(N * 4), tm(N * 64 * 2);
    GdnChunkArgs a =
        chunkArgs(DType::BF16, s, 0.1f,
                  {q.p, k.p, v.p, g.p, b.p, nullptr, nullptr, nullptr},
                  {o.p, nullptr, gc.p, tm.p, nullptr, nullptr, nullptr, nullptr,
                   nullptr, nullptr});
    Dev ws(gdnChunkForwardWorkspaceBytes(a));
    KernelContext ctx = gpuCtx(ws.p, ws.bytes);
    a.stateSplit = 2;
    EXPECT_EQ(gdnChunkForward(ctx, a), Status::InvalidArgument) << s.dk;
    a.stateSplit = 1;
    EXPECT_EQ(gdnChunkForward(ctx, a), Status::Ok) << s.dk;
    CK(cudaDeviceSynchronize());
  }
}

/// Grouped heads: dq/dk of the GPU equal the sum of per-value-head
/// references (checked on a small shape where the full reference is cheap).
TEST_F(GdnCuda, ChunkGroupedQKGradientSum) {
  Shape s{1, 100, 1, 3, 32, 16};
  const size_t N = size_t(s.B) * s.T;
  Vec q = randn(N * s.dk, 11, 0.18), k = randn(N * s.dk, 12, 0.18),
      v = randn(N * s.Hv * s.dv, 13), g = uniform(N * s.Hv, 14, -0.3, -0.01),
      beta = uniform(N * s.Hv, 15, 0.1, 0.9), dO = randn(N * s.Hv * s.dv, 16);
  auto qb = toBf(q), kb = toBf(k), vb = toBf(v), dOb = toBf(dO);
  auto gf = toF(g), btf = toF(beta);
  Dev dq_(qb), dk_(kb), dv_(vb), dg_(gf), db_(btf), ddO(dOb);
  Dev o(N * s.Hv * s.dv * 2), gc(N * s.Hv * 4), tm(N * s.Hv * 128),
      gq(qb.size() * 2), gk(kb.size() * 2), gv(vb.size() * 2), gg(N * s.Hv * 4),
      gb(N * s.Hv * 4);
  GdnChunkArgs a;
  a.dtype = DType::BF16;
  a.batch = s.B;
  a.seqLen = s.T;
  a.keyHeads = s.Hk;
  a.valueHeads = s.Hv;
  a.keyDim = s.dk;
  a.valueDim = s.dv;
  a.scale = 0.17f;
  a.q = dq_.p;
  a.k = dk_.p;
  a.v = dv_.p;
  a.g = dg_.p;
  a.beta = db_.p;
  a.o = o.p;
  a.gCum = gc.p;
  a.tMat = tm.p;
  a.dO = ddO.p;
  a.dq = gq.p;
  a.dk = gk.p;
  a.dv = gv.p;
  a.dg = gg.p;
  a.dbeta = gb.p;
  size_t wsBytes = gdnChunkBackwardWorkspaceBytes(a);
  Dev ws(wsBytes);
  KernelContext ctx = gpuCtx(ws.p, wsBytes);
  for (Dev *d : {&o, &gq, &gk})
    d->poison();
  ASSERT_EQ(gdnChunkForward(ctx, a), Status::Ok);
  ASSERT_EQ(gdnChunkBackward(ctx, a), Status::Ok);
  CK(cudaDeviceSynchronize());
  Vec rq(q.size()), rk(k.size()), ro(o.bytes / 2), rgc(N * s.Hv),
      rtm(N * s.Hv * 64), rdv(v.size()), rdg(N * s.Hv), rdb(N * s.Hv);
  GdnChunkArgs r = a;
  r.dtype = DType::F64;
  r.q = q.data();
  r.k = k.data();
  r.v = v.data();
  r.g = g.data();
  r.beta = beta.data();
  r.o = ro.data();
  r.gCum = rgc.data();
  r.tMat = rtm.data();
  r.dO = dO.data();
  r.dq = rq.data();
  r.dk = rk.data();
  r.dv = rdv.data();
  r.dg = rdg.data();
  r.dbeta = rdb.data();
  ASSERT_EQ(gdnChunkForward(KernelContext{}, r), Status::Ok);
  ASSERT_EQ(gdnChunkBackward(KernelContext{}, r), Status::Ok);
  double eq = relErr(gq.bf(), rq), ek = relErr(gk.bf(), rk);
  std::printf("[gdn chunk grouped r=3] rel err dq %.2e dk %.2e o %.2e\n", eq,
              ek, relErr(o.bf(), ro));
  EXPECT_LT(eq, 4e-2);
  EXPECT_LT(ek, 4e-2);
  EXPECT_LT(relErr(o.bf(), ro), 2e-2);
}

// Packed sequences: 2 rows of 200 tokens, row 0 holding documents at 0, 37,
// 106 (inside the second 64-token chunk) and 199, row 1 one document, with
// grouped heads (Hv = 2 Hk). Every output of the packed forward and backward
// is written (NaN poison) and equals bitwise what the kernels give for each
// document alone, as its own row copied into fresh buffers: o, gCum, tMat,
// dq, dk, dv, dg, dbeta at the document's tokens; a row's finalState and
// dInitialState those of its last and first document, whose initial state
// and final-state gradient are the row's. The packed o and dq also match the
// float64 host reference of the packed row.
TEST_F(GdnCuda, ChunkPackedDocumentsAsRows) {
  const ap::test::PackedRow &row0 = ap::test::kPackedRow200;
  const Shape s{2, row0.T, 2, 4, 64, 64};
  const size_t N = size_t(s.B) * s.T, T = size_t(s.T);
  const size_t qw = size_t(s.Hk) * s.dk, vw = size_t(s.Hv) * s.dv,
               hw = size_t(s.Hv), tw = size_t(s.Hv) * 64,
               stN = size_t(s.Hv) * s.dk * s.dv;
  std::vector<int32_t> ds = row0.docStart();
  ds.resize(N, 0); // row 1: one document
  struct Doc {
    int b, start, len;
    bool first, last;
  };
  std::vector<Doc> docs;
  for (size_t d = 0; d < row0.documents(); ++d)
    docs.push_back(
        {0, row0.starts[d], row0.length(d), d == 0, d + 1 == row0.documents()});
  docs.push_back({1, 0, s.T, true, true});

  Vec q = randn(N * qw, 41, 0.125), k = randn(N * qw, 42, 0.125),
      v = randn(N * vw, 43), g = uniform(N * hw, 44, -0.3, -0.005),
      beta = uniform(N * hw, 45, 0.05, 0.95),
      h0 = randn(size_t(s.B) * stN, 46, 0.2), dO = randn(N * vw, 47),
      dF = randn(h0.size(), 48, 0.2);
  auto qb = toBf(q), kb = toBf(k), vb = toBf(v), dOb = toBf(dO);
  auto gf = toF(g), btf = toF(beta), h0f = toF(h0), dFf = toF(dF);
  Dev iq(qb), ik(kb), iv(vb), ig(gf), ib(btf), ih0(h0f), idO(dOb), idF(dFf),
      dDs(ds);
  Dev o(N * vw * 2), fin(h0.size() * 4), gc(N * hw * 4), tm(N * tw * 2),
      gq(N * qw * 2), gk(N * qw * 2), gv(N * vw * 2), gg(N * hw * 4),
      gb(N * hw * 4), gh0(h0.size() * 4);
  const float scale = 0.125f;
  GdnChunkArgs a =
      chunkArgs(DType::BF16, s, scale,
                {iq.p, ik.p, iv.p, ig.p, ib.p, ih0.p, idO.p, idF.p},
                {o.p, fin.p, gc.p, tm.p, gq.p, gk.p, gv.p, gg.p, gb.p, gh0.p});
  a.docStart = static_cast<const int32_t *>(dDs.p);
  const size_t wsBytes = std::max(gdnChunkForwardWorkspaceBytes(a),
                                  gdnChunkBackwardWorkspaceBytes(a));
  Dev ws(wsBytes);
  ASSERT_NE(ws.p, nullptr);
  const KernelContext ctx = gpuCtx(ws.p, wsBytes);
  Dev *outs[] = {&o, &fin, &gc, &tm, &gq, &gk, &gv, &gg, &gb, &gh0};
  for (Dev *d : outs)
    d->poison();
  ASSERT_EQ(gdnChunkForward(ctx, a), Status::Ok);
  ASSERT_EQ(gdnChunkBackward(ctx, a), Status::Ok);
  CK(cudaDeviceSynchronize());
  std::vector<std::vector<unsigned char>> packed;
  for (Dev *d : outs)
    packed.push_back(d->raw());
  {
    const char *names[] = {"o",  "finalState", "gCum", "tMat",  "dq",
                           "dk", "dv",         "dg",   "dbeta", "dInitial"};
    for (size_t i = 0; i < std::size(outs); ++i) {
      // tMat rows past a document's last chunk row are not written (as
      // for a row's tail chunk), so only the rest must be finite.
      if (i == 3)
        continue;
      Vec x = (i == 1 || i == 2 || i >= 7) ? outs[i]->f32() : outs[i]->bf();
      size_t bad = 0;
      for (double e : x)
        bad += !std::isfinite(e);
      EXPECT_EQ(bad, 0u) << names[i] << " has unwritten elements";
    }
  }
  // Each document alone.
  for (const Doc &doc : docs) {
    SCOPED_TRACE(::testing::Message()
                 << "document at row " << doc.b << " token " << doc.start);
    const size_t L = size_t(doc.len), tok = size_t(doc.b) * T + doc.start;
    auto sub = [&](const Dev &src, size_t width, size_t elem) {
      auto d = std::make_unique<Dev>(L * width * elem);
      EXPECT_EQ(cudaMemcpy(
                    d->p, static_cast<const char *>(src.p) + tok * width * elem,
                    d->bytes, cudaMemcpyDeviceToDevice),
                cudaSuccess);
      return d;
    };
    auto sq = sub(iq, qw, 2), sk = sub(ik, qw, 2), sv = sub(iv, vw, 2),
         sg = sub(ig, hw, 4), sb = sub(ib, hw, 4), sdO = sub(idO, vw, 2);
    Dev sh0(stN * 4), sdF(stN * 4);
    CK(cudaMemcpy(sh0.p, static_cast<const char *>(ih0.p) + doc.b * stN * 4,
                  stN * 4, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(sdF.p, static_cast<const char *>(idF.p) + doc.b * stN * 4,
                  stN * 4, cudaMemcpyDeviceToDevice));
    Dev oo(L * vw * 2), of(stN * 4), ogc(L * hw * 4), otm(L * tw * 2),
        oq(L * qw * 2), ok(L * qw * 2), ov(L * vw * 2), og(L * hw * 4),
        ob(L * hw * 4), oh0(stN * 4);
    GdnChunkArgs one = chunkArgs(
        DType::BF16, {1, doc.len, s.Hk, s.Hv, s.dk, s.dv}, scale,
        {sq->p, sk->p, sv->p, sg->p, sb->p, doc.first ? sh0.p : nullptr, sdO->p,
         doc.last ? sdF.p : nullptr},
        {oo.p, of.p, ogc.p, otm.p, oq.p, ok.p, ov.p, og.p, ob.p, oh0.p});
    ASSERT_EQ(gdnChunkForward(ctx, one), Status::Ok);
    ASSERT_EQ(gdnChunkBackward(ctx, one), Status::Ok);
    CK(cudaDeviceSynchronize());
    struct Cmp {
      const char *name;
      Dev *alone;
      size_t out, width, elem;
    };
    for (Cmp c : {Cmp{"o", &oo, 0, vw, 2}, Cmp{"gCum", &ogc, 2, hw, 4},
                  Cmp{"dq", &oq, 4, qw, 2}, Cmp{"dk", &ok, 5, qw, 2},
                  Cmp{"dv", &ov, 6, vw, 2}, Cmp{"dg", &og, 7, hw, 4},
                  Cmp{"dbeta", &ob, 8, hw, 4}}) {
      auto al = c.alone->raw();
      EXPECT_TRUE(std::equal(al.begin(), al.end(),
                             packed[c.out].begin() + tok * c.width * c.elem))
          << c.name;
    }
    // tMat: the rows the document's chunks fill.
    {
      auto al = otm.raw();
      bool same = true;
      for (size_t t = 0; t < L && same; ++t)
        same =
            std::equal(al.begin() + t * tw * 2, al.begin() + (t + 1) * tw * 2,
                       packed[3].begin() + (tok + t) * tw * 2);
      EXPECT_TRUE(same) << "tMat";
    }
    if (doc.last) {
      auto al = of.raw();
      EXPECT_TRUE(
          std::equal(al.begin(), al.end(), packed[1].begin() + doc.b * stN * 4))
          << "finalState";
    }
    if (doc.first) {
      auto al = oh0.raw();
      EXPECT_TRUE(
          std::equal(al.begin(), al.end(), packed[9].begin() + doc.b * stN * 4))
          << "dInitialState";
    }
  }
  // The float64 host reference of the packed rows.
  Vec ro(N * vw), rf(h0.size()), rgc(N * hw), rtm(N * tw), rdq(N * qw),
      rdk(N * qw), rdv(N * vw), rdg(N * hw), rdb(N * hw), rdh0(h0.size());
  GdnChunkArgs r =
      chunkArgs(DType::F64, s, scale,
                {q.data(), k.data(), v.data(), g.data(), beta.data(), h0.data(),
                 dO.data(), dF.data()},
                {ro.data(), rf.data(), rgc.data(), rtm.data(), rdq.data(),
                 rdk.data(), rdv.data(), rdg.data(), rdb.data(), rdh0.data()});
  r.docStart = ds.data();
  ASSERT_EQ(gdnChunkForward(KernelContext{}, r), Status::Ok);
  ASSERT_EQ(gdnChunkBackward(KernelContext{}, r), Status::Ok);
  const double eo = relErr(o.bf(), ro), eq = relErr(gq.bf(), rdq);
  std::printf("[gdn chunk packed] rel err against the float64 reference: o "
              "%.2e dq %.2e\n",
              eo, eq);
  EXPECT_LT(eo, 2e-2);
  EXPECT_LT(eq, 4e-2);
}

//===----------------------------------------------------------------------===//
// Short conv, gates, L2 norm, gated norm
//===----------------------------------------------------------------------===//

/// One short-conv problem: bf16-exact random x, w, dy on the host, their
/// device copies, the outputs, the dw start value and the workspace.
struct ConvCase {
  Vec x, w, dy;
  std::vector<float> dw0;
  Dev X, W, DY, Y, DX, DW, ws;
  GdnConvArgs a;
  KernelContext ctx;

  ConvCase(int B, int T, int Cc, int K, uint64_t seed, float dwStart)
      : x(randn(size_t(B) * T * Cc, seed)),
        w(randn(size_t(Cc) * K, seed + 1, 0.5)), dy(randn(x.size(), seed + 2)),
        dw0(w.size(), dwStart), X(toBf(x)), W(toBf(w)), DY(toBf(dy)),
        Y(x.size() * 2), DX(x.size() * 2), DW(dw0),
        ws(workspaceFor(B, T, Cc, K)), a(args(B, T, Cc, K)),
        ctx(gpuCtx(ws.p, ws.bytes)) {}

  static GdnConvArgs args(int B, int T, int Cc, int K) {
    GdnConvArgs a;
    a.dtype = DType::BF16;
    a.batch = B;
    a.seqLen = T;
    a.channels = Cc;
    a.kernelSize = K;
    return a;
  }
  static size_t workspaceFor(int B, int T, int Cc, int K) {
    return gdnConvBackwardWorkspaceBytes(args(B, T, Cc, K));
  }
  /// Forward and backward on the GPU from poisoned outputs and dw0.
  void run() {
    a.x = X.p;
    a.w = W.p;
    a.y = Y.p;
    a.dy = DY.p;
    a.dx = DX.p;
    a.dw = DW.p;
    cudaMemcpy(DW.p, dw0.data(), DW.bytes, cudaMemcpyHostToDevice);
    Y.poison();
    DX.poison();
    ASSERT_EQ(gdnConvForward(ctx, a), Status::Ok);
    ASSERT_EQ(gdnConvBackward(ctx, a), Status::Ok);
    CK(cudaDeviceSynchronize());
  }
  /// The float64 reference: y, dx and dw (from dw0).
  void reference(Vec &ry, Vec &rdx, Vec &rdw) {
    rdw.assign(dw0.begin(), dw0.end());
    ap::test::convReferenceF64(int(a.batch), int(a.seqLen), int(a.channels),
                               a.kernelSize, x, w, dy, ry, rdx, rdw);
  }
};

TEST_F(GdnCuda, ConvForwardBackward) {
  ConvCase c(2, 700, 768, 4, 1, 0.5f);
  c.run();
  auto y1 = c.Y.raw(), dx1 = c.DX.raw();
  Vec dwg = c.DW.f32(), ry, rdx, rdw;
  c.reference(ry, rdx, rdw);
  EXPECT_LT(relErr(c.Y.bf(), ry), 1e-2);
  EXPECT_LT(relErr(c.DX.bf(), rdx), 1e-2);
  EXPECT_LT(relErr(dwg, rdw), 1e-4); // fp32 sums of exact bf16 products
  // Determinism: dw accumulates again from the same start.
  c.run();
  EXPECT_TRUE(c.Y.raw() == y1);
  EXPECT_TRUE(c.DX.raw() == dx1);
  EXPECT_EQ(c.DW.f32(), dwg);
}

// Packed sequences: a row of documents starting at 0, 37, 106 and 199
// (kernels/kernels.h, docStart) gives each document's y and dx bitwise as
// the kernels give them for that document alone as a row, and dw within the
// float64 reference's bound of the documents' summed gradients; with either
// conv path asked for (packed rows take the per-element kernels).
TEST_F(GdnCuda, ConvPackedDocumentsAsRows) {
  const ap::test::PackedRow &row = ap::test::kPackedRow200;
  const int T = row.T, Cc = 160, K = 4;
  Dev dDs(row.docStart());
  for (GdnConvKernels k :
       {GdnConvKernels::PerElement, GdnConvKernels::Fastest}) {
    ConvCase p(1, T, Cc, K, 31, 0.25f);
    p.a.kernels = k;
    p.a.docStart = static_cast<const int32_t *>(dDs.p);
    p.run();
    auto py = p.Y.raw(), pdx = p.DX.raw();
    Vec pdw = p.DW.f32();
    Vec rdw(p.dw0.begin(), p.dw0.end());
    for (size_t d = 0; d < row.documents(); ++d) {
      const int t0 = row.starts[d], L = row.length(d);
      const size_t off = size_t(t0) * Cc, n = size_t(L) * Cc;
      ConvCase one(1, L, Cc, K, 32, 0.25f);
      one.a.kernels = k;
      CK(cudaMemcpy(one.X.p, static_cast<char *>(p.X.p) + off * 2, n * 2,
                    cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy(one.DY.p, static_cast<char *>(p.DY.p) + off * 2, n * 2,
                    cudaMemcpyDeviceToDevice));
      CK(cudaMemcpy(one.W.p, p.W.p, p.W.bytes, cudaMemcpyDeviceToDevice));
      one.run();
      auto oy = one.Y.raw(), odx = one.DX.raw();
      EXPECT_TRUE(std::equal(oy.begin(), oy.end(), py.begin() + off * 2))
          << "y of the document at " << t0;
      EXPECT_TRUE(std::equal(odx.begin(), odx.end(), pdx.begin() + off * 2))
          << "dx of the document at " << t0;
      Vec xs(p.x.begin() + off, p.x.begin() + off + n),
          dys(p.dy.begin() + off, p.dy.begin() + off + n), ry, rdx;
      ap::test::convReferenceF64(1, L, Cc, K, xs, p.w, dys, ry, rdx, rdw);
    }
    EXPECT_LT(relErr(pdw, rdw), 1e-4);
  }
}

/// Runs `body` with `a` asking for the per-element conv kernels, then for
/// the windowed ones (GdnConvKernels::Fastest, the default), then for the
/// staged backward (windowed where the shape does not allow it).
template <typename F> void forEachConvPath(GdnConvArgs &a, F &&body) {
  for (GdnConvKernels k : {GdnConvKernels::PerElement, GdnConvKernels::Fastest,
                           GdnConvKernels::Staged}) {
    SCOPED_TRACE(::testing::Message()
                 << (k == GdnConvKernels::PerElement ? "per-element"
                     : k == GdnConvKernels::Fastest  ? "windowed"
                                                     : "staged"));
    a.kernels = k;
    body();
  }
}

// The staged kernels (x and dpre in shared memory, tiles of 64 channels)
// give the windowed kernels' y, dx and dw bit for bit, at the Qwen3.5
// shape and where runs of 128 tokens cross sequence starts, every kernel
// size, several channel tiles; and the same bits on a second run.
TEST_F(GdnCuda, ConvStagedBitwiseAsWindowed) {
  struct Shape {
    int B, T, Cc, K;
  };
  for (Shape sh :
       {Shape{1, 4096, 6144, 4}, Shape{2, 200, 128, 4}, Shape{4, 77, 192, 2},
        Shape{1, 129, 64, 3}, Shape{2, 3, 64, 8}, Shape{3, 1000, 128, 4},
        Shape{1, 300, 64, 1}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << sh.B << " T=" << sh.T
                                      << " C=" << sh.Cc << " K=" << sh.K);
    ConvCase c(sh.B, sh.T, sh.Cc, sh.K, 13, 0.25f);
    c.a.kernels = GdnConvKernels::Fastest;
    c.run();
    const auto y = c.Y.raw(), dx = c.DX.raw();
    const Vec dw = c.DW.f32();
    c.a.kernels = GdnConvKernels::Staged;
    for (int rep = 0; rep < 2; ++rep) {
      c.run();
      EXPECT_TRUE(c.Y.raw() == y) << "run " << rep;
      EXPECT_TRUE(c.DX.raw() == dx) << "run " << rep;
      EXPECT_EQ(c.DW.f32(), dw) << "run " << rep;
    }
  }
}

// The windowed conv kernels slide windows over runs of tokens (32 forward,
// 128 per dw partial backward): runs that cross sequence starts (T smaller
// than a run, T not a multiple of it, T < K), every kernel size, a channel
// count that is odd and spans two blocks of 128; both conv paths.
TEST_F(GdnCuda, ConvWindowsAcrossSequences) {
  struct Shape {
    int B, T, Cc, K;
  };
  for (Shape sh :
       {Shape{3, 5, 37, 4}, Shape{2, 3, 130, 4}, Shape{4, 77, 130, 1},
        Shape{2, 200, 37, 2}, Shape{3, 45, 64, 3}, Shape{2, 300, 33, 8},
        Shape{1, 7, 5, 8}}) {
    SCOPED_TRACE(::testing::Message() << "B=" << sh.B << " T=" << sh.T
                                      << " C=" << sh.Cc << " K=" << sh.K);
    ConvCase c(sh.B, sh.T, sh.Cc, sh.K, 11, 0.f);
    Vec ry, rdx, rdw;
    c.reference(ry, rdx, rdw);
    forEachConvPath(c.a, [&] {
      c.run();
      // Elementwise: bf16 rounding of y and dx (2^-9 relative) plus fp32
      // sums.
      Vec y = c.Y.bf(), dx = c.DX.bf();
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_NEAR(y[i], ry[i], 8e-3 * std::abs(ry[i]) + 1e-5) << "y at " << i;
        ASSERT_NEAR(dx[i], rdx[i], 8e-3 * std::abs(rdx[i]) + 1e-4)
            << "dx at " << i;
      }
      EXPECT_LT(relErr(c.DW.f32(), rdw), 1e-4);
    });
  }
}

// Every conv path (per-element, windowed, staged) gives the same bits at the
// Qwen3.5 shape (they sum the same terms in the same order).
TEST_F(GdnCuda, ConvPathsBitwiseEqual) {
  ConvCase c(1, 4096, 6144, 4, 21, 0.25f);
  std::vector<std::vector<unsigned char>> ys, dxs;
  std::vector<Vec> dws;
  forEachConvPath(c.a, [&] {
    c.run();
    ys.push_back(c.Y.raw());
    dxs.push_back(c.DX.raw());
    dws.push_back(c.DW.f32());
  });
  ASSERT_EQ(ys.size(), 3u);
  for (size_t k = 1; k < ys.size(); ++k) {
    EXPECT_TRUE(ys[0] == ys[k]) << "path " << k;
    EXPECT_TRUE(dxs[0] == dxs[k]) << "path " << k;
    EXPECT_EQ(dws[0], dws[k]) << "path " << k;
  }
}

// The split output layout at the Qwen3.5 shape (q, k, v of 2048 channels
// each in their own buffers) gives the dense layout's bits on both paths.
TEST_F(GdnCuda, ConvSplitOutputEqualsDenseBitwise) {
  ConvCase c(1, 4096, 6144, 4, 31, 0.25f);
  forEachConvPath(c.a, [&] {
    c.run();
    auto y = c.Y.raw(), dx = c.DX.raw();
    Vec dw = c.DW.f32();
    const size_t rows = 4096, group = 2048, C = 6144;
    std::vector<bf16> dyh(rows * C);
    cudaMemcpy(dyh.data(), c.DY.p, dyh.size() * 2, cudaMemcpyDeviceToHost);
    std::vector<std::unique_ptr<Dev>> ys, dys;
    GdnConvArgs g = c.a;
    g.y = nullptr;
    g.dy = nullptr;
    g.splits = 3;
    for (int s = 0; s < 3; ++s) {
      std::vector<bf16> part(rows * group);
      for (size_t r = 0; r < rows; ++r)
        std::copy_n(dyh.begin() + r * C + s * group, group,
                    part.begin() + r * group);
      dys.push_back(std::make_unique<Dev>(part));
      ys.push_back(std::make_unique<Dev>(rows * group * 2));
      ys.back()->poison();
      g.splitChannels[s] = group;
      g.ys[s] = ys.back()->p;
      g.dys[s] = dys.back()->p;
    }
    c.DX.poison();
    cudaMemcpy(c.DW.p, c.dw0.data(), c.DW.bytes, cudaMemcpyHostToDevice);
    ASSERT_EQ(gdnConvForward(c.ctx, g), Status::Ok);
    ASSERT_EQ(gdnConvBackward(c.ctx, g), Status::Ok);
    CK(cudaDeviceSynchronize());
    for (int s = 0; s < 3; ++s) {
      auto part = ys[s]->raw();
      for (size_t r = 0; r < rows; ++r)
        ASSERT_EQ(0, std::memcmp(part.data() + r * group * 2,
                                 y.data() + (r * C + s * group) * 2, group * 2))
            << "group " << s << " row " << r;
    }
    EXPECT_TRUE(c.DX.raw() == dx);
    EXPECT_EQ(c.DW.f32(), dw);
  });
}

TEST_F(GdnCuda, GatesForwardBackward) {
  const long N = 5000;
  const int H = 16;
  Vec a = randn(N * H, 1, 3.0), b = randn(N * H, 2, 2.0), dg = randn(N * H, 3),
      db = randn(N * H, 4);
  a[7] = 30.0;
  Vec aLog = uniform(H, 5, std::log(0.5), std::log(16.0)), dtb = randn(H, 6);
  auto ab = toBf(a), bb = toBf(b);
  // beta and dbeta are storage-dtype (bf16) tensors, as in the train op.
  auto dgf = toF(dg), alf = toF(aLog), dtf = toF(dtb);
  auto dbb = toBf(db);
  Dev A(ab), Bv(bb), AL(alf), DT(dtf), DG(dgf), DB(dbb), G(N * H * 4),
      BE(N * H * 2), DA(N * H * 2), DBo(N * H * 2);
  std::vector<float> zero(H, 0.f);
  Dev DAL(zero), DDT(zero);
  GdnGatesArgs x;
  x.dtype = DType::BF16;
  x.tokens = N;
  x.heads = H;
  x.a = A.p;
  x.b = Bv.p;
  x.aLog = AL.p;
  x.dtBias = DT.p;
  x.g = G.p;
  x.beta = BE.p;
  x.dg = DG.p;
  x.dbeta = DB.p;
  x.da = DA.p;
  x.db = DBo.p;
  x.dALog = DAL.p;
  x.dDtBias = DDT.p;
  KernelContext ctx = gpuCtx(nullptr, 0);
  for (Dev *d : {&G, &BE, &DA, &DBo})
    d->poison();
  ASSERT_EQ(gdnGatesForward(ctx, x), Status::Ok);
  ASSERT_EQ(gdnGatesBackward(ctx, x), Status::Ok);
  CK(cudaDeviceSynchronize());
  Vec rg(N * H), rb(N * H), rda(N * H), rdb(N * H), ral(H, 0.0), rdt(H, 0.0);
  GdnGatesArgs r = x;
  r.dtype = DType::F64;
  r.a = a.data();
  r.b = b.data();
  r.aLog = aLog.data();
  r.dtBias = dtb.data();
  r.g = rg.data();
  r.beta = rb.data();
  r.dg = dg.data();
  r.dbeta = db.data();
  r.da = rda.data();
  r.db = rdb.data();
  r.dALog = ral.data();
  r.dDtBias = rdt.data();
  ASSERT_EQ(gdnGatesForward(KernelContext{}, r), Status::Ok);
  ASSERT_EQ(gdnGatesBackward(KernelContext{}, r), Status::Ok);
  EXPECT_LT(relErr(G.f32(), rg), 1e-5);
  // One bf16 rounding: at most 2^-9 relative per element.
  EXPECT_LT(relErr(BE.bf(), rb), 4e-3);
  EXPECT_LT(relErr(DA.bf(), rda), 1e-2);
  EXPECT_LT(relErr(DBo.bf(), rdb), 1e-2);
  EXPECT_LT(relErr(DAL.f32(), ral), 1e-4);
  EXPECT_LT(relErr(DDT.f32(), rdt), 1e-4);
}

/// Device copies of host data placed `shift` elements past a 16-byte
/// boundary: shift 0 lets the row kernels use 16-byte accesses, shift 1
/// forces their element-wise fallback.
struct Shifted {
  Dev buf;
  size_t shift;
  Shifted(size_t bytes, size_t shiftElems, size_t elemBytes)
      : buf(bytes + 16), shift(shiftElems * elemBytes) {}
  void *p() const { return static_cast<char *>(buf.p) + shift; }
  template <typename T> void up(const std::vector<T> &h) {
    cudaMemcpy(p(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  void poison() { buf.poison(); }
  std::vector<unsigned char> raw(size_t bytes) const {
    std::vector<unsigned char> r(bytes);
    cudaMemcpy(r.data(), p(), bytes, cudaMemcpyDeviceToHost);
    return r;
  }
  Vec bf(size_t n) const {
    std::vector<bf16> h(n);
    cudaMemcpy(h.data(), p(), n * 2, cudaMemcpyDeviceToHost);
    Vec r(n);
    for (size_t i = 0; i < n; ++i)
      r[i] = toFloat(h[i]);
    return r;
  }
};

/// Raw outputs of one L2 norm forward + backward run.
struct L2Out {
  std::vector<unsigned char> y, rstd, dx;
};

/// L2 norm at N tokens, H heads of d, x rows of xs >= H*d elements (q heads
/// inside a wider conv output row), buffers `shift` elements off alignment:
/// against the float64 reference, then a second run bitwise equal.
L2Out checkL2(long N, int H, int d, long xs, size_t shift) {
  SCOPED_TRACE(::testing::Message() << "l2 N=" << N << " H=" << H << " d=" << d
                                    << " xs=" << xs << " shift=" << shift);
  const long hd = long(H) * d;
  Vec x = randn(N * xs, 1), dy = randn(N * hd, 2);
  auto xb = toBf(x), dyb = toBf(dy);
  Shifted X(xb.size() * 2, shift, 2), DY(dyb.size() * 2, shift, 2),
      Y(N * hd * 2, shift, 2), DX(N * xs * 2, shift, 2);
  Dev R(N * H * 4);
  X.up(xb);
  DY.up(dyb);
  GdnL2NormArgs a;
  a.dtype = DType::BF16;
  a.tokens = N;
  a.heads = H;
  a.dim = d;
  a.xStride = xs == hd ? 0 : xs;
  a.x = X.p();
  a.y = Y.p();
  a.rstd = R.p;
  a.dy = DY.p();
  a.dx = DX.p();
  KernelContext ctx = gpuCtx(nullptr, 0);
  L2Out first;
  for (int run = 0; run < 2; ++run) {
    Y.poison();
    R.poison();
    DX.poison();
    EXPECT_EQ(gdnL2NormForward(ctx, a), Status::Ok);
    EXPECT_EQ(gdnL2NormBackward(ctx, a), Status::Ok);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    L2Out o{Y.raw(N * hd * 2), R.raw(), DX.raw(N * xs * 2)};
    if (run == 0) {
      first = o;
      continue;
    }
    EXPECT_TRUE(o.y == first.y && o.rstd == first.rstd && o.dx == first.dx)
        << "l2 norm not deterministic";
  }
  Vec gy = Y.bf(N * hd);
  Vec ry(gy.size()), rr(N * H), rdx(N * xs, 0.0);
  GdnL2NormArgs r = a;
  r.dtype = DType::F64;
  r.x = x.data();
  r.y = ry.data();
  r.rstd = rr.data();
  EXPECT_EQ(gdnL2NormForward(KernelContext{}, r), Status::Ok);
  // Backward reference from the GPU's own saved y (bf16) and rstd.
  Vec ry2 = gy, rr2 = R.f32();
  r.y = ry2.data();
  r.rstd = rr2.data();
  r.dy = dy.data();
  r.dx = rdx.data();
  EXPECT_EQ(gdnL2NormBackward(KernelContext{}, r), Status::Ok);
  EXPECT_LT(relErr(gy, ry), 1e-2);
  EXPECT_LT(relErr(R.f32(), rr), 1e-5);
  Vec gdx = DX.bf(N * xs), gdxRows, rdxRows;
  long outside = 0; // the rest of a wider row must keep its poison
  for (long n = 0; n < N; ++n)
    for (long i = 0; i < xs; ++i) {
      if (i < hd) {
        gdxRows.push_back(gdx[n * xs + i]);
        rdxRows.push_back(rdx[n * xs + i]);
      } else {
        outside += !std::isnan(gdx[n * xs + i]);
      }
    }
  EXPECT_EQ(outside, 0) << "dx written outside its view";
  EXPECT_LT(relErr(gdxRows, rdxRows), 1e-2);
  return first;
}

TEST_F(GdnCuda, L2NormForwardBackward) {
  checkL2(3000, 4, 128, 3 * 4 * 128, 0);
}

TEST_F(GdnCuda, L2NormQwenShapes) {
  // q and k of the GDN layers: 4096 tokens, 16 heads of 128, dense.
  checkL2(4096, 16, 128, 16 * 128, 0);
}

TEST_F(GdnCuda, L2NormOddShapes) {
  checkL2(333, 3, 100, 3 * 100, 0);   // d not a multiple of 8
  checkL2(257, 5, 24, 5 * 24 + 8, 0); // four rows per lane group set
  checkL2(101, 2, 1056, 2 * 1056, 0); // wider than the register rows
}

TEST_F(GdnCuda, L2NormAlignedAndElementwiseAccessBitwiseEqual) {
  L2Out v = checkL2(1001, 16, 128, 3 * 16 * 128, 0);
  L2Out e = checkL2(1001, 16, 128, 3 * 16 * 128, 1);
  EXPECT_TRUE(v.y == e.y && v.rstd == e.rstd && v.dx == e.dx);
}

/// Raw outputs of one gated norm forward + backward run.
struct GatedOut {
  std::vector<unsigned char> y, rstd, dx, dz, dw;
};

/// Gated RMSNorm at N tokens, H heads of d, buffers `shift` elements off
/// alignment: against the float64 reference, then a second run (dw back at
/// its initial value) bitwise equal.
GatedOut checkGated(long N, int H, int d, size_t shift) {
  SCOPED_TRACE(::testing::Message() << "gated norm N=" << N << " H=" << H
                                    << " d=" << d << " shift=" << shift);
  const size_t n = size_t(N) * H * d;
  Vec x = randn(n, 1), z = randn(n, 2, 2.0), w = randn(d, 3), dy = randn(n, 4);
  auto xb = toBf(x), zb = toBf(z), wb = toBf(w), dyb = toBf(dy);
  Shifted X(n * 2, shift, 2), Z(n * 2, shift, 2), W(d * 2, shift, 2),
      DY(n * 2, shift, 2), Y(n * 2, shift, 2), DX(n * 2, shift, 2),
      DZ(n * 2, shift, 2);
  X.up(xb);
  Z.up(zb);
  W.up(wb);
  DY.up(dyb);
  Dev R(N * H * 4);
  std::vector<float> dw0(d);
  for (int i = 0; i < d; ++i)
    dw0[i] = 0.25f * float(i % 7) - 0.5f; // accumulate onto non-zero values
  Dev DW(dw0);
  GdnGatedNormArgs a;
  a.dtype = DType::BF16;
  a.tokens = N;
  a.heads = H;
  a.dim = d;
  a.x = X.p();
  a.z = Z.p();
  a.w = W.p();
  a.y = Y.p();
  a.rstd = R.p;
  a.dy = DY.p();
  a.dx = DX.p();
  a.dz = DZ.p();
  a.dw = DW.p;
  size_t wsb = gdnGatedNormBackwardWorkspaceBytes(a);
  Dev ws(wsb);
  KernelContext ctx = gpuCtx(ws.p, wsb);
  GatedOut first;
  for (int run = 0; run < 2; ++run) {
    for (Shifted *p : {&Y, &DX, &DZ})
      p->poison();
    R.poison();
    ws.poison();
    cudaMemcpy(DW.p, dw0.data(), DW.bytes, cudaMemcpyHostToDevice);
    EXPECT_EQ(gdnGatedNormForward(ctx, a), Status::Ok);
    EXPECT_EQ(gdnGatedNormBackward(ctx, a), Status::Ok);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    GatedOut o{Y.raw(n * 2), R.raw(), DX.raw(n * 2), DZ.raw(n * 2), DW.raw()};
    if (run == 0) {
      first = o;
      continue;
    }
    EXPECT_TRUE(o.y == first.y && o.rstd == first.rstd && o.dx == first.dx &&
                o.dz == first.dz && o.dw == first.dw)
        << "gated norm not deterministic";
  }
  {
    // train-fuse-recompute: a backward alone, with y set, writes the
    // forward's bytes there (from the saved rstd), and dx, dz, dw as before.
    for (Shifted *p : {&Y, &DX, &DZ})
      p->poison();
    cudaMemcpy(DW.p, dw0.data(), DW.bytes, cudaMemcpyHostToDevice);
    EXPECT_EQ(gdnGatedNormBackward(ctx, a), Status::Ok);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(Y.raw(n * 2) == first.y) << "rebuilt y";
    EXPECT_TRUE(DX.raw(n * 2) == first.dx && DZ.raw(n * 2) == first.dz &&
                DW.raw() == first.dw)
        << "dx, dz, dw with y";
  }
  Vec ry(n), rr(N * H), rdx(n), rdz(n), rdw(d, 0.0);
  GdnGatedNormArgs r = a;
  r.dtype = DType::F64;
  r.x = x.data();
  r.z = z.data();
  r.w = w.data();
  r.y = ry.data();
  r.rstd = rr.data();
  r.dy = dy.data();
  r.dx = rdx.data();
  r.dz = rdz.data();
  r.dw = rdw.data();
  EXPECT_EQ(gdnGatedNormForward(KernelContext{}, r), Status::Ok);
  EXPECT_EQ(gdnGatedNormBackward(KernelContext{}, r), Status::Ok);
  EXPECT_LT(relErr(Y.bf(n), ry), 1e-2);
  EXPECT_LT(relErr(R.f32(), rr), 1e-5);
  EXPECT_LT(relErr(DX.bf(n), rdx), 1e-2);
  EXPECT_LT(relErr(DZ.bf(n), rdz), 1e-2);
  Vec gdw = DW.f32();
  for (int i = 0; i < d; ++i)
    gdw[i] -= dw0[i];
  EXPECT_LT(relErr(gdw, rdw), 1e-4);
  return first;
}

TEST_F(GdnCuda, GatedNormForwardBackward) { checkGated(4000, 16, 128, 0); }

TEST_F(GdnCuda, GatedNormQwenShape) { checkGated(4096, 16, 128, 0); }

TEST_F(GdnCuda, GatedNormOddShapes) {
  checkGated(1001, 3, 72, 0); // rows not a multiple of a block's rows
  checkGated(513, 2, 100, 0); // d not a multiple of 8
  checkGated(77, 1, 1024, 0); // four vectors per lane
  checkGated(40, 3, 1200, 0); // wider than the register rows
}

TEST_F(GdnCuda, GatedNormAlignedAndElementwiseAccessBitwiseEqual) {
  GatedOut v = checkGated(1500, 16, 128, 0);
  GatedOut e = checkGated(1500, 16, 128, 1);
  EXPECT_TRUE(v.y == e.y && v.rstd == e.rstd && v.dx == e.dx && v.dz == e.dz &&
              v.dw == e.dw);
}

//===----------------------------------------------------------------------===//
// Long sequences: Qwen3.5-0.8B's GDN layer at 32768 and 131072 tokens
//===----------------------------------------------------------------------===//
//
// Run alone with --gtest_filter='*Long*'. Each kernel runs on the whole long
// shape (B = 1, the model's heads and widths) from poisoned outputs and a
// poisoned workspace between guard bands: every output element must be
// finite, the guard bands untouched (the kernel used no more than its
// workspace query), and a second run must give the same bits. The float64
// reference then checks slices, with the bounds of the tests above.

using ap::test::bfAt;
using ap::test::ErrAcc;
using ap::test::f32At;
using ap::test::fastUniform;
using ap::test::GuardedWorkspace;
using ap::test::nonFiniteBf16;
using ap::test::nonFiniteF32;
using ap::test::parallelFor;

/// The chunked rule at B = 1, T tokens, Hk = Hv = 16, dk = dv = 128 (the
/// Qwen3.5-0.8B GDN layer). The recurrence runs through every chunk, so a
/// float64 reference over the whole sequence would take minutes; instead the
/// first and the last P = 128 tokens of every head are checked exactly, with
/// the boundary states from GPU runs over the rest:
///   - last P tokens: the GPU forward over tokens [0, T - P) gives the state
///     at T - P; the reference over [T - P, T) from it (and dFinalState)
///     gives o, the final state and every gradient of those tokens;
///   - first P tokens: the reference forward over [0, P) gives the state at
///     P; a GPU forward + backward over [P, T) from it gives its gradient
///     dS_P (dInitialState); the reference backward over [0, P) with
///     dFinalState = dS_P gives the gradients of those tokens and of the
///     initial state.
/// Both edges sit where index arithmetic is at its extremes (offsets 0 and
/// the largest: a 32-bit wrap lands in the last chunks). The sub-runs start
/// at a chunk boundary (P % 64 == 0), so their chunks are the full run's.
void checkChunkLong(int T, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "T=" << T);
  constexpr int H = 16, D = 128, P = 128;
  const size_t N = size_t(T), S = size_t(D) * D;
  // Inputs: q, k rows of norm 1 (the kernel sees L2-normalised q, k),
  // rounded to bf16; the reference reads the same bf16 values.
  auto q = fastUniform<bf16>(N * H * D, seed + 1, -1, 1),
       k = fastUniform<bf16>(N * H * D, seed + 2, -1, 1);
  parallelFor(N * H, [&](size_t r) {
    for (auto *x : {&q, &k}) {
      double ss = 0;
      for (int i = 0; i < D; ++i)
        ss += std::pow(double(toFloat((*x)[r * D + i])), 2);
      for (int i = 0; i < D; ++i)
        (*x)[r * D + i] = bf16(float(toFloat((*x)[r * D + i]) / std::sqrt(ss)));
    }
  });
  auto v = fastUniform<bf16>(N * H * D, seed + 3, -1.7, 1.7),
       dO = fastUniform<bf16>(N * H * D, seed + 4, -1.7, 1.7);
  auto g = fastUniform<float>(N * H, seed + 5, -0.3, -0.005),
       beta = fastUniform<float>(N * H, seed + 6, 0.05, 0.95),
       h0 = fastUniform<float>(H * S, seed + 7, -0.3, 0.3),
       dF = fastUniform<float>(H * S, seed + 8, -0.3, 0.3);
  Dev dq_(q), dk_(k), dv_(v), dg_(g), db_(beta), dh0(h0), ddO(dO), ddF(dF);
  Dev o(N * H * D * 2), fin(H * S * 4), gc(N * H * 4), tm(N * H * 64 * 2),
      gq(N * H * D * 2), gk(N * H * D * 2), gv(N * H * D * 2), gg(N * H * 4),
      gb(N * H * 4), gh0(H * S * 4), aux(H * S * 4), auxIn(H * S * 4);
  for (Dev *d : {&dq_, &dk_, &dv_, &dg_, &db_, &dh0, &ddO, &ddF, &o,   &fin,
                 &gc,  &tm,  &gq,  &gk,  &gv,  &gg,  &gb,  &gh0, &aux, &auxIn})
    ASSERT_NE(d->p, nullptr) << "cudaMalloc";
  GdnChunkArgs a = chunkArgs(
      DType::BF16, {1, T, H, H, D, D}, float(1.0 / std::sqrt(double(D))),
      {dq_.p, dk_.p, dv_.p, dg_.p, db_.p, dh0.p, ddO.p, ddF.p},
      {o.p, fin.p, gc.p, tm.p, gq.p, gk.p, gv.p, gg.p, gb.p, gh0.p});
  const size_t wsBytes = std::max(gdnChunkForwardWorkspaceBytes(a),
                                  gdnChunkBackwardWorkspaceBytes(a));
  std::printf("[gdn chunk long] T=%d workspace %.2f GB\n", T, wsBytes / 1e9);
  GuardedWorkspace ws(wsBytes);
  ASSERT_NE(ws.p(), nullptr) << "cudaMalloc of " << wsBytes << " bytes";
  KernelContext ctx = gpuCtx(ws.p(), wsBytes);

  // The full run, twice: finite everywhere, guards intact, same bits.
  Dev *outs[] = {&o, &fin, &gq, &gk, &gv, &gg, &gb, &gh0};
  const char *names[] = {"o",  "finalState", "dq",    "dk",
                         "dv", "dg",         "dbeta", "dInitialState"};
  const bool isBf[] = {true, false, true, true, true, false, false, false};
  std::vector<std::vector<unsigned char>> res;
  for (int run = 0; run < 2; ++run) {
    for (Dev *d : outs)
      d->poison();
    gc.poison();
    tm.poison();
    ws.poison();
    ASSERT_EQ(gdnChunkForward(ctx, a), Status::Ok);
    ASSERT_EQ(gdnChunkBackward(ctx, a), Status::Ok);
    CK(cudaDeviceSynchronize());
    EXPECT_TRUE(ws.intact())
        << "wrote outside its " << wsBytes << "-byte workspace";
    for (size_t i = 0; i < std::size(outs); ++i) {
      auto r = outs[i]->raw();
      if (run == 0) {
        const size_t n = r.size() / (isBf[i] ? 2 : 4);
        const size_t bad =
            isBf[i] ? nonFiniteBf16(r.data(), n) : nonFiniteF32(r.data(), n);
        EXPECT_EQ(bad, 0u) << names[i] << ": " << bad << " of " << n
                           << " elements not finite";
        res.push_back(std::move(r));
      } else {
        EXPECT_TRUE(r == res[i]) << names[i] << " differs between runs";
      }
    }
  }
  const auto &ro = res[0], &rfin = res[1], &rdq = res[2], &rdk = res[3],
             &rdv = res[4], &rdg = res[5], &rdb = res[6], &rdh0 = res[7];

  // One head's tokens [t0, t0 + L) as a one-head float64 problem.
  struct Slice {
    Vec q, k, v, g, beta, dO, init, dFin;
    Vec o, fin, gCum, tMat, dq, dk, dv, dg, db, dInit;
    GdnChunkArgs r;
  };
  auto makeSlice = [&](int h, size_t t0, size_t L, Slice &s) {
    auto rows = [&](const std::vector<bf16> &x, Vec &out) {
      out.resize(L * D);
      for (size_t t = 0; t < L; ++t)
        for (int i = 0; i < D; ++i)
          out[t * D + i] = toFloat(x[((t0 + t) * H + h) * D + i]);
    };
    rows(q, s.q);
    rows(k, s.k);
    rows(v, s.v);
    rows(dO, s.dO);
    s.g.resize(L);
    s.beta.resize(L);
    for (size_t t = 0; t < L; ++t) {
      s.g[t] = g[(t0 + t) * H + h];
      s.beta[t] = beta[(t0 + t) * H + h];
    }
    for (Vec *x : {&s.o, &s.dq, &s.dk, &s.dv})
      x->assign(L * D, 0.0);
    for (Vec *x : {&s.gCum, &s.dg, &s.db})
      x->assign(L, 0.0);
    s.tMat.assign(L * 64, 0.0);
    for (Vec *x : {&s.fin, &s.dInit})
      x->assign(S, 0.0);
    s.r = chunkArgs(DType::F64, {1, int(L), 1, 1, D, D}, a.scale,
                    {s.q.data(), s.k.data(), s.v.data(), s.g.data(),
                     s.beta.data(), s.init.data(), s.dO.data(), s.dFin.data()},
                    {s.o.data(), s.fin.data(), s.gCum.data(), s.tMat.data(),
                     s.dq.data(), s.dk.data(), s.dv.data(), s.dg.data(),
                     s.db.data(), s.dInit.data()});
  };
  auto stateOf = [&](const std::vector<float> &all, int h) {
    return Vec(all.begin() + size_t(h) * S, all.begin() + size_t(h + 1) * S);
  };
  auto f32Vec = [&](const Dev &d) {
    std::vector<float> r(d.bytes / 4);
    cudaMemcpy(r.data(), d.p, d.bytes, cudaMemcpyDeviceToHost);
    return r;
  };

  // State at T - P: GPU forward over [0, T - P) (outputs land in the full
  // run's buffers, already read back).
  GdnChunkArgs pre = a;
  pre.seqLen = T - P;
  pre.finalState = aux.p;
  aux.poison();
  ASSERT_EQ(gdnChunkForward(ctx, pre), Status::Ok);
  CK(cudaDeviceSynchronize());
  const std::vector<float> stateEnd = f32Vec(aux);
  EXPECT_EQ(nonFiniteF32(stateEnd.data(), stateEnd.size()), 0u);

  // The first P tokens' forward on the host gives the state at P.
  std::vector<Slice> first(H), last(H);
  std::vector<int> ok(2 * H, 1);
  parallelFor(H, [&](size_t h) {
    Slice &s = first[h];
    s.init = stateOf(h0, int(h));
    s.dFin.assign(S, 0.0);
    makeSlice(int(h), 0, P, s);
    ok[h] = gdnChunkForward(KernelContext{}, s.r) == Status::Ok;
  });
  std::vector<float> stateP(H * S);
  for (int h = 0; h < H; ++h)
    for (size_t i = 0; i < S; ++i)
      stateP[h * S + i] = float(first[h].fin[i]);
  // Its gradient dS_P: GPU forward + backward over [P, T) from it.
  CK(cudaMemcpy(auxIn.p, stateP.data(), auxIn.bytes, cudaMemcpyHostToDevice));
  GdnChunkArgs suf = a;
  suf.seqLen = T - P;
  const size_t tokOff = size_t(P) * H;
  suf.q = static_cast<const bf16 *>(a.q) + tokOff * D;
  suf.k = static_cast<const bf16 *>(a.k) + tokOff * D;
  suf.v = static_cast<const bf16 *>(a.v) + tokOff * D;
  suf.dO = static_cast<const bf16 *>(a.dO) + tokOff * D;
  suf.g = static_cast<const float *>(a.g) + tokOff;
  suf.beta = static_cast<const float *>(a.beta) + tokOff;
  suf.initialState = auxIn.p;
  suf.finalState = nullptr;
  suf.dInitialState = aux.p;
  aux.poison();
  ASSERT_EQ(gdnChunkForward(ctx, suf), Status::Ok);
  ASSERT_EQ(gdnChunkBackward(ctx, suf), Status::Ok);
  CK(cudaDeviceSynchronize());
  EXPECT_TRUE(ws.intact());
  const std::vector<float> dStateP = f32Vec(aux);
  EXPECT_EQ(nonFiniteF32(dStateP.data(), dStateP.size()), 0u);

  // Reference backward of the first P tokens, and forward + backward of the
  // last P tokens, per head.
  parallelFor(2 * H, [&](size_t i) {
    const int h = int(i % H);
    if (i < size_t(H)) {
      Slice &s = first[h];
      s.dFin = stateOf(dStateP, h);
      s.r.dFinalState = s.dFin.data();
      ok[i] = ok[i] && gdnChunkBackward(KernelContext{}, s.r) == Status::Ok;
      return;
    }
    Slice &s = last[h];
    s.init = stateOf(stateEnd, h);
    s.dFin = stateOf(dF, h);
    makeSlice(h, N - P, P, s);
    ok[i] = gdnChunkForward(KernelContext{}, s.r) == Status::Ok &&
            gdnChunkBackward(KernelContext{}, s.r) == Status::Ok;
  });
  for (size_t i = 0; i < ok.size(); ++i)
    ASSERT_TRUE(ok[i]) << "reference failed on slice " << i;

  // Per tensor, over both edges of every head: max |err| / max |ref| within
  // a slice, the worst slice reported.
  enum { kO, kFin, kDq, kDk, kDv, kDg, kDb, kDh0, kNum };
  const char *errNames[kNum] = {"o",  "final", "dq",    "dk",
                                "dv", "dg",    "dbeta", "dh0"};
  double worst[kNum] = {};
  for (int edge = 0; edge < 2; ++edge)
    for (int h = 0; h < H; ++h) {
      const Slice &s = edge ? last[h] : first[h];
      const size_t t0 = edge ? N - P : 0;
      ErrAcc e[kNum];
      for (size_t t = 0; t < size_t(P); ++t) {
        for (int c = 0; c < D; ++c) {
          const size_t gi = ((t0 + t) * H + h) * D + c, li = t * D + c;
          e[kO].add(bfAt(ro, gi), s.o[li]);
          e[kDq].add(bfAt(rdq, gi), s.dq[li]);
          e[kDk].add(bfAt(rdk, gi), s.dk[li]);
          e[kDv].add(bfAt(rdv, gi), s.dv[li]);
        }
        e[kDg].add(f32At(rdg, (t0 + t) * H + h), s.dg[t]);
        e[kDb].add(f32At(rdb, (t0 + t) * H + h), s.db[t]);
      }
      for (size_t i = 0; i < S; ++i) {
        if (edge)
          e[kFin].add(f32At(rfin, h * S + i), s.fin[i]);
        else
          e[kDh0].add(f32At(rdh0, h * S + i), s.dInit[i]);
      }
      for (int t = 0; t < kNum; ++t)
        if (e[t].count)
          worst[t] = std::max(worst[t], e[t].rel());
    }
  std::printf("[gdn chunk long] T=%d worst rel err over the first and last "
              "%d tokens of %d heads:",
              T, P, H);
  for (int t = 0; t < kNum; ++t) {
    std::printf(" %s %.2e", errNames[t], worst[t]);
    EXPECT_LT(worst[t], (t == kO || t == kFin) ? 2e-2 : 4e-2) << errNames[t];
  }
  std::printf("\n");
}

TEST_F(GdnCuda, LongT32768ChunkQwenHeads) { checkChunkLong(32768, 100); }
TEST_F(GdnCuda, LongT131072ChunkQwenHeads) { checkChunkLong(131072, 200); }

/// The short conv at the Qwen3.5 GDN layer's conv width (q, k, v: 6144
/// channels, kernel 4) over 131072 tokens, both conv paths: every output
/// finite, the guards intact, and channel slices against the float64
/// reference over the whole sequence (channels are independent, so a slice
/// is a narrower conv with every token: y, dx and the dw of its channels).
TEST_F(GdnCuda, LongT131072ConvChannelSlices) {
  constexpr int T = 131072, C = 6144, K = 4, kSlice = 64;
  const size_t n = size_t(T) * C;
  auto x = fastUniform<bf16>(n, 301, -2, 2),
       dy = fastUniform<bf16>(n, 302, -2, 2),
       w = fastUniform<bf16>(size_t(C) * K, 303, -0.8, 0.8);
  std::vector<float> dw0(size_t(C) * K, 0.25f);
  Dev X(x), DY(dy), W(w), Y(n * 2), DX(n * 2), DW(dw0);
  for (Dev *d : {&X, &DY, &W, &Y, &DX, &DW})
    ASSERT_NE(d->p, nullptr) << "cudaMalloc";
  GdnConvArgs a = ConvCase::args(1, T, C, K);
  a.x = X.p;
  a.w = W.p;
  a.y = Y.p;
  a.dy = DY.p;
  a.dx = DX.p;
  a.dw = DW.p;
  const size_t wsBytes = gdnConvBackwardWorkspaceBytes(a);
  GuardedWorkspace ws(wsBytes);
  ASSERT_NE(ws.p(), nullptr);
  KernelContext ctx = gpuCtx(ws.p(), wsBytes);
  // Slices: the first, a middle and the last 64 channels (q, k, v).
  const int starts[] = {0, 2048 + 1000, C - kSlice};
  forEachConvPath(a, [&] {
    Y.poison();
    DX.poison();
    ws.poison();
    CK(cudaMemcpy(DW.p, dw0.data(), DW.bytes, cudaMemcpyHostToDevice));
    ASSERT_EQ(gdnConvForward(ctx, a), Status::Ok);
    ASSERT_EQ(gdnConvBackward(ctx, a), Status::Ok);
    CK(cudaDeviceSynchronize());
    EXPECT_TRUE(ws.intact())
        << "wrote outside its " << wsBytes << "-byte workspace";
    auto ry = Y.raw(), rdx = DX.raw();
    auto rdw = DW.raw();
    EXPECT_EQ(nonFiniteBf16(ry.data(), n), 0u) << "y";
    EXPECT_EQ(nonFiniteBf16(rdx.data(), n), 0u) << "dx";
    EXPECT_EQ(nonFiniteF32(rdw.data(), dw0.size()), 0u) << "dw";
    ErrAcc ey[3], edx[3], edw[3];
    parallelFor(3, [&](size_t si) {
      const int c0 = starts[si];
      Vec sx(size_t(T) * kSlice), sdy(sx.size()), sw(size_t(kSlice) * K),
          sdw(sw.size()), oy, odx;
      for (size_t t = 0; t < size_t(T); ++t)
        for (int c = 0; c < kSlice; ++c) {
          sx[t * kSlice + c] = toFloat(x[t * C + c0 + c]);
          sdy[t * kSlice + c] = toFloat(dy[t * C + c0 + c]);
        }
      for (int c = 0; c < kSlice; ++c)
        for (int j = 0; j < K; ++j) {
          sw[c * K + j] = toFloat(w[(c0 + c) * K + j]);
          sdw[c * K + j] = dw0[(c0 + c) * K + j];
        }
      ap::test::convReferenceF64(1, T, kSlice, K, sx, sw, sdy, oy, odx, sdw);
      for (size_t t = 0; t < size_t(T); ++t)
        for (int c = 0; c < kSlice; ++c) {
          ey[si].add(bfAt(ry, t * C + c0 + c), oy[t * kSlice + c]);
          edx[si].add(bfAt(rdx, t * C + c0 + c), odx[t * kSlice + c]);
        }
      for (int i = 0; i < kSlice * K; ++i)
        edw[si].add(f32At(rdw, size_t(c0) * K + i), sdw[i]);
    });
    for (int si = 0; si < 3; ++si) {
      SCOPED_TRACE(testing::Message() << "channels from " << starts[si]);
      EXPECT_LT(ey[si].rel(), 1e-2);
      EXPECT_LT(edx[si].rel(), 1e-2);
      EXPECT_LT(edw[si].rel(), 1e-4); // fp32 sums of exact bf16 products
    }
  });
}

/// The gated RMSNorm of the GDN output (16 heads of 128) over 131072
/// tokens, 2M rows: every output finite, the guards intact, two runs the
/// same bits, and the float64 reference on every row (blocks of rows on the
/// host threads; dw summed over all of them).
TEST_F(GdnCuda, LongT131072GatedNormAllRows) {
  constexpr int T = 131072, H = 16, d = 128;
  const size_t rows = size_t(T) * H, n = rows * d;
  auto x = fastUniform<bf16>(n, 401, -2, 2),
       z = fastUniform<bf16>(n, 402, -3, 3),
       dy = fastUniform<bf16>(n, 403, -2, 2),
       w = fastUniform<bf16>(d, 404, 0.5, 1.5);
  std::vector<float> dw0(d, 0.5f);
  Dev X(x), Z(z), DY(dy), W(w), Y(n * 2), R(rows * 4), DX(n * 2), DZ(n * 2),
      DW(dw0);
  for (Dev *p : {&X, &Z, &DY, &W, &Y, &R, &DX, &DZ, &DW})
    ASSERT_NE(p->p, nullptr) << "cudaMalloc";
  GdnGatedNormArgs a;
  a.dtype = DType::BF16;
  a.tokens = T;
  a.heads = H;
  a.dim = d;
  a.x = X.p;
  a.z = Z.p;
  a.w = W.p;
  a.y = Y.p;
  a.rstd = R.p;
  a.dy = DY.p;
  a.dx = DX.p;
  a.dz = DZ.p;
  a.dw = DW.p;
  const size_t wsBytes = gdnGatedNormBackwardWorkspaceBytes(a);
  GuardedWorkspace ws(wsBytes);
  ASSERT_NE(ws.p(), nullptr);
  KernelContext ctx = gpuCtx(ws.p(), wsBytes);
  std::vector<std::vector<unsigned char>> first;
  for (int run = 0; run < 2; ++run) {
    for (Dev *p : {&Y, &R, &DX, &DZ})
      p->poison();
    ws.poison();
    CK(cudaMemcpy(DW.p, dw0.data(), DW.bytes, cudaMemcpyHostToDevice));
    ASSERT_EQ(gdnGatedNormForward(ctx, a), Status::Ok);
    ASSERT_EQ(gdnGatedNormBackward(ctx, a), Status::Ok);
    CK(cudaDeviceSynchronize());
    EXPECT_TRUE(ws.intact())
        << "wrote outside its " << wsBytes << "-byte workspace";
    std::vector<std::vector<unsigned char>> cur = {Y.raw(), R.raw(), DX.raw(),
                                                   DZ.raw(), DW.raw()};
    if (run == 0)
      first = std::move(cur);
    else
      for (size_t i = 0; i < cur.size(); ++i)
        EXPECT_TRUE(cur[i] == first[i]) << "output " << i << " differs";
  }
  EXPECT_EQ(nonFiniteBf16(first[0].data(), n), 0u) << "y";
  EXPECT_EQ(nonFiniteF32(first[1].data(), rows), 0u) << "rstd";
  EXPECT_EQ(nonFiniteBf16(first[2].data(), n), 0u) << "dx";
  EXPECT_EQ(nonFiniteBf16(first[3].data(), n), 0u) << "dz";
  // The reference in blocks of 1024 tokens; dw per block, summed in order.
  constexpr size_t kTok = 1024;
  const size_t blocks = T / kTok, per = kTok * H * d;
  std::vector<ErrAcc> ey(blocks), er(blocks), edx(blocks), edz(blocks);
  std::vector<Vec> dwPart(blocks);
  Vec wv(d);
  for (int i = 0; i < d; ++i)
    wv[i] = toFloat(w[i]);
  std::vector<int> ok(blocks, 0);
  parallelFor(blocks, [&](size_t b) {
    const size_t e0 = b * per;
    Vec sx(per), sz(per), sdy(per), oy(per), orr(kTok * H), odx(per), odz(per);
    for (size_t i = 0; i < per; ++i) {
      sx[i] = toFloat(x[e0 + i]);
      sz[i] = toFloat(z[e0 + i]);
      sdy[i] = toFloat(dy[e0 + i]);
    }
    dwPart[b].assign(d, 0.0);
    GdnGatedNormArgs r = a;
    r.dtype = DType::F64;
    r.tokens = kTok;
    r.x = sx.data();
    r.z = sz.data();
    r.w = wv.data();
    r.y = oy.data();
    r.rstd = orr.data();
    r.dy = sdy.data();
    r.dx = odx.data();
    r.dz = odz.data();
    r.dw = dwPart[b].data();
    ok[b] = gdnGatedNormForward(KernelContext{}, r) == Status::Ok &&
            gdnGatedNormBackward(KernelContext{}, r) == Status::Ok;
    for (size_t i = 0; i < per; ++i) {
      ey[b].add(bfAt(first[0], e0 + i), oy[i]);
      edx[b].add(bfAt(first[2], e0 + i), odx[i]);
      edz[b].add(bfAt(first[3], e0 + i), odz[i]);
    }
    for (size_t i = 0; i < kTok * H; ++i)
      er[b].add(f32At(first[1], b * kTok * H + i), orr[i]);
  });
  ErrAcc ty, tr, tdx, tdz, tdw;
  Vec dwRef(d, 0.0);
  for (size_t b = 0; b < blocks; ++b) {
    ASSERT_TRUE(ok[b]) << "reference failed on block " << b;
    ty.merge(ey[b]);
    tr.merge(er[b]);
    tdx.merge(edx[b]);
    tdz.merge(edz[b]);
    for (int i = 0; i < d; ++i)
      dwRef[i] += dwPart[b][i];
  }
  for (int i = 0; i < d; ++i)
    tdw.add(f32At(first[4], i) - dw0[i], dwRef[i]);
  std::printf("[gated norm long] rel err y %.2e rstd %.2e dx %.2e dz %.2e "
              "dw %.2e\n",
              ty.rel(), tr.rel(), tdx.rel(), tdz.rel(), tdw.rel());
  EXPECT_LT(ty.rel(), 1e-2);
  EXPECT_LT(tr.rel(), 1e-5);
  EXPECT_LT(tdx.rel(), 1e-2);
  EXPECT_LT(tdz.rel(), 1e-2);
  EXPECT_LT(tdw.rel(), 1e-4);
}

#else
TEST(GdnCuda, Skipped) { GTEST_SKIP() << "built without CUDA"; }
#endif

} // namespace
