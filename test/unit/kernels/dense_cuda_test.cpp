//===- dense_cuda_test.cpp - dense CUDA kernels vs reference ----*- C++ -*-===//
//
// GPU tests of the dense CUDA kernels at the Qwen3.5-0.8B shapes (D=1024,
// I=3584, V=248320, T=4096): CUDA against the reference kernels (or float64
// math where the reference would take too long on the host) within stated
// bf16 bounds, outputs poisoned before every run, bitwise run-to-run
// determinism. Skipped without a usable GPU.
//
// Bounds (tensor-relative: max |got - ref| / max |ref|):
//  - bf16 outputs of elementwise ops and norms: 8e-3 (one bf16 rounding,
//    2^-8, of values computed in fp32 in a possibly different order);
//  - GEMM outputs in bf16: 8e-3; fp32 weight gradients: 1e-3 (fp32
//    accumulation over up to 4096 bf16 products in another order);
//  - cross-entropy loss and lse: 1e-4 relative; gradients through bf16
//    dlogits: 2e-2.
//  - Embedding, residual add and AdamW are bitwise equal to the reference by
//    construction (same operations in the same order).
//  - A vocabulary split over ranks (threads sharing the device) against the
//    unsplit kernels: loss and lse 1e-5 (the same sums merged in another
//    order); dW 1e-3 (fp32 weight gradient of bf16 dlogits that differ only
//    where the lse's last bits round them differently); dh 2e-2 (the sum of
//    the ranks' bf16-rounded partials); the ranks agree bitwise, and the
//    split embedding sums (forward) and concatenates (backward) to the
//    unsplit bits.
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"
#include "long_shapes.h"
#include "packed_documents.h"
#include "vocab_threads.h"

#include <gtest/gtest.h>

#if defined(ACTPLACE_HAVE_CUDA)
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

using namespace ap::kernels;

namespace {

#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call

bool gpuPresent() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// A device buffer of n elements of T (bytes are all that matter here).
template <class T> struct Dev {
  T *p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)) != cudaSuccess)
      p = nullptr;
  }
  ~Dev() { cudaFree(p); }
  Dev(const Dev &) = delete;
  void up(const std::vector<T> &v) {
    ASSERT_EQ(v.size(), n);
    ASSERT_EQ(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> down() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return v;
  }
  /// Fills with a byte pattern: 0xFF is NaN for bf16 and fp32.
  void poison(int byte = 0xFF) {
    ASSERT_EQ(cudaMemset(p, byte, n * sizeof(T)), cudaSuccess);
  }
};

std::vector<bf16> randBf16(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<bf16> v(n);
  for (auto &x : v)
    x = bf16(d(gen));
  return v;
}
/// Cheap deterministic non-zero fill for large fp32 buffers.
std::vector<float> hashFloats(size_t n, uint32_t seed, float scale) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto &x : v) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    x = scale * (float(s & 0xffffff) / float(0x1000000) - 0.5f);
  }
  return v;
}

template <class T> double val(T v) { return double(toFloat(v)); }

template <class A, class B>
double relErr(const std::vector<A> &got, const std::vector<B> &ref) {
  double mx = 0, mr = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = val(got[i]), r = val(ref[i]);
    if (std::isnan(g) || std::isnan(r))
      return INFINITY;
    mx = std::max(mx, std::fabs(g - r));
    mr = std::max(mr, std::fabs(r));
  }
  return mx / std::max(mr, 1e-30);
}

template <class T>
bool sameBytes(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

class DenseCuda : public ::testing::Test {
protected:
  void SetUp() override {
    if (!gpuPresent())
      GTEST_SKIP() << "no usable CUDA device";
    ASSERT_EQ(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    CK(cudaStreamCreate(&stream));
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    ctx.backend = Backend::Cuda;
    ctx.stream = stream;
    ctx.cublasLt = lt;
    ctx.smCount = sms;
    reserve(linearWorkspaceBytes(Backend::Cuda));
  }
  void TearDown() override {
    if (ws)
      cudaFree(ws);
    if (stream)
      cudaStreamDestroy(stream);
    if (lt)
      cublasLtDestroy(lt);
  }
  void reserve(size_t bytes) {
    if (bytes <= ctx.workspaceBytes)
      return;
    if (ws)
      cudaFree(ws);
    ASSERT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
    ctx.workspace = ws;
    ctx.workspaceBytes = bytes;
  }
  void sync() { ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess); }
  /// AdamW step 7 over the state (p, m, v) on the host with `hostGrad` and
  /// `clip`, then on the device with `devGrad` and `devClip`: bitwise equal
  /// results (masters, moments, bf16 compute copy).
  void expectAdamWBitwise(const std::vector<float> &p,
                          const std::vector<float> &m,
                          const std::vector<float> &v, const void *hostGrad,
                          const void *devGrad, DType gradDType,
                          const float *clip, const float *devClip) {
    const size_t n = p.size();
    std::vector<float> pr = p, mr = m, vr = v;
    std::vector<bf16> copyRef(n);
    AdamWArgs a;
    a.master = pr.data();
    a.expAvg = mr.data();
    a.expAvgSq = vr.data();
    a.grad = hostGrad;
    a.gradDType = gradDType;
    a.clipCoef = clip;
    a.computeCopy = copyRef.data();
    a.n = int64_t(n);
    a.lr = 1e-3;
    a.beta1 = 0.9;
    a.beta2 = 0.95;
    a.eps = 1e-8;
    a.weightDecay = 0.1;
    a.step = 7;
    ASSERT_EQ(adamWStep(host, a), Status::Ok);
    Dev<float> dP(n), dM(n), dV(n);
    Dev<bf16> dCopy(n);
    dP.up(p);
    dM.up(m);
    dV.up(v);
    dCopy.poison();
    a.master = dP.p;
    a.expAvg = dM.p;
    a.expAvgSq = dV.p;
    a.grad = devGrad;
    a.clipCoef = devClip;
    a.computeCopy = dCopy.p;
    ASSERT_EQ(adamWStep(ctx, a), Status::Ok);
    sync();
    EXPECT_TRUE(sameBytes(dP.down(), pr));
    EXPECT_TRUE(sameBytes(dM.down(), mr));
    EXPECT_TRUE(sameBytes(dV.down(), vr));
    EXPECT_TRUE(sameBytes(dCopy.down(), copyRef));
  }

  void rmsNormCase(int64_t rows, int64_t dim, int64_t stride, bool zc);
  void ropeCase(const RopeArgs &a, const std::vector<bf16> &x);
  void embeddingBitwise(const std::vector<int32_t> &ids,
                        const std::vector<bf16> &w, const std::vector<bf16> &dy,
                        const std::vector<float> &dw0, int64_t D);
  void crossEntropyVsReference(LmHeadCrossEntropyArgs a,
                               const std::vector<bf16> &h,
                               const std::vector<bf16> &w,
                               const std::vector<int32_t> &labels);

  cublasLtHandle_t lt = nullptr;
  cudaStream_t stream = nullptr;
  void *ws = nullptr;
  KernelContext ctx;
  KernelContext host;
};

constexpr int64_t kT = 4096, kD = 1024, kI = 3584, kV = 248320;

//===----------------------------------------------------------------------===//
// GEMM
//===----------------------------------------------------------------------===//

TEST_F(DenseCuda, LinearQwenShapesVsFloat64AndDeterministic) {
  for (auto [in, out] : {std::pair<int64_t, int64_t>{kD, kI}, {kI, kD}}) {
    const int64_t M = kT;
    auto x = randBf16(M * in, 1),
         w = randBf16(out * in, 2, 1.f / std::sqrt(float(in))),
         dy = randBf16(M * out, 3);
    auto dw0 = hashFloats(out * in, 4, 0.1f);
    Dev<bf16> dX(M * in), dW(out * in), dY(M * out), dOut(M * out), dDx(M * in);
    Dev<float> dDw(out * in);
    dX.up(x);
    dW.up(w);
    dY.up(dy);
    std::vector<bf16> y1, dx1;
    std::vector<float> dw1;
    for (int run = 0; run < 2; ++run) {
      dOut.poison(run ? 0x7F : 0xFF);
      dDx.poison(run ? 0x7F : 0xFF);
      dDw.up(dw0);
      ASSERT_EQ(
          linearForward(ctx, {DType::BF16, dX.p, dW.p, dOut.p, M, in, out}),
          Status::Ok);
      ASSERT_EQ(linearBackward(ctx, {DType::BF16, dX.p, dW.p, dY.p, dDx.p,
                                     dDw.p, M, in, out}),
                Status::Ok);
      sync();
      auto y = dOut.down(), dx = dDx.down();
      auto dw = dDw.down();
      if (run == 0) {
        y1 = y;
        dx1 = dx;
        dw1 = dw;
        continue;
      }
      EXPECT_TRUE(sameBytes(y, y1)) << "forward not deterministic";
      EXPECT_TRUE(sameBytes(dx, dx1)) << "dx not deterministic";
      EXPECT_TRUE(sameBytes(dw, dw1)) << "dw not deterministic";
    }
    // float64 on every 64th row (forward, dx) and every 64th weight row (dw).
    std::vector<double> yr, yg, dxr, dxg, dwr, dwg;
    for (int64_t i = 0; i < M; i += 64) {
      for (int64_t j = 0; j < out; ++j) {
        double s = 0;
        for (int64_t k = 0; k < in; ++k)
          s += val(x[i * in + k]) * val(w[j * in + k]);
        yr.push_back(s);
        yg.push_back(val(y1[i * out + j]));
      }
      std::vector<double> acc(in, 0.0);
      for (int64_t j = 0; j < out; ++j) {
        double g = val(dy[i * out + j]);
        for (int64_t k = 0; k < in; ++k)
          acc[k] += g * val(w[j * in + k]);
      }
      for (int64_t k = 0; k < in; ++k) {
        dxr.push_back(acc[k]);
        dxg.push_back(val(dx1[i * in + k]));
      }
    }
    for (int64_t j = 0; j < out; j += 64) {
      std::vector<double> acc(in, 0.0);
      for (int64_t i = 0; i < M; ++i) {
        double g = val(dy[i * out + j]);
        for (int64_t k = 0; k < in; ++k)
          acc[k] += g * val(x[i * in + k]);
      }
      for (int64_t k = 0; k < in; ++k) {
        dwr.push_back(acc[k]);
        dwg.push_back(double(dw1[j * in + k]) - double(dw0[j * in + k]));
      }
    }
    EXPECT_LT(relErr(yg, yr), 8e-3) << in << "->" << out;
    EXPECT_LT(relErr(dxg, dxr), 8e-3) << in << "->" << out;
    EXPECT_LT(relErr(dwg, dwr), 1e-3) << in << "->" << out;
  }
}

// The side stream's SM target narrows the GEMM's grid, not its algorithm:
// forward and both gradients are the same bits with and without it.
TEST_F(DenseCuda, LinearSmTargetKeepsTheBits) {
  if (ctx.smCount < 101)
    GTEST_SKIP() << "needs more than 100 SMs (" << ctx.smCount << ")";
  const int64_t M = kT, in = kD, out = kI;
  auto x = randBf16(M * in, 11),
       w = randBf16(out * in, 12, 1.f / std::sqrt(float(in))),
       dy = randBf16(M * out, 13);
  auto dw0 = hashFloats(out * in, 14, 0.1f);
  Dev<bf16> dX(M * in), dW(out * in), dY(M * out), dOut(M * out), dDx(M * in);
  Dev<float> dDw(out * in);
  dX.up(x);
  dW.up(w);
  dY.up(dy);
  std::vector<bf16> y0, dx0;
  std::vector<float> dw0Out;
  // 0 first (the reference); then the default side target (75 % of 132
  // SMs) and the other side-stream SM targets the benchmarks tried.
  for (int32_t target : {0, 99, 110, 80, 66, 33}) {
    KernelContext c = ctx;
    c.smTarget = target;
    dOut.poison(target ? 0x7F : 0xFF);
    dDx.poison(target ? 0x7F : 0xFF);
    dDw.up(dw0);
    ASSERT_EQ(linearForward(c, {DType::BF16, dX.p, dW.p, dOut.p, M, in, out}),
              Status::Ok);
    ASSERT_EQ(linearBackward(
                  c, {DType::BF16, dX.p, dW.p, dY.p, dDx.p, dDw.p, M, in, out}),
              Status::Ok);
    sync();
    if (target == 0) {
      y0 = dOut.down();
      dx0 = dDx.down();
      dw0Out = dDw.down();
      continue;
    }
    EXPECT_TRUE(sameBytes(dOut.down(), y0)) << "forward changed by smTarget";
    EXPECT_TRUE(sameBytes(dDx.down(), dx0)) << "dx changed by smTarget";
    EXPECT_TRUE(sameBytes(dDw.down(), dw0Out)) << "dw changed by smTarget";
  }
}

//===----------------------------------------------------------------------===//
// RMSNorm
//===----------------------------------------------------------------------===//

/// RMSNorm forward and backward over `rows` rows of `dim` (row stride
/// `stride`, 0: dense; zc: zero-centred weight) against the host reference,
/// twice (bitwise equal), and the backward that rebuilds y.
void DenseCuda::rmsNormCase(int64_t rows, int64_t dim, int64_t stride,
                            bool zc) {
  SCOPED_TRACE(::testing::Message()
               << "rows " << rows << " dim " << dim << " stride " << stride);
  const int64_t xs = stride ? stride : dim;
  auto x = randBf16(rows * xs, 10, 2.f), w = randBf16(dim, 11, 0.5f),
       dy = randBf16(rows * xs, 12);
  auto dw0 = hashFloats(dim, 13, 1.f);
  // Host reference.
  std::vector<bf16> yRef(rows * dim), dxRef(rows * xs, bf16(7.f));
  std::vector<float> rsRef(rows), dwRef = dw0;
  RmsNormForwardArgs f{DType::BF16, x.data(),     w.data(),
                       yRef.data(), rsRef.data(), rows,
                       dim,         xs,           0};
  f.zeroCentered = zc;
  ASSERT_EQ(rmsNormForward(host, f), Status::Ok);
  RmsNormBackwardArgs b{DType::BF16, x.data(),     w.data(),     rsRef.data(),
                        dy.data(),   dxRef.data(), dwRef.data(), rows,
                        dim,         xs,           xs,           xs};
  b.zeroCentered = zc;
  ASSERT_EQ(rmsNormBackward(host, b), Status::Ok);

  Dev<bf16> dX(x.size()), dWt(w.size()), dY(rows * dim), dDy(dy.size()),
      dDx(rows * xs);
  Dev<float> dRs(rows), dDw(dim);
  dX.up(x);
  dWt.up(w);
  dDy.up(dy);
  reserve(rmsNormBackwardWorkspaceBytes(Backend::Cuda, b));
  std::vector<bf16> y1, dx1;
  std::vector<float> rs1, dw1;
  for (int run = 0; run < 2; ++run) {
    dY.poison(run ? 0x7F : 0xFF);
    dRs.poison(run ? 0x7F : 0xFF);
    // Same poison both runs: outside a strided view it must survive, and
    // the bytes there take part in the determinism comparison.
    dDx.poison(0xFF);
    dDw.up(dw0);
    RmsNormForwardArgs fg = f;
    fg.x = dX.p;
    fg.w = dWt.p;
    fg.y = dY.p;
    fg.rstd = dRs.p;
    ASSERT_EQ(rmsNormForward(ctx, fg), Status::Ok);
    RmsNormBackwardArgs bg = b;
    bg.x = dX.p;
    bg.w = dWt.p;
    bg.rstd = dRs.p;
    bg.dy = dDy.p;
    bg.dx = dDx.p;
    bg.dw = dDw.p;
    ASSERT_EQ(rmsNormBackward(ctx, bg), Status::Ok);
    sync();
    auto y = dY.down(), dx = dDx.down();
    auto rs = dRs.down(), dw = dDw.down();
    if (run == 1) {
      EXPECT_TRUE(sameBytes(y, y1) && sameBytes(dx, dx1) &&
                  sameBytes(rs, rs1) && sameBytes(dw, dw1))
          << "rmsnorm not deterministic";
      break;
    }
    y1 = y, dx1 = dx, rs1 = rs, dw1 = dw;
  }
  {
    // train-fuse-recompute: the backward that also writes y (from the
    // saved rstd) writes the forward's bytes, and dx, dw as without y.
    Dev<bf16> dY2(rows * dim), dDx2(rows * xs);
    Dev<float> dDw2(dim);
    dY2.poison(0xFF);
    dDx2.poison(0xFF);
    dDw2.up(dw0);
    RmsNormBackwardArgs bg = b;
    bg.x = dX.p;
    bg.w = dWt.p;
    bg.rstd = dRs.p;
    bg.dy = dDy.p;
    bg.dx = dDx2.p;
    bg.dw = dDw2.p;
    bg.y = dY2.p;
    ASSERT_EQ(rmsNormBackward(ctx, bg), Status::Ok);
    sync();
    EXPECT_TRUE(sameBytes(dY2.down(), y1)) << "rebuilt y";
    EXPECT_TRUE(sameBytes(dDx2.down(), dx1) && sameBytes(dDw2.down(), dw1))
        << "dx, dw with y";
  }
  EXPECT_LT(relErr(y1, yRef), 8e-3);
  EXPECT_LT(relErr(rs1, rsRef), 1e-5);
  // Only the dx view is compared; the other half of a strided row must
  // keep its poison.
  std::vector<bf16> dxView, dxRefView;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < xs; ++j) {
      if (j < dim) {
        dxView.push_back(dx1[r * xs + j]);
        dxRefView.push_back(dxRef[r * xs + j]);
      } else if (dx1[r * xs + j].bits != 0xFFFF) {
        ADD_FAILURE() << "dx written outside its view";
        r = rows;
        break;
      }
    }
  EXPECT_LT(relErr(dxView, dxRefView), 1e-2);
  std::vector<double> dwg(dim), dwr(dim);
  for (int64_t j = 0; j < dim; ++j) {
    dwg[j] = double(dw1[j]) - dw0[j];
    dwr[j] = double(dwRef[j]) - dw0[j];
  }
  EXPECT_LT(relErr(dwg, dwr), 1e-4);
}

TEST_F(DenseCuda, RmsNormModelAndQNormShapes) {
  struct Case {
    int64_t rows, dim, stride;
    bool zc;
  };
  // The model norms (D), q_norm on the gated q_proj output (8 heads of 256
  // in rows of 512), k_norm (2 heads, dense); then odd shapes: rows not a
  // multiple of a block's rows, dims not a multiple of 8, narrow rows that
  // share a warp, rows wider than the register-tiled kernels hold.
  for (Case c : {Case{kT, kD, 0, true}, Case{kT, kD, 0, false},
                 Case{kT * 8, 256, 512, true}, Case{kT * 2, 256, 0, true},
                 Case{kT + 3, kD, 0, true}, Case{777, 100, 0, false},
                 Case{1000, 24, 40, true}, Case{301, 1536, 0, true}}) {
    rmsNormCase(c.rows, c.dim, c.stride, c.zc);
  }
}

/// One RMSNorm forward + backward on device copies placed `shift` elements
/// past a 16-byte boundary (1: the kernels fall back to element accesses);
/// returns y, rstd, dx and dw as raw bytes.
std::vector<std::vector<unsigned char>>
rmsNormRaw(const KernelContext &ctx, int64_t rows, int64_t dim, size_t shift) {
  auto x = randBf16(rows * dim, 14, 2.f), w = randBf16(dim, 15, 0.5f),
       dy = randBf16(rows * dim, 16);
  const size_t n = size_t(rows * dim);
  Dev<bf16> dX(n + 8), dW(dim + 8), dY(n + 8), dDy(n + 8), dDx(n + 8);
  Dev<float> dRs(rows), dDw(dim);
  cudaMemcpy(dX.p + shift, x.data(), n * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dW.p + shift, w.data(), dim * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dDy.p + shift, dy.data(), n * 2, cudaMemcpyHostToDevice);
  cudaMemset(dDw.p, 0, dim * 4);
  RmsNormForwardArgs f{DType::BF16, dX.p + shift, dW.p + shift, dY.p + shift,
                       dRs.p,       rows,         dim};
  RmsNormBackwardArgs b{DType::BF16, dX.p + shift,  dW.p + shift,
                        dRs.p,       dDy.p + shift, dDx.p + shift,
                        dDw.p,       rows,          dim};
  EXPECT_EQ(rmsNormForward(ctx, f), Status::Ok);
  EXPECT_EQ(rmsNormBackward(ctx, b), Status::Ok);
  EXPECT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx.stream)),
            cudaSuccess);
  auto bytes = [](const void *p, size_t nb) {
    std::vector<unsigned char> v(nb);
    cudaMemcpy(v.data(), p, nb, cudaMemcpyDeviceToHost);
    return v;
  };
  return {bytes(dY.p + shift, n * 2), bytes(dRs.p, rows * 4),
          bytes(dDx.p + shift, n * 2), bytes(dDw.p, dim * 4)};
}

TEST_F(DenseCuda, RmsNormAlignedAndElementwiseAccessBitwiseEqual) {
  for (int64_t dim : {kD, int64_t(256)}) {
    const int64_t rows = 1003;
    RmsNormBackwardArgs probe{DType::BF16};
    probe.rows = rows;
    probe.dim = dim;
    probe.dw = ws; // only its non-nullness matters to the query
    reserve(rmsNormBackwardWorkspaceBytes(Backend::Cuda, probe));
    EXPECT_TRUE(rmsNormRaw(ctx, rows, dim, 0) == rmsNormRaw(ctx, rows, dim, 1))
        << "dim " << dim;
  }
}

//===----------------------------------------------------------------------===//
// RoPE
//===----------------------------------------------------------------------===//

/// RoPE of `a`'s shape on x, forward and backward: twice (bitwise equal)
/// against the host reference, and in place the same bits.
void DenseCuda::ropeCase(const RopeArgs &a, const std::vector<bf16> &x) {
  const int64_t n = a.batch * a.seq * a.heads * a.headDim;
  for (bool backward : {false, true}) {
    std::vector<bf16> ref(n);
    RopeArgs h = a;
    h.x = x.data();
    h.y = ref.data();
    ASSERT_EQ(backward ? ropeBackward(host, h) : ropeForward(host, h),
              Status::Ok);
    Dev<bf16> dX(n), dY(n);
    dX.up(x);
    std::vector<bf16> first;
    for (int run = 0; run < 2; ++run) {
      dY.poison(run ? 0x7F : 0xFF);
      RopeArgs g = a;
      g.x = dX.p;
      g.y = dY.p;
      ASSERT_EQ(backward ? ropeBackward(ctx, g) : ropeForward(ctx, g),
                Status::Ok);
      sync();
      auto y = dY.down();
      if (run)
        EXPECT_TRUE(sameBytes(y, first)) << "rope not deterministic";
      first = y;
    }
    EXPECT_LT(relErr(first, ref), 8e-3);
    // In place gives the same bits as out of place.
    RopeArgs g = a;
    g.x = dX.p;
    g.y = dX.p;
    ASSERT_EQ(backward ? ropeBackward(ctx, g) : ropeForward(ctx, g),
              Status::Ok);
    sync();
    EXPECT_TRUE(sameBytes(dX.down(), first));
  }
}

TEST_F(DenseCuda, RopeQwenAndMlaShapes) {
  struct Case {
    int64_t heads, headDim, offset, rd;
    double theta;
  };
  // q and k of the Qwen3.5 attention (8 and 2 heads), MLA shapes, then
  // shapes the 16-byte kernel does not take (offset and half rotation not
  // multiples of 8): the element kernel.
  for (Case c : {Case{8, 256, 0, 64, 1e7}, Case{2, 256, 0, 64, 1e7},
                 Case{16, 192, 128, 64, 1e4}, Case{1, 64, 0, 64, 1e4},
                 Case{3, 40, 4, 20, 1e4}}) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.heads << " headDim "
                                      << c.headDim << " offset " << c.offset);
    RopeArgs a{DType::BF16};
    a.batch = 2;
    a.seq = kT / 2;
    a.heads = c.heads;
    a.headDim = c.headDim;
    a.offset = c.offset;
    a.rotaryDim = c.rd;
    a.theta = c.theta;
    ropeCase(a, randBf16(a.batch * a.seq * a.heads * a.headDim, 20));
  }
}

TEST_F(DenseCuda, RopeAlignedAndElementwiseAccessBitwiseEqual) {
  // The Qwen q shape at 16-byte and at 2-byte alignment (the element
  // kernel), forward and backward, out of place and in place: same bits.
  RopeArgs a{DType::BF16};
  a.batch = 1;
  a.seq = 1000;
  a.heads = 8;
  a.headDim = 256;
  a.rotaryDim = 64;
  a.theta = 1e7;
  const int64_t n = a.seq * a.heads * a.headDim;
  auto x = randBf16(n, 21);
  for (bool backward : {false, true})
    for (bool inPlace : {false, true}) {
      std::vector<std::vector<bf16>> outs;
      for (int shift : {0, 1}) {
        Dev<bf16> dX(n + 8), dY(n + 8);
        cudaMemcpy(dX.p + shift, x.data(), n * 2, cudaMemcpyHostToDevice);
        dY.poison();
        RopeArgs g = a;
        g.x = dX.p + shift;
        g.y = inPlace ? dX.p + shift : dY.p + shift;
        ASSERT_EQ(backward ? ropeBackward(ctx, g) : ropeForward(ctx, g),
                  Status::Ok);
        sync();
        std::vector<bf16> y(n);
        cudaMemcpy(y.data(), g.y, n * 2, cudaMemcpyDeviceToHost);
        outs.push_back(y);
      }
      EXPECT_TRUE(sameBytes(outs[0], outs[1]))
          << "backward " << backward << " in place " << inPlace;
    }
}

//===----------------------------------------------------------------------===//
// SwiGLU, gate, residual
//===----------------------------------------------------------------------===//

/// SwiGLU forward into y, then backward into dg and du, on ctx's backend.
void swiGlu(const KernelContext &ctx, const void *g, const void *u,
            const void *dy, void *y, void *dg, void *du, int64_t rows,
            int64_t cols) {
  ASSERT_EQ(swiGluForward(ctx, {DType::BF16, g, u, y, rows, cols}), Status::Ok);
  ASSERT_EQ(swiGluBackward(ctx, {DType::BF16, g, u, dy, dg, du, rows, cols}),
            Status::Ok);
}

/// SwiGLU operands of [rows, cols] (gate, up, dy from seeds seed, seed + 1,
/// seed + 2), the reference outputs, and device operands and outputs.
struct SwiGluCase {
  SwiGluCase(int64_t rows, int64_t cols, uint32_t seed)
      : rows(rows), cols(cols), g(randBf16(rows * cols, seed, 2.f)),
        u(randBf16(rows * cols, seed + 1)), dy(randBf16(rows * cols, seed + 2)),
        yRef(rows * cols), dgRef(rows * cols), duRef(rows * cols),
        dG(rows * cols), dU(rows * cols), dDy(rows * cols), dY(rows * cols),
        dDg(rows * cols), dDu(rows * cols) {}
  /// The reference outputs on host, the operands uploaded.
  void prepare(const KernelContext &host) {
    swiGlu(host, g.data(), u.data(), dy.data(), yRef.data(), dgRef.data(),
           duRef.data(), rows, cols);
    dG.up(g);
    dU.up(u);
    dDy.up(dy);
  }
  void run(const KernelContext &ctx) {
    swiGlu(ctx, dG.p, dU.p, dDy.p, dY.p, dDg.p, dDu.p, rows, cols);
  }

  int64_t rows, cols;
  std::vector<bf16> g, u, dy, yRef, dgRef, duRef;
  Dev<bf16> dG, dU, dDy, dY, dDg, dDu;
};

// Packed sequences: a row of documents starting at 0, 37, 106 (inside the
// second 64-token block) and 199 rotates each document bitwise as the same
// kernel rotates it alone as a row, forward and backward, and within the
// usual bound of the host's packed rotation; for Qwen's and MLA's heads.
TEST_F(DenseCuda, RopePackedDocumentsAsRows) {
  const ap::test::PackedRow &row = ap::test::kPackedRow200;
  const int64_t T = row.T;
  const std::vector<int32_t> ds = row.docStart();
  Dev<int32_t> dDs(T);
  dDs.up(ds);
  struct Case {
    int64_t heads, headDim, offset, rd;
    double theta;
  };
  for (Case c : {Case{8, 256, 0, 64, 1e7}, Case{4, 192, 128, 64, 1e4}})
    for (bool backward : {false, true}) {
      RopeArgs a{DType::BF16};
      a.batch = 1;
      a.seq = T;
      a.heads = c.heads;
      a.headDim = c.headDim;
      a.offset = c.offset;
      a.rotaryDim = c.rd;
      a.theta = c.theta;
      const int64_t per = c.heads * c.headDim, n = T * per;
      auto x = randBf16(n, 95);
      auto run = [&](RopeArgs r) { // r.x/r.y device pointers
        return backward ? ropeBackward(ctx, r) : ropeForward(ctx, r);
      };
      Dev<bf16> dX(n), dY(n);
      dX.up(x);
      dY.poison();
      RopeArgs p = a;
      p.x = dX.p;
      p.y = dY.p;
      p.docStart = dDs.p;
      ASSERT_EQ(run(p), Status::Ok);
      sync();
      std::vector<bf16> packed = dY.down();
      // Each document alone, as its own row.
      for (size_t d = 0; d < row.documents(); ++d) {
        int64_t t0 = row.starts[d], len = row.length(d);
        Dev<bf16> dDoc(len * per);
        std::vector<bf16> doc(x.begin() + t0 * per,
                              x.begin() + (t0 + len) * per);
        dDoc.up(doc);
        RopeArgs r = a;
        r.seq = len;
        r.x = r.y = dDoc.p;
        ASSERT_EQ(run(r), Status::Ok);
        sync();
        std::vector<bf16> alone = dDoc.down();
        std::vector<bf16> part(packed.begin() + t0 * per,
                               packed.begin() + (t0 + len) * per);
        EXPECT_TRUE(sameBytes(part, alone))
            << "document at " << t0 << (backward ? " backward" : " forward");
      }
      std::vector<bf16> ref(n);
      RopeArgs h = a;
      h.x = x.data();
      h.y = ref.data();
      h.docStart = ds.data();
      ASSERT_EQ(backward ? ropeBackward(host, h) : ropeForward(host, h),
                Status::Ok);
      EXPECT_LT(relErr(packed, ref), 8e-3);
    }
}

TEST_F(DenseCuda, SwiGluBackwardRebuildsForwardBits) {
  // train-fuse-recompute reads the activation from the backward kernel: its
  // y must be the forward kernel's bytes, and dg, du as without y. The MLP
  // shape (8-wide path) and an odd width (scalar path).
  for (int64_t cols : {kI, int64_t(37)}) {
    SwiGluCase c(kT / 4, cols, 31);
    ASSERT_NO_FATAL_FAILURE(c.prepare(host));
    ASSERT_NO_FATAL_FAILURE(c.run(ctx));
    Dev<bf16> y2(c.rows * c.cols), dg2(c.rows * c.cols), du2(c.rows * c.cols);
    y2.poison(0xFF);
    SwiGluBackwardArgs a{DType::BF16, c.dG.p, c.dU.p, c.dDy.p,
                         dg2.p,       du2.p,  c.rows, c.cols};
    a.y = y2.p;
    ASSERT_EQ(swiGluBackward(ctx, a), Status::Ok);
    sync();
    EXPECT_TRUE(sameBytes(y2.down(), c.dY.down())) << "cols " << cols;
    EXPECT_TRUE(sameBytes(dg2.down(), c.dDg.down())) << "cols " << cols;
    EXPECT_TRUE(sameBytes(du2.down(), c.dDu.down())) << "cols " << cols;
  }
}

TEST_F(DenseCuda, SwiGluMlpShape) {
  SwiGluCase c(kT, kI, 30);
  ASSERT_NO_FATAL_FAILURE(c.prepare(host));
  std::vector<bf16> y1, dg1, du1;
  for (int run = 0; run < 2; ++run) {
    for (auto *b : {&c.dY, &c.dDg, &c.dDu})
      b->poison(run ? 0x7F : 0xFF);
    ASSERT_NO_FATAL_FAILURE(c.run(ctx));
    sync();
    auto y = c.dY.down(), dg = c.dDg.down(), du = c.dDu.down();
    if (run)
      EXPECT_TRUE(sameBytes(y, y1) && sameBytes(dg, dg1) && sameBytes(du, du1));
    y1 = y, dg1 = dg, du1 = du;
  }
  EXPECT_LT(relErr(y1, c.yRef), 8e-3);
  EXPECT_LT(relErr(dg1, c.dgRef), 8e-3);
  EXPECT_LT(relErr(du1, c.duRef), 8e-3);
}

TEST_F(DenseCuda, SwiGluOddShapes) {
  // cols % 8 != 0 (2-wide accesses) and odd cols (element accesses).
  for (int64_t cols : {int64_t(3586), int64_t(3583)}) {
    SwiGluCase c(129, cols, 33);
    ASSERT_NO_FATAL_FAILURE(c.prepare(host));
    for (auto *b : {&c.dY, &c.dDg, &c.dDu})
      b->poison();
    ASSERT_NO_FATAL_FAILURE(c.run(ctx));
    sync();
    EXPECT_LT(relErr(c.dY.down(), c.yRef), 8e-3) << cols;
    EXPECT_LT(relErr(c.dDg.down(), c.dgRef), 8e-3) << cols;
    EXPECT_LT(relErr(c.dDu.down(), c.duRef), 8e-3) << cols;
  }
}

TEST_F(DenseCuda, ElementwiseAccessWidthsBitwiseEqual) {
  // The same [rows, cols] data at 16-byte (8-wide), 4-byte (2-wide) and
  // 2-byte (element) alignment of every view: SwiGLU, the sigmoid gate and
  // the residual add give the same bits at every width.
  const int64_t rows = 257, cols = kI, n = rows * cols;
  auto g = randBf16(n, 36, 2.f), u = randBf16(n, 37), dy = randBf16(n, 38);
  std::vector<std::vector<bf16>> first;
  for (int shift : {0, 2, 1}) {
    SCOPED_TRACE(shift);
    Dev<bf16> dG(n + 8), dU(n + 8), dDy(n + 8), o1(n + 8), o2(n + 8);
    auto at = [&](Dev<bf16> &d) { return d.p + shift; };
    cudaMemcpy(at(dG), g.data(), n * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(at(dU), u.data(), n * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(at(dDy), dy.data(), n * 2, cudaMemcpyHostToDevice);
    auto get = [&](Dev<bf16> &d) {
      std::vector<bf16> v(n);
      cudaMemcpy(v.data(), at(d), n * 2, cudaMemcpyDeviceToHost);
      return v;
    };
    std::vector<std::vector<bf16>> outs;
    ASSERT_EQ(
        swiGluForward(ctx, {DType::BF16, at(dG), at(dU), at(o1), rows, cols}),
        Status::Ok);
    sync();
    outs.push_back(get(o1));
    ASSERT_EQ(swiGluBackward(ctx, {DType::BF16, at(dG), at(dU), at(dDy), at(o1),
                                   at(o2), rows, cols}),
              Status::Ok);
    sync();
    outs.push_back(get(o1));
    outs.push_back(get(o2));
    SigmoidGateForwardArgs gf{DType::BF16, at(dU), at(dG), at(o1), rows, cols};
    ASSERT_EQ(sigmoidGateForward(ctx, gf), Status::Ok);
    sync();
    outs.push_back(get(o1));
    SigmoidGateBackwardArgs gb{DType::BF16, at(dU), at(dG), at(dDy),
                               at(o1),      at(o2), rows,   cols};
    ASSERT_EQ(sigmoidGateBackward(ctx, gb), Status::Ok);
    sync();
    outs.push_back(get(o1));
    outs.push_back(get(o2));
    ASSERT_EQ(residualAddForward(ctx, {DType::BF16, at(dG), at(dU), at(o1), n}),
              Status::Ok);
    sync();
    outs.push_back(get(o1));
    if (first.empty()) {
      first = outs;
      continue;
    }
    for (size_t i = 0; i < outs.size(); ++i)
      EXPECT_TRUE(sameBytes(outs[i], first[i])) << "output " << i;
  }
}

TEST_F(DenseCuda, SigmoidGateOnGatedQProjection) {
  // o [T, 8, 256]; gate = second half of each head of q_proj out [T, 8, 512].
  const int64_t rows = kT * 8, cols = 256;
  auto o = randBf16(rows * cols, 40), qg = randBf16(rows * 2 * cols, 41, 2.f),
       dy = randBf16(rows * cols, 42);
  SigmoidGateForwardArgs f{DType::BF16, o.data(), qg.data() + cols,
                           nullptr,     rows,     cols,
                           0,           2 * cols, 0};
  std::vector<bf16> yRef(rows * cols), doRef(rows * cols),
      dgRef(rows * 2 * cols, bf16(3.f));
  f.y = yRef.data();
  ASSERT_EQ(sigmoidGateForward(host, f), Status::Ok);
  SigmoidGateBackwardArgs b{DType::BF16,
                            o.data(),
                            qg.data() + cols,
                            dy.data(),
                            doRef.data(),
                            dgRef.data() + cols,
                            rows,
                            cols,
                            0,
                            2 * cols,
                            0,
                            0,
                            2 * cols};
  ASSERT_EQ(sigmoidGateBackward(host, b), Status::Ok);
  Dev<bf16> dO(o.size()), dQg(qg.size()), dDy(dy.size()), dYo(o.size()),
      dDo(o.size()), dDqg(qg.size());
  dO.up(o);
  dQg.up(qg);
  dDy.up(dy);
  dYo.poison();
  dDo.poison();
  dDqg.poison();
  f.o = dO.p;
  f.gate = dQg.p + cols;
  f.y = dYo.p;
  ASSERT_EQ(sigmoidGateForward(ctx, f), Status::Ok);
  b.o = dO.p;
  b.gate = dQg.p + cols;
  b.dy = dDy.p;
  b.dout = dDo.p;
  b.dgate = dDqg.p + cols;
  ASSERT_EQ(sigmoidGateBackward(ctx, b), Status::Ok);
  sync();
  auto y = dYo.down(), dO_ = dDo.down(), dqg = dDqg.down();
  EXPECT_LT(relErr(y, yRef), 8e-3);
  EXPECT_LT(relErr(dO_, doRef), 8e-3);
  std::vector<bf16> g1, gr;
  int64_t touched = 0; // the q half of the gradient buffer must keep its poison
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      touched += dqg[r * 2 * cols + j].bits != 0xFFFF;
      g1.push_back(dqg[r * 2 * cols + cols + j]);
      gr.push_back(dgRef[r * 2 * cols + cols + j]);
    }
  EXPECT_EQ(touched, 0);
  EXPECT_LT(relErr(g1, gr), 8e-3);
}

TEST_F(DenseCuda, ResidualAddBitwise) {
  for (int64_t n : {kT * kD, kT * kD - 3}) {
    auto a = randBf16(n, 50), b = randBf16(n, 51);
    std::vector<bf16> ref(n);
    ASSERT_EQ(residualAddForward(
                  host, {DType::BF16, a.data(), b.data(), ref.data(), n}),
              Status::Ok);
    Dev<bf16> dA(n), dB(n), dYo(n), dDa(n);
    dA.up(a);
    dB.up(b);
    dYo.poison();
    dDa.poison();
    ASSERT_EQ(residualAddForward(ctx, {DType::BF16, dA.p, dB.p, dYo.p, n}),
              Status::Ok);
    ASSERT_EQ(residualAddBackward(ctx, {DType::BF16, dYo.p, dDa.p, nullptr, n}),
              Status::Ok);
    sync();
    EXPECT_TRUE(sameBytes(dYo.down(), ref));
    EXPECT_TRUE(sameBytes(dDa.down(), ref));
  }
}

//===----------------------------------------------------------------------===//
// Embedding
//===----------------------------------------------------------------------===//

/// The embedding forward and backward over `ids` (N tokens, vocab V = w's
/// rows, width D): twice on the device from poisoned y and from dw0, each
/// bitwise equal to the host reference.
void DenseCuda::embeddingBitwise(const std::vector<int32_t> &ids,
                                 const std::vector<bf16> &w,
                                 const std::vector<bf16> &dy,
                                 const std::vector<float> &dw0, int64_t D) {
  const int64_t N = int64_t(ids.size()), V = int64_t(w.size()) / D;
  std::vector<bf16> yRef(N * D);
  ASSERT_EQ(embeddingForward(host, {DType::BF16, ids.data(), w.data(),
                                    yRef.data(), N, V, D}),
            Status::Ok);
  std::vector<float> dwRef = dw0;
  ASSERT_EQ(embeddingBackward(host, {DType::BF16, ids.data(), dy.data(),
                                     dwRef.data(), N, V, D}),
            Status::Ok);
  Dev<int32_t> dIds(N);
  Dev<bf16> dW(V * D), dDy(N * D), dYo(N * D);
  Dev<float> dDw(V * D);
  dIds.up(ids);
  dW.up(w);
  dDy.up(dy);
  for (int run = 0; run < 2; ++run) {
    dYo.poison(run ? 0x7F : 0xFF);
    dDw.up(dw0);
    ASSERT_EQ(
        embeddingForward(ctx, {DType::BF16, dIds.p, dW.p, dYo.p, N, V, D}),
        Status::Ok);
    ASSERT_EQ(
        embeddingBackward(ctx, {DType::BF16, dIds.p, dDy.p, dDw.p, N, V, D}),
        Status::Ok);
    sync();
    EXPECT_TRUE(sameBytes(dYo.down(), yRef)) << "run " << run;
    EXPECT_TRUE(sameBytes(dDw.down(), dwRef)) << "run " << run;
  }
}

TEST_F(DenseCuda, EmbeddingQwenShapeBitwise) {
  const int64_t N = kT, V = kV, D = kD;
  auto w = randBf16(V * D, 60, 0.02f), dy = randBf16(N * D, 61);
  std::vector<int32_t> ids(N);
  std::mt19937 gen(62);
  for (int64_t n = 0; n < N; ++n)
    ids[n] = n % 5 == 0 ? int32_t(n % 7) : int32_t(gen() % V); // duplicates
  ids[N - 1] = int32_t(V - 1);
  embeddingBitwise(ids, w, dy, hashFloats(V * D, 63, 1e-3f), D);
}

//===----------------------------------------------------------------------===//
// LM head + cross-entropy
//===----------------------------------------------------------------------===//

/// The host reference of the LM head + cross-entropy backward on host data,
/// for the shape and options of `a` (its pointers are replaced).
struct LmHeadRef {
  float loss = 0;
  int32_t count = 0;
  std::vector<float> lse, dW;
  std::vector<bf16> dh;
};
LmHeadRef lmHeadReference(const LmHeadCrossEntropyArgs &a,
                          const std::vector<bf16> &h,
                          const std::vector<bf16> &w,
                          const std::vector<int32_t> &labels) {
  LmHeadRef r;
  r.lse.assign(a.tokens, 0.f);
  r.dW.assign(a.vocab * a.dim, 0.f);
  r.dh.resize(a.tokens * a.dim);
  LmHeadCrossEntropyArgs hA = a;
  hA.hidden = h.data();
  hA.weight = w.data();
  hA.labels = labels.data();
  hA.lossSum = &r.loss;
  hA.validCount = &r.count;
  hA.lse = r.lse.data();
  hA.dHidden = r.dh.data();
  hA.dWeight = r.dW.data();
  EXPECT_EQ(lmHeadCrossEntropyBackward(KernelContext{}, hA), Status::Ok);
  return r;
}

/// The LM head + cross-entropy of `a`'s shape and options on h, w, labels:
/// forward alone, then the backward twice (bitwise equal), against the host
/// reference: loss and lse within 1e-4, dh and dW within 2e-2, every dh
/// element written.
void DenseCuda::crossEntropyVsReference(LmHeadCrossEntropyArgs a,
                                        const std::vector<bf16> &h,
                                        const std::vector<bf16> &w,
                                        const std::vector<int32_t> &labels) {
  const int64_t N = a.tokens, D = a.dim, V = a.vocab;
  const LmHeadRef ref = lmHeadReference(a, h, w, labels);
  const float lossRef = ref.loss;
  const int32_t countRef = ref.count;
  const std::vector<float> &lseRef = ref.lse, &dWRef = ref.dW;
  const std::vector<bf16> &dhRef = ref.dh;
  Dev<bf16> dH(N * D), dWt(V * D), dDh(N * D);
  Dev<int32_t> dLab(N), dCount(1);
  Dev<float> dLoss(1), dLse(N), dDW(V * D);
  dH.up(h);
  dWt.up(w);
  dLab.up(labels);
  a.hidden = dH.p;
  a.weight = dWt.p;
  a.labels = dLab.p;
  a.lossSum = dLoss.p;
  a.validCount = dCount.p;
  a.lse = dLse.p;
  reserve(lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, a));
  // Forward only first.
  dLoss.poison();
  dLse.poison();
  ASSERT_EQ(lmHeadCrossEntropyForward(ctx, a), Status::Ok);
  sync();
  float lossFwd = dLoss.down()[0];
  EXPECT_NEAR(lossFwd, lossRef, 1e-4 * std::fabs(lossRef));
  EXPECT_EQ(dCount.down()[0], countRef);
  EXPECT_LT(relErr(dLse.down(), lseRef), 1e-4);
  a.dHidden = dDh.p;
  a.dWeight = dDW.p;
  std::vector<bf16> dh1;
  std::vector<float> dW1;
  for (int run = 0; run < 2; ++run) {
    dDh.poison(run ? 0x7F : 0xFF);
    ASSERT_EQ(cudaMemset(dDW.p, 0, V * D * sizeof(float)), cudaSuccess);
    ASSERT_EQ(lmHeadCrossEntropyBackward(ctx, a), Status::Ok);
    sync();
    auto dh = dDh.down();
    auto dW = dDW.down();
    EXPECT_EQ(dLoss.down()[0], lossFwd) << "backward loss differs from forward";
    if (run) {
      EXPECT_TRUE(sameBytes(dh, dh1));
      EXPECT_TRUE(sameBytes(dW, dW1));
    }
    dh1 = dh, dW1 = dW;
  }
  EXPECT_LT(relErr(dh1, dhRef), 2e-2);
  EXPECT_LT(relErr(dW1, dWRef), 2e-2);
}

/// The bf16 LM head + cross-entropy arguments of one shape (pointers unset).
LmHeadCrossEntropyArgs bf16CeArgs(int64_t tokens, int64_t dim, int64_t vocab,
                                  int64_t chunkTokens, double gradScale) {
  LmHeadCrossEntropyArgs a;
  a.dtype = DType::BF16;
  a.tokens = tokens;
  a.dim = dim;
  a.vocab = vocab;
  a.chunkTokens = chunkTokens;
  a.gradScale = gradScale;
  return a;
}

TEST_F(DenseCuda, CrossEntropyFullVocabVsReference) {
  // Few tokens so that the host reference stays quick; chunk 4 over 10
  // tokens exercises a partial last chunk.
  const int64_t N = 10, D = kD, V = kV;
  auto h = randBf16(N * D, 70), w = randBf16(V * D, 71, 0.05f);
  std::vector<int32_t> labels(N);
  for (int64_t n = 0; n < N; ++n)
    labels[n] = int32_t((n * 7919) % V);
  labels[3] = -100;
  crossEntropyVsReference(bf16CeArgs(N, D, V, 4, 1.0 / 9), h, w, labels);
}

TEST_F(DenseCuda, CrossEntropyOddVocabVsReference) {
  // A vocabulary that is not a multiple of 8 takes the element-by-element
  // row statistics and gradient (the aligned shapes read groups of eight):
  // labels at both ends of the rows and between, one ignored, chunk 16 over
  // 37 tokens.
  const int64_t N = 37, D = 256, V = 50257;
  auto h = randBf16(N * D, 72), w = randBf16(V * D, 73, 0.05f);
  std::vector<int32_t> labels(N);
  for (int64_t n = 0; n < N; ++n)
    labels[n] = int32_t((n * 104729) % V);
  labels[1] = 0;
  labels[2] = int32_t(V - 1);
  labels[5] = -100;
  crossEntropyVsReference(bf16CeArgs(N, D, V, 16, 1.0 / 36), h, w, labels);
}

TEST_F(DenseCuda, CrossEntropyQwenShapeDeterministic) {
  const int64_t N = kT, D = kD, V = kV;
  auto h = randBf16(N * D, 80), w = randBf16(V * D, 81, 0.05f);
  std::vector<int32_t> labels(N);
  std::mt19937 gen(82);
  int32_t valid = 0;
  for (int64_t n = 0; n < N; ++n) {
    labels[n] = n % 97 == 0 ? -100 : int32_t(gen() % V);
    valid += labels[n] != -100;
  }
  Dev<bf16> dH(N * D), dWt(V * D), dDh(N * D);
  Dev<int32_t> dLab(N), dCount(1);
  Dev<float> dLoss(1), dDW(V * D);
  dH.up(h);
  dWt.up(w);
  dLab.up(labels);
  LmHeadCrossEntropyArgs a;
  a.dtype = DType::BF16;
  a.hidden = dH.p;
  a.weight = dWt.p;
  a.labels = dLab.p;
  a.tokens = N;
  a.dim = D;
  a.vocab = V;
  a.chunkTokens = 1024;
  a.lossSum = dLoss.p;
  a.validCount = dCount.p;
  a.gradScale = 1.0 / valid;
  a.dHidden = dDh.p;
  a.dWeight = dDW.p;
  reserve(lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, a));
  std::vector<bf16> dh1;
  std::vector<float> dW1;
  float loss1 = 0;
  for (int run = 0; run < 2; ++run) {
    dDh.poison(run ? 0x7F : 0xFF);
    dLoss.poison();
    ASSERT_EQ(cudaMemset(dDW.p, 0, V * D * sizeof(float)), cudaSuccess);
    ASSERT_EQ(lmHeadCrossEntropyBackward(ctx, a), Status::Ok);
    sync();
    auto dh = dDh.down();
    auto dW = dDW.down();
    float loss = dLoss.down()[0];
    EXPECT_EQ(dCount.down()[0], valid);
    if (run) {
      EXPECT_EQ(loss, loss1);
      EXPECT_TRUE(sameBytes(dh, dh1));
      EXPECT_TRUE(sameBytes(dW, dW1));
    }
    dh1 = dh, dW1 = dW, loss1 = loss;
  }
  // Small random weights: logits ~ N(0, 0.05^2 * D), loss near log V + var/2.
  double mean = loss1 / valid;
  EXPECT_GT(mean, std::log(double(V)));
  EXPECT_LT(mean, std::log(double(V)) + 3.0);
  for (auto v : dh1)
    ASSERT_FALSE(std::isnan(toFloat(v)));
}

//===----------------------------------------------------------------------===//
// Split vocabulary (VocabGroup): R ranks as R threads sharing the device.
//===----------------------------------------------------------------------===//

/// Device buffers: the rank's send buffer to its host slot after the work
/// on its stream, the slots back into recv on that stream, synchronized.
struct DeviceSlots {
  static cudaStream_t stream(const KernelContext &ctx) {
    return static_cast<cudaStream_t>(ctx.stream);
  }
  static bool toSlot(const KernelContext &ctx, const float *send,
                     std::vector<float> &slot, int64_t n) {
    slot.resize(size_t(n));
    return cudaMemcpyAsync(slot.data(), send, size_t(n) * sizeof(float),
                           cudaMemcpyDeviceToHost,
                           stream(ctx)) == cudaSuccess &&
           cudaStreamSynchronize(stream(ctx)) == cudaSuccess;
  }
  static bool fromSlot(const KernelContext &ctx, const std::vector<float> &slot,
                       float *recv) {
    return cudaMemcpyAsync(recv, slot.data(), slot.size() * sizeof(float),
                           cudaMemcpyHostToDevice, stream(ctx)) == cudaSuccess;
  }
  static bool done(const KernelContext &ctx) {
    return cudaStreamSynchronize(stream(ctx)) == cudaSuccess;
  }
};
/// The ranks of a split vocabulary as threads on one device.
using DeviceThreadGroup = ap::test::ThreadVocabGroup<DeviceSlots>;

/// One rank's CUDA context: its own stream, cuBLASLt handle and workspace,
/// as the fixture sets up its own.
struct RankContext {
  cublasLtHandle_t lt = nullptr;
  cudaStream_t stream = nullptr;
  void *ws = nullptr;
  KernelContext ctx;
  RankContext(int smCount, size_t workspaceBytes) {
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS ||
        cudaStreamCreate(&stream) != cudaSuccess ||
        cudaMalloc(&ws, workspaceBytes) != cudaSuccess)
      return;
    ctx.backend = Backend::Cuda;
    ctx.stream = stream;
    ctx.cublasLt = lt;
    ctx.smCount = smCount;
    ctx.workspace = ws;
    ctx.workspaceBytes = workspaceBytes;
  }
  ~RankContext() {
    if (ws)
      cudaFree(ws);
    if (stream)
      cudaStreamDestroy(stream);
    if (lt)
      cublasLtDestroy(lt);
  }
  RankContext(const RankContext &) = delete;
  bool ready() const { return ctx.workspace != nullptr; }
};

/// One rank's (or the unsplit) LM head + cross-entropy outputs on the host:
/// the forward alone, then the backward, which writes loss, count and lse
/// again.
struct CeResult {
  float lossFwd = -1, loss = -1;
  int32_t countFwd = -1, count = -1;
  std::vector<float> lseFwd, lse, dW;
  std::vector<bf16> dh;
  Status fwd = Status::Unsupported, bwd = Status::Unsupported;
  bool copied = false;
};

/// Runs `a` (device hidden, labels and weight; the outputs are allocated
/// here, poisoned first) forward then backward on ctx, and downloads the
/// outputs.
CeResult runCeOnDevice(const KernelContext &ctx, LmHeadCrossEntropyArgs a) {
  CeResult r;
  const int64_t N = a.tokens, D = a.dim, V = a.vocab;
  Dev<float> dLoss(1), dLse(N), dDW(V * D);
  Dev<int32_t> dCount(1);
  Dev<bf16> dDh(N * D);
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  if (cudaMemsetAsync(dLoss.p, 0xFF, sizeof(float), stream) != cudaSuccess ||
      cudaMemsetAsync(dLse.p, 0xFF, N * sizeof(float), stream) != cudaSuccess ||
      cudaMemsetAsync(dDh.p, 0xFF, N * D * sizeof(bf16), stream) !=
          cudaSuccess ||
      cudaMemsetAsync(dDW.p, 0, V * D * sizeof(float), stream) != cudaSuccess)
    return r;
  a.lossSum = dLoss.p;
  a.validCount = dCount.p;
  a.lse = dLse.p;
  r.fwd = lmHeadCrossEntropyForward(ctx, a);
  if (r.fwd != Status::Ok || cudaStreamSynchronize(stream) != cudaSuccess)
    return r;
  r.lossFwd = dLoss.down()[0];
  r.countFwd = dCount.down()[0];
  r.lseFwd = dLse.down();
  if (cudaMemsetAsync(dLse.p, 0xFF, N * sizeof(float), stream) != cudaSuccess)
    return r;
  a.dHidden = dDh.p;
  a.dWeight = dDW.p;
  r.bwd = lmHeadCrossEntropyBackward(ctx, a);
  if (r.bwd != Status::Ok || cudaStreamSynchronize(stream) != cudaSuccess)
    return r;
  r.loss = dLoss.down()[0];
  r.count = dCount.down()[0];
  r.lse = dLse.down();
  r.dh = dDh.down();
  r.dW = dDW.down();
  r.copied = true;
  return r;
}

/// The vocabulary of Vt rows split over `ranks` threads, each with its own
/// stream, handle, workspace and weight block: the ranks agree bitwise on
/// loss, count and lse (forward and backward alike, and over two runs with
/// every output); the split run is within the file's split bounds of the
/// unsplit CUDA run (the ranks' dW blocks side by side, the sum of their dh
/// partials).
void vocabParallelCeCase(const KernelContext &unsplitCtx, int ranks, int64_t N,
                         int64_t chunk, int64_t D, int64_t Vt) {
  const int64_t V = Vt / ranks;
  ASSERT_EQ(V * ranks, Vt);
  auto h = randBf16(N * D, 400), w = randBf16(Vt * D, 401, 0.05f);
  std::vector<int32_t> labels(N);
  for (int64_t n = 0; n < N; ++n)
    labels[n] = n % 41 == 3 ? -100 : int32_t((n * 7919) % Vt);
  labels[0] = 0;
  labels[1] = int32_t(Vt - 1);
  labels[N - 1] = -100; // in the last, partial chunk
  int32_t valid = 0;
  for (int32_t l : labels)
    valid += l != -100;
  for (int r = 0; r < ranks; ++r)
    ASSERT_TRUE(
        std::any_of(labels.begin(), labels.end(),
                    [&](int32_t l) { return l >= r * V && l < (r + 1) * V; }))
        << "no label in rank " << r << "'s block";
  Dev<bf16> dH(N * D), dW(Vt * D);
  Dev<int32_t> dLab(N);
  dH.up(h);
  dW.up(w);
  dLab.up(labels);
  LmHeadCrossEntropyArgs a;
  a.dtype = DType::BF16;
  a.hidden = dH.p;
  a.weight = dW.p;
  a.labels = dLab.p;
  a.tokens = N;
  a.dim = D;
  a.vocab = Vt;
  a.chunkTokens = chunk;
  a.gradScale = 1.0 / valid;
  ASSERT_LE(lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, a),
            unsplitCtx.workspaceBytes);
  const CeResult whole = runCeOnDevice(unsplitCtx, a);
  ASSERT_EQ(whole.fwd, Status::Ok);
  ASSERT_EQ(whole.bwd, Status::Ok);
  ASSERT_TRUE(whole.copied);
  EXPECT_EQ(whole.count, valid);

  // Each rank's weight block in its own buffer (as a rank holds it).
  std::vector<std::unique_ptr<Dev<bf16>>> blocks;
  std::vector<std::unique_ptr<RankContext>> ctxs;
  LmHeadCrossEntropyArgs split = a;
  split.vocab = V;
  split.group.ranks = ranks;
  const size_t wsBytes = lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, split);
  for (int r = 0; r < ranks; ++r) {
    blocks.push_back(std::make_unique<Dev<bf16>>(V * D));
    blocks.back()->up(
        std::vector<bf16>(w.begin() + r * V * D, w.begin() + (r + 1) * V * D));
    ctxs.push_back(std::make_unique<RankContext>(unsplitCtx.smCount, wsBytes));
    ASSERT_TRUE(ctxs.back()->ready());
  }
  std::vector<CeResult> first;
  for (int run = 0; run < 2; ++run) {
    DeviceThreadGroup group(ranks);
    std::vector<CeResult> out(ranks);
    group.run([&](int r) {
      LmHeadCrossEntropyArgs ar = split;
      ar.weight = blocks[r]->p;
      ar.group = group.group(r, V);
      out[r] = runCeOnDevice(ctxs[r]->ctx, ar);
    });
    ASSERT_TRUE(group.ok());
    const int64_t chunks = (N + chunk - 1) / chunk;
    for (int r = 0; r < ranks; ++r) {
      ASSERT_EQ(out[r].fwd, Status::Ok) << r;
      ASSERT_EQ(out[r].bwd, Status::Ok) << r;
      ASSERT_TRUE(out[r].copied) << r;
      EXPECT_EQ(group.calls(r), 2 * chunks) << r; // one gather per chunk
      EXPECT_EQ(out[r].count, valid) << r;
      EXPECT_EQ(out[r].countFwd, valid) << r;
      EXPECT_TRUE(sameBytes(std::vector<float>{out[r].loss},
                            std::vector<float>{out[0].loss}))
          << r;
      EXPECT_TRUE(sameBytes(std::vector<float>{out[r].loss},
                            std::vector<float>{out[r].lossFwd}))
          << r;
      EXPECT_TRUE(sameBytes(out[r].lse, out[0].lse)) << r;
      EXPECT_TRUE(sameBytes(out[r].lse, out[r].lseFwd)) << r;
      if (run) {
        EXPECT_TRUE(sameBytes(out[r].dh, first[r].dh)) << r;
        EXPECT_TRUE(sameBytes(out[r].dW, first[r].dW)) << r;
        EXPECT_TRUE(sameBytes(out[r].lse, first[r].lse)) << r;
      }
    }
    if (run == 0)
      first = std::move(out);
  }

  std::vector<float> dWcat;
  std::vector<double> dhSum(N * D, 0.0), dhWhole(N * D);
  for (int r = 0; r < ranks; ++r) {
    dWcat.insert(dWcat.end(), first[r].dW.begin(), first[r].dW.end());
    for (int64_t i = 0; i < N * D; ++i)
      dhSum[i] += val(first[r].dh[i]);
  }
  for (int64_t i = 0; i < N * D; ++i)
    dhWhole[i] = val(whole.dh[i]);
  const double lossErr =
      std::fabs(double(first[0].loss) - whole.loss) / std::fabs(whole.loss);
  const double lseErr = relErr(first[0].lse, whole.lse);
  const double dhErr = relErr(dhSum, dhWhole);
  const double dWErr = relErr(dWcat, whole.dW);
  std::printf("split R=%d N=%lld D=%lld V=%lld vs unsplit: loss %.3g lse "
              "%.3g dh %.3g dW %.3g\n",
              ranks, (long long)N, (long long)D, (long long)Vt, lossErr, lseErr,
              dhErr, dWErr);
  EXPECT_LE(lossErr, 1e-5);
  EXPECT_LE(lseErr, 1e-5);
  EXPECT_LE(dhErr, 2e-2);
  EXPECT_LE(dWErr, 1e-3);
}

TEST_F(DenseCuda, VocabParallelCrossEntropyMatchesUnsplit) {
  // 300 tokens in chunks of 128 (the last partial), a 8000-row vocabulary.
  const int64_t N = 300, chunk = 128, D = 256, Vt = 8000;
  LmHeadCrossEntropyArgs a;
  a.tokens = N;
  a.dim = D;
  a.vocab = Vt;
  a.chunkTokens = chunk;
  reserve(lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, a));
  for (int ranks : {2, 4}) {
    vocabParallelCeCase(ctx, ranks, N, chunk, D, Vt);
    if (HasFatalFailure())
      return;
  }
}

TEST_F(DenseCuda, VocabParallelCrossEntropyNeedsAllGather) {
  Dev<bf16> dH(4 * 8), dW(16 * 8);
  Dev<int32_t> dLab(4);
  Dev<float> dLoss(1);
  LmHeadCrossEntropyArgs a;
  a.dtype = DType::BF16;
  a.hidden = dH.p;
  a.weight = dW.p;
  a.labels = dLab.p;
  a.tokens = 4;
  a.dim = 8;
  a.vocab = 16;
  a.lossSum = dLoss.p;
  a.group.ranks = 2;
  a.group.offset = 16;
  reserve(lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, a));
  EXPECT_EQ(lmHeadCrossEntropyForward(ctx, a), Status::InvalidArgument);
  EXPECT_EQ(lmHeadCrossEntropyBackward(ctx, a), Status::InvalidArgument);
}

// Each id's row lives on one rank and the others write zero rows, so the
// ranks' outputs sum to the unsplit output exactly, ids outside the whole
// table give zero rows everywhere, and each rank's backward adds the same dy
// rows in the same order to its block.
TEST_F(DenseCuda, VocabParallelEmbeddingSumsToUnsplit) {
  const int64_t N = 4096, D = 512, Vt = 3000;
  auto w = randBf16(Vt * D, 410, 0.02f), dy = randBf16(N * D, 411);
  auto dw0 = hashFloats(Vt * D, 412, 1e-3f);
  std::vector<int32_t> ids(N);
  std::mt19937 gen(413);
  for (int64_t n = 0; n < N; ++n)
    ids[n] = n % 5 == 0 ? int32_t(n % 7) : int32_t(gen() % Vt); // duplicates
  ids[1] = int32_t(Vt - 1);
  ids[2] = int32_t(Vt); // outside the table: zero rows, no gradient
  ids[3] = -1;
  Dev<int32_t> dIds(N);
  Dev<bf16> dWt(Vt * D), dDy(N * D), dY(N * D);
  Dev<float> dDw(Vt * D);
  dIds.up(ids);
  dWt.up(w);
  dDy.up(dy);
  dDw.up(dw0);
  dY.poison();
  ASSERT_EQ(embeddingForward(ctx, {DType::BF16, dIds.p, dWt.p, dY.p, N, Vt, D}),
            Status::Ok);
  ASSERT_EQ(
      embeddingBackward(ctx, {DType::BF16, dIds.p, dDy.p, dDw.p, N, Vt, D}),
      Status::Ok);
  sync();
  const auto y = dY.down();
  const auto dw = dDw.down();
  for (int ranks : {2, 4}) {
    const int64_t V = Vt / ranks;
    std::vector<float> sum(N * D, 0.f);
    std::vector<float> dwSplit;
    for (int r = 0; r < ranks; ++r) {
      Dev<bf16> dWr(V * D), dYr(N * D);
      Dev<float> dDwr(V * D);
      dWr.up(std::vector<bf16>(w.begin() + r * V * D,
                               w.begin() + (r + 1) * V * D));
      dDwr.up(std::vector<float>(dw0.begin() + r * V * D,
                                 dw0.begin() + (r + 1) * V * D));
      dYr.poison();
      VocabGroup g;
      g.ranks = ranks;
      g.offset = r * V;
      EmbeddingForwardArgs f{DType::BF16, dIds.p, dWr.p, dYr.p, N, V, D};
      f.group = g;
      ASSERT_EQ(embeddingForward(ctx, f), Status::Ok);
      EmbeddingBackwardArgs b{DType::BF16, dIds.p, dDy.p, dDwr.p, N, V, D};
      b.group = g;
      ASSERT_EQ(embeddingBackward(ctx, b), Status::Ok);
      sync();
      const auto yr = dYr.down();
      int64_t wrongRows = 0;
      for (int64_t n = 0; n < N; ++n) {
        const bool mine = ids[n] >= r * V && ids[n] < (r + 1) * V;
        bool rowOk = true;
        for (int64_t d = 0; d < D; ++d) {
          const uint16_t bits = yr[n * D + d].bits;
          rowOk = rowOk && bits == (mine ? y[n * D + d].bits : uint16_t(0));
          sum[n * D + d] += toFloat(yr[n * D + d]);
        }
        wrongRows += !rowOk;
      }
      EXPECT_EQ(wrongRows, 0) << "R=" << ranks << " rank " << r;
      const auto dwr = dDwr.down();
      dwSplit.insert(dwSplit.end(), dwr.begin(), dwr.end());
    }
    std::vector<bf16> sumBf16(N * D);
    for (int64_t i = 0; i < N * D; ++i)
      sumBf16[i] = bf16(sum[i]);
    EXPECT_TRUE(sameBytes(sumBf16, y)) << ranks;
    EXPECT_TRUE(sameBytes(dwSplit, dw)) << ranks;
  }
}

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

TEST_F(DenseCuda, AdamWBitwiseAndGradNorm) {
  const int64_t n = (int64_t(1) << 24) + 3;
  auto p = hashFloats(n, 90, 2.f), g = hashFloats(n, 91, 0.02f),
       m = hashFloats(n, 92, 0.01f), v = hashFloats(n, 93, 1e-4f);
  for (auto &x : v)
    x = std::fabs(x);
  // Grad norm over several tensors (views of g) with a clip.
  std::vector<GradTensor> hostT = {{g.data(), 1000003},
                                   {g.data() + 1000003, 65536},
                                   {g.data() + 1065539, 7},
                                   {g.data() + 1065546, n - 1065546}};
  float normRef = 0, clipRef = 0;
  GradNormArgs gnHost{hostT.data(), 4, 1.0, &normRef, &clipRef};
  ASSERT_EQ(gradNorm(host, gnHost), Status::Ok);
  Dev<float> dG(n), dNorm(1), dClip(1);
  dG.up(g);
  std::vector<GradTensor> devT = {{dG.p, 1000003},
                                  {dG.p + 1000003, 65536},
                                  {dG.p + 1065539, 7},
                                  {dG.p + 1065546, n - 1065546}};
  GradNormArgs gn{devT.data(), 4, 1.0, dNorm.p, dClip.p};
  reserve(gradNormWorkspaceBytes(Backend::Cuda, gn));
  dNorm.poison();
  dClip.poison();
  ASSERT_EQ(gradNorm(ctx, gn), Status::Ok);
  sync();
  float norm = dNorm.down()[0], clip = dClip.down()[0];
  EXPECT_NEAR(norm, normRef, 1e-6 * normRef);
  EXPECT_LT(clip, 1.0f);
  EXPECT_NEAR(clip, clipRef, 1e-6 * clipRef);

  // AdamW with the device clip coefficient vs the reference with the same.
  expectAdamWBitwise(p, m, v, g.data(), dG.p, DType::F32, &clip, dClip.p);
}

// A bf16 main grad (ZeRO-3): the norm over bf16 tensors (mixed with f32 in
// one list) within float's rounding of the reference, and AdamW reading the
// bf16 grad bitwise equal to the reference.
TEST_F(DenseCuda, AdamWAndGradNormReadBf16Grads) {
  const int64_t n = (int64_t(1) << 22) + 5;
  auto p = hashFloats(n, 94, 2.f), m = hashFloats(n, 95, 0.01f),
       v = hashFloats(n, 96, 1e-4f), f = hashFloats(70001, 97, 0.02f);
  for (auto &x : v)
    x = std::fabs(x);
  std::vector<bf16> g = randBf16(size_t(n), 98, 0.01f);
  std::vector<GradTensor> hostT = {
      {g.data(), 1000003, DType::BF16},
      {f.data(), int64_t(f.size())},
      {g.data() + 1000003, n - 1000003, DType::BF16}};
  float normRef = 0, clipRef = 0;
  GradNormArgs gnHost{hostT.data(), 3, 1.0, &normRef, &clipRef};
  ASSERT_EQ(gradNorm(host, gnHost), Status::Ok);
  Dev<bf16> dG{size_t(n)};
  Dev<float> dF(f.size()), dNorm(1), dClip(1);
  dG.up(g);
  dF.up(f);
  std::vector<GradTensor> devT = {{dG.p, 1000003, DType::BF16},
                                  {dF.p, int64_t(f.size())},
                                  {dG.p + 1000003, n - 1000003, DType::BF16}};
  GradNormArgs gn{devT.data(), 3, 1.0, dNorm.p, dClip.p};
  reserve(gradNormWorkspaceBytes(Backend::Cuda, gn));
  dNorm.poison();
  dClip.poison();
  ASSERT_EQ(gradNorm(ctx, gn), Status::Ok);
  sync();
  float norm = dNorm.down()[0], clip = dClip.down()[0];
  EXPECT_NEAR(norm, normRef, 1e-6 * normRef);
  EXPECT_NEAR(clip, clipRef, 1e-6 * clipRef);

  expectAdamWBitwise(p, m, v, g.data(), dG.p, DType::BF16, &clip, dClip.p);
}

// A grad view 4 bytes (f32) or 2 bytes (bf16) into its buffer cannot take
// the 16- or 8-byte loads of the four-a-thread kernel: the element-by-element
// one runs (the other would stop at a misaligned address), with the
// reference's bits; n % 4 = 1 leaves a tail for the aligned case too.
TEST_F(DenseCuda, AdamWMisalignedGradBitwise) {
  const int64_t n = 100001;
  auto p = hashFloats(n, 140, 2.f), m = hashFloats(n, 141, 0.01f),
       v = hashFloats(n, 142, 1e-4f), g = hashFloats(n + 1, 143, 0.02f);
  for (auto &x : v)
    x = std::fabs(x);
  std::vector<bf16> gb = randBf16(size_t(n + 1), 144, 0.01f);
  Dev<float> dG{size_t(n + 1)}, dClip{1};
  Dev<bf16> dGb{size_t(n + 1)};
  dG.up(g);
  dGb.up(gb);
  const float clip = 0.75f;
  dClip.up({clip});
  expectAdamWBitwise(p, m, v, g.data() + 1, dG.p + 1, DType::F32, &clip,
                     dClip.p);
  expectAdamWBitwise(p, m, v, gb.data() + 1, dGb.p + 1, DType::BF16, &clip,
                     dClip.p);
  // The same update from aligned views: the four-a-thread kernel, same bits.
  expectAdamWBitwise(p, m, v, g.data(), dG.p, DType::F32, &clip, dClip.p);
  expectAdamWBitwise(p, m, v, gb.data(), dGb.p, DType::BF16, &clip, dClip.p);
}

// AdamW over a list in few launches (adamWSteps): more tensors than one
// launch takes, f32 and bf16 grads, bf16, f32 and no compute copies, sizes
// from 1 to past a block's quads with every n % 4, one tensor whose grad view
// is misaligned (adamWStep alone, then a memset); every master, moment and
// copy equal to the reference's adamWStep bit for bit, every grad zero.
TEST_F(DenseCuda, AdamWStepsBitwiseAndZeroGrads) {
  const int numTensors = 230;
  const int64_t choices[] = {1,    3,    4,    5,     7, 1024,
                             4095, 4096, 4097, 70001, 0, 262147};
  struct Slot {
    int64_t n, off; // elements, offset in the flat buffers (a multiple of 4)
    DType grad, copy;
    bool hasCopy, misaligned;
  };
  std::vector<Slot> slots;
  int64_t total = 0;
  for (int t = 0; t < numTensors; ++t) {
    Slot sl;
    sl.n = choices[(uint32_t(t) * 2654435761u >> 7) % 12];
    sl.off = total;
    sl.grad = t % 2 ? DType::BF16 : DType::F32;
    sl.copy = t % 3 == 2 ? DType::F32 : DType::BF16;
    sl.hasCopy = t % 7 != 3;
    sl.misaligned = t == 17;
    slots.push_back(sl);
    total += (sl.n + 1 + 3) / 4 * 4; // room for the misaligned view's shift
  }
  auto p = hashFloats(total, 150, 2.f), m = hashFloats(total, 151, 0.01f),
       v = hashFloats(total, 152, 1e-4f), gf = hashFloats(total, 153, 0.02f);
  for (auto &x : v)
    x = std::fabs(x);
  std::vector<bf16> gb = randBf16(size_t(total), 154, 0.01f);
  Dev<float> dP{size_t(total)}, dM{size_t(total)}, dV{size_t(total)},
      dGf{size_t(total)}, dCopyF{size_t(total)}, dClip{1};
  Dev<bf16> dGb{size_t(total)}, dCopyB{size_t(total)};
  dP.up(p);
  dM.up(m);
  dV.up(v);
  dGf.up(gf);
  dGb.up(gb);
  dCopyF.poison();
  dCopyB.poison();
  const float clip = 0.6f;
  dClip.up({clip});
  std::vector<float> pr = p, mr = m, vr = v, copyFr(static_cast<size_t>(total));
  std::vector<bf16> copyBr(static_cast<size_t>(total));
  std::vector<AdamWArgs> devList;
  for (int t = 0; t < numTensors; ++t) {
    const Slot &sl = slots[t];
    const int64_t o = sl.off;
    const int64_t go = o + (sl.misaligned ? 1 : 0);
    AdamWArgs a;
    a.gradDType = sl.grad;
    a.computeDType = sl.copy;
    a.n = sl.n;
    a.lr = 1e-3;
    a.beta1 = 0.9;
    a.beta2 = 0.95;
    a.eps = 1e-8;
    a.weightDecay = t % 5 == 0 ? 0.0 : 0.1;
    a.step = 3 + t % 4;
    AdamWArgs h = a;
    h.master = pr.data() + o;
    h.expAvg = mr.data() + o;
    h.expAvgSq = vr.data() + o;
    h.grad = sl.grad == DType::BF16 ? static_cast<const void *>(gb.data() + go)
                                    : gf.data() + go;
    h.clipCoef = &clip;
    h.computeCopy = !sl.hasCopy ? nullptr
                    : sl.copy == DType::BF16
                        ? static_cast<void *>(copyBr.data() + o)
                        : copyFr.data() + o;
    ASSERT_EQ(adamWStep(host, h), Status::Ok) << t;
    a.master = dP.p + o;
    a.expAvg = dM.p + o;
    a.expAvgSq = dV.p + o;
    a.grad = sl.grad == DType::BF16 ? static_cast<const void *>(dGb.p + go)
                                    : dGf.p + go;
    a.clipCoef = dClip.p;
    a.computeCopy = !sl.hasCopy              ? nullptr
                    : sl.copy == DType::BF16 ? static_cast<void *>(dCopyB.p + o)
                                             : dCopyF.p + o;
    devList.push_back(a);
  }
  AdamWBatchArgs batch{devList.data(), int64_t(devList.size()), true};
  ASSERT_EQ(adamWSteps(ctx, batch), Status::Ok);
  sync();
  const auto P = dP.down(), M = dM.down(), V = dV.down(), CF = dCopyF.down(),
             GF = dGf.down();
  const auto CB = dCopyB.down(), GB = dGb.down();
  int wrong = 0;
  for (int t = 0; t < numTensors; ++t) {
    const Slot &sl = slots[t];
    const int64_t go = sl.off + (sl.misaligned ? 1 : 0);
    bool ok = true;
    for (int64_t i = sl.off; i < sl.off + sl.n; ++i) {
      ok = ok && std::memcmp(&P[i], &pr[i], 4) == 0 &&
           std::memcmp(&M[i], &mr[i], 4) == 0 &&
           std::memcmp(&V[i], &vr[i], 4) == 0;
      if (sl.hasCopy)
        ok = ok &&
             (sl.copy == DType::BF16 ? CB[i].bits == copyBr[i].bits
                                     : std::memcmp(&CF[i], &copyFr[i], 4) == 0);
    }
    for (int64_t i = go; i < go + sl.n; ++i)
      ok = ok && (sl.grad == DType::BF16 ? GB[i].bits == 0 : GF[i] == 0.f);
    wrong += !ok;
    EXPECT_TRUE(ok) << "tensor " << t << " n " << sl.n;
  }
  EXPECT_EQ(wrong, 0);
}

// The CUDA grad norm's order, emulated on the host in double: per tensor,
// blocks of kGradNormBlockElements; in a block, thread t of 256 sums
// elements t, t + 256, ... in order, then the 256 sums meet in the tree
// sh[t] += sh[t + k] for k = 128, 64, ..., 1; the block partials are added
// one after another in list order, after `initial`. Every operation is
// IEEE double (a float or bf16 squared is exact), so the GPU must give
// these bits whatever tensors it groups into a launch.
static double
cudaOrderSquares(const std::vector<std::function<double(int64_t)>> &elem,
                 const std::vector<int64_t> &sizes, double initial) {
  constexpr int kThreads = 256;
  double total = initial;
  for (size_t t = 0; t < sizes.size(); ++t) {
    for (int64_t b0 = 0; b0 < sizes[t]; b0 += kGradNormBlockElements) {
      const int64_t b1 = std::min(sizes[t], b0 + kGradNormBlockElements);
      double sh[kThreads];
      for (int th = 0; th < kThreads; ++th) {
        double s = 0;
        for (int64_t i = b0 + th; i < b1; i += kThreads) {
          double v = elem[t](i);
          s += v * v;
        }
        sh[th] = s;
      }
      for (int k = kThreads / 2; k > 0; k >>= 1)
        for (int th = 0; th < k; ++th)
          sh[th] += sh[th + k];
      total += sh[0];
    }
  }
  return total;
}

// Many tensors (more than one launch holds, f32 and bf16 interleaved, empty
// ones, sizes on both sides of a block boundary): the sum of squares and
// the norm are the bits of the emulated order, started from a pipeline
// stage's running sum, and match the reference to rounding.
TEST_F(DenseCuda, GradNormManyTensorsBitsOfTheBlockOrder) {
  const int numTensors = 600;
  std::vector<int64_t> sizes(numTensors);
  std::vector<DType> types(numTensors);
  int64_t nf = 0, nb = 0;
  for (int t = 0; t < numTensors; ++t) {
    const uint32_t h = uint32_t(t) * 2654435761u;
    const int64_t choices[] = {0,      1,     7,     1024,         4096,
                               65535,  65536, 65537, 131072 + 300, 2048,
                               200003, 5000,  16};
    sizes[t] = choices[h % 13];
    types[t] = (t % 3 == 1) ? DType::BF16 : DType::F32;
    (types[t] == DType::BF16 ? nb : nf) += sizes[t];
  }
  auto f = hashFloats(nf, 130, 0.02f);
  std::vector<bf16> g = randBf16(size_t(nb), 131, 0.01f);
  Dev<float> dF{size_t(nf)};
  Dev<bf16> dG{size_t(nb)};
  dF.up(f);
  dG.up(g);
  std::vector<GradTensor> hostT, devT;
  std::vector<std::function<double(int64_t)>> elem;
  int64_t of = 0, ob = 0;
  for (int t = 0; t < numTensors; ++t) {
    if (types[t] == DType::BF16) {
      hostT.push_back({g.data() + ob, sizes[t], DType::BF16});
      devT.push_back({dG.p + ob, sizes[t], DType::BF16});
      const bf16 *base = g.data() + ob;
      elem.push_back([base](int64_t i) { return double(toFloat(base[i])); });
      ob += sizes[t];
    } else {
      hostT.push_back({f.data() + of, sizes[t]});
      devT.push_back({dF.p + of, sizes[t]});
      const float *base = f.data() + of;
      elem.push_back([base](int64_t i) { return double(base[i]); });
      of += sizes[t];
    }
  }
  const double initial = 3.25;
  const double want = cudaOrderSquares(elem, sizes, initial);

  Dev<float> dNorm(1), dClip(1);
  Dev<double> dInitial(1), dSquares(1);
  dInitial.up({initial});
  GradNormArgs gn{devT.data(), numTensors, 1.0,       dNorm.p,
                  dClip.p,     dInitial.p, dSquares.p};
  reserve(gradNormWorkspaceBytes(Backend::Cuda, gn));
  dNorm.poison();
  dSquares.poison();
  ASSERT_EQ(gradNorm(ctx, gn), Status::Ok);
  sync();
  const double squares = dSquares.down()[0];
  const float norm = dNorm.down()[0];
  EXPECT_EQ(std::memcmp(&squares, &want, 8), 0)
      << "squares " << squares << " want " << want;
  const float wantNorm = float(std::sqrt(want));
  EXPECT_EQ(std::memcmp(&norm, &wantNorm, 4), 0)
      << "norm " << norm << " want " << wantNorm;

  // The reference (its own order) agrees to rounding.
  float normRef = 0, clipRef = 0;
  double initialHost = initial, squaresRef = 0;
  GradNormArgs gnHost{hostT.data(), numTensors,   1.0,        &normRef,
                      &clipRef,     &initialHost, &squaresRef};
  ASSERT_EQ(gradNorm(host, gnHost), Status::Ok);
  EXPECT_NEAR(squares, squaresRef, 1e-12 * squaresRef);
  EXPECT_NEAR(dClip.down()[0], clipRef, 1e-6 * clipRef);
}

//===----------------------------------------------------------------------===//
// Long sequences: 131072 tokens (Qwen3.5-0.8B at seq 128k, or B x T of it)
//===----------------------------------------------------------------------===//
//
// Run alone with --gtest_filter='*Long*': the embedding and the chunked LM
// head + cross-entropy over 131072 tokens of the full vocabulary (the logits
// would be 3.3e10 elements whole), and a cross-entropy chunk of more rows
// than a grid's y dimension holds.

using ap::test::ErrAcc;
using ap::test::fastUniform;
using ap::test::GuardedWorkspace;
using ap::test::nonFiniteBf16;
using ap::test::nonFiniteF32;
using ap::test::parallelFor;

constexpr int64_t kLongTokens = 131072;

/// Token ids / labels: random over the vocabulary, repeats, the last id.
std::vector<int32_t> longIds(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> ids(n);
  std::mt19937 gen(seed);
  for (int64_t i = 0; i < n; ++i)
    ids[i] = i % 5 == 0 ? int32_t(i % 7) : int32_t(gen() % vocab);
  ids[n - 1] = int32_t(vocab - 1);
  return ids;
}

/// The final RMSNorm over 131072 rows of 1024, and RoPE of the attention
/// q (8 heads of 256, a quarter rotated, theta 1e7) at positions up to
/// 131071 (angles in double on both sides).
TEST_F(DenseCuda, LongT131072RmsNormAndRope) {
  rmsNormCase(kLongTokens, kD, 0, true);
  RopeArgs a{DType::BF16};
  a.batch = 1;
  a.seq = kLongTokens;
  a.heads = 8;
  a.headDim = 256;
  a.offset = 0;
  a.rotaryDim = 64;
  a.theta = 1e7;
  ropeCase(a, fastUniform<bf16>(a.seq * a.heads * a.headDim, 89, -2, 2));
}

// Packed sequences: the document starts of 2 rows of 131072 ids (several
// thread tiles per row), separators at random places, in runs, at the row
// ends and none in the second row, against the host kernel.
TEST_F(DenseCuda, LongT131072DocumentStartsMatchHost) {
  const int64_t B = 2, T = kLongTokens;
  const int32_t sep = 7;
  std::vector<int32_t> ids(B * T);
  std::mt19937 gen(90);
  for (int64_t i = 0; i < B * T; ++i)
    ids[i] = int32_t(gen() % 1000);
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] == sep || gen() % 997 == 0)
      ids[t] = sep;
    if (ids[T + t] == sep)
      ids[T + t] = sep + 1;
  }
  ids[0] = ids[1] = ids[2] = sep;
  ids[T - 1] = sep;
  DocumentStartsArgs a;
  a.batch = B;
  a.seq = T;
  a.separator = sep;
  std::vector<int32_t> want(B * T);
  a.tokens = ids.data();
  a.docStart = want.data();
  ASSERT_EQ(documentStarts(host, a), Status::Ok);
  Dev<int32_t> dIds(B * T), dStart(B * T);
  dIds.up(ids);
  dStart.poison();
  a.tokens = dIds.p;
  a.docStart = dStart.p;
  ASSERT_EQ(documentStarts(ctx, a), Status::Ok);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(dStart.down(), want);
}

TEST_F(DenseCuda, LongT131072EmbeddingBitwise) {
  const int64_t N = kLongTokens, V = kV, D = kD;
  embeddingBitwise(longIds(N, V, 92), fastUniform<bf16>(V * D, 90, -0.05, 0.05),
                   fastUniform<bf16>(N * D, 91, -1, 1),
                   fastUniform<float>(V * D, 93, -1e-3, 1e-3), D);
}

/// The LM head + cross-entropy over 131072 tokens in chunks of 1024 (the
/// plan's default), forward and backward: lse, dh and dW finite everywhere,
/// the guards intact, a second run the same bits; float64 checks of the lse
/// and dh rows of tokens at the start, chunk edges, the middle and the end,
/// of the loss (from the GPU's lse, checked on those rows, and float64 label
/// logits of every token), and of dW rows (float64 over every token, with P
/// from the GPU's lse). Bounds as above: 1e-4 for lse and the loss, 2e-2
/// for gradients.
TEST_F(DenseCuda, LongT131072LmHeadCrossEntropyRows) {
  const int64_t N = kLongTokens, D = kD, V = kV;
  // Logits about N(0, 1): h in [-1, 1), w in [-0.094, 0.094).
  auto h = fastUniform<bf16>(N * D, 94, -1, 1),
       w = fastUniform<bf16>(V * D, 95, -0.094, 0.094);
  auto labels = longIds(N, V, 96);
  int32_t valid = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (n % 97 == 3)
      labels[n] = -100;
    valid += labels[n] != -100;
  }
  Dev<bf16> dH(N * D), dWt(V * D), dDh(N * D);
  Dev<int32_t> dLab(N), dCount(1);
  Dev<float> dLoss(1), dLse(N), dDW(V * D);
  for (void *p : {(void *)dH.p, (void *)dWt.p, (void *)dDh.p, (void *)dDW.p})
    ASSERT_NE(p, nullptr) << "cudaMalloc";
  dH.up(h);
  dWt.up(w);
  dLab.up(labels);
  LmHeadCrossEntropyArgs a;
  a.dtype = DType::BF16;
  a.hidden = dH.p;
  a.weight = dWt.p;
  a.labels = dLab.p;
  a.tokens = N;
  a.dim = D;
  a.vocab = V;
  a.chunkTokens = 1024;
  a.lossSum = dLoss.p;
  a.validCount = dCount.p;
  a.lse = dLse.p;
  a.gradScale = 1.0 / valid;
  a.dHidden = dDh.p;
  a.dWeight = dDW.p;
  const size_t wsBytes = lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, a);
  GuardedWorkspace gws(wsBytes);
  ASSERT_NE(gws.p(), nullptr);
  KernelContext c = ctx;
  c.workspace = gws.p();
  c.workspaceBytes = wsBytes;
  std::vector<bf16> dh;
  std::vector<float> lse, dW;
  float loss = 0;
  for (int run = 0; run < 2; ++run) {
    dDh.poison();
    dLse.poison();
    dLoss.poison();
    gws.poison();
    ASSERT_EQ(cudaMemset(dDW.p, 0, V * D * sizeof(float)), cudaSuccess);
    ASSERT_EQ(lmHeadCrossEntropyBackward(c, a), Status::Ok);
    sync();
    EXPECT_TRUE(gws.intact())
        << "wrote outside its " << wsBytes << "-byte workspace";
    EXPECT_EQ(dCount.down()[0], valid);
    if (run == 0) {
      dh = dDh.down(), lse = dLse.down(), dW = dDW.down();
      loss = dLoss.down()[0];
      EXPECT_EQ(nonFiniteBf16(dh.data(), dh.size()), 0u) << "dh";
      EXPECT_EQ(nonFiniteF32(lse.data(), lse.size()), 0u) << "lse";
      EXPECT_EQ(nonFiniteF32(dW.data(), dW.size()), 0u) << "dW";
    } else {
      EXPECT_EQ(dLoss.down()[0], loss);
      EXPECT_TRUE(sameBytes(dDh.down(), dh));
      EXPECT_TRUE(sameBytes(dLse.down(), lse));
      EXPECT_TRUE(sameBytes(dDW.down(), dW));
    }
  }
  std::vector<float> hf(N * D), wf(V * D);
  parallelFor(size_t(N), [&](size_t n) {
    for (int64_t d = 0; d < D; ++d)
      hf[n * D + d] = toFloat(h[n * D + d]);
  });
  parallelFor(size_t(V), [&](size_t v) {
    for (int64_t d = 0; d < D; ++d)
      wf[v * D + d] = toFloat(w[v * D + d]);
  });
  auto dotHW = [&](int64_t n, int64_t v) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d)
      s += double(hf[n * D + d]) * wf[v * D + d];
    return s;
  };
  const double scale = a.gradScale;
  // Token rows: lse and dh in float64.
  const int64_t toks[] = {0, 1, 1023, 1024, 3, N / 2, N - 1025, N - 1};
  constexpr size_t kToks = std::size(toks);
  ErrAcc eDh[kToks];
  double lseErr[kToks] = {};
  parallelFor(kToks, [&](size_t t) {
    const int64_t n = toks[t];
    std::vector<double> logit(V);
    double m = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
      m = std::max(m, logit[v] = dotHW(n, v));
    double sum = 0;
    for (int64_t v = 0; v < V; ++v)
      sum += std::exp(logit[v] - m);
    const double ls = m + std::log(sum);
    lseErr[t] = std::fabs(lse[n] - ls) / std::max(1.0, std::fabs(ls));
    std::vector<double> g(D, 0.0);
    if (labels[n] != -100)
      for (int64_t v = 0; v < V; ++v) {
        const double p = std::exp(logit[v] - ls) - (v == labels[n] ? 1 : 0);
        for (int64_t d = 0; d < D; ++d)
          g[d] += scale * p * wf[v * D + d];
      }
    for (int64_t d = 0; d < D; ++d)
      eDh[t].add(toFloat(dh[n * D + d]), g[d]);
  });
  // The loss: sum of lse - label logit over valid tokens.
  constexpr int64_t kBlk = 4096;
  std::vector<double> part(N / kBlk, 0.0);
  parallelFor(part.size(), [&](size_t b) {
    for (int64_t n = int64_t(b) * kBlk; n < int64_t(b + 1) * kBlk; ++n)
      if (labels[n] != -100)
        part[b] += lse[n] - dotHW(n, labels[n]);
  });
  double lossRef = 0;
  for (double p : part)
    lossRef += p;
  // dW rows: labels of checked tokens, the first and last rows, one more.
  const int64_t vrows[] = {labels[0], labels[N - 1], 0, V - 1, 123457};
  constexpr size_t kRows = std::size(vrows);
  ErrAcc eDw[kRows];
  parallelFor(kRows, [&](size_t r) {
    const int64_t v = vrows[r];
    std::vector<double> g(D, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      if (labels[n] == -100)
        continue;
      const double p =
          std::exp(dotHW(n, v) - lse[n]) - (v == labels[n] ? 1 : 0);
      for (int64_t d = 0; d < D; ++d)
        g[d] += scale * p * hf[n * D + d];
    }
    for (int64_t d = 0; d < D; ++d)
      eDw[r].add(dW[v * D + d], g[d]);
  });
  ErrAcc tDh, tDw;
  double tLse = 0;
  for (size_t t = 0; t < kToks; ++t) {
    tDh.merge(eDh[t]);
    tLse = std::max(tLse, lseErr[t]);
  }
  for (size_t r = 0; r < kRows; ++r)
    tDw.merge(eDw[r]);
  std::printf("[lm head long] N=%lld loss %.6e ref %.6e; lse rel %.2e, dh "
              "%.2e over %zu rows, dW %.2e over %zu rows\n",
              (long long)N, double(loss), lossRef, tLse, tDh.rel(), kToks,
              tDw.rel(), kRows);
  EXPECT_NEAR(loss, lossRef, 1e-4 * std::fabs(lossRef));
  EXPECT_LT(tLse, 1e-4);
  EXPECT_LT(tDh.rel(), 2e-2);
  EXPECT_LT(tDw.rel(), 2e-2);
}

/// One cross-entropy chunk of 70000 tokens: more rows than a grid's y
/// dimension (65535) holds, which the gradient kernel's rows stride over
/// (chunk_tokens is any positive count). Small vocabulary and width, so the
/// host reference checks every output.
TEST_F(DenseCuda, LongCrossEntropyChunkPastGridRows) {
  const int64_t N = 70000, D = 32, V = 256;
  auto h = fastUniform<bf16>(N * D, 97, -1, 1),
       w = fastUniform<bf16>(V * D, 98, -0.3, 0.3);
  auto labels = longIds(N, V, 99);
  labels[65535] = -100;
  LmHeadCrossEntropyArgs a;
  a.dtype = DType::BF16;
  a.tokens = N;
  a.dim = D;
  a.vocab = V;
  a.chunkTokens = N;
  a.gradScale = 1.0 / N;
  crossEntropyVsReference(a, h, w, labels);
}

} // namespace

#else
TEST(DenseCuda, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }
#endif
