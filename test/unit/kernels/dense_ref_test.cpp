//===- dense_ref_test.cpp - dense reference kernels vs float64 math -*- C++
//-*-===//
//
// CI tests of the dense reference kernels (kernels/dense.h, host backend):
// float64 instances against direct float64 formulas and central finite
// differences, bf16/f32 instances against float64 within stated bounds,
// chunked cross-entropy against the unchunked formula, the vocabulary split
// over ranks (run as threads) against the unsplit kernels, AdamW against the
// textbook update.
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"
#include "vocab_threads.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <type_traits>
#include <vector>

using namespace ap::kernels;

namespace {

KernelContext hostCtx() { return KernelContext{}; }

std::vector<double> randn(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (auto &x : v)
    x = d(gen);
  return v;
}

std::vector<bf16> toBf16(const std::vector<double> &v) {
  std::vector<bf16> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = bf16(float(v[i]));
  return r;
}
std::vector<float> toF32(const std::vector<double> &v) {
  return std::vector<float>(v.begin(), v.end());
}
/// The values a bf16 tensor really holds, in double.
std::vector<double> roundBf16(const std::vector<double> &v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = double(float(bf16(float(v[i]))));
  return r;
}
template <class T> std::vector<double> toD(const std::vector<T> &v) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = double(toFloat(v[i]));
  return r;
}

double dot(const std::vector<double> &a, const std::vector<double> &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}

/// Max |a - b| / (max |b| over the tensor): a tensor-relative error, robust
/// to entries near zero.
double relErr(const std::vector<double> &a, const std::vector<double> &b) {
  double mx = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    mx = std::max(mx, std::fabs(a[i] - b[i]));
    mb = std::max(mb, std::fabs(b[i]));
  }
  return mx / std::max(mb, 1e-300);
}

/// Central finite differences of f at x along every coordinate, compared
/// with the analytic gradient g.
void checkFd(std::vector<double> x,
             const std::function<double(const std::vector<double> &)> &f,
             const std::vector<double> &g, double tol = 1e-6, double h = 1e-5) {
  ASSERT_EQ(x.size(), g.size());
  std::vector<double> fd(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = x[i];
    x[i] = x0 + h;
    double fp = f(x);
    x[i] = x0 - h;
    double fm = f(x);
    x[i] = x0;
    fd[i] = (fp - fm) / (2 * h);
  }
  EXPECT_LT(relErr(g, fd), tol);
}

//===----------------------------------------------------------------------===//
// GEMM
//===----------------------------------------------------------------------===//

std::vector<double> naiveLinear(const std::vector<double> &x,
                                const std::vector<double> &w, int64_t M,
                                int64_t K, int64_t N) {
  std::vector<double> y(M * N, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += x[i * K + k] * w[j * K + k];
      y[i * N + j] = s;
    }
  return y;
}

TEST(DenseRef, LinearF64MatchesNaiveAndFiniteDifferences) {
  const int64_t M = 7, K = 13, N = 5; // K not a multiple of 8: tail path
  auto x = randn(M * K, 1), w = randn(N * K, 2), r = randn(M * N, 3);
  std::vector<double> y(M * N);
  ASSERT_EQ(linearForward(hostCtx(),
                          {DType::F64, x.data(), w.data(), y.data(), M, K, N}),
            Status::Ok);
  EXPECT_LT(relErr(y, naiveLinear(x, w, M, K, N)), 1e-14);

  // L = sum(y * r): dy = r.
  std::vector<double> dx(M * K, 123.0), dw(N * K, 0.5), dw0 = dw;
  LinearBackwardArgs b{DType::F64, x.data(), w.data(), r.data(), dx.data(),
                       dw.data(),  M,        K,        N};
  ASSERT_EQ(linearBackward(hostCtx(), b), Status::Ok);
  auto loss = [&](const std::vector<double> &xx,
                  const std::vector<double> &ww) {
    return dot(naiveLinear(xx, ww, M, K, N), r);
  };
  auto fdX = [&](auto &xx) { return loss(xx, w); };
  checkFd(x, fdX, dx);
  std::vector<double> dwOnly(N * K);
  for (size_t i = 0; i < dw.size(); ++i)
    dwOnly[i] = dw[i] - dw0[i]; // dw accumulates onto the main grad
  auto fdW = [&](auto &ww) { return loss(x, ww); };
  checkFd(w, fdW, dwOnly);
  // A second microbatch adds the same gradient again.
  ASSERT_EQ(linearBackward(hostCtx(), {DType::F64, x.data(), w.data(), r.data(),
                                       nullptr, dw.data(), M, K, N}),
            Status::Ok);
  for (size_t i = 0; i < dw.size(); ++i)
    EXPECT_NEAR(dw[i], dw0[i] + 2 * dwOnly[i], 1e-12);
}

TEST(DenseRef, LinearBf16AndF32WithinBounds) {
  const int64_t M = 33, K = 70, N = 19;
  auto x = roundBf16(randn(M * K, 4)), w = roundBf16(randn(N * K, 5)),
       dy = roundBf16(randn(M * N, 6));
  auto yRef = naiveLinear(x, w, M, K, N);
  auto xb = toBf16(x), wb = toBf16(w), dyb = toBf16(dy);
  std::vector<bf16> yb(M * N);
  ASSERT_EQ(linearForward(hostCtx(), {DType::BF16, xb.data(), wb.data(),
                                      yb.data(), M, K, N}),
            Status::Ok);
  // One bf16 rounding of the output (2^-8 relative) dominates.
  EXPECT_LT(relErr(toD(yb), yRef), 8e-3);
  auto xf = toF32(x), wf = toF32(w);
  std::vector<float> yf(M * N);
  ASSERT_EQ(linearForward(hostCtx(), {DType::F32, xf.data(), wf.data(),
                                      yf.data(), M, K, N}),
            Status::Ok);
  EXPECT_LT(relErr(toD(yf), yRef), 1e-5);
  // bf16 backward: dx rounded to bf16, dw in f32.
  std::vector<bf16> dxb(M * K);
  std::vector<float> dwf(N * K, 0.f);
  ASSERT_EQ(
      linearBackward(hostCtx(), {DType::BF16, xb.data(), wb.data(), dyb.data(),
                                 dxb.data(), dwf.data(), M, K, N}),
      Status::Ok);
  std::vector<double> dxRef(M * K, 0.0), dwRef(N * K, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) {
        dxRef[i * K + k] += dy[i * N + j] * w[j * K + k];
        dwRef[j * K + k] += dy[i * N + j] * x[i * K + k];
      }
  EXPECT_LT(relErr(toD(dxb), dxRef), 8e-3);
  EXPECT_LT(relErr(toD(dwf), dwRef), 1e-5);
}

TEST(DenseRef, InvalidArgumentsAndCudaWithoutKernels) {
  std::vector<float> a(4), b(4), c(4);
  EXPECT_EQ(linearForward(hostCtx(),
                          {DType::F32, a.data(), b.data(), c.data(), 0, 2, 2}),
            Status::InvalidArgument);
  EXPECT_EQ(linearForward(hostCtx(),
                          {DType::I32, a.data(), b.data(), c.data(), 2, 2, 2}),
            Status::InvalidArgument);
#if !defined(ACTPLACE_HAVE_CUDA)
  KernelContext cuda;
  cuda.backend = Backend::Cuda;
  EXPECT_EQ(
      linearForward(cuda, {DType::F32, a.data(), b.data(), c.data(), 2, 2, 2}),
      Status::Unsupported);
#endif
}

//===----------------------------------------------------------------------===//
// RMSNorm
//===----------------------------------------------------------------------===//

std::vector<double> naiveRmsNorm(const std::vector<double> &x,
                                 const std::vector<double> &w, int64_t rows,
                                 int64_t dim, double eps, bool zc) {
  std::vector<double> y(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j)
      ss += x[r * dim + j] * x[r * dim + j];
    double rs = 1.0 / std::sqrt(ss / dim + eps);
    for (int64_t j = 0; j < dim; ++j)
      y[r * dim + j] = x[r * dim + j] * rs * (zc ? 1 + w[j] : w[j]);
  }
  return y;
}

class DenseRefRmsNorm : public ::testing::TestWithParam<bool> {};

TEST_P(DenseRefRmsNorm, F64FormulaAndFiniteDifferences) {
  const bool zc = GetParam();
  const int64_t rows = 6, dim = 10;
  const double eps = 1e-6;
  auto x = randn(rows * dim, 10), w = randn(dim, 11, 0.5),
       r = randn(rows * dim, 12);
  std::vector<double> y(rows * dim), rstd(rows);
  RmsNormForwardArgs f{DType::F64,  x.data(), w.data(), y.data(),
                       rstd.data(), rows,     dim};
  f.eps = eps;
  f.zeroCentered = zc;
  ASSERT_EQ(rmsNormForward(hostCtx(), f), Status::Ok);
  EXPECT_LT(relErr(y, naiveRmsNorm(x, w, rows, dim, eps, zc)), 1e-14);

  std::vector<double> dx(rows * dim, 7.0), dw(dim, 0.25);
  RmsNormBackwardArgs b{DType::F64, x.data(),  w.data(), rstd.data(), r.data(),
                        dx.data(),  dw.data(), rows,     dim};
  b.zeroCentered = zc;
  ASSERT_EQ(rmsNormBackward(hostCtx(), b), Status::Ok);
  for (auto &v : dw)
    v -= 0.25;
  checkFd(
      x,
      [&](auto &xx) { return dot(naiveRmsNorm(xx, w, rows, dim, eps, zc), r); },
      dx);
  checkFd(
      w,
      [&](auto &ww) { return dot(naiveRmsNorm(x, ww, rows, dim, eps, zc), r); },
      dw);
}

TEST_P(DenseRefRmsNorm, StridedViewsAndBf16Bound) {
  const bool zc = GetParam();
  // q_norm over the q half of a gated [rows, 2*dim] projection.
  const int64_t rows = 12, dim = 16;
  auto xBig = roundBf16(randn(rows * 2 * dim, 20)),
       w = roundBf16(randn(dim, 21, 0.3)),
       dyBig = roundBf16(randn(rows * 2 * dim, 22));
  std::vector<double> x(rows * dim), dy(rows * dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < dim; ++j) {
      x[r * dim + j] = xBig[r * 2 * dim + j];
      dy[r * dim + j] = dyBig[r * 2 * dim + j];
    }
  auto xb = toBf16(xBig), wb = toBf16(w), dyb = toBf16(dyBig);
  std::vector<bf16> y(rows * 3 * dim, bf16(99.f)),
      dx(rows * 2 * dim, bf16(99.f));
  std::vector<float> rstd(rows), dw(dim, 0.f);
  RmsNormForwardArgs f{DType::BF16, xb.data(), wb.data(), y.data(), rstd.data(),
                       rows,        dim,       2 * dim,   3 * dim};
  f.zeroCentered = zc;
  ASSERT_EQ(rmsNormForward(hostCtx(), f), Status::Ok);
  auto yRef = naiveRmsNorm(x, w, rows, dim, 1e-6, zc);
  std::vector<double> yGot(rows * dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < 3 * dim; ++j) {
      if (j < dim)
        yGot[r * dim + j] = toFloat(y[r * 3 * dim + j]);
      else // outside the view: untouched
        EXPECT_EQ(toFloat(y[r * 3 * dim + j]), 99.f);
    }
  EXPECT_LT(relErr(yGot, yRef), 8e-3);

  RmsNormBackwardArgs b{DType::BF16, xb.data(),  wb.data(),
                        rstd.data(), dyb.data(), dx.data(),
                        dw.data(),   rows,       dim};
  b.xStride = 2 * dim;
  b.dyStride = 2 * dim;
  b.dxStride = 2 * dim;
  b.zeroCentered = zc;
  ASSERT_EQ(rmsNormBackward(hostCtx(), b), Status::Ok);
  // float64 backward on the same (bf16) inputs.
  std::vector<double> rs64(rows), dx64(rows * dim), dw64(dim, 0.0);
  std::vector<double> dummy(rows * dim);
  RmsNormForwardArgs f64{DType::F64,  x.data(), w.data(), dummy.data(),
                         rs64.data(), rows,     dim};
  f64.zeroCentered = zc;
  ASSERT_EQ(rmsNormForward(hostCtx(), f64), Status::Ok);
  RmsNormBackwardArgs b64{DType::F64,  x.data(),  w.data(),
                          rs64.data(), dy.data(), dx64.data(),
                          dw64.data(), rows,      dim};
  b64.zeroCentered = zc;
  ASSERT_EQ(rmsNormBackward(hostCtx(), b64), Status::Ok);
  std::vector<double> dxGot(rows * dim);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < 2 * dim; ++j) {
      if (j < dim)
        dxGot[r * dim + j] = toFloat(dx[r * 2 * dim + j]);
      else
        EXPECT_EQ(toFloat(dx[r * 2 * dim + j]), 99.f);
    }
  EXPECT_LT(relErr(dxGot, dx64), 1e-2);
  EXPECT_LT(relErr(toD(dw), dw64), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Variants, DenseRefRmsNorm, ::testing::Bool());

//===----------------------------------------------------------------------===//
// RoPE
//===----------------------------------------------------------------------===//

TEST(DenseRef, RopeFormulaAdjointAndInverse) {
  // Qwen3.5-like partial rotary on two batch rows.
  RopeArgs a{DType::F64};
  a.batch = 2;
  a.seq = 9;
  a.heads = 3;
  a.headDim = 24;
  a.offset = 0;
  a.rotaryDim = 8;
  a.theta = 1e7;
  const int64_t n = a.batch * a.seq * a.heads * a.headDim;
  auto x = randn(n, 30), r = randn(n, 31);
  std::vector<double> y(n), back(n), rt(n);
  a.x = x.data();
  a.y = y.data();
  ASSERT_EQ(ropeForward(hostCtx(), a), Status::Ok);
  const int64_t h = a.rotaryDim / 2;
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t t = 0; t < a.seq; ++t)
      for (int64_t hh = 0; hh < a.heads; ++hh) {
        int64_t base = ((b * a.seq + t) * a.heads + hh) * a.headDim;
        for (int64_t j = a.rotaryDim; j < a.headDim; ++j)
          EXPECT_EQ(y[base + j], x[base + j]);
        for (int64_t i = 0; i < h; ++i) {
          double ang = t * std::pow(1e7, -2.0 * i / a.rotaryDim);
          EXPECT_NEAR(y[base + i],
                      x[base + i] * std::cos(ang) -
                          x[base + i + h] * std::sin(ang),
                      1e-13);
          EXPECT_NEAR(y[base + i + h],
                      x[base + i + h] * std::cos(ang) +
                          x[base + i] * std::sin(ang),
                      1e-13);
        }
      }
  // Backward is the adjoint: <R x, r> = <x, R^T r>.
  a.x = r.data();
  a.y = rt.data();
  ASSERT_EQ(ropeBackward(hostCtx(), a), Status::Ok);
  EXPECT_NEAR(dot(y, r), dot(x, rt), 1e-12 * n);
  // ... and the inverse: R^T R x = x; in place.
  back = y;
  a.x = back.data();
  a.y = back.data();
  ASSERT_EQ(ropeBackward(hostCtx(), a), Status::Ok);
  EXPECT_LT(relErr(back, x), 1e-14);
}

TEST(DenseRef, RopeMlaOffsetAndBf16) {
  // MLA q heads of 192 = 128 nope + 64 rope (rope dims last).
  RopeArgs a{DType::BF16};
  a.batch = 1;
  a.seq = 17;
  a.heads = 2;
  a.headDim = 192;
  a.offset = 128;
  a.rotaryDim = 64;
  a.theta = 1e4;
  const int64_t n = a.seq * a.heads * a.headDim;
  auto x = roundBf16(randn(n, 40));
  auto xb = toBf16(x);
  std::vector<bf16> yb(n);
  a.x = xb.data();
  a.y = yb.data();
  ASSERT_EQ(ropeForward(hostCtx(), a), Status::Ok);
  std::vector<double> y64(n);
  RopeArgs a64 = a;
  a64.dtype = DType::F64;
  a64.x = x.data();
  a64.y = y64.data();
  ASSERT_EQ(ropeForward(hostCtx(), a64), Status::Ok);
  EXPECT_LT(relErr(toD(yb), y64), 8e-3);
  for (int64_t t = 0; t < a.seq * a.heads; ++t)
    for (int64_t j = 0; j < 128; ++j) // nope dims copied bit for bit
      EXPECT_EQ(yb[t * 192 + j].bits, xb[t * 192 + j].bits);
  a.rotaryDim = 65;
  EXPECT_EQ(ropeForward(hostCtx(), a), Status::InvalidArgument);
}

//===----------------------------------------------------------------------===//
// SwiGLU, sigmoid gate, residual
//===----------------------------------------------------------------------===//

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(DenseRef, SwiGluFiniteDifferences) {
  const int64_t rows = 4, cols = 9;
  auto g = randn(rows * cols, 50, 2.0), u = randn(rows * cols, 51),
       r = randn(rows * cols, 52);
  auto fwd = [&](const std::vector<double> &gg, const std::vector<double> &uu) {
    std::vector<double> y(rows * cols);
    SwiGluForwardArgs a{DType::F64, gg.data(), uu.data(), y.data(), rows, cols};
    EXPECT_EQ(swiGluForward(hostCtx(), a), Status::Ok);
    return y;
  };
  auto y = fwd(g, u);
  for (size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(y[i], g[i] * sig(g[i]) * u[i], 1e-14);
  std::vector<double> dg(rows * cols), du(rows * cols);
  SwiGluBackwardArgs b{DType::F64, g.data(),  u.data(), r.data(),
                       dg.data(),  du.data(), rows,     cols};
  ASSERT_EQ(swiGluBackward(hostCtx(), b), Status::Ok);
  auto fdG = [&](auto &gg) { return dot(fwd(gg, u), r); };
  checkFd(g, fdG, dg);
  auto fdU = [&](auto &uu) { return dot(fwd(g, uu), r); };
  checkFd(u, fdU, du);
}

TEST(DenseRef, SwiGluFusedHalvesBf16) {
  // gate and up as the two halves of one [rows, 2*cols] projection.
  const int64_t rows = 5, cols = 12;
  auto gu = roundBf16(randn(rows * 2 * cols, 53, 2.0));
  auto gub = toBf16(gu);
  std::vector<bf16> y(rows * cols);
  SwiGluForwardArgs a{DType::BF16, gub.data(), gub.data() + cols,
                      y.data(),    rows,       cols,
                      2 * cols,    2 * cols,   0};
  ASSERT_EQ(swiGluForward(hostCtx(), a), Status::Ok);
  std::vector<double> ref(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      double gv = gu[r * 2 * cols + c], uv = gu[r * 2 * cols + cols + c];
      ref[r * cols + c] = gv * sig(gv) * uv;
    }
  EXPECT_LT(relErr(toD(y), ref), 8e-3);
}

TEST(DenseRef, SwiGluBackwardRebuildsForwardBitsBf16) {
  // The fused recompute (train-fuse-recompute) takes y from the backward:
  // it must be the forward's bytes, and asking for it must not change dg, du.
  // Gate and up as strided halves of one projection, as in a fused MLP.
  const int64_t rows = 7, cols = 10;
  auto gub = toBf16(roundBf16(randn(rows * 2 * cols, 54, 3.0)));
  auto dy = toBf16(roundBf16(randn(rows * cols, 55)));
  std::vector<bf16> yFwd(rows * cols), yBwd(rows * cols, bf16{}),
      dg(rows * cols), du(rows * cols), dg2(rows * cols), du2(rows * cols);
  SwiGluForwardArgs f{DType::BF16, gub.data(), gub.data() + cols,
                      yFwd.data(), rows,       cols,
                      2 * cols,    2 * cols,   0};
  ASSERT_EQ(swiGluForward(hostCtx(), f), Status::Ok);
  SwiGluBackwardArgs b{DType::BF16, gub.data(), gub.data() + cols,
                       dy.data(),   dg.data(),  du.data(),
                       rows,        cols,       2 * cols,
                       2 * cols};
  ASSERT_EQ(swiGluBackward(hostCtx(), b), Status::Ok);
  SwiGluBackwardArgs fused = b;
  fused.dgate = dg2.data();
  fused.dup = du2.data();
  fused.y = yBwd.data();
  ASSERT_EQ(swiGluBackward(hostCtx(), fused), Status::Ok);
  EXPECT_EQ(std::memcmp(yFwd.data(), yBwd.data(), yFwd.size() * sizeof(bf16)),
            0);
  EXPECT_EQ(std::memcmp(dg.data(), dg2.data(), dg.size() * sizeof(bf16)), 0);
  EXPECT_EQ(std::memcmp(du.data(), du2.data(), du.size() * sizeof(bf16)), 0);
}

TEST(DenseRef, RmsNormBackwardRebuildsForwardBitsBf16) {
  // train-fuse-recompute: the norm backward writes y from the saved rstd;
  // it must be the forward's bytes, and dx, dw as without y.
  const int64_t rows = 6, dim = 24;
  for (bool zc : {true, false}) {
    auto x = toBf16(roundBf16(randn(rows * dim, 56, 2.0)));
    auto w = toBf16(roundBf16(randn(dim, 57, 0.5)));
    auto dy = toBf16(roundBf16(randn(rows * dim, 58)));
    std::vector<bf16> yFwd(rows * dim), yBwd(rows * dim), dx(rows * dim),
        dx2(rows * dim);
    std::vector<float> rstd(rows), dw(dim, 0.f), dw2(dim, 0.f);
    RmsNormForwardArgs f{DType::BF16, x.data(), w.data(), yFwd.data(),
                         rstd.data(), rows,     dim};
    f.zeroCentered = zc;
    ASSERT_EQ(rmsNormForward(hostCtx(), f), Status::Ok);
    RmsNormBackwardArgs b{DType::BF16, x.data(),  w.data(),
                          rstd.data(), dy.data(), dx.data(),
                          dw.data(),   rows,      dim};
    b.zeroCentered = zc;
    ASSERT_EQ(rmsNormBackward(hostCtx(), b), Status::Ok);
    RmsNormBackwardArgs fused = b;
    fused.dx = dx2.data();
    fused.dw = dw2.data();
    fused.y = yBwd.data();
    ASSERT_EQ(rmsNormBackward(hostCtx(), fused), Status::Ok);
    EXPECT_EQ(std::memcmp(yFwd.data(), yBwd.data(), yFwd.size() * 2), 0)
        << "zero-centered " << zc;
    EXPECT_EQ(std::memcmp(dx.data(), dx2.data(), dx.size() * 2), 0);
    EXPECT_EQ(std::memcmp(dw.data(), dw2.data(), dw.size() * 4), 0);
  }
}

TEST(DenseRef, SigmoidGateFiniteDifferences) {
  const int64_t rows = 6, cols = 7;
  auto o = randn(rows * cols, 60), g = randn(rows * cols, 61, 2.0),
       r = randn(rows * cols, 62);
  auto fwd = [&](const std::vector<double> &oo, const std::vector<double> &gg) {
    std::vector<double> y(rows * cols);
    SigmoidGateForwardArgs a{DType::F64, oo.data(), gg.data(),
                             y.data(),   rows,      cols};
    EXPECT_EQ(sigmoidGateForward(hostCtx(), a), Status::Ok);
    return y;
  };
  auto y = fwd(o, g);
  for (size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(y[i], o[i] * sig(g[i]), 1e-14);
  std::vector<double> dO(rows * cols), dg(rows * cols);
  SigmoidGateBackwardArgs b{DType::F64, o.data(),  g.data(), r.data(),
                            dO.data(),  dg.data(), rows,     cols};
  ASSERT_EQ(sigmoidGateBackward(hostCtx(), b), Status::Ok);
  auto fdO = [&](auto &oo) { return dot(fwd(oo, g), r); };
  checkFd(o, fdO, dO);
  auto fdG = [&](auto &gg) { return dot(fwd(o, gg), r); };
  checkFd(g, fdG, dg);
}

TEST(DenseRef, ResidualAdd) {
  auto a = randn(37, 70), b = randn(37, 71);
  std::vector<double> y(37), da(37), db(37);
  ASSERT_EQ(residualAddForward(hostCtx(),
                               {DType::F64, a.data(), b.data(), y.data(), 37}),
            Status::Ok);
  for (int i = 0; i < 37; ++i)
    EXPECT_EQ(y[i], a[i] + b[i]);
  ASSERT_EQ(residualAddBackward(
                hostCtx(), {DType::F64, y.data(), da.data(), db.data(), 37}),
            Status::Ok);
  EXPECT_EQ(da, y);
  EXPECT_EQ(db, y);
}

//===----------------------------------------------------------------------===//
// Embedding
//===----------------------------------------------------------------------===//

TEST(DenseRef, EmbeddingGatherAndDeterministicBackward) {
  const int64_t V = 11, D = 6, N = 20;
  auto w = randn(V * D, 80), dy = randn(N * D, 81);
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n)
    ids[n] = int32_t((n * 7) % 5); // repeated ids: accumulation matters
  std::vector<double> y(N * D);
  ASSERT_EQ(embeddingForward(hostCtx(), {DType::F64, ids.data(), w.data(),
                                         y.data(), N, V, D}),
            Status::Ok);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d)
      EXPECT_EQ(y[n * D + d], w[ids[n] * D + d]);
  std::vector<double> dw(V * D, 1.0), expect(V * D, 1.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d)
      expect[ids[n] * D + d] += dy[n * D + d];
  ASSERT_EQ(embeddingBackward(hostCtx(), {DType::F64, ids.data(), dy.data(),
                                          dw.data(), N, V, D}),
            Status::Ok);
  EXPECT_EQ(dw, expect); // same order of additions: exact
  ids[3] = int32_t(V);
  EXPECT_EQ(embeddingForward(hostCtx(), {DType::F64, ids.data(), w.data(),
                                         y.data(), N, V, D}),
            Status::InvalidArgument);
  for (int64_t d = 0; d < D; ++d)
    EXPECT_EQ(y[3 * D + d], 0.0);
}

//===----------------------------------------------------------------------===//
// LM head + cross-entropy
//===----------------------------------------------------------------------===//

struct CeRef {
  double loss = 0;
  int count = 0;
  std::vector<double> lse, dh, dW;
};

/// The unchunked formula on full logits, float64.
/// The cross-entropy in float64; with bf16Logits the logits are rounded to
/// bf16 first, as the op defines them for bf16 storage (the GEMM's output
/// precision), and everything after them is float64.
CeRef naiveCe(const std::vector<double> &h, const std::vector<double> &w,
              const std::vector<int32_t> &labels, int64_t N, int64_t D,
              int64_t V, double scale, bool bf16Logits = false) {
  CeRef r;
  auto logits = naiveLinear(h, w, N, D, V);
  if (bf16Logits)
    logits = roundBf16(logits);
  r.lse.resize(N);
  r.dh.assign(N * D, 0.0);
  r.dW.assign(V * D, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e300;
    for (int64_t v = 0; v < V; ++v)
      mx = std::max(mx, logits[n * V + v]);
    double s = 0;
    for (int64_t v = 0; v < V; ++v)
      s += std::exp(logits[n * V + v] - mx);
    r.lse[n] = mx + std::log(s);
    if (labels[n] == -100)
      continue;
    r.loss += r.lse[n] - logits[n * V + labels[n]];
    ++r.count;
    for (int64_t v = 0; v < V; ++v) {
      double g = scale * (std::exp(logits[n * V + v] - r.lse[n]) -
                          (v == labels[n] ? 1.0 : 0.0));
      for (int64_t d = 0; d < D; ++d) {
        r.dh[n * D + d] += g * w[v * D + d];
        r.dW[v * D + d] += g * h[n * D + d];
      }
    }
  }
  return r;
}

TEST(DenseRef, ChunkedCrossEntropyEqualsUnchunkedF64) {
  const int64_t N = 10, D = 8, V = 29;
  auto h = randn(N * D, 90), w = randn(V * D, 91, 0.5);
  std::vector<int32_t> labels(N);
  for (int64_t n = 0; n < N; ++n)
    labels[n] = int32_t((n * 13 + 5) % V);
  labels[4] = -100;
  labels[7] = -100;
  const double scale = 1.0 / 8;
  auto ref = naiveCe(h, w, labels, N, D, V, scale);
  for (int64_t chunk : {1, 3, 4, 10, 64}) {
    double loss = -1;
    int32_t count = -1;
    std::vector<double> lse(N), dh(N * D, 5.0), dW(V * D, 0.5);
    LmHeadCrossEntropyArgs a;
    a.dtype = DType::F64;
    a.hidden = h.data();
    a.weight = w.data();
    a.labels = labels.data();
    a.tokens = N;
    a.dim = D;
    a.vocab = V;
    a.chunkTokens = chunk;
    a.lossSum = &loss;
    a.validCount = &count;
    a.lse = lse.data();
    ASSERT_EQ(lmHeadCrossEntropyForward(hostCtx(), a), Status::Ok);
    EXPECT_NEAR(loss, ref.loss, 1e-12 * std::fabs(ref.loss)) << chunk;
    EXPECT_EQ(count, 8);
    EXPECT_LT(relErr(lse, ref.lse), 1e-14);
    a.gradScale = scale;
    a.dHidden = dh.data();
    a.dWeight = dW.data();
    loss = -1;
    ASSERT_EQ(lmHeadCrossEntropyBackward(hostCtx(), a), Status::Ok);
    EXPECT_NEAR(loss, ref.loss, 1e-12 * std::fabs(ref.loss));
    for (auto &v : dW)
      v -= 0.5;
    EXPECT_LT(relErr(dh, ref.dh), 1e-13) << chunk;
    EXPECT_LT(relErr(dW, ref.dW), 1e-13) << chunk;
  }
}

TEST(DenseRef, CrossEntropyFiniteDifferences) {
  const int64_t N = 5, D = 4, V = 7;
  auto h = randn(N * D, 92), w = randn(V * D, 93);
  std::vector<int32_t> labels = {3, -100, 0, 6, 2};
  auto lossOf = [&](const std::vector<double> &hh,
                    const std::vector<double> &ww) {
    double loss = 0;
    LmHeadCrossEntropyArgs a;
    a.dtype = DType::F64;
    a.hidden = hh.data();
    a.weight = ww.data();
    a.labels = labels.data();
    a.tokens = N;
    a.dim = D;
    a.vocab = V;
    a.chunkTokens = 2;
    a.lossSum = &loss;
    EXPECT_EQ(lmHeadCrossEntropyForward(hostCtx(), a), Status::Ok);
    return loss;
  };
  std::vector<double> dh(N * D), dW(V * D, 0.0);
  double loss = 0;
  LmHeadCrossEntropyArgs a;
  a.dtype = DType::F64;
  a.hidden = h.data();
  a.weight = w.data();
  a.labels = labels.data();
  a.tokens = N;
  a.dim = D;
  a.vocab = V;
  a.chunkTokens = 2;
  a.lossSum = &loss;
  a.dHidden = dh.data();
  a.dWeight = dW.data();
  ASSERT_EQ(lmHeadCrossEntropyBackward(hostCtx(), a), Status::Ok);
  auto fdH = [&](auto &hh) { return lossOf(hh, w); };
  checkFd(h, fdH, dh);
  auto fdW = [&](auto &ww) { return lossOf(h, ww); };
  checkFd(w, fdW, dW);
}

TEST(DenseRef, CrossEntropyBf16WithinBounds) {
  const int64_t N = 24, D = 32, V = 301;
  auto h = roundBf16(randn(N * D, 94)), w = roundBf16(randn(V * D, 95, 0.2));
  std::vector<int32_t> labels(N);
  for (int64_t n = 0; n < N; ++n)
    labels[n] = int32_t((n * 37) % V);
  labels[0] = -100;
  auto ref = naiveCe(h, w, labels, N, D, V, 1.0, /*bf16Logits=*/true);
  auto hb = toBf16(h), wb = toBf16(w);
  float loss = 0;
  int32_t count = 0;
  std::vector<float> lse(N), dW(V * D, 0.f);
  std::vector<bf16> dh(N * D);
  LmHeadCrossEntropyArgs a;
  a.dtype = DType::BF16;
  a.hidden = hb.data();
  a.weight = wb.data();
  a.labels = labels.data();
  a.tokens = N;
  a.dim = D;
  a.vocab = V;
  a.chunkTokens = 5;
  a.lossSum = &loss;
  a.validCount = &count;
  a.lse = lse.data();
  a.dHidden = dh.data();
  a.dWeight = dW.data();
  ASSERT_EQ(lmHeadCrossEntropyBackward(hostCtx(), a), Status::Ok);
  EXPECT_EQ(count, N - 1);
  // bf16 logits (rounded alike in the float64 oracle; a logit whose fp32 sum
  // sits at a rounding boundary may round the other way), fp32 softmax:
  // loss to ~1e-5; gradients pass through bf16 dlogits (2^-8 relative each)
  // and bf16 dh.
  EXPECT_NEAR(loss, ref.loss, 1e-5 * std::fabs(ref.loss));
  EXPECT_LT(relErr(toD(lse), ref.lse), 1e-5);
  EXPECT_LT(relErr(toD(dh), ref.dh), 1.5e-2);
  EXPECT_LT(relErr(toD(dW), ref.dW), 1e-2);
}

//===----------------------------------------------------------------------===//
// Split vocabulary (VocabGroup): R ranks as R threads of this process.
//===----------------------------------------------------------------------===//

/// The ranks of a split vocabulary as threads sharing host memory.
using ThreadGroup = ap::test::ThreadVocabGroup<ap::test::HostSlots>;

template <class T> std::vector<T> castTo(const std::vector<double> &v) {
  std::vector<T> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = T(float(v[i]));
  return r;
}
template <> std::vector<double> castTo<double>(const std::vector<double> &v) {
  return v;
}
template <class T> constexpr DType dtypeOf() {
  return std::is_same_v<T, bf16>    ? DType::BF16
         : std::is_same_v<T, float> ? DType::F32
                                    : DType::F64;
}
template <class T>
using AccOf = std::conditional_t<std::is_same_v<T, double>, double, float>;
template <class T> bool sameBits(const T &a, const T &b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}
template <class T>
bool sameBits(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// One rank's (or the unsplit) LM head + cross-entropy: the forward alone,
/// then the backward, which writes loss, count and lse again.
template <class T> struct CeOutputs {
  using A = AccOf<T>;
  A lossFwd = -1, loss = -1;
  int32_t countFwd = -1, count = -1;
  std::vector<A> lseFwd, lse, dW;
  std::vector<T> dh;
  Status fwd = Status::Unsupported, bwd = Status::Unsupported;
};
template <class T>
CeOutputs<T> runCe(const T *h, const T *w, const int32_t *labels, int64_t N,
                   int64_t D, int64_t V, int64_t chunk, double scale,
                   const VocabGroup &group) {
  using A = AccOf<T>;
  CeOutputs<T> o;
  o.lseFwd.assign(N, A(-1));
  o.lse.assign(N, A(-1));
  o.dW.assign(V * D, A(0));
  o.dh.assign(N * D, T(-1.0f));
  LmHeadCrossEntropyArgs a;
  a.dtype = dtypeOf<T>();
  a.hidden = h;
  a.weight = w;
  a.labels = labels;
  a.tokens = N;
  a.dim = D;
  a.vocab = V;
  a.chunkTokens = chunk;
  a.lossSum = &o.lossFwd;
  a.validCount = &o.countFwd;
  a.lse = o.lseFwd.data();
  a.group = group;
  o.fwd = lmHeadCrossEntropyForward(hostCtx(), a);
  a.lossSum = &o.loss;
  a.validCount = &o.count;
  a.lse = o.lse.data();
  a.gradScale = scale;
  a.dHidden = o.dh.data();
  a.dWeight = o.dW.data();
  o.bwd = lmHeadCrossEntropyBackward(hostCtx(), a);
  return o;
}

/// Tensor-relative bounds of a split run (loss: relative).
struct SplitBounds {
  double loss, lse, dh, dW;
};

/// A random problem (37 tokens in chunks of 16, the last one partial; labels
/// in every rank's block, ignored ones in both chunks' kinds) with its
/// 40-row vocabulary split over `ranks` threads: the ranks agree bitwise on
/// loss, count and lse (forward and backward alike); the split run is within
/// `unsplit` of the same dtype's unsplit run and within `f64` of float64
/// math: loss, lse, the ranks' dWeight blocks side by side, and the sum of
/// their dHidden partials. The gathered statistics are fp32 whatever the
/// dtype, so f64 agrees with the unsplit run to fp32 rounding, not to f64's.
template <class T>
void vocabParallelCe(int ranks, const SplitBounds &unsplitBound,
                     const SplitBounds &f64Bound) {
  using A = AccOf<T>;
  const int64_t N = 37, chunk = 16, D = 24, Vt = 40, V = Vt / ranks;
  ASSERT_EQ(V * ranks, Vt);
  const std::vector<T> h = castTo<T>(randn(N * D, 300)),
                       w = castTo<T>(randn(Vt * D, 301, 0.5));
  std::vector<int32_t> labels(N);
  for (int64_t n = 0; n < N; ++n)
    labels[n] = int32_t((n * 13 + 5) % Vt);
  labels[0] = 0;
  labels[1] = int32_t(Vt - 1);
  labels[4] = labels[19] = labels[36] = -100;
  for (int r = 0; r < ranks; ++r)
    ASSERT_TRUE(
        std::any_of(labels.begin(), labels.end(),
                    [&](int32_t l) { return l >= r * V && l < (r + 1) * V; }))
        << "no label in rank " << r << "'s block";
  const int32_t valid = int32_t(N - 3);
  const double scale = 1.0 / valid;
  const CeRef ref =
      naiveCe(toD(h), toD(w), labels, N, D, Vt, scale, std::is_same_v<T, bf16>);
  const CeOutputs<T> whole = runCe(h.data(), w.data(), labels.data(), N, D, Vt,
                                   chunk, scale, VocabGroup{});
  ASSERT_EQ(whole.fwd, Status::Ok);
  ASSERT_EQ(whole.bwd, Status::Ok);

  ThreadGroup group(ranks);
  std::vector<CeOutputs<T>> out(ranks);
  group.run([&](int r) {
    out[r] = runCe(h.data(), w.data() + r * V * D, labels.data(), N, D, V,
                   chunk, scale, group.group(r, V));
  });
  ASSERT_TRUE(group.ok());
  const int64_t chunks = (N + chunk - 1) / chunk;
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(out[r].fwd, Status::Ok) << r;
    ASSERT_EQ(out[r].bwd, Status::Ok) << r;
    EXPECT_EQ(group.calls(r), 2 * chunks) << r; // one gather per chunk
    EXPECT_TRUE(sameBits(out[r].loss, out[0].loss)) << r;
    EXPECT_TRUE(sameBits(out[r].loss, out[r].lossFwd)) << r;
    EXPECT_EQ(out[r].count, valid) << r;
    EXPECT_EQ(out[r].countFwd, valid) << r;
    EXPECT_TRUE(sameBits(out[r].lse, out[0].lse)) << r;
    EXPECT_TRUE(sameBits(out[r].lse, out[r].lseFwd)) << r;
  }
  EXPECT_EQ(whole.count, valid);
  EXPECT_EQ(ref.count, valid);

  std::vector<double> dW, dh(N * D, 0.0);
  for (int r = 0; r < ranks; ++r) {
    dW.insert(dW.end(), out[r].dW.begin(), out[r].dW.end());
    auto part = toD(out[r].dh);
    for (int64_t i = 0; i < N * D; ++i)
      dh[i] += part[i];
  }
  const A loss = out[0].loss;
  const std::vector<double> lse = toD(out[0].lse);
  const double lossVsWhole =
      std::fabs(double(loss) - double(whole.loss)) / std::fabs(whole.loss);
  const double lossVsRef = std::fabs(double(loss) - ref.loss) / ref.loss;
  const SplitBounds vsWhole{lossVsWhole, relErr(lse, toD(whole.lse)),
                            relErr(dh, toD(whole.dh)),
                            relErr(dW, toD(whole.dW))};
  const SplitBounds vsRef{lossVsRef, relErr(lse, ref.lse), relErr(dh, ref.dh),
                          relErr(dW, ref.dW)};
  const char *name = std::is_same_v<T, bf16>    ? "bf16"
                     : std::is_same_v<T, float> ? "f32"
                                                : "f64";
  std::printf("split %s R=%d vs unsplit: loss %.3g lse %.3g dh %.3g dW "
              "%.3g; vs f64: loss %.3g lse %.3g dh %.3g dW %.3g\n",
              name, ranks, vsWhole.loss, vsWhole.lse, vsWhole.dh, vsWhole.dW,
              vsRef.loss, vsRef.lse, vsRef.dh, vsRef.dW);
  EXPECT_LE(vsWhole.loss, unsplitBound.loss);
  EXPECT_LE(vsWhole.lse, unsplitBound.lse);
  EXPECT_LE(vsWhole.dh, unsplitBound.dh);
  EXPECT_LE(vsWhole.dW, unsplitBound.dW);
  EXPECT_LE(vsRef.loss, f64Bound.loss);
  EXPECT_LE(vsRef.lse, f64Bound.lse);
  EXPECT_LE(vsRef.dh, f64Bound.dh);
  EXPECT_LE(vsRef.dW, f64Bound.dW);
}

// f32: fp32 logits and statistics, the ranks' merge another rounding of the
// same sums: 1e-5. bf16: as CrossEntropyBf16WithinBounds against float64
// (bf16 logits in both);
// against the unsplit run the dlogits round to bf16 alike except where the
// lse's last bits differ, and dh sums the ranks' bf16-rounded partials.
// f64: the statistics travel as fp32 (kernels/dense.h: allGather of floats).
TEST(DenseRef, VocabParallelCrossEntropyF32) {
  for (int ranks : {2, 4})
    vocabParallelCe<float>(ranks, {1e-5, 1e-5, 1e-5, 1e-5},
                           {1e-5, 1e-5, 1e-5, 1e-5});
}
TEST(DenseRef, VocabParallelCrossEntropyBf16) {
  for (int ranks : {2, 4})
    vocabParallelCe<bf16>(ranks, {1e-5, 1e-5, 1.5e-2, 1e-2},
                          {1e-5, 1e-5, 1.5e-2, 1e-2});
}
TEST(DenseRef, VocabParallelCrossEntropyF64) {
  for (int ranks : {2, 4})
    vocabParallelCe<double>(ranks, {1e-6, 1e-6, 1e-6, 1e-6},
                            {1e-6, 1e-6, 1e-6, 1e-6});
}

// Each id's row lives on one rank and the others write zero rows, so the
// ranks' outputs sum to the unsplit output exactly; each rank's backward
// adds the same dy rows in the same order to its block.
TEST(DenseRef, VocabParallelEmbeddingSumsToUnsplit) {
  const int64_t Vt = 40, D = 6, N = 50;
  const auto w = toF32(randn(Vt * D, 310)), dy = toF32(randn(N * D, 311)),
             dw0 = toF32(randn(Vt * D, 312));
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n)
    ids[n] = int32_t((n * 17 + n / 3) % Vt); // N > Vt: repeated ids
  ids[0] = 0;
  ids[1] = int32_t(Vt - 1);
  std::vector<float> y(N * D), dw = dw0;
  ASSERT_EQ(embeddingForward(hostCtx(), {DType::F32, ids.data(), w.data(),
                                         y.data(), N, Vt, D}),
            Status::Ok);
  ASSERT_EQ(embeddingBackward(hostCtx(), {DType::F32, ids.data(), dy.data(),
                                          dw.data(), N, Vt, D}),
            Status::Ok);
  for (int ranks : {2, 4}) {
    const int64_t V = Vt / ranks;
    std::vector<float> sum(N * D, 0.f), dwSplit;
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> yr(N * D, 7.f);
      std::vector<float> dwr(dw0.begin() + r * V * D,
                             dw0.begin() + (r + 1) * V * D);
      VocabGroup g;
      g.ranks = ranks;
      g.offset = r * V;
      EmbeddingForwardArgs f{
          DType::F32, ids.data(), w.data() + r * V * D, yr.data(), N, V, D};
      f.group = g;
      ASSERT_EQ(embeddingForward(hostCtx(), f), Status::Ok);
      EmbeddingBackwardArgs b{DType::F32, ids.data(), dy.data(), dwr.data(),
                              N,          V,          D};
      b.group = g;
      ASSERT_EQ(embeddingBackward(hostCtx(), b), Status::Ok);
      for (int64_t n = 0; n < N; ++n) {
        bool mine = ids[n] / V == r;
        for (int64_t d = 0; d < D; ++d) {
          float v = yr[n * D + d];
          EXPECT_TRUE(mine ? sameBits(v, y[n * D + d]) : sameBits(v, 0.f))
              << "R=" << ranks << " rank " << r << " token " << n;
          sum[n * D + d] += v;
        }
      }
      dwSplit.insert(dwSplit.end(), dwr.begin(), dwr.end());
    }
    EXPECT_TRUE(sameBits(sum, y)) << ranks;
    EXPECT_TRUE(sameBits(dwSplit, dw)) << ranks;
  }
}

TEST(DenseRef, VocabParallelInvalidArguments) {
  const int64_t Vt = 8, V = 4, D = 3, N = 4;
  const auto w = toF32(randn(V * D, 320)), dy = toF32(randn(N * D, 321));
  VocabGroup g;
  g.ranks = 2;
  g.offset = V; // rank 1: rows [4, 8)
  // Ids of rank 0's rows are valid (zero rows here); only ids outside the
  // whole table are not, and their rows are zero too.
  std::vector<int32_t> ids = {0, 5, 7, 3};
  std::vector<float> y(N * D, 7.f);
  EmbeddingForwardArgs f{DType::F32, ids.data(), w.data(), y.data(), N, V, D};
  f.group = g;
  EXPECT_EQ(embeddingForward(hostCtx(), f), Status::Ok);
  for (int64_t d = 0; d < D; ++d) {
    EXPECT_EQ(y[0 * D + d], 0.f);
    EXPECT_EQ(y[1 * D + d], w[1 * D + d]);
    EXPECT_EQ(y[2 * D + d], w[3 * D + d]);
    EXPECT_EQ(y[3 * D + d], 0.f);
  }
  for (int32_t bad : {int32_t(Vt), -1}) {
    ids[2] = bad;
    std::fill(y.begin(), y.end(), 7.f);
    EXPECT_EQ(embeddingForward(hostCtx(), f), Status::InvalidArgument) << bad;
    for (int64_t d = 0; d < D; ++d) {
      EXPECT_EQ(y[1 * D + d], w[1 * D + d]); // the valid rows are written
      EXPECT_EQ(y[2 * D + d], 0.f);
    }
    // The backward skips every id outside the rank's rows.
    std::vector<float> dw(V * D, 0.f);
    EmbeddingBackwardArgs b{DType::F32, ids.data(), dy.data(), dw.data(),
                            N,          V,          D};
    b.group = g;
    ASSERT_EQ(embeddingBackward(hostCtx(), b), Status::Ok);
    for (int64_t i = 0; i < V * D; ++i)
      EXPECT_EQ(dw[i], i / D == 1 ? dy[1 * D + i % D] : 0.f) << i;
  }
  // A group whose rows leave the table, or no ranks.
  for (auto [ranks, offset] :
       {std::pair<int32_t, int64_t>{2, Vt}, {2, -V}, {0, 0}}) {
    f.group.ranks = ranks;
    f.group.offset = offset;
    EXPECT_EQ(embeddingForward(hostCtx(), f), Status::InvalidArgument);
  }

  // Cross-entropy: a split vocabulary needs allGather.
  const auto h = toF32(randn(N * D, 322));
  std::vector<int32_t> labels = {int32_t(Vt), -100, 2, int32_t(Vt) + 5};
  float loss = -1;
  int32_t count = -1;
  LmHeadCrossEntropyArgs a;
  a.dtype = DType::F32;
  a.hidden = h.data();
  a.weight = w.data();
  a.labels = labels.data();
  a.tokens = N;
  a.dim = D;
  a.vocab = V;
  a.chunkTokens = 2;
  a.lossSum = &loss;
  a.validCount = &count;
  a.group = g;
  EXPECT_EQ(lmHeadCrossEntropyForward(hostCtx(), a), Status::InvalidArgument);
  EXPECT_EQ(lmHeadCrossEntropyBackward(hostCtx(), a), Status::InvalidArgument);
  // Labels past the whole table count as ignored, on every rank alike.
  ThreadGroup group(2);
  std::vector<float> losses(2, -1.f);
  std::vector<int32_t> counts(2, -1);
  std::vector<Status> st(2, Status::Unsupported);
  const auto w0 = toF32(randn(V * D, 323));
  group.run([&](int r) {
    LmHeadCrossEntropyArgs ar = a;
    ar.weight = r ? w.data() : w0.data();
    ar.lossSum = &losses[r];
    ar.validCount = &counts[r];
    ar.group = group.group(r, V);
    st[r] = lmHeadCrossEntropyForward(hostCtx(), ar);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(st[r], Status::Ok);
    EXPECT_EQ(counts[r], 1);
    EXPECT_GT(losses[r], 0.f);
  }
  EXPECT_TRUE(sameBits(losses[0], losses[1]));

  // The CUDA workspace adds the sent and the gathered statistics (3 floats
  // per chunk token, and per rank), each 256-byte aligned; host needs none.
  LmHeadCrossEntropyArgs s;
  s.tokens = 100;
  s.vocab = 1000;
  s.chunkTokens = 30;
  const size_t one = lmHeadCrossEntropyChunkWorkspaceBytes(Backend::Cuda, s);
  s.group.ranks = 4; // nothing else of the group is read
  EXPECT_EQ(lmHeadCrossEntropyChunkWorkspaceBytes(Backend::Cuda, s),
            one + 512 + 1536);
  EXPECT_EQ(lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, s),
            one + 512 + 1536 + linearWorkspaceBytes(Backend::Cuda));
  EXPECT_EQ(lmHeadCrossEntropyWorkspaceBytes(Backend::Host, s), 0u);
}

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

/// AdamW's float state from `p0` (and a bf16 compute copy) beside textbook
/// AdamW (Loshchilov & Hutter, PyTorch's form) in float64.
struct AdamWCheck {
  static constexpr double lr = 3e-3, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  std::vector<float> master, m, v;
  std::vector<bf16> copy;
  std::vector<double> P, M, V;
  explicit AdamWCheck(const std::vector<double> &p0)
      : master(toF32(p0)), m(p0.size(), 0.f), v(p0.size(), 0.f),
        copy(p0.size()), P(p0), M(p0.size(), 0.0), V(p0.size(), 0.0) {}
  /// The kernel's arguments for this state and a grad of `gradDType`.
  AdamWArgs args(const void *grad, DType gradDType, const float *clip,
                 int64_t step) {
    AdamWArgs a;
    a.master = master.data();
    a.expAvg = m.data();
    a.expAvgSq = v.data();
    a.grad = grad;
    a.gradDType = gradDType;
    a.clipCoef = clip;
    a.computeCopy = copy.data();
    a.n = int64_t(master.size());
    a.lr = lr;
    a.beta1 = b1;
    a.beta2 = b2;
    a.eps = eps;
    a.weightDecay = wd;
    a.step = step;
    return a;
  }
  /// The float64 update with the float grads `g` times `clip`.
  void textbook(const std::vector<float> &g, double clip, int64_t step) {
    for (size_t i = 0; i < P.size(); ++i) {
      double gi = double(g[i]) * clip;
      P[i] *= 1 - lr * wd;
      M[i] = b1 * M[i] + (1 - b1) * gi;
      V[i] = b2 * V[i] + (1 - b2) * gi * gi;
      double mh = M[i] / (1 - std::pow(b1, step));
      double vh = V[i] / (1 - std::pow(b2, step));
      P[i] -= lr * mh / (std::sqrt(vh) + eps);
    }
  }
  void expectClose() const {
    for (size_t i = 0; i < P.size(); ++i) {
      EXPECT_NEAR(master[i], P[i], 2e-6 * (1 + std::fabs(P[i])));
      // m sums terms of size ~|g| ~ 0.1 with cancellation: float rounding
      // of those terms bounds its error, not |m|.
      EXPECT_NEAR(m[i], M[i], 2e-8 + 1e-6 * std::fabs(M[i]));
      EXPECT_NEAR(v[i], V[i], 1e-5 * (1e-6 + std::fabs(V[i])));
      EXPECT_EQ(copy[i].bits, bf16(master[i]).bits);
    }
  }
};

TEST(DenseRef, AdamWMatchesTextbook) {
  const int64_t n = 1000;
  AdamWCheck c(randn(n, 100));
  for (int64_t step = 1; step <= 5; ++step) {
    std::vector<float> gf = toF32(randn(n, 200 + step, 0.1));
    float clip = step == 3 ? 0.5f : 1.0f;
    ASSERT_EQ(adamWStep(hostCtx(), c.args(gf.data(), DType::F32, &clip, step)),
              Status::Ok);
    c.textbook(gf, clip, step);
  }
  c.expectClose();
}

TEST(DenseRef, GradNormAndClip) {
  auto a = toF32(randn(70000, 110)), b = toF32(randn(5, 111)),
       c = toF32(randn(131073, 112));
  GradTensor ts[3] = {{a.data(), int64_t(a.size())},
                      {b.data(), int64_t(b.size())},
                      {c.data(), int64_t(c.size())}};
  double ss = 0;
  for (auto *vec : {&a, &b, &c})
    for (float x : *vec)
      ss += double(x) * double(x);
  float norm = 0, clip = 0;
  GradNormArgs g{ts, 3, 100.0, &norm, &clip};
  ASSERT_EQ(gradNorm(hostCtx(), g), Status::Ok);
  EXPECT_NEAR(norm, std::sqrt(ss), 1e-6 * std::sqrt(ss));
  EXPECT_NEAR(clip, 100.0 / (double(norm) + 1e-6), 1e-6);
  g.maxNorm = 1e6;
  ASSERT_EQ(gradNorm(hostCtx(), g), Status::Ok);
  EXPECT_EQ(clip, 1.0f);
}

// A bf16 main grad (ZeRO-3): the norm widens each element exactly and
// keeps the f32 path's blocking, so it equals the f32 norm of the widened
// values bit for bit, and it is within float's rounding of the float64 norm;
// mixing dtypes in one list keeps the list order.
TEST(DenseRef, GradNormOfBf16Grads) {
  auto a = toF32(randn(70000, 120)), c = toF32(randn(131073, 122));
  std::vector<bf16> b(65539);
  auto bd = randn(b.size(), 121, 1e-3);
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = bf16(float(bd[i]));
  std::vector<float> bw(b.size());
  for (size_t i = 0; i < b.size(); ++i)
    bw[i] = float(b[i]);
  GradTensor mixed[3] = {{a.data(), int64_t(a.size())},
                         {b.data(), int64_t(b.size()), DType::BF16},
                         {c.data(), int64_t(c.size())}};
  GradTensor widened[3] = {mixed[0], {bw.data(), int64_t(bw.size())}, mixed[2]};
  double ss = 0;
  for (float x : a)
    ss += double(x) * double(x);
  for (bf16 x : b)
    ss += double(float(x)) * double(float(x));
  for (float x : c)
    ss += double(x) * double(x);
  float norm = 0, clip = 0, normW = 0, clipW = 0;
  GradNormArgs g{mixed, 3, 100.0, &norm, &clip};
  ASSERT_EQ(gradNorm(hostCtx(), g), Status::Ok);
  EXPECT_NEAR(norm, std::sqrt(ss), 1e-6 * std::sqrt(ss));
  GradNormArgs gw{widened, 3, 100.0, &normW, &clipW};
  ASSERT_EQ(gradNorm(hostCtx(), gw), Status::Ok);
  EXPECT_EQ(norm, normW);
  EXPECT_EQ(clip, clipW);
  // A bf16 tensor alone.
  GradNormArgs only{mixed + 1, 1, 0.0, &norm, nullptr};
  ASSERT_EQ(gradNorm(hostCtx(), only), Status::Ok);
  double sb = 0;
  for (bf16 x : b)
    sb += double(float(x)) * double(float(x));
  EXPECT_NEAR(norm, std::sqrt(sb), 1e-6 * std::sqrt(sb));
  // Neither f32 nor bf16.
  mixed[1].dtype = DType::F64;
  EXPECT_EQ(gradNorm(hostCtx(), g), Status::InvalidArgument);
}

// AdamW over a list (adamWSteps): each tensor's update is adamWStep's bit
// for bit, the grads are zeroed only with zeroGrads, and a bad entry anywhere
// in the list is refused before any tensor changes.
TEST(DenseRef, AdamWStepsEqualsOneByOne) {
  const int64_t n = 777;
  auto p0 = randn(n, 140);
  AdamWCheck a(p0), b(p0), c(p0), a1(p0), b1(p0), c1(p0);
  std::vector<float> ga = toF32(randn(n, 141, 0.1));
  std::vector<bf16> gb(n);
  auto gbd = randn(n, 142, 0.1);
  for (int64_t i = 0; i < n; ++i)
    gb[i] = bf16(float(gbd[i]));
  std::vector<float> gc = toF32(randn(n, 143, 0.1));
  std::vector<float> ga1 = ga, gc1 = gc;
  std::vector<bf16> gb1 = gb;
  float clip = 0.75f;
  AdamWArgs list[3] = {a.args(ga.data(), DType::F32, &clip, 4),
                       b.args(gb.data(), DType::BF16, &clip, 4),
                       c.args(gc.data(), DType::F32, &clip, 4)};
  list[2].computeCopy = nullptr; // a tensor without a compute copy
  list[1].weightDecay = 0.0;     // per-tensor settings
  AdamWBatchArgs batch{list, 3, true};
  // An entry that adamWStep refuses: nothing runs.
  list[1].gradDType = DType::I32;
  EXPECT_EQ(adamWSteps(hostCtx(), batch), Status::InvalidArgument);
  EXPECT_EQ(a.master, toF32(p0));
  EXPECT_EQ(ga, ga1);
  list[1].gradDType = DType::BF16;
  ASSERT_EQ(adamWSteps(hostCtx(), batch), Status::Ok);

  AdamWArgs one[3] = {a1.args(ga1.data(), DType::F32, &clip, 4),
                      b1.args(gb1.data(), DType::BF16, &clip, 4),
                      c1.args(gc1.data(), DType::F32, &clip, 4)};
  one[2].computeCopy = nullptr;
  one[1].weightDecay = 0.0;
  for (const AdamWArgs &x : one)
    ASSERT_EQ(adamWStep(hostCtx(), x), Status::Ok);
  for (auto [x, y] : {std::pair{&a, &a1}, {&b, &b1}, {&c, &c1}}) {
    EXPECT_EQ(std::memcmp(x->master.data(), y->master.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(x->m.data(), y->m.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(x->v.data(), y->v.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(x->copy.data(), y->copy.data(), n * 2), 0);
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(ga[i], 0.f);
    EXPECT_EQ(gb[i].bits, 0);
    EXPECT_EQ(gc[i], 0.f);
  }
  // Without zeroGrads the grads are left as they were.
  batch.zeroGrads = false;
  std::vector<float> gKeep = toF32(randn(n, 144, 0.1)), gKeep0 = gKeep;
  AdamWArgs keep = a.args(gKeep.data(), DType::F32, &clip, 5);
  batch.tensors = &keep;
  batch.numTensors = 1;
  ASSERT_EQ(adamWSteps(hostCtx(), batch), Status::Ok);
  EXPECT_EQ(gKeep, gKeep0);
}

// AdamW reading a bf16 main grad: the textbook update in float64 of the
// widened grads, within the f32 path's bounds, and bitwise the f32 path
// fed those widened values (the widening is exact).
TEST(DenseRef, AdamWReadsBf16Grads) {
  const int64_t n = 1000;
  auto p0 = randn(n, 130);
  AdamWCheck c(p0), f(p0);
  for (int64_t step = 1; step <= 5; ++step) {
    auto g = randn(n, 230 + step, 0.1);
    std::vector<bf16> gb(n);
    std::vector<float> gw(n);
    for (int64_t i = 0; i < n; ++i) {
      gb[i] = bf16(float(g[i]));
      gw[i] = float(gb[i]);
    }
    float clip = step == 3 ? 0.5f : 1.0f;
    ASSERT_EQ(adamWStep(hostCtx(), c.args(gb.data(), DType::BF16, &clip, step)),
              Status::Ok);
    ASSERT_EQ(adamWStep(hostCtx(), f.args(gw.data(), DType::F32, &clip, step)),
              Status::Ok);
    c.textbook(gw, clip, step);
  }
  c.expectClose();
  EXPECT_EQ(std::memcmp(c.master.data(), f.master.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(c.m.data(), f.m.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(c.v.data(), f.v.data(), n * 4), 0);
  float one = 1.f;
  EXPECT_EQ(adamWStep(hostCtx(), c.args(c.copy.data(), DType::I32, &one, 1)),
            Status::InvalidArgument);
}

} // namespace
