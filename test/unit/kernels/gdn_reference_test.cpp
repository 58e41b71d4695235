//===- gdn_reference_test.cpp - GDN host reference kernels ------*- C++ -*-===//
//
// CI tests of the GDN reference: chunked vs naive recurrence in float64 (tail
// chunks included), every backward against central finite differences of
// its forward in float64, determinism, and a bf16 sanity check.
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"
#include "random_data.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

using namespace ap::kernels;

namespace {

using ap::test::randn;
using ap::test::uniform;
using ap::test::unitRows;
using ap::test::Vec;
double dot(const Vec &a, const Vec &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}
/// max |a - b| / max |b|.
double relErr(const Vec &a, const Vec &b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return num / std::max(den, 1e-300);
}

/// Central differences of the scalar loss() with respect to every element of x.
Vec finiteDiff(Vec &x, const std::function<double()> &loss, double h = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double x0 = x[i];
    x[i] = x0 + h;
    double lp = loss();
    x[i] = x0 - h;
    double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

KernelContext host() { return KernelContext{}; }

//===----------------------------------------------------------------------===//
// Gated delta rule
//===----------------------------------------------------------------------===//

struct ChunkShape {
  int64_t B, T;
  int32_t Hk, Hv, dk, dv;
};

struct ChunkData {
  ChunkShape s;
  Vec q, k, v, g, beta, h0;
  ChunkData(ChunkShape sh, uint64_t seed) : s(sh) {
    size_t N = size_t(sh.B * sh.T);
    q = unitRows(N * sh.Hk, sh.dk, seed + 1);
    k = unitRows(N * sh.Hk, sh.dk, seed + 2);
    v = randn(N * sh.Hv * sh.dv, seed + 3);
    g = uniform(N * sh.Hv, seed + 4, -0.6, -0.01);
    beta = uniform(N * sh.Hv, seed + 5, 0.1, 0.95);
    h0 = randn(size_t(sh.B * sh.Hv * sh.dk * sh.dv), seed + 6, 0.3);
  }
  GdnChunkArgs args() {
    GdnChunkArgs a;
    a.dtype = DType::F64;
    a.batch = s.B;
    a.seqLen = s.T;
    a.keyHeads = s.Hk;
    a.valueHeads = s.Hv;
    a.keyDim = s.dk;
    a.valueDim = s.dv;
    a.scale = float(1.0 / std::sqrt(double(s.dk)));
    a.q = q.data();
    a.k = k.data();
    a.v = v.data();
    a.g = g.data();
    a.beta = beta.data();
    a.initialState = h0.data();
    return a;
  }
  size_t oSize() const { return size_t(s.B * s.T * s.Hv * s.dv); }
  size_t stSize() const { return size_t(s.B * s.Hv * s.dk * s.dv); }
};

TEST(GdnReference, ChunkedMatchesNaiveFloat64) {
  for (ChunkShape sh :
       {ChunkShape{2, 150, 2, 4, 8, 6}, ChunkShape{1, 64, 1, 1, 16, 16},
        ChunkShape{1, 13, 1, 2, 5, 7}, ChunkShape{2, 129, 2, 2, 12, 4}}) {
    ChunkData d(sh, 100 + sh.T);
    Vec oN(d.oSize()), oC(d.oSize()), fN(d.stSize()), fC(d.stSize());
    Vec gc(size_t(sh.B * sh.T * sh.Hv)), tm(size_t(sh.B * sh.T * sh.Hv * 64));
    GdnChunkArgs a = d.args();
    a.o = oN.data();
    a.finalState = fN.data();
    ASSERT_EQ(gdnRecurrentForwardReference(a), Status::Ok);
    a.o = oC.data();
    a.finalState = fC.data();
    a.gCum = gc.data();
    a.tMat = tm.data();
    ASSERT_EQ(gdnChunkForward(host(), a), Status::Ok);
    EXPECT_LT(relErr(oC, oN), 1e-12) << "T=" << sh.T;
    EXPECT_LT(relErr(fC, fN), 1e-12) << "T=" << sh.T;
    // Without an initial state too.
    a.initialState = nullptr;
    ASSERT_EQ(gdnChunkForward(host(), a), Status::Ok);
    a.o = oN.data();
    a.finalState = fN.data();
    ASSERT_EQ(gdnRecurrentForwardReference(a), Status::Ok);
    EXPECT_LT(relErr(oC, oN), 1e-12);
    EXPECT_LT(relErr(fC, fN), 1e-12);
  }
}

TEST(GdnReference, ChunkBackwardMatchesFiniteDifferences) {
  // Two chunks plus a 6-row tail; grouped value heads (r = 2).
  ChunkShape sh{2, 134, 1, 2, 4, 3};
  ChunkData d(sh, 7);
  Vec ro = randn(d.oSize(), 11), rf = randn(d.stSize(), 12);
  Vec o(d.oSize()), f(d.stSize());
  auto loss = [&]() {
    GdnChunkArgs a = d.args();
    a.o = o.data();
    a.finalState = f.data();
    EXPECT_EQ(gdnRecurrentForwardReference(a), Status::Ok);
    return dot(o, ro) + dot(f, rf);
  };
  Vec gc(size_t(sh.B * sh.T * sh.Hv)), tm(size_t(sh.B * sh.T * sh.Hv * 64));
  GdnChunkArgs a = d.args();
  a.o = o.data();
  a.gCum = gc.data();
  a.tMat = tm.data();
  ASSERT_EQ(gdnChunkForward(host(), a), Status::Ok);
  Vec dq(d.q.size()), dk(d.k.size()), dv(d.v.size()), dg(d.g.size()),
      db(d.beta.size()), dh0(d.h0.size());
  a.dO = ro.data();
  a.dFinalState = rf.data();
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  a.dg = dg.data();
  a.dbeta = db.data();
  a.dInitialState = dh0.data();
  ASSERT_EQ(gdnChunkBackward(host(), a), Status::Ok);
  EXPECT_LT(relErr(dq, finiteDiff(d.q, loss)), 1e-6);
  EXPECT_LT(relErr(dk, finiteDiff(d.k, loss)), 1e-6);
  EXPECT_LT(relErr(dv, finiteDiff(d.v, loss)), 1e-6);
  EXPECT_LT(relErr(dg, finiteDiff(d.g, loss)), 1e-6);
  EXPECT_LT(relErr(db, finiteDiff(d.beta, loss)), 1e-6);
  EXPECT_LT(relErr(dh0, finiteDiff(d.h0, loss)), 1e-6);
}

template <typename S> std::vector<S> cast(const Vec &v) {
  std::vector<S> r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = S(float(v[i]));
  return r;
}
template <typename S> Vec uncast(const std::vector<S> &v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    r[i] = double(toFloat(v[i]));
  return r;
}
std::vector<float> f32(const Vec &v) {
  return std::vector<float>(v.begin(), v.end());
}

/// Chunk forward + backward in storage S; returns all outputs as doubles.
template <typename S> std::vector<Vec> runChunk(ChunkData &d, const Vec &dO) {
  const ChunkShape &sh = d.s;
  auto q = cast<S>(d.q), k = cast<S>(d.k), v = cast<S>(d.v), dOs = cast<S>(dO);
  auto g = f32(d.g), beta = f32(d.beta), h0 = f32(d.h0);
  std::vector<S> o(d.oSize()), tm(size_t(sh.B * sh.T * sh.Hv * 64));
  std::vector<S> dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<float> gc(g.size()), fin(d.stSize()), dg(g.size()), db(g.size()),
      dh0(h0.size());
  GdnChunkArgs a;
  a.dtype = std::is_same_v<S, bf16> ? DType::BF16 : DType::F32;
  a.batch = sh.B;
  a.seqLen = sh.T;
  a.keyHeads = sh.Hk;
  a.valueHeads = sh.Hv;
  a.keyDim = sh.dk;
  a.valueDim = sh.dv;
  a.scale = float(1.0 / std::sqrt(double(sh.dk)));
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.g = g.data();
  a.beta = beta.data();
  a.initialState = h0.data();
  a.o = o.data();
  a.finalState = fin.data();
  a.gCum = gc.data();
  a.tMat = tm.data();
  EXPECT_EQ(gdnChunkForward(host(), a), Status::Ok);
  a.dO = dOs.data();
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  a.dg = dg.data();
  a.dbeta = db.data();
  a.dInitialState = dh0.data();
  EXPECT_EQ(gdnChunkBackward(host(), a), Status::Ok);
  auto fv = [](const std::vector<float> &x) { return Vec(x.begin(), x.end()); };
  return {uncast(o),  fv(fin), uncast(dq), uncast(dk),
          uncast(dv), fv(dg),  fv(db),     fv(dh0)};
}

TEST(GdnReference, ChunkDeterministicAndBf16Sane) {
  ChunkShape sh{1, 100, 2, 4, 32, 16};
  ChunkData d(sh, 3);
  Vec dO = randn(d.oSize(), 4);
  // Inputs exactly representable in bf16 (f32 for the gates), so that every
  // path sees the same function arguments.
  for (Vec *x : {&d.q, &d.k, &d.v, &dO})
    *x = uncast(cast<bf16>(*x));
  for (Vec *x : {&d.g, &d.beta, &d.h0})
    *x = uncast(f32(*x));
  auto b1 = runChunk<bf16>(d, dO), b2 = runChunk<bf16>(d, dO);
  auto f1 = runChunk<float>(d, dO), f2 = runChunk<float>(d, dO);
  for (size_t i = 0; i < b1.size(); ++i) {
    EXPECT_EQ(b1[i], b2[i]) << "bf16 output " << i << " not bitwise repeatable";
    EXPECT_EQ(f1[i], f2[i]) << "f32 output " << i << " not bitwise repeatable";
  }
  // f64 on the same (bf16-rounded) inputs as the oracle for both.
  ChunkData r = d;
  Vec dOr = dO;
  auto f64 = [&]() {
    std::vector<Vec> out;
    Vec o(r.oSize()), fin(r.stSize()), gc(r.g.size()),
        tm(size_t(sh.B * sh.T * sh.Hv * 64));
    Vec dq(r.q.size()), dk(r.k.size()), dv(r.v.size()), dg(r.g.size()),
        db(r.g.size()), dh0(r.h0.size());
    Vec g32 = uncast(f32(r.g)), b32 = uncast(f32(r.beta)),
        h32 = uncast(f32(r.h0));
    GdnChunkArgs a = r.args();
    a.g = g32.data();
    a.beta = b32.data();
    a.initialState = h32.data();
    a.o = o.data();
    a.finalState = fin.data();
    a.gCum = gc.data();
    a.tMat = tm.data();
    EXPECT_EQ(gdnChunkForward(host(), a), Status::Ok);
    a.dO = dOr.data();
    a.dq = dq.data();
    a.dk = dk.data();
    a.dv = dv.data();
    a.dg = dg.data();
    a.dbeta = db.data();
    a.dInitialState = dh0.data();
    EXPECT_EQ(gdnChunkBackward(host(), a), Status::Ok);
    return std::vector<Vec>{o, fin, dq, dk, dv, dg, db, dh0};
  }();
  const char *names[] = {"o", "final", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
  for (size_t i = 0; i < f64.size(); ++i) {
    // bf16 storage of o, T and the gradients (8 bits of mantissa): 2e-2.
    EXPECT_LT(relErr(b1[i], f64[i]), 2e-2) << names[i];
    EXPECT_LT(relErr(f1[i], f64[i]), 1e-4) << names[i];
  }
}

//===----------------------------------------------------------------------===//
// Short conv, gates, L2 norm, gated norm
//===----------------------------------------------------------------------===//

/// F64 short-conv arguments on x, w and y (the rest unset).
GdnConvArgs f64Conv(int64_t B, int64_t T, int64_t C, int64_t K, const Vec &x,
                    const Vec &w, Vec &y) {
  GdnConvArgs a;
  a.dtype = DType::F64;
  a.batch = B;
  a.seqLen = T;
  a.channels = C;
  a.kernelSize = int32_t(K);
  a.x = x.data();
  a.w = w.data();
  a.y = y.data();
  return a;
}

// The split output layout (q, k, v in their own buffers) gives the dense
// layout's values exactly; bad splits are rejected.
TEST(GdnReference, ConvSplitOutputEqualsDense) {
  const int64_t B = 2, T = 9, C = 7, K = 4;
  const int64_t widths[3] = {3, 1, 3};
  Vec x = randn(size_t(B * T * C), 4), w = randn(size_t(C * K), 5, 0.5);
  Vec dy = randn(x.size(), 6), y(x.size()), dx(x.size()), dw(w.size(), 0.0);
  GdnConvArgs a = f64Conv(B, T, C, K, x, w, y);
  a.dy = dy.data();
  a.dx = dx.data();
  a.dw = dw.data();
  ASSERT_EQ(gdnConvForward(host(), a), Status::Ok);
  ASSERT_EQ(gdnConvBackward(host(), a), Status::Ok);
  // The same problem with y and dy in three groups.
  std::vector<Vec> ys, dys;
  for (int64_t s = 0, c0 = 0; s < 3; c0 += widths[s++]) {
    ys.emplace_back(size_t(B * T * widths[s]), -7.0);
    dys.emplace_back(size_t(B * T * widths[s]));
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t c = 0; c < widths[s]; ++c)
        dys[s][size_t(r * widths[s] + c)] = dy[size_t(r * C + c0 + c)];
  }
  GdnConvArgs g = a;
  g.y = nullptr;
  g.dy = nullptr;
  g.splits = 3;
  Vec gdx(x.size()), gdw(w.size(), 0.0);
  g.dx = gdx.data();
  g.dw = gdw.data();
  for (int s = 0; s < 3; ++s) {
    g.splitChannels[s] = widths[s];
    g.ys[s] = ys[s].data();
    g.dys[s] = dys[s].data();
  }
  ASSERT_EQ(gdnConvForward(host(), g), Status::Ok);
  ASSERT_EQ(gdnConvBackward(host(), g), Status::Ok);
  for (int64_t s = 0, c0 = 0; s < 3; c0 += widths[s++])
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t c = 0; c < widths[s]; ++c)
        ASSERT_EQ(ys[s][size_t(r * widths[s] + c)], y[size_t(r * C + c0 + c)])
            << "group " << s << " row " << r << " channel " << c;
  EXPECT_EQ(gdx, dx);
  EXPECT_EQ(gdw, dw);
  g.splitChannels[2] = 2; // groups sum to 6 of 7 channels
  EXPECT_EQ(gdnConvForward(host(), g), Status::InvalidArgument);
  g.splitChannels[2] = 3;
  g.splits = kGdnConvMaxSplits + 1;
  EXPECT_EQ(gdnConvBackward(host(), g), Status::InvalidArgument);
}

TEST(GdnReference, ConvBackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 9, C = 5, K = 4;
  Vec x = randn(size_t(B * T * C), 1), w = randn(size_t(C * K), 2, 0.5);
  Vec r = randn(x.size(), 3), y(x.size());
  auto run = [&]() { return f64Conv(B, T, C, K, x, w, y); };
  auto loss = [&]() {
    EXPECT_EQ(gdnConvForward(host(), run()), Status::Ok);
    return dot(y, r);
  };
  GdnConvArgs a = run();
  Vec dx(x.size()), dw(w.size(), 0.25);
  a.dy = r.data();
  a.dx = dx.data();
  a.dw = dw.data();
  ASSERT_EQ(gdnConvBackward(host(), a), Status::Ok);
  for (auto &v : dw)
    v -= 0.25; // accumulated into the preset value
  EXPECT_LT(relErr(dx, finiteDiff(x, loss)), 1e-7);
  EXPECT_LT(relErr(dw, finiteDiff(w, loss)), 1e-7);
  // Causality and the per-row reset: y at row 1, t = 0 only sees x there.
  loss();
  Vec y0 = y;
  x[size_t((0 * T + T - 1) * C)] += 1.0;
  loss();
  for (int64_t c = 0; c < C; ++c)
    EXPECT_EQ(y[size_t((1 * T + 0) * C + c)], y0[size_t((1 * T + 0) * C + c)]);
}

TEST(GdnReference, GatesBackwardMatchesFiniteDifferences) {
  const int64_t N = 7;
  const int32_t H = 3;
  Vec a = randn(size_t(N * H), 1, 2.0), b = randn(size_t(N * H), 2, 2.0);
  a[0] = 25.0; // softplus threshold branch
  Vec aLog = {std::log(1.5), std::log(0.2), std::log(8.0)},
      dtb = {1.0, -0.5, 0.3};
  Vec g(a.size()), beta(a.size());
  Vec rg = randn(a.size(), 3), rb = randn(a.size(), 4);
  auto args = [&]() {
    GdnGatesArgs x;
    x.dtype = DType::F64;
    x.tokens = N;
    x.heads = H;
    x.a = a.data();
    x.b = b.data();
    x.aLog = aLog.data();
    x.dtBias = dtb.data();
    x.g = g.data();
    x.beta = beta.data();
    return x;
  };
  auto loss = [&]() {
    EXPECT_EQ(gdnGatesForward(host(), args()), Status::Ok);
    return dot(g, rg) + dot(beta, rb);
  };
  loss();
  GdnGatesArgs x = args();
  Vec da(a.size()), db(b.size()), dAl(3, 0.0), ddt(3, 0.0);
  x.dg = rg.data();
  x.dbeta = rb.data();
  x.da = da.data();
  x.db = db.data();
  x.dALog = dAl.data();
  x.dDtBias = ddt.data();
  ASSERT_EQ(gdnGatesBackward(host(), x), Status::Ok);
  EXPECT_LT(relErr(db, finiteDiff(b, loss)), 1e-7);
  EXPECT_LT(relErr(dAl, finiteDiff(aLog, loss)), 1e-7);
  EXPECT_LT(relErr(ddt, finiteDiff(dtb, loss)), 1e-7);
  // a[0] sits in the linear branch of softplus (x > 20): FD checks it too.
  EXPECT_LT(relErr(da, finiteDiff(a, loss)), 1e-6);
}

TEST(GdnReference, L2NormBackwardMatchesFiniteDifferences) {
  const int64_t N = 6;
  const int32_t H = 2, d = 5;
  const int64_t xs = 13,
                ys = 11; // strided rows, as read out of the conv output
  Vec x = randn(size_t(N * xs), 1), y(size_t(N * ys), 7.0), rstd(size_t(N * H));
  Vec r = randn(y.size(), 2);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = H * d; i < ys; ++i)
      r[size_t(n * ys + i)] = 0; // gaps are not outputs
  auto args = [&]() {
    GdnL2NormArgs a;
    a.dtype = DType::F64;
    a.tokens = N;
    a.heads = H;
    a.dim = d;
    a.xStride = xs;
    a.yStride = ys;
    a.x = x.data();
    a.y = y.data();
    a.rstd = rstd.data();
    return a;
  };
  auto loss = [&]() {
    EXPECT_EQ(gdnL2NormForward(host(), args()), Status::Ok);
    return dot(y, r);
  };
  loss();
  for (int64_t n = 0; n < N; ++n)
    EXPECT_EQ(y[size_t(n * ys + H * d)], 7.0) << "wrote outside the rows";
  GdnL2NormArgs a = args();
  Vec dx(x.size(), 0.0);
  a.dy = r.data();
  a.dx = dx.data();
  ASSERT_EQ(gdnL2NormBackward(host(), a), Status::Ok);
  EXPECT_LT(relErr(dx, finiteDiff(x, loss)), 1e-7);
}

/// Gated norm forward arguments over host arrays.
GdnGatedNormArgs gatedNormArgs(DType dtype, int64_t tokens, int32_t heads,
                               int32_t dim, const void *x, const void *z,
                               const void *w, void *y, void *rstd) {
  GdnGatedNormArgs a;
  a.dtype = dtype;
  a.tokens = tokens;
  a.heads = heads;
  a.dim = dim;
  a.x = x;
  a.z = z;
  a.w = w;
  a.y = y;
  a.rstd = rstd;
  return a;
}

TEST(GdnReference, GatedNormBackwardMatchesFiniteDifferences) {
  const int64_t N = 5;
  const int32_t H = 2, d = 6;
  Vec x = randn(size_t(N * H * d), 1), z = randn(x.size(), 2, 2.0),
      w = randn(size_t(d), 3), y(x.size()), rstd(size_t(N * H));
  Vec r = randn(x.size(), 4);
  auto args = [&]() {
    return gatedNormArgs(DType::F64, N, H, d, x.data(), z.data(), w.data(),
                         y.data(), rstd.data());
  };
  auto loss = [&]() {
    EXPECT_EQ(gdnGatedNormForward(host(), args()), Status::Ok);
    return dot(y, r);
  };
  loss();
  GdnGatedNormArgs a = args();
  Vec dx(x.size()), dz(x.size()), dw(size_t(d), 0.0);
  a.dy = r.data();
  a.dx = dx.data();
  a.dz = dz.data();
  a.dw = dw.data();
  ASSERT_EQ(gdnGatedNormBackward(host(), a), Status::Ok);
  EXPECT_LT(relErr(dx, finiteDiff(x, loss)), 1e-7);
  EXPECT_LT(relErr(dz, finiteDiff(z, loss)), 1e-7);
  EXPECT_LT(relErr(dw, finiteDiff(w, loss)), 1e-7);
}

TEST(GdnReference, GatedNormBackwardRebuildsForwardBitsBf16) {
  // train-fuse-recompute: the backward writes y from the saved rstd; it must
  // be the forward's bytes, and dx, dz, dw as without y.
  const int64_t N = 7;
  const int32_t H = 3, d = 20;
  const size_t n = size_t(N * H * d);
  auto bf = [](const Vec &v) {
    std::vector<bf16> o(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      o[i] = bf16(float(v[i]));
    return o;
  };
  auto x = bf(randn(n, 11, 2.0)), z = bf(randn(n, 12, 2.0)),
       w = bf(randn(size_t(d), 13)), dy = bf(randn(n, 14));
  std::vector<bf16> yF(n), yB(n), dx(n), dz(n), dx2(n), dz2(n);
  std::vector<float> rstd(size_t(N * H)), dw(size_t(d), 0.f), dw2 = dw;
  GdnGatedNormArgs a = gatedNormArgs(DType::BF16, N, H, d, x.data(), z.data(),
                                     w.data(), yF.data(), rstd.data());
  ASSERT_EQ(gdnGatedNormForward(host(), a), Status::Ok);
  a.y = nullptr;
  a.dy = dy.data();
  a.dx = dx.data();
  a.dz = dz.data();
  a.dw = dw.data();
  ASSERT_EQ(gdnGatedNormBackward(host(), a), Status::Ok);
  a.y = yB.data();
  a.dx = dx2.data();
  a.dz = dz2.data();
  a.dw = dw2.data();
  ASSERT_EQ(gdnGatedNormBackward(host(), a), Status::Ok);
  EXPECT_EQ(std::memcmp(yF.data(), yB.data(), n * 2), 0);
  EXPECT_EQ(std::memcmp(dx.data(), dx2.data(), n * 2), 0);
  EXPECT_EQ(std::memcmp(dz.data(), dz2.data(), n * 2), 0);
  EXPECT_EQ(std::memcmp(dw.data(), dw2.data(), dw.size() * 4), 0);
}

#if !ACTPLACE_HAVE_CUDA
/// Without the cuda kernels the entries answer Unsupported on the cuda
/// backend (weak references resolve to null) and need no workspace.
TEST(GdnReference, CudaBackendUnsupportedWithoutCuda) {
  KernelContext ctx;
  ctx.backend = Backend::Cuda;
  GdnGatesArgs g;
  g.dtype = DType::BF16;
  EXPECT_EQ(gdnGatesForward(ctx, g), Status::Unsupported);
  GdnChunkArgs c;
  c.dtype = DType::BF16;
  EXPECT_EQ(gdnChunkForward(ctx, c), Status::Unsupported);
  EXPECT_EQ(gdnChunkBackward(ctx, c), Status::Unsupported);
  EXPECT_EQ(gdnChunkBackwardWorkspaceBytes(c), 0u);
}
#endif

} // namespace
