//===- gdn_ops.cpp - GDN short conv, gates, L2 norm, gated norm -*- C++ -*-===//
//
// Host reference kernels (plain loops, fixed reduction order) for the
// element- and row-wise GDN ops of docs/model-math.md section 1.
//
//===----------------------------------------------------------------------===//
#include "kernels/reference/gdn/gdn_reference.h"

#include <utility>
#include <vector>

namespace ap::kernels::gdnref {

/// Where channel c of token row `row` of the conv output (y or dy) lives:
/// the dense [B, T, C] buffer, or its group's [B, T, Cs] buffer.
template <typename Ptr>
static std::pair<Ptr, int64_t> convOut(const GdnConvArgs &a, Ptr dense,
                                       Ptr const *groups, int64_t row,
                                       int64_t c) {
  if (a.splits == 0)
    return {dense, row * a.channels + c};
  int s = 0;
  while (c >= a.splitChannels[s]) {
    c -= a.splitChannels[s];
    ++s;
  }
  return {groups[s], row * a.splitChannels[s] + c};
}

/// The first position of row b that the window of token t reads: its
/// document's first token (kernels/kernels.h), 0 when the row is one.
static int64_t convWindowStart(const GdnConvArgs &a, int64_t b, int64_t t) {
  return a.docStart ? a.docStart[b * a.seqLen + t] : 0;
}

template <typename S> Status convForward(const GdnConvArgs &a) {
  using A = AccOf<S>;
  if (!gdnConvSplitsValid(a) || !docStartValid(a.docStart, a.batch, a.seqLen))
    return Status::InvalidArgument;
  const int64_t C = a.channels, T = a.seqLen, K = a.kernelSize;
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const int64_t lo = convWindowStart(a, b, t);
        A pre = 0;
        for (int64_t j = 0; j < K; ++j) {
          int64_t ts = t - (K - 1) + j;
          if (ts >= lo)
            pre += ld<S>(a.w, c * K + j) * ld<S>(a.x, (b * T + ts) * C + c);
        }
        auto [y, at] = convOut<void *>(a, a.y, a.ys, b * T + t, c);
        st<S>(y, at, pre * sigm(pre));
      }
  return Status::Ok;
}

template <typename S> Status convBackward(const GdnConvArgs &a) {
  using A = AccOf<S>;
  if (!gdnConvSplitsValid(a) || !docStartValid(a.docStart, a.batch, a.seqLen))
    return Status::InvalidArgument;
  const int64_t C = a.channels, T = a.seqLen, K = a.kernelSize;
  std::vector<A> dpre(static_cast<size_t>(T));
  A *dw = static_cast<A *>(a.dw);
  for (int64_t c = 0; c < C; ++c) {
    std::vector<A> dwc(static_cast<size_t>(K), A(0));
    for (int64_t b = 0; b < a.batch; ++b) {
      // x at ts as the window of output token t reads it.
      auto X = [&](int64_t t, int64_t ts) {
        return ts < convWindowStart(a, b, t) ? A(0)
                                             : ld<S>(a.x, (b * T + ts) * C + c);
      };
      for (int64_t t = 0; t < T; ++t) {
        A pre = 0;
        for (int64_t j = 0; j < K; ++j)
          pre += ld<S>(a.w, c * K + j) * X(t, t - (K - 1) + j);
        A s = sigm(pre);
        auto [dy, at] = convOut<const void *>(a, a.dy, a.dys, b * T + t, c);
        dpre[t] = ld<S>(dy, at) * s * (A(1) + pre * (A(1) - s));
      }
      for (int64_t t = 0; t < T; ++t) {
        A dx = 0;
        for (int64_t j = 0; j < K; ++j) {
          // Output td reads x at t only within t's document.
          int64_t td = t + K - 1 - j;
          if (td < T && convWindowStart(a, b, td) <= t)
            dx += ld<S>(a.w, c * K + j) * dpre[td];
        }
        st<S>(a.dx, (b * T + t) * C + c, dx);
      }
      for (int64_t j = 0; j < K; ++j)
        for (int64_t t = 0; t < T; ++t)
          dwc[j] += dpre[t] * X(t, t - K + 1 + j);
    }
    for (int64_t j = 0; j < K; ++j)
      dw[c * K + j] += dwc[j];
  }
  return Status::Ok;
}

template <typename A> static A softplus20(A x) {
  return x > A(20) ? x : std::log1p(std::exp(x));
}

template <typename S> Status gatesForward(const GdnGatesArgs &a) {
  using A = AccOf<S>;
  const A *aLog = static_cast<const A *>(a.aLog);
  const A *dtb = static_cast<const A *>(a.dtBias);
  A *g = static_cast<A *>(a.g);
  for (int64_t n = 0; n < a.tokens; ++n)
    for (int64_t h = 0; h < a.heads; ++h) {
      int64_t i = n * a.heads + h;
      g[i] = -std::exp(aLog[h]) * softplus20(ld<S>(a.a, i) + dtb[h]);
      st<S>(a.beta, i, sigm(ld<S>(a.b, i)));
    }
  return Status::Ok;
}

template <typename S> Status gatesBackward(const GdnGatesArgs &a) {
  using A = AccOf<S>;
  const A *aLog = static_cast<const A *>(a.aLog);
  const A *dtb = static_cast<const A *>(a.dtBias);
  const A *dg = static_cast<const A *>(a.dg);
  for (int64_t h = 0; h < a.heads; ++h) {
    A sumDa = 0, sumDaLog = 0;
    A e = std::exp(aLog[h]);
    for (int64_t n = 0; n < a.tokens; ++n) {
      int64_t i = n * a.heads + h;
      A x = ld<S>(a.a, i) + dtb[h];
      A sp = softplus20(x);
      A dsp = x > A(20) ? A(1) : sigm(x);
      A da = dg[i] * (-e) * dsp;
      st<S>(a.da, i, da);
      sumDa += da;
      sumDaLog += dg[i] * (-e * sp);
      A bt = ld<S>(a.beta, i);
      st<S>(a.db, i, ld<S>(a.dbeta, i) * bt * (A(1) - bt));
    }
    static_cast<A *>(a.dALog)[h] += sumDaLog;
    static_cast<A *>(a.dDtBias)[h] += sumDa;
  }
  return Status::Ok;
}

template <typename S> Status l2NormForward(const GdnL2NormArgs &a) {
  using A = AccOf<S>;
  const int64_t H = a.heads, d = a.dim;
  const int64_t xs = a.xStride ? a.xStride : H * d;
  const int64_t ys = a.yStride ? a.yStride : H * d;
  for (int64_t n = 0; n < a.tokens; ++n)
    for (int64_t h = 0; h < H; ++h) {
      A ss = 0;
      for (int64_t i = 0; i < d; ++i) {
        A x = ld<S>(a.x, n * xs + h * d + i);
        ss += x * x;
      }
      A r = A(1) / std::sqrt(ss + static_cast<A>(a.eps));
      static_cast<A *>(a.rstd)[n * H + h] = r;
      for (int64_t i = 0; i < d; ++i)
        st<S>(a.y, n * ys + h * d + i, ld<S>(a.x, n * xs + h * d + i) * r);
    }
  return Status::Ok;
}

template <typename S> Status l2NormBackward(const GdnL2NormArgs &a) {
  using A = AccOf<S>;
  const int64_t H = a.heads, d = a.dim;
  const int64_t xs = a.xStride ? a.xStride : H * d;
  const int64_t ys = a.yStride ? a.yStride : H * d;
  for (int64_t n = 0; n < a.tokens; ++n)
    for (int64_t h = 0; h < H; ++h) {
      A dot = 0;
      for (int64_t i = 0; i < d; ++i)
        dot += ld<S>(a.dy, n * ys + h * d + i) * ld<S>(a.y, n * ys + h * d + i);
      A r = static_cast<const A *>(a.rstd)[n * H + h];
      for (int64_t i = 0; i < d; ++i) {
        int64_t j = n * ys + h * d + i;
        st<S>(a.dx, n * xs + h * d + i,
              r * (ld<S>(a.dy, j) - dot * ld<S>(a.y, j)));
      }
    }
  return Status::Ok;
}

/// w x rstd z sigmoid(z), left to right: one expression for the forward
/// and a backward that rebuilds y, so both write the same bits.
template <typename A> A gatedNormValue(A w, A x, A r, A z, A s) {
  return w * x * r * z * s;
}

template <typename S> Status gatedNormForward(const GdnGatedNormArgs &a) {
  using A = AccOf<S>;
  const int64_t H = a.heads, d = a.dim;
  for (int64_t n = 0; n < a.tokens; ++n)
    for (int64_t h = 0; h < H; ++h) {
      int64_t base = (n * H + h) * d;
      A ss = 0;
      for (int64_t i = 0; i < d; ++i) {
        A x = ld<S>(a.x, base + i);
        ss += x * x;
      }
      A r = A(1) / std::sqrt(ss / A(d) + static_cast<A>(a.eps));
      static_cast<A *>(a.rstd)[n * H + h] = r;
      for (int64_t i = 0; i < d; ++i) {
        A z = ld<S>(a.z, base + i);
        st<S>(
            a.y, base + i,
            gatedNormValue(ld<S>(a.w, i), ld<S>(a.x, base + i), r, z, sigm(z)));
      }
    }
  return Status::Ok;
}

template <typename S> Status gatedNormBackward(const GdnGatedNormArgs &a) {
  using A = AccOf<S>;
  const int64_t H = a.heads, d = a.dim;
  std::vector<A> dw(static_cast<size_t>(d), A(0)), wdy(static_cast<size_t>(d));
  for (int64_t n = 0; n < a.tokens; ++n)
    for (int64_t h = 0; h < H; ++h) {
      int64_t base = (n * H + h) * d;
      A r = static_cast<const A *>(a.rstd)[n * H + h];
      A mean = 0;
      for (int64_t i = 0; i < d; ++i) {
        A xh = ld<S>(a.x, base + i) * r, w = ld<S>(a.w, i);
        A z = ld<S>(a.z, base + i), s = sigm(z), dy = ld<S>(a.dy, base + i);
        A dyh = dy * z * s;
        if (a.y)
          st<S>(a.y, base + i,
                gatedNormValue(w, ld<S>(a.x, base + i), r, z, s));
        st<S>(a.dz, base + i, dy * w * xh * s * (A(1) + z * (A(1) - s)));
        dw[i] += dyh * xh;
        wdy[i] = w * dyh;
        mean += wdy[i] * xh;
      }
      mean /= A(d);
      for (int64_t i = 0; i < d; ++i)
        st<S>(a.dx, base + i, r * (wdy[i] - ld<S>(a.x, base + i) * r * mean));
    }
  for (int64_t i = 0; i < d; ++i)
    static_cast<A *>(a.dw)[i] += dw[i];
  return Status::Ok;
}

#define AP_GDN_INSTANTIATE(S)                                                  \
  template Status convForward<S>(const GdnConvArgs &);                         \
  template Status convBackward<S>(const GdnConvArgs &);                        \
  template Status gatesForward<S>(const GdnGatesArgs &);                       \
  template Status gatesBackward<S>(const GdnGatesArgs &);                      \
  template Status l2NormForward<S>(const GdnL2NormArgs &);                     \
  template Status l2NormBackward<S>(const GdnL2NormArgs &);                    \
  template Status gatedNormForward<S>(const GdnGatedNormArgs &);               \
  template Status gatedNormBackward<S>(const GdnGatedNormArgs &);
AP_GDN_INSTANTIATE(bf16)
AP_GDN_INSTANTIATE(float)
AP_GDN_INSTANTIATE(double)
#undef AP_GDN_INSTANTIATE

} // namespace ap::kernels::gdnref
