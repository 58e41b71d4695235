//===- dense_ref.cpp - dense kernels: CPU reference ---------------*- C++
//-*-===//
//
// The oracle for the dense op family (kernels/dense.h) and the kernels the
// host backend runs. Single-threaded, fixed summation orders, templated on the
// storage type (bf16, float, double) with accumulation in Acc<T>.
//
//===----------------------------------------------------------------------===//
#include "kernels/reference/dense/dense_internal.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace ap::kernels::ref {
namespace {

template <class T> std::vector<Acc<T>> toAcc(const T *p, int64_t n) {
  std::vector<Acc<T>> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = load(p[i]);
  return v;
}

/// Transposed acc copy of a row-major [rows, cols] matrix.
template <class T>
std::vector<Acc<T>> toAccT(const T *p, int64_t rows, int64_t cols) {
  std::vector<Acc<T>> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v[c * rows + r] = load(p[r * cols + c]);
  return v;
}

template <class A> A sigmoid(A x) { return A(1) / (A(1) + std::exp(-x)); }

inline int64_t strideOr(int64_t s, int64_t cols) { return s ? s : cols; }

} // namespace

//===----------------------------------------------------------------------===//
// GEMM
//===----------------------------------------------------------------------===//

template <class T>
Status linearForward(const T *x, const T *w, T *y, int64_t rows, int64_t in,
                     int64_t out) {
  auto xa = toAcc(x, rows * in);
  auto wa = toAcc(w, out * in);
  gemmNT(xa.data(), wa.data(), rows, out, in,
         [&](int64_t i, int64_t j, Acc<T> s) { y[i * out + j] = store<T>(s); });
  return Status::Ok;
}

template <class T>
Status linearBackward(const T *x, const T *w, const T *dy, T *dx, Acc<T> *dw,
                      int64_t rows, int64_t in, int64_t out) {
  if (dx) {
    auto dya = toAcc(dy, rows * out);
    auto wt = toAccT(w, out, in); // [in, out]
    gemmNT(
        dya.data(), wt.data(), rows, in, out,
        [&](int64_t i, int64_t j, Acc<T> s) { dx[i * in + j] = store<T>(s); });
  }
  if (dw) {
    auto dyt = toAccT(dy, rows, out); // [out, rows]
    auto xt = toAccT(x, rows, in);    // [in, rows]
    gemmNT(dyt.data(), xt.data(), out, in, rows,
           [&](int64_t i, int64_t j, Acc<T> s) { dw[i * in + j] += s; });
  }
  return Status::Ok;
}

//===----------------------------------------------------------------------===//
// RMSNorm
//===----------------------------------------------------------------------===//

/// x * rstd * w_eff: one expression for the forward and for a backward that
/// rebuilds y from the saved rstd, so both write the same bits.
template <class A> A rmsNormValue(A x, A rs, A we) { return x * rs * we; }

template <class T> Status rmsNormForward(const RmsNormForwardArgs &a) {
  using A = Acc<T>;
  const T *x = static_cast<const T *>(a.x);
  const T *w = static_cast<const T *>(a.w);
  T *y = static_cast<T *>(a.y);
  A *rstd = static_cast<A *>(a.rstd);
  int64_t xs = strideOr(a.xStride, a.dim), ys = strideOr(a.yStride, a.dim);
  std::vector<A> weff(static_cast<size_t>(a.dim));
  for (int64_t j = 0; j < a.dim; ++j)
    weff[j] = a.zeroCentered ? A(1) + load(w[j]) : load(w[j]);
  for (int64_t r = 0; r < a.rows; ++r) {
    const T *xr = x + r * xs;
    A ss = 0;
    for (int64_t j = 0; j < a.dim; ++j) {
      A v = load(xr[j]);
      ss += v * v;
    }
    A rs = A(1) / std::sqrt(ss / A(a.dim) + A(a.eps));
    if (rstd)
      rstd[r] = rs;
    T *yr = y + r * ys;
    for (int64_t j = 0; j < a.dim; ++j)
      yr[j] = store<T>(rmsNormValue(load(xr[j]), rs, weff[j]));
  }
  return Status::Ok;
}

template <class T> Status rmsNormBackward(const RmsNormBackwardArgs &a) {
  using A = Acc<T>;
  const T *x = static_cast<const T *>(a.x);
  const T *w = static_cast<const T *>(a.w);
  const A *rstd = static_cast<const A *>(a.rstd);
  const T *dy = static_cast<const T *>(a.dy);
  T *dx = static_cast<T *>(a.dx);
  T *y = static_cast<T *>(a.y);
  A *dw = static_cast<A *>(a.dw);
  int64_t xs = strideOr(a.xStride, a.dim), dys = strideOr(a.dyStride, a.dim),
          dxs = strideOr(a.dxStride, a.dim), ys = strideOr(a.yStride, a.dim);
  std::vector<A> weff(static_cast<size_t>(a.dim)), dwSum(a.dim, A(0));
  for (int64_t j = 0; j < a.dim; ++j)
    weff[j] = a.zeroCentered ? A(1) + load(w[j]) : load(w[j]);
  for (int64_t r = 0; r < a.rows; ++r) {
    const T *xr = x + r * xs;
    const T *dyr = dy + r * dys;
    A rs = rstd[r];
    A dot = 0;
    for (int64_t j = 0; j < a.dim; ++j)
      dot += load(dyr[j]) * weff[j] * load(xr[j]);
    A c = dot * rs * rs * rs / A(a.dim);
    for (int64_t j = 0; j < a.dim; ++j) {
      A xv = load(xr[j]), g = load(dyr[j]);
      if (dx)
        dx[r * dxs + j] = store<T>(rs * weff[j] * g - c * xv);
      if (y)
        y[r * ys + j] = store<T>(rmsNormValue(xv, rs, weff[j]));
      dwSum[j] += g * xv * rs;
    }
  }
  if (dw)
    for (int64_t j = 0; j < a.dim; ++j)
      dw[j] += dwSum[j];
  return Status::Ok;
}

//===----------------------------------------------------------------------===//
// Rotary embedding
//===----------------------------------------------------------------------===//

template <class T> Status rope(const RopeArgs &a, bool backward) {
  using A = Acc<T>;
  const T *x = static_cast<const T *>(a.x);
  T *y = static_cast<T *>(a.y);
  int64_t h = a.rotaryDim / 2;
  // cos/sin per (position, frequency): angle in double, rounded to acc. A
  // token's position is at most its index, with or without packed documents.
  std::vector<A> cs(static_cast<size_t>(a.seq * h)), sn(cs.size());
  for (int64_t t = 0; t < a.seq; ++t)
    for (int64_t i = 0; i < h; ++i) {
      double invFreq =
          std::pow(a.theta, -2.0 * double(i) / double(a.rotaryDim));
      double ang = double(t) * invFreq;
      cs[t * h + i] = A(std::cos(ang));
      sn[t * h + i] = backward ? A(-std::sin(ang)) : A(std::sin(ang));
    }
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t t = 0; t < a.seq; ++t)
      for (int64_t hh = 0; hh < a.heads; ++hh) {
        int64_t base = ((b * a.seq + t) * a.heads + hh) * a.headDim;
        if (x != y)
          for (int64_t j = 0; j < a.headDim; ++j)
            if (j < a.offset || j >= a.offset + a.rotaryDim)
              y[base + j] = x[base + j];
        const T *xr = x + base + a.offset;
        T *yr = y + base + a.offset;
        const int64_t pos = a.docStart ? t - a.docStart[b * a.seq + t] : t;
        for (int64_t i = 0; i < h; ++i) {
          A c = cs[pos * h + i], s = sn[pos * h + i];
          A x1 = load(xr[i]), x2 = load(xr[i + h]);
          yr[i] = store<T>(x1 * c - x2 * s);
          yr[i + h] = store<T>(x2 * c + x1 * s);
        }
      }
  return Status::Ok;
}

//===----------------------------------------------------------------------===//
// Document starts of packed sequences
//===----------------------------------------------------------------------===//

Status documentStarts(const DocumentStartsArgs &a) {
  for (int64_t b = 0; b < a.batch; ++b) {
    const int32_t *tok = a.tokens + b * a.seq;
    int32_t *ds = a.docStart + b * a.seq;
    int32_t start = 0;
    for (int64_t t = 0; t < a.seq; ++t) {
      ds[t] = start;
      if (tok[t] == a.separator)
        start = int32_t(t + 1);
    }
  }
  return Status::Ok;
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

/// silu(g) * u with s = sigmoid(g): one expression for the forward and for a
/// backward that rebuilds y, so both write the same bits.
template <class A> A swiGluValue(A g, A s, A u) { return g * s * u; }

template <class T> Status swiGluForward(const SwiGluForwardArgs &a) {
  using A = Acc<T>;
  const T *g = static_cast<const T *>(a.gate);
  const T *u = static_cast<const T *>(a.up);
  T *y = static_cast<T *>(a.y);
  int64_t gs = strideOr(a.gateStride, a.cols),
          us = strideOr(a.upStride, a.cols), ys = strideOr(a.yStride, a.cols);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) {
      A gv = load(g[r * gs + c]);
      y[r * ys + c] =
          store<T>(swiGluValue(gv, sigmoid(gv), load(u[r * us + c])));
    }
  return Status::Ok;
}

template <class T> Status swiGluBackward(const SwiGluBackwardArgs &a) {
  using A = Acc<T>;
  const T *g = static_cast<const T *>(a.gate);
  const T *u = static_cast<const T *>(a.up);
  const T *dy = static_cast<const T *>(a.dy);
  T *dg = static_cast<T *>(a.dgate);
  T *du = static_cast<T *>(a.dup);
  T *y = static_cast<T *>(a.y);
  int64_t gs = strideOr(a.gateStride, a.cols),
          us = strideOr(a.upStride, a.cols), dys = strideOr(a.dyStride, a.cols),
          dgs = strideOr(a.dgateStride, a.cols),
          dus = strideOr(a.dupStride, a.cols), ys = strideOr(a.yStride, a.cols);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) {
      A gv = load(g[r * gs + c]), uv = load(u[r * us + c]),
        d = load(dy[r * dys + c]);
      A s = sigmoid(gv);
      if (dg)
        dg[r * dgs + c] = store<T>(d * uv * s * (A(1) + gv * (A(1) - s)));
      if (du)
        du[r * dus + c] = store<T>(d * (gv * s));
      if (y)
        y[r * ys + c] = store<T>(swiGluValue(gv, s, uv));
    }
  return Status::Ok;
}

template <class T> Status sigmoidGateForward(const SigmoidGateForwardArgs &a) {
  const T *o = static_cast<const T *>(a.o);
  const T *g = static_cast<const T *>(a.gate);
  T *y = static_cast<T *>(a.y);
  int64_t os = strideOr(a.oStride, a.cols), gs = strideOr(a.gateStride, a.cols),
          ys = strideOr(a.yStride, a.cols);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c)
      y[r * ys + c] =
          store<T>(load(o[r * os + c]) * sigmoid(load(g[r * gs + c])));
  return Status::Ok;
}

template <class T>
Status sigmoidGateBackward(const SigmoidGateBackwardArgs &a) {
  using A = Acc<T>;
  const T *o = static_cast<const T *>(a.o);
  const T *g = static_cast<const T *>(a.gate);
  const T *dy = static_cast<const T *>(a.dy);
  T *dO = static_cast<T *>(a.dout);
  T *dg = static_cast<T *>(a.dgate);
  int64_t os = strideOr(a.oStride, a.cols), gs = strideOr(a.gateStride, a.cols),
          dys = strideOr(a.dyStride, a.cols),
          dos = strideOr(a.doStride, a.cols),
          dgs = strideOr(a.dgateStride, a.cols);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) {
      A s = sigmoid(load(g[r * gs + c])), d = load(dy[r * dys + c]);
      if (dO)
        dO[r * dos + c] = store<T>(d * s);
      if (dg)
        dg[r * dgs + c] = store<T>(d * load(o[r * os + c]) * s * (A(1) - s));
    }
  return Status::Ok;
}

template <class T> Status residualAddForward(const ResidualAddArgs &a) {
  const T *x = static_cast<const T *>(a.a);
  const T *z = static_cast<const T *>(a.b);
  T *y = static_cast<T *>(a.y);
  for (int64_t i = 0; i < a.n; ++i)
    y[i] = store<T>(load(x[i]) + load(z[i]));
  return Status::Ok;
}

template <class T>
Status residualAddBackward(const ResidualAddBackwardArgs &a) {
  const T *dy = static_cast<const T *>(a.dy);
  for (T *d : {static_cast<T *>(a.da), static_cast<T *>(a.db)})
    if (d && d != dy)
      std::copy(dy, dy + a.n, d);
  return Status::Ok;
}

//===----------------------------------------------------------------------===//
// Embedding
//===----------------------------------------------------------------------===//

template <class T> Status embeddingForward(const EmbeddingForwardArgs &a) {
  const T *w = static_cast<const T *>(a.w);
  T *y = static_cast<T *>(a.y);
  // This rank's rows [off, off + vocab) of the table's [0, bound).
  const int64_t off = vocabOffset(a.group),
                bound = vocabBound(a.group, a.vocab);
  Status st = Status::Ok;
  for (int64_t n = 0; n < a.tokens; ++n) {
    int64_t id = a.ids[n];
    T *yr = y + n * a.dim;
    if (id < off || id >= off + a.vocab) {
      std::fill(yr, yr + a.dim, store<T>(Acc<T>(0)));
      if (id < 0 || id >= bound)
        st = Status::InvalidArgument;
      continue;
    }
    std::copy(w + (id - off) * a.dim, w + (id - off + 1) * a.dim, yr);
  }
  return st;
}

template <class T> Status embeddingBackward(const EmbeddingBackwardArgs &a) {
  const T *dy = static_cast<const T *>(a.dy);
  Acc<T> *dw = static_cast<Acc<T> *>(a.dw);
  const int64_t off = vocabOffset(a.group);
  // Token order per vocab row: the order the CUDA owner kernel uses too.
  for (int64_t n = 0; n < a.tokens; ++n) {
    int64_t id = a.ids[n];
    if (id < off || id >= off + a.vocab)
      continue;
    Acc<T> *row = dw + (id - off) * a.dim;
    for (int64_t d = 0; d < a.dim; ++d)
      row[d] += load(dy[n * a.dim + d]);
  }
  return Status::Ok;
}

//===----------------------------------------------------------------------===//
// Tied LM head + chunked cross-entropy
//===----------------------------------------------------------------------===//

/// Online (max, sum of exp) merge of (m2, s2) into (m, s) in a fixed operand
/// order: the CUDA kernels' lseMerge.
template <class A> void lseMerge(A &m, A &s, A m2, A s2) {
  A mn = std::max(m, m2);
  if (mn == -std::numeric_limits<A>::infinity())
    return;
  s = s * std::exp(m - mn) + s2 * std::exp(m2 - mn);
  m = mn;
}

template <class T>
Status lmHeadCrossEntropy(const KernelContext &ctx,
                          const LmHeadCrossEntropyArgs &a, bool backward) {
  using A = Acc<T>;
  const T *h = static_cast<const T *>(a.hidden);
  const T *w = static_cast<const T *>(a.weight);
  A *lse = static_cast<A *>(a.lse);
  T *dh = backward ? static_cast<T *>(a.dHidden) : nullptr;
  A *dW = backward ? static_cast<A *>(a.dWeight) : nullptr;
  const int64_t N = a.tokens, D = a.dim, V = a.vocab;
  const int64_t chunk =
      std::min<int64_t>(std::max<int64_t>(a.chunkTokens, 1), N);
  // A split vocabulary: this rank's logits are the whole table's columns
  // [off, off + V) of [0, bound), and each row's statistics are all-gathered
  // as floats (the group's collective), so with f64 storage the merged lse
  // carries fp32 rounding.
  const VocabGroup &group = a.group;
  const bool split = group.ranks > 1;
  const int64_t off = vocabOffset(group), bound = vocabBound(group, V);
  std::vector<float> send, recv;
  if (split) {
    send.resize(static_cast<size_t>(chunk * kCeStats));
    recv.resize(static_cast<size_t>(group.ranks * chunk * kCeStats));
  }
  auto wa = toAcc(w, V * D);
  std::vector<A> wt;
  if (dh)
    wt = toAccT(w, V, D); // [D, V]
  std::vector<A> logits(static_cast<size_t>(chunk * V));
  A lossSum = 0;
  int32_t count = 0;
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    int64_t cn = std::min(chunk, N - n0);
    auto ha = toAcc(h + n0 * D, cn * D);
    // Logits rounded to storage (bf16 on the training path, as the CUDA
    // GEMM writes them); statistics and gradients from them in acc.
    gemmNT(ha.data(), wa.data(), cn, V, D, [&](int64_t i, int64_t j, A s) {
      logits[i * V + j] = load(store<T>(s));
    });
    std::vector<A> rowLse(static_cast<size_t>(cn));
    for (int64_t r = 0; r < cn; ++r) {
      const A *l = logits.data() + r * V;
      A mx = l[0];
      for (int64_t v = 1; v < V; ++v)
        mx = std::max(mx, l[v]);
      A s = 0;
      for (int64_t v = 0; v < V; ++v)
        s += std::exp(l[v] - mx);
      int32_t lab = a.labels[n0 + r];
      if (split) {
        float *stats = send.data() + r * kCeStats;
        stats[0] = float(mx);
        stats[1] = float(s);
        stats[2] = lab >= off && lab < off + V ? float(l[lab - off]) : 0.f;
        continue;
      }
      A ls = mx + std::log(s);
      rowLse[r] = ls;
      if (lse)
        lse[n0 + r] = ls;
      if (lab != a.ignoreIndex && lab >= 0 && lab < V) {
        lossSum += ls - l[lab];
        ++count;
      }
    }
    if (split) {
      group.allGather(group.self, ctx, send.data(), recv.data(), cn * kCeStats);
      // Every rank merges the same gathered bits in rank order.
      for (int64_t r = 0; r < cn; ++r) {
        const float *first = recv.data() + r * kCeStats;
        A m = first[0], s = first[1], t = first[2];
        for (int32_t k = 1; k < group.ranks; ++k) {
          const float *o = recv.data() + (k * cn + r) * kCeStats;
          lseMerge(m, s, A(o[0]), A(o[1]));
          t += A(o[2]);
        }
        A ls = m + std::log(s);
        rowLse[r] = ls;
        if (lse)
          lse[n0 + r] = ls;
        int32_t lab = a.labels[n0 + r];
        if (lab != a.ignoreIndex && lab >= 0 && lab < bound) {
          lossSum += ls - t;
          ++count;
        }
      }
    }
    if (!dh && !dW)
      continue;
    // dlogits rounded to storage (what the CUDA GEMMs consume), kept in acc.
    std::vector<A> dl(static_cast<size_t>(cn * V));
    for (int64_t r = 0; r < cn; ++r) {
      int32_t lab = a.labels[n0 + r];
      bool valid = lab != a.ignoreIndex && lab >= 0 && lab < bound;
      for (int64_t v = 0; v < V; ++v) {
        A g = valid
                  ? A(a.gradScale) * (std::exp(logits[r * V + v] - rowLse[r]) -
                                      (v + off == lab ? A(1) : A(0)))
                  : A(0);
        dl[r * V + v] = load(store<T>(g));
      }
    }
    if (dh)
      gemmNT(dl.data(), wt.data(), cn, D, V, [&](int64_t i, int64_t j, A s) {
        dh[(n0 + i) * D + j] = store<T>(s);
      });
    if (dW) {
      std::vector<A> dlt(static_cast<size_t>(V * cn)),
          hT(static_cast<size_t>(D * cn));
      for (int64_t r = 0; r < cn; ++r) {
        for (int64_t v = 0; v < V; ++v)
          dlt[v * cn + r] = dl[r * V + v];
        for (int64_t d = 0; d < D; ++d)
          hT[d * cn + r] = ha[r * D + d];
      }
      gemmNT(dlt.data(), hT.data(), V, D, cn,
             [&](int64_t i, int64_t j, A s) { dW[i * D + j] += s; });
    }
  }
  *static_cast<A *>(a.lossSum) = lossSum;
  if (a.validCount)
    *a.validCount = count;
  return Status::Ok;
}

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

namespace {
/// The sum of squares of one gradient tensor in kGradNormBlock blocks,
/// added into `total` block by block (the CUDA kernel's partials, in order).
template <typename T> void addSquares(const T *p, int64_t n, double &total) {
  for (int64_t b0 = 0; b0 < n; b0 += kGradNormBlock) {
    int64_t b1 = std::min(n, b0 + kGradNormBlock);
    double part = 0;
    for (int64_t i = b0; i < b1; ++i) {
      double v = double(toFloat(p[i]));
      part += v * v;
    }
    total += part;
  }
}
} // namespace

Status gradNorm(const GradNormArgs &a) {
  double total = a.initialSquares ? *a.initialSquares : 0;
  for (int64_t t = 0; t < a.numTensors; ++t) {
    const GradTensor &g = a.tensors[t];
    if (g.dtype == DType::BF16)
      addSquares(static_cast<const bf16 *>(g.data), g.n, total);
    else
      addSquares(static_cast<const float *>(g.data), g.n, total);
  }
  if (a.squares)
    *a.squares = total;
  double norm = std::sqrt(total);
  *a.norm = float(norm);
  if (a.clipCoef)
    *a.clipCoef =
        a.maxNorm > 0
            ? float(std::min(1.0, a.maxNorm / (double(float(norm)) + 1e-6)))
            : 1.0f;
  return Status::Ok;
}

Status adamWStep(const AdamWArgs &a) {
  const AdamWScalars k = adamWScalars(a);
  const float stepSize = k.stepSize, bc2Sqrt = k.bc2Sqrt, decay = k.decay;
  const float b1 = k.beta1, b2 = k.beta2, eps = k.eps;
  const float cc = a.clipCoef ? *a.clipCoef : 1.0f;
  const bool bf16Grad = a.gradDType == DType::BF16;
  for (int64_t i = 0; i < a.n; ++i) {
    float gi = bf16Grad ? float(static_cast<const bf16 *>(a.grad)[i])
                        : static_cast<const float *>(a.grad)[i];
    float g = gi * cc;
    float p = a.master[i] * decay;
    float m = b1 * a.expAvg[i] + (1.0f - b1) * g;
    float v = b2 * a.expAvgSq[i] + (1.0f - b2) * (g * g);
    float denom = std::sqrt(v) / bc2Sqrt + eps;
    p = p - stepSize * (m / denom);
    a.master[i] = p;
    a.expAvg[i] = m;
    a.expAvgSq[i] = v;
    if (a.computeCopy) {
      if (a.computeDType == DType::BF16)
        static_cast<bf16 *>(a.computeCopy)[i] = bf16(p);
      else
        static_cast<float *>(a.computeCopy)[i] = p;
    }
  }
  return Status::Ok;
}

//===----------------------------------------------------------------------===//
// Explicit instantiations.
//===----------------------------------------------------------------------===//

#define AP_DENSE_INSTANTIATE(T)                                                \
  template Status linearForward<T>(const T *, const T *, T *, int64_t,         \
                                   int64_t, int64_t);                          \
  template Status linearBackward<T>(const T *, const T *, const T *, T *,      \
                                    Acc<T> *, int64_t, int64_t, int64_t);      \
  template Status rmsNormForward<T>(const RmsNormForwardArgs &);               \
  template Status rmsNormBackward<T>(const RmsNormBackwardArgs &);             \
  template Status rope<T>(const RopeArgs &, bool);                             \
  template Status swiGluForward<T>(const SwiGluForwardArgs &);                 \
  template Status swiGluBackward<T>(const SwiGluBackwardArgs &);               \
  template Status sigmoidGateForward<T>(const SigmoidGateForwardArgs &);       \
  template Status sigmoidGateBackward<T>(const SigmoidGateBackwardArgs &);     \
  template Status residualAddForward<T>(const ResidualAddArgs &);              \
  template Status residualAddBackward<T>(const ResidualAddBackwardArgs &);     \
  template Status embeddingForward<T>(const EmbeddingForwardArgs &);           \
  template Status embeddingBackward<T>(const EmbeddingBackwardArgs &);         \
  template Status lmHeadCrossEntropy<T>(const KernelContext &,                 \
                                        const LmHeadCrossEntropyArgs &, bool);

AP_DENSE_INSTANTIATE(bf16)
AP_DENSE_INSTANTIATE(float)
AP_DENSE_INSTANTIATE(double)
#undef AP_DENSE_INSTANTIATE

} // namespace ap::kernels::ref
