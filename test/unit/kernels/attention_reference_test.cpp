//===- attention_reference_test.cpp - CPU attention vs float64 math -------===//
//
// The reference attention (the oracle for CUDA and the host backend) against
// an independent float64 naive softmax attention, and its backward against
// central finite differences in float64. Shapes are small and deliberately
// awkward: GQA groups of 2 and 3, Dqk != Dv, T not a multiple of any tile.
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

using namespace ap::kernels;

namespace {

struct Shape {
  int B, T, Hq, Hkv, Dqk, Dv;
  double scale;
};

std::string str(const Shape &s) {
  return "B" + std::to_string(s.B) + " T" + std::to_string(s.T) + " Hq" +
         std::to_string(s.Hq) + " Hkv" + std::to_string(s.Hkv) + " Dqk" +
         std::to_string(s.Dqk) + " Dv" + std::to_string(s.Dv);
}

AttentionShape toShape(const Shape &s) {
  AttentionShape a;
  a.batch = s.B;
  a.seqLen = s.T;
  a.numQHeads = s.Hq;
  a.numKvHeads = s.Hkv;
  a.headDimQk = s.Dqk;
  a.headDimV = s.Dv;
  a.softmaxScale = s.scale;
  return a;
}

struct Tensors {
  std::vector<double> q, k, v, dO;
};

/// Random N(0,1) data, rounded through bf16 so that every storage type sees
/// exactly the same values (bf16 values are exact in float and double).
Tensors makeInputs(const Shape &s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto fill = [&](size_t n) {
    std::vector<double> x(n);
    for (auto &e : x)
      e = static_cast<float>(bf16(nd(rng)));
    return x;
  };
  Tensors t;
  t.q = fill(size_t(s.B) * s.T * s.Hq * s.Dqk);
  t.k = fill(size_t(s.B) * s.T * s.Hkv * s.Dqk);
  t.v = fill(size_t(s.B) * s.T * s.Hkv * s.Dv);
  t.dO = fill(size_t(s.B) * s.T * s.Hq * s.Dv);
  return t;
}

/// Independent float64 oracle: materialises the whole masked score matrix per
/// (batch, q head) and applies the textbook softmax.
void naiveForward(const Shape &s, const std::vector<double> &q,
                  const std::vector<double> &k, const std::vector<double> &v,
                  std::vector<double> &o, std::vector<double> &lse) {
  o.assign(size_t(s.B) * s.T * s.Hq * s.Dv, 0.0);
  lse.assign(size_t(s.B) * s.Hq * s.T, 0.0);
  const int group = s.Hq / s.Hkv;
  std::vector<double> S(size_t(s.T) * s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.Hq; ++h) {
      const int hk = h / group;
      for (int i = 0; i < s.T; ++i)
        for (int j = 0; j < s.T; ++j) {
          double dot = 0;
          for (int d = 0; d < s.Dqk; ++d)
            dot += q[((size_t(b) * s.T + i) * s.Hq + h) * s.Dqk + d] *
                   k[((size_t(b) * s.T + j) * s.Hkv + hk) * s.Dqk + d];
          S[size_t(i) * s.T + j] = j <= i ? dot * s.scale : -INFINITY;
        }
      for (int i = 0; i < s.T; ++i) {
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < s.T; ++j)
          m = std::max(m, S[size_t(i) * s.T + j]);
        for (int j = 0; j < s.T; ++j)
          sum += std::exp(S[size_t(i) * s.T + j] - m);
        lse[(size_t(b) * s.Hq + h) * s.T + i] = m + std::log(sum);
        for (int j = 0; j < s.T; ++j) {
          double p = std::exp(S[size_t(i) * s.T + j] - m) / sum;
          for (int d = 0; d < s.Dv; ++d)
            o[((size_t(b) * s.T + i) * s.Hq + h) * s.Dv + d] +=
                p * v[((size_t(b) * s.T + j) * s.Hkv + hk) * s.Dv + d];
        }
      }
    }
}

template <typename T> std::vector<T> cast(const std::vector<double> &x) {
  std::vector<T> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = T(static_cast<T>(x[i]));
  return y;
}
template <> std::vector<bf16> cast<bf16>(const std::vector<double> &x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = bf16(static_cast<float>(x[i]));
  return y;
}
template <typename T> std::vector<double> back(const std::vector<T> &x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = static_cast<double>(toFloat(x[i]));
  return y;
}

template <typename T> constexpr DType dtypeOf();
template <> constexpr DType dtypeOf<bf16>() { return DType::BF16; }
template <> constexpr DType dtypeOf<float>() { return DType::F32; }
template <> constexpr DType dtypeOf<double>() { return DType::F64; }
template <typename T>
using LseOf = std::conditional_t<std::is_same_v<T, double>, double, float>;

struct Outputs {
  std::vector<double> o, lse, dq, dk, dv;
};

/// Runs the reference forward and backward through the public entries with
/// storage type T; returns everything widened to double.
template <typename T> Outputs runReference(const Shape &s, const Tensors &in) {
  std::vector<T> q = cast<T>(in.q), k = cast<T>(in.k), v = cast<T>(in.v),
                 dO = cast<T>(in.dO);
  std::vector<T> o(size_t(s.B) * s.T * s.Hq * s.Dv);
  std::vector<LseOf<T>> lse(size_t(s.B) * s.Hq * s.T);
  KernelContext ctx; // host backend
  AttentionForwardArgs fa;
  fa.dtype = dtypeOf<T>();
  fa.shape = toShape(s);
  fa.q = q.data();
  fa.k = k.data();
  fa.v = v.data();
  fa.o = o.data();
  fa.lse = lse.data();
  EXPECT_EQ(attentionForward(ctx, fa), Status::Ok);

  std::vector<T> dq(q.size()), dk(k.size()), dv(v.size());
  AttentionBackwardArgs ba;
  ba.dtype = fa.dtype;
  ba.shape = fa.shape;
  ba.q = q.data();
  ba.k = k.data();
  ba.v = v.data();
  ba.o = o.data();
  ba.lse = lse.data();
  ba.dO = dO.data();
  ba.dq = dq.data();
  ba.dk = dk.data();
  ba.dv = dv.data();
  EXPECT_EQ(attentionBackward(ctx, ba), Status::Ok);

  Outputs out;
  out.o = back(o);
  out.lse.assign(lse.begin(), lse.end());
  out.dq = back(dq);
  out.dk = back(dk);
  out.dv = back(dv);
  return out;
}

/// Element-wise |got - want| <= rtol |want| + atol * max|want|.
void expectClose(const std::string &what, const std::vector<double> &got,
                 const std::vector<double> &want, double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double maxAbs = 0;
  for (double w : want)
    maxAbs = std::max(maxAbs, std::fabs(w));
  ASSERT_GT(maxAbs, 0.0) << what << ": reference is all zeros";
  size_t bad = 0, worst = 0;
  double worstErr = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(got[i] - want[i]);
    double lim = rtol * std::fabs(want[i]) + atol * maxAbs;
    if (!(err <= lim))
      ++bad;
    if (!(err <= worstErr) || std::isnan(err)) {
      worstErr = err;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": worst index " << worst << " got "
                     << got[worst] << " want " << want[worst] << " (max|want| "
                     << maxAbs << ")";
}

const Shape kShapes[] = {
    {2, 7, 4, 2, 6, 4, 0.4},     // GQA group 2, Dqk != Dv, tiny T
    {1, 70, 3, 1, 24, 16, 0.2},  // group 3, T not a tile multiple
    {1, 45, 2, 2, 40, 24, 0.15}, // MHA (the MLA case), Dqk > Dv
    {3, 19, 2, 1, 16, 32, 0.25}, // Dv > Dqk, B > 1
};

TEST(AttentionReference, ForwardMatchesNaiveFloat64) {
  for (const Shape &s : kShapes) {
    SCOPED_TRACE(str(s));
    Tensors in = makeInputs(s, 1234u + s.T);
    std::vector<double> o, lse;
    naiveForward(s, in.q, in.k, in.v, o, lse);

    Outputs d = runReference<double>(s, in);
    expectClose("o f64", d.o, o, 1e-12, 1e-13);
    expectClose("lse f64", d.lse, lse, 1e-12, 1e-13);

    Outputs f = runReference<float>(s, in);
    expectClose("o f32", f.o, o, 1e-5, 1e-6);
    expectClose("lse f32", f.lse, lse, 1e-5, 1e-6);

    // bf16 storage: output rounding (2^-9 relative) plus fp32 accumulation.
    Outputs h = runReference<bf16>(s, in);
    expectClose("o bf16", h.o, o, 4e-3, 1e-5);
    expectClose("lse bf16", h.lse, lse, 1e-5, 1e-6);
  }
}

TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  for (const Shape &s : kShapes) {
    if (s.T > 20)
      continue; // every coordinate is perturbed: keep it small
    SCOPED_TRACE(str(s));
    Tensors in = makeInputs(s, 99u + s.T);
    Outputs g = runReference<double>(s, in);

    // L(q, k, v) = sum(dO * O(q, k, v)) so dL/dx is exactly what backward
    // computes with upstream gradient dO.
    auto loss = [&](const Tensors &t) {
      std::vector<double> o, lse;
      naiveForward(s, t.q, t.k, t.v, o, lse);
      double l = 0;
      for (size_t i = 0; i < o.size(); ++i)
        l += in.dO[i] * o[i];
      return l;
    };
    const double eps = 1e-6;
    auto fd = [&](std::vector<double> Tensors::*field) {
      Tensors t = in;
      std::vector<double> grad((t.*field).size());
      for (size_t i = 0; i < grad.size(); ++i) {
        double x = (t.*field)[i];
        (t.*field)[i] = x + eps;
        double lp = loss(t);
        (t.*field)[i] = x - eps;
        double lm = loss(t);
        (t.*field)[i] = x;
        grad[i] = (lp - lm) / (2 * eps);
      }
      return grad;
    };
    expectClose("dq", g.dq, fd(&Tensors::q), 1e-6, 1e-7);
    expectClose("dk", g.dk, fd(&Tensors::k), 1e-6, 1e-7);
    expectClose("dv", g.dv, fd(&Tensors::v), 1e-6, 1e-7);
  }
}

TEST(AttentionReference, LowerPrecisionBackwardTracksFloat64) {
  for (const Shape &s : kShapes) {
    SCOPED_TRACE(str(s));
    Tensors in = makeInputs(s, 7u + s.T);
    Outputs d = runReference<double>(s, in);
    Outputs f = runReference<float>(s, in);
    expectClose("dq f32", f.dq, d.dq, 1e-4, 1e-5);
    expectClose("dk f32", f.dk, d.dk, 1e-4, 1e-5);
    expectClose("dv f32", f.dv, d.dv, 1e-4, 1e-5);
    // bf16: O is rounded before D = dO.O, so dS carries ~2^-9 relative noise
    // in D on top of the output rounding.
    Outputs h = runReference<bf16>(s, in);
    expectClose("dq bf16", h.dq, d.dq, 8e-3, 4e-3);
    expectClose("dk bf16", h.dk, d.dk, 8e-3, 4e-3);
    expectClose("dv bf16", h.dv, d.dv, 8e-3, 1e-4);
  }
}

TEST(AttentionReference, Deterministic) {
  const Shape s{2, 37, 4, 2, 16, 8, 0.25};
  Tensors in = makeInputs(s, 5u);
  Outputs a = runReference<bf16>(s, in);
  Outputs b = runReference<bf16>(s, in);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.dq, b.dq);
  EXPECT_EQ(a.dk, b.dk);
  EXPECT_EQ(a.dv, b.dv);
}

TEST(AttentionReference, RejectsBadShapes) {
  std::vector<float> buf(64);
  KernelContext ctx;
  AttentionForwardArgs fa;
  fa.dtype = DType::F32;
  fa.shape = toShape({1, 2, 3, 2, 4, 4, 0.5}); // 3 q heads over 2 kv heads
  fa.q = fa.k = fa.v = buf.data();
  fa.o = fa.lse = buf.data();
  EXPECT_EQ(attentionForward(ctx, fa), Status::InvalidArgument);
  fa.shape = toShape({1, 2, 2, 2, 4, 4, 0.0}); // no scale
  EXPECT_EQ(attentionForward(ctx, fa), Status::InvalidArgument);
  fa.shape = toShape({1, 2, 2, 2, 4, 4, 0.5});
  fa.dtype = DType::I32;
  EXPECT_EQ(attentionForward(ctx, fa), Status::InvalidArgument);
  fa.dtype = DType::F32;
  fa.lse = nullptr;
  EXPECT_EQ(attentionForward(ctx, fa), Status::InvalidArgument);
#ifndef ACTPLACE_HAVE_CUDA
  fa.lse = buf.data();
  ctx.backend = Backend::Cuda;
  EXPECT_EQ(attentionForward(ctx, fa), Status::Unsupported);
#endif
}

TEST(AttentionReference, WorkspaceQuery) {
  AttentionBackwardArgs a;
  a.shape = toShape({2, 100, 8, 2, 256, 256, 0.0625});
  // D (fp32 per row and q head) plus fp32 per-q-head dK and dV partials,
  // plus (StoredDs) the causal 64x64 bf16 dS tiles of every (batch, head).
  size_t rows = 2 * 100;
  auto align = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t dsTiles = 2 * 3 / 2 * 64 * 64 * 2; // 2 tiles: 3 causal pairs
  EXPECT_EQ(detail::attentionBackwardWorkspaceBytesFor(
                a.shape, AttentionBackwardAlgo::RecomputeDq),
            align(rows * 8 * 4) + 2 * align(rows * 8 * 256 * 4));
  EXPECT_EQ(detail::attentionBackwardWorkspaceBytesFor(
                a.shape, AttentionBackwardAlgo::StoredDs),
            align(rows * 8 * 4) + 2 * align(rows * 8 * 256 * 4) +
                align(2 * 8 * dsTiles));
  EXPECT_EQ(attentionBackwardWorkspaceBytes(a),
            detail::attentionBackwardWorkspaceBytesFor(
                a.shape, detail::attentionBackwardDefaultAlgo(a.shape)));
  a.shape = toShape({1, 100, 16, 16, 192, 128, 0.07});
  EXPECT_EQ(detail::attentionBackwardWorkspaceBytesFor(
                a.shape, AttentionBackwardAlgo::RecomputeDq),
            align(100 * 16 * 4));
  // Chunks of (batch, head) pairs: at most 256 MiB of dS, equal sizes.
  AttentionShape big = toShape({1, 4096, 128, 128, 192, 128, 0.07});
  const int64_t perPair = 64 * 65 / 2 * 64 * 64 * 2; // 17 MB at T = 4096
  const int64_t chunk = detail::attentionStoredDsChunk(big);
  EXPECT_LE(chunk * perPair, int64_t(256) << 20);
  EXPECT_EQ(chunk, 15); // 128 pairs in 9 launches of at most 15
  EXPECT_EQ(detail::attentionStoredDsChunk(
                toShape({1, 4096, 8, 2, 256, 256, 0.0625})),
            8);
  AttentionForwardArgs f;
  EXPECT_EQ(attentionForwardWorkspaceBytes(f), 0u);
}

} // namespace
