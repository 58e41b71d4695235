//===- kernelgen_test_util.h - shared helpers of the kernelgen tests -*- C++
//-*-===//
//
// Seeded storage buffers, bitwise comparison, the reference RMSNorm forward
// and a model of kernelgen's reduction orders, shared by the host (JIT) and
// GPU (driver API) tests of the generated kernels.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_KERNELGEN_KERNELGEN_TEST_UTIL_H
#define ACTPLACE_TEST_UNIT_KERNELGEN_KERNELGEN_TEST_UTIL_H

#include "kernelgen/KernelAbi.h"
#include "kernels/kernels.h"
#include "test/unit/kernels/random_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

namespace ap::kernelgen::test {

using namespace ap::kernels;
namespace kg = ap::kernelgen;
using I = int64_t;

inline DType dtypeOf(kg::ElemType t) {
  return t == kg::ElemType::BF16 ? DType::BF16 : DType::F32;
}
inline size_t bytesOf(kg::ElemType t) {
  return t == kg::ElemType::BF16 ? 2 : 4;
}

/// n storage elements of seeded N(0, s^2) values, in bf16 or f32 bytes, with
/// a few specials (signed zero, a value that rounds to even in bf16, a
/// denormal, an overflow to infinity) where n allows.
inline std::vector<uint8_t> randomStorage(kg::ElemType t, size_t n,
                                          uint64_t seed, double s = 1.0,
                                          bool specials = true) {
  std::vector<double> v = ap::test::randn(n, seed, s);
  if (specials && n >= 8) {
    v[1] = -0.0;
    v[3] = 1.00390625; // exactly between two bf16 values: ties to even
    v[5] = 1e-40;      // denormal in f32
    v[7] = 3.3e38;     // rounds to +inf in bf16
  }
  std::vector<uint8_t> out(n * bytesOf(t));
  for (size_t i = 0; i < n; ++i) {
    float f = float(v[i]);
    if (t == kg::ElemType::BF16) {
      bf16 b(f);
      std::memcpy(out.data() + 2 * i, &b.bits, 2);
    } else {
      std::memcpy(out.data() + 4 * i, &f, 4);
    }
  }
  return out;
}

/// Bitwise equality of two byte buffers, naming the first differing element.
inline ::testing::AssertionResult sameBits(const std::vector<uint8_t> &want,
                                           const std::vector<uint8_t> &got,
                                           size_t elemBytes, const char *what) {
  if (want.size() != got.size())
    return ::testing::AssertionFailure()
           << what << ": " << got.size() << " bytes, expected " << want.size();
  for (size_t i = 0; i < want.size(); i += elemBytes)
    if (std::memcmp(want.data() + i, got.data() + i, elemBytes) != 0) {
      uint32_t w = 0, g = 0;
      std::memcpy(&w, want.data() + i, elemBytes);
      std::memcpy(&g, got.data() + i, elemBytes);
      std::ostringstream os;
      os << what << ": element " << i / elemBytes << " has bits 0x" << std::hex
         << g << ", the reference 0x" << w;
      return ::testing::AssertionFailure() << os.str();
    }
  return ::testing::AssertionSuccess();
}

inline const KernelContext kHost{};

/// Storage element i of a bf16 or f32 buffer, widened to f32.
inline float loadAt(kg::ElemType t, const void *p, I i) {
  if (t == kg::ElemType::F32)
    return static_cast<const float *>(p)[i];
  return bf16::toFloat(static_cast<const uint16_t *>(p)[i]);
}
/// Stores f32 v as element i of a bf16 (round to nearest even) or f32
/// buffer.
inline void storeAt(kg::ElemType t, void *p, I i, float v) {
  if (t == kg::ElemType::F32)
    static_cast<float *>(p)[i] = v;
  else
    static_cast<uint16_t *>(p)[i] = bf16::fromFloat(v);
}

// A plain C++ model of kernelgen's fixed reduction orders (KernelGen.h,
// Numerics), written apart from the generator so a test can hold the
// generated kernels to them bit for bit. Every sum and product is its own
// f32 operation (no contraction on the generic x86-64 target).

/// Row sum: lane l of kg::kLanes sums term(j) for the j of its chunks
/// (elements [c vec, c vec + vec) for c = l, l + 32, ...; vec =
/// kg::rowChunkOf of the group) in increasing j from 0; then p[l] = p[l] +
/// p[l ^ k], k = 16, 8, 4, 2, 1; the result p[0].
template <class F> float modelRowSum(I vec, I n, F term) {
  constexpr int L = int(kg::kLanes);
  float p[L] = {}, q[L];
  for (I j = 0; j < n; ++j) {
    int l = int((j / vec) % L);
    p[l] = p[l] + term(j);
  }
  for (int k = L / 2; k >= 1; k /= 2) {
    for (int l = 0; l < L; ++l)
      q[l] = p[l] + p[l ^ k];
    std::memcpy(p, q, sizeof(p));
  }
  return p[0];
}

/// Grouped sum of term(r), r in [lo, hi): group g of G sums r = lo + g,
/// lo + g + G, ... from 0; then p[g] = p[g] + p[g + k] for g < k, k = G / 2,
/// ..., 1; the result p[0].
template <class F> float modelGroupSum(int G, I lo, I hi, F term) {
  std::vector<float> p(size_t(G), 0.f);
  for (int g = 0; g < G; ++g) {
    float acc = 0.f;
    for (I r = lo + g; r < hi; r += G)
      acc = acc + term(r);
    p[size_t(g)] = acc;
  }
  for (int k = G / 2; k >= 1; k /= 2)
    for (int g = 0; g < k; ++g)
      p[size_t(g)] = p[size_t(g)] + p[size_t(g + k)];
  return p[0];
}

/// Column sum over rows: per part of kg::rmsNormDwRowsPerPart(rows) rows
/// the grouped sum of kg::kDwGroups groups, then the grouped sum of the
/// parts with kg::kLanes groups.
template <class F> float modelColumnSum(I rows, F term) {
  const I parts = kg::rmsNormDwParts(rows);
  const I per = kg::rmsNormDwRowsPerPart(rows);
  std::vector<float> sums(static_cast<size_t>(parts));
  for (I p = 0; p < parts; ++p)
    sums[size_t(p)] = modelGroupSum(int(kg::kDwGroups), p * per,
                                    std::min(rows, (p + 1) * per), term);
  return modelGroupSum(int(kg::kLanes), 0, parts,
                       [&](I p) { return sums[size_t(p)]; });
}

/// kernelgen's RMSNorm forward: the reference's per-element code with the
/// row sum above. x [rows, dim] with row stride xs, y contiguous.
inline void modelRmsNorm(kg::ElemType t, const void *x, const void *w, void *y,
                         float *rstd, I rows, I dim, I xs, bool zc, float eps) {
  for (I r = 0; r < rows; ++r) {
    float ss = modelRowSum(kg::rowChunkOf(kg::GroupKind::RmsNormForward, t),
                           dim, [&](I j) {
                             float v = loadAt(t, x, r * xs + j);
                             return v * v;
                           });
    float rs = 1.0f / std::sqrt(ss / float(dim) + eps);
    if (rstd)
      rstd[r] = rs;
    for (I j = 0; j < dim; ++j) {
      float wv = loadAt(t, w, j);
      float we = zc ? 1.0f + wv : wv;
      storeAt(t, y, r * dim + j, loadAt(t, x, r * xs + j) * rs * we);
    }
  }
}

/// kernelgen's RMSNorm backward: dx (contiguous), the recomputed y (when
/// y is not null) and dw += the column sums (when dw is not null).
inline void modelRmsNormBackward(kg::ElemType t, const void *x, const void *w,
                                 const float *rstd, const void *dy, void *dx,
                                 float *dw, void *y, I rows, I dim, I xs,
                                 bool zc) {
  auto weff = [&](I j) {
    float wv = loadAt(t, w, j);
    return zc ? 1.0f + wv : wv;
  };
  for (I r = 0; r < rows; ++r) {
    float rs = rstd[r];
    float dot = modelRowSum(kg::rowChunkOf(kg::GroupKind::RmsNormForward, t),
                            dim, [&](I j) {
                              return loadAt(t, dy, r * dim + j) * weff(j) *
                                     loadAt(t, x, r * xs + j);
                            });
    float c = dot * rs * rs * rs / float(dim);
    for (I j = 0; j < dim; ++j) {
      float xv = loadAt(t, x, r * xs + j), g = loadAt(t, dy, r * dim + j);
      storeAt(t, dx, r * dim + j, rs * weff(j) * g - c * xv);
      if (y)
        storeAt(t, y, r * dim + j, xv * rs * weff(j));
    }
  }
  if (dw)
    for (I j = 0; j < dim; ++j)
      dw[j] = dw[j] + modelColumnSum(rows, [&](I r) {
                return loadAt(t, dy, r * dim + j) * loadAt(t, x, r * xs + j) *
                       rstd[r];
              });
}

/// kernelgen's L2 norm of each contiguous row of x [rows, dim]: y and rstd;
/// with dy, the backward dx from y and rstd.
inline void modelL2Norm(kg::ElemType t, const void *x, void *y, float *rstd,
                        I rows, I dim, float eps) {
  for (I r = 0; r < rows; ++r) {
    float ss = modelRowSum(kg::rowChunkOf(kg::GroupKind::L2NormForward, t), dim,
                           [&](I j) {
                             float v = loadAt(t, x, r * dim + j);
                             return v * v;
                           });
    float rs = 1.0f / std::sqrt(ss + eps);
    rstd[r] = rs;
    for (I j = 0; j < dim; ++j)
      storeAt(t, y, r * dim + j, loadAt(t, x, r * dim + j) * rs);
  }
}
inline void modelL2NormBackward(kg::ElemType t, const void *y,
                                const float *rstd, const void *dy, void *dx,
                                I rows, I dim) {
  for (I r = 0; r < rows; ++r) {
    float dot = modelRowSum(
        kg::rowChunkOf(kg::GroupKind::L2NormForward, t), dim, [&](I j) {
          return loadAt(t, dy, r * dim + j) * loadAt(t, y, r * dim + j);
        });
    for (I j = 0; j < dim; ++j)
      storeAt(t, dx, r * dim + j,
              rstd[r] * (loadAt(t, dy, r * dim + j) -
                         dot * loadAt(t, y, r * dim + j)));
  }
}

/// kernelgen's gated RMSNorm of each contiguous row of x [rows, dim] (GDN's
/// norm of a head's output): y = (((w x) r) z) s, s = sigmoid(z), and rstd.
inline float modelSigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
inline void modelGatedNorm(kg::ElemType t, const void *x, const void *z,
                           const void *w, void *y, float *rstd, I rows, I dim,
                           float eps) {
  const I vec = kg::rowChunkOf(kg::GroupKind::GatedNormForward, t);
  for (I r = 0; r < rows; ++r) {
    float ss = modelRowSum(vec, dim, [&](I j) {
      float v = loadAt(t, x, r * dim + j);
      return v * v;
    });
    float rs = 1.0f / std::sqrt(ss / float(dim) + eps);
    rstd[r] = rs;
    for (I j = 0; j < dim; ++j) {
      float zv = loadAt(t, z, r * dim + j);
      storeAt(t, y, r * dim + j,
              loadAt(t, w, j) * loadAt(t, x, r * dim + j) * rs * zv *
                  modelSigmoid(zv));
    }
  }
}
/// Its backward: dx, dz, the rebuilt y (when y is not null) and dw += the
/// column sums of ((dy z) s) (x r) (when dw is not null).
inline void modelGatedNormBackward(kg::ElemType t, const void *x, const void *z,
                                   const void *w, const float *rstd,
                                   const void *dy, void *dx, void *dz,
                                   float *dw, void *y, I rows, I dim) {
  const I vec = kg::rowChunkOf(kg::GroupKind::GatedNormBackward, t);
  auto at = [&](const void *p, I r, I j) { return loadAt(t, p, r * dim + j); };
  auto dyh = [&](I r, I j) {
    float zv = at(z, r, j);
    return at(dy, r, j) * zv * modelSigmoid(zv);
  };
  for (I r = 0; r < rows; ++r) {
    float rs = rstd[r];
    float mean =
        modelRowSum(vec, dim,
                    [&](I j) {
                      return loadAt(t, w, j) * dyh(r, j) * (at(x, r, j) * rs);
                    }) /
        float(dim);
    for (I j = 0; j < dim; ++j) {
      float xv = at(x, r, j), wv = loadAt(t, w, j), zv = at(z, r, j),
            g = at(dy, r, j), s = modelSigmoid(zv), xh = xv * rs;
      if (y)
        storeAt(t, y, r * dim + j, wv * xv * rs * zv * s);
      storeAt(t, dz, r * dim + j, g * wv * xh * s * (1.0f + zv * (1.0f - s)));
      float wdy = wv * (g * zv * s);
      storeAt(t, dx, r * dim + j, rs * (wdy - xv * rs * mean));
    }
  }
  if (dw)
    for (I j = 0; j < dim; ++j)
      dw[j] = dw[j] + modelColumnSum(rows, [&](I r) {
                return dyh(r, j) * (at(x, r, j) * rstd[r]);
              });
}

/// kernelgen's GDN gates backward sums over the tokens of a [rows, heads]
/// problem: dALog[h] += the column sum of dg * (-exp(aLog[h]) * sp) and
/// dDtBias[h] += that of da = (dg * -exp(aLog[h])) * dsp (before rounding),
/// with x = a + dtBias[h], sp = softplus (threshold 20), dsp its slope.
inline void modelGdnGatesSums(kg::ElemType t, const void *a, const float *aLog,
                              const float *dtBias, const float *dg,
                              float *dALog, float *dDtBias, I rows, I heads) {
  for (I h = 0; h < heads; ++h) {
    float ne = -std::exp(aLog[h]);
    auto x = [&](I r) { return loadAt(t, a, r * heads + h) + dtBias[h]; };
    dALog[h] = dALog[h] + modelColumnSum(rows, [&](I r) {
                 float v = x(r);
                 float sp = v > 20.0f ? v : std::log1p(std::exp(v));
                 return dg[r * heads + h] * (ne * sp);
               });
    dDtBias[h] = dDtBias[h] + modelColumnSum(rows, [&](I r) {
                   float v = x(r);
                   float dsp = v > 20.0f ? 1.0f : modelSigmoid(v);
                   return dg[r * heads + h] * ne * dsp;
                 });
  }
}

/// Inputs of a GDN gates test over [rows, heads]: a (every eleventh element
/// from the third set around and above softplus's threshold of 20), b and
/// dbeta in storage; A_log, dt_bias, dg and the two parameter gradients'
/// starting values in f32. Seeds seed + 1 ... seed + 8.
struct GatesInputs {
  std::vector<uint8_t> a, b, dbeta;
  std::vector<float> aLog, dtBias, dg, dALog0, dDtBias0;
};
inline GatesInputs gatesInputs(kg::ElemType t, I rows, I heads, uint64_t seed) {
  size_t n = size_t(rows * heads);
  auto floats = [](size_t count, uint64_t s, double scale) {
    std::vector<float> out;
    for (double v : ap::test::randn(count, s, scale))
      out.push_back(float(v));
    return out;
  };
  GatesInputs in;
  in.a = randomStorage(t, n, seed + 1, 6.0);
  in.b = randomStorage(t, n, seed + 2, 3.0);
  in.dbeta = randomStorage(t, n, seed + 3, 1.0, false);
  for (size_t i = 2; i < n; i += 11)
    storeAt(t, in.a.data(), I(i), 17.0f + 0.25f * float(i % 29));
  in.aLog = floats(size_t(heads), seed + 4, 0.5);
  in.dtBias = floats(size_t(heads), seed + 5, 1.0);
  in.dg = floats(n, seed + 6, 1.0);
  in.dALog0 = floats(size_t(heads), seed + 7, 1.0);
  in.dDtBias0 = floats(size_t(heads), seed + 8, 1.0);
  return in;
}

/// The reference gates' arguments over `in` (outputs and gradients unset).
inline GdnGatesArgs gatesArgs(kg::ElemType t, const GatesInputs &in, I rows,
                              I heads) {
  GdnGatesArgs r;
  r.dtype = dtypeOf(t);
  r.tokens = rows;
  r.heads = int32_t(heads);
  r.a = in.a.data();
  r.b = in.b.data();
  r.aLog = in.aLog.data();
  r.dtBias = in.dtBias.data();
  r.dg = in.dg.data();
  r.dbeta = in.dbeta.data();
  return r;
}

/// One RoPE problem of the tests: x [batch, seq, heads, headDim], rotary
/// dims [offset, offset + rotaryDim), and whether the rows pack documents.
struct RopeCase {
  I batch, seq, heads, headDim, offset, rotaryDim;
  double theta;
  bool packed;
};

/// Document starts [batch, seq] with documents at 0, 37, 106 and 199 of
/// each row (those below seq).
inline std::vector<int32_t> packedDocStarts(I batch, I seq) {
  std::vector<int32_t> out(size_t(batch * seq));
  for (I b = 0; b < batch; ++b)
    for (I t = 0; t < seq; ++t)
      out[size_t(b * seq + t)] = int32_t(t >= 199   ? 199
                                         : t >= 106 ? 106
                                         : t >= 37  ? 37
                                                    : 0);
  return out;
}

/// The reference RoPE (forward, or backward: the rotation by minus the
/// angle) of case `c` from x into y, with `docStart` when c.packed.
inline Status referenceRope(kg::ElemType t, const RopeCase &c, const void *x,
                            void *y, const int32_t *docStart, bool backward) {
  RopeArgs r;
  r.dtype = dtypeOf(t);
  r.x = x;
  r.y = y;
  r.batch = c.batch;
  r.seq = c.seq;
  r.heads = c.heads;
  r.headDim = c.headDim;
  r.offset = c.offset;
  r.rotaryDim = c.rotaryDim;
  r.theta = c.theta;
  r.docStart = c.packed ? docStart : nullptr;
  return backward ? ropeBackward(kHost, r) : ropeForward(kHost, r);
}

/// Max |got - want| within tol x max |want| over a storage buffer (two
/// orders of the same sums: a bound, not bits).
inline ::testing::AssertionResult closeTo(kg::ElemType t,
                                          const std::vector<uint8_t> &want,
                                          const std::vector<uint8_t> &got,
                                          double tol, const char *what) {
  size_t eb = bytesOf(t), n = want.size() / eb;
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": sizes differ";
  double scale = 0, worst = 0;
  for (size_t i = 0; i < n; ++i) {
    double a = loadAt(t, want.data(), I(i)), b = loadAt(t, got.data(), I(i));
    if (std::isfinite(a))
      scale = std::max(scale, std::fabs(a));
    if (std::isfinite(a) || std::isfinite(b))
      worst = std::max(worst, std::fabs(a - b));
  }
  if (!(worst <= tol * scale))
    return ::testing::AssertionFailure()
           << what << ": max |difference| " << worst << " above " << tol
           << " x max |reference| " << scale;
  return ::testing::AssertionSuccess();
}
/// The bound of closeTo for a storage type: two bf16 ulps, or 1e-5 in f32.
inline double orderTol(kg::ElemType t) {
  return t == kg::ElemType::BF16 ? 2.0 / 128 : 1e-5;
}

/// The grad norm's tensor sizes: one element, part of a block, a whole
/// block, a block and one element, several blocks and a short last one.
inline const I kGradNormSizes[] = {1, 1000, kg::kGradNormBlock,
                                   kg::kGradNormBlock + 1,
                                   3 * kg::kGradNormBlock + 77};

/// The grad norm's partials of one tensor in kernelgen's order (KernelAbi.h,
/// the kernel library's CUDA order): per block of kGradNormBlock elements,
/// thread t of kGradNormThreads sums v * v (v widened exactly to f64) over
/// the elements t, t + kGradNormThreads, ... in increasing order; then p[t]
/// = p[t] + p[t + k] for t < k, k = kGradNormThreads / 2, ..., 1.
inline std::vector<double> modelGradNormPartials(kg::ElemType t, const void *p,
                                                 I n) {
  constexpr I T = kg::kGradNormThreads;
  std::vector<double> out;
  for (I b0 = 0; b0 < n; b0 += kg::kGradNormBlock) {
    I b1 = std::min(n, b0 + kg::kGradNormBlock);
    double part[T];
    for (I th = 0; th < T; ++th) {
      double sum = 0;
      for (I i = b0 + th; i < b1; i += T) {
        double v = double(loadAt(t, p, i));
        sum += v * v;
      }
      part[th] = sum;
    }
    for (I k = T / 2; k >= 1; k /= 2)
      for (I th = 0; th < k; ++th)
        part[th] = part[th] + part[th + k];
    out.push_back(part[0]);
  }
  return out;
}

/// The grad norm's finish over the partials: one running sum from
/// `initial`, the norm sqrt(sum) as f32, the clip coefficient min(1,
/// maxNorm / (norm + 1e-6)) (1 for maxNorm <= 0).
struct GradNormResult {
  double squares;
  float norm, clip;
};
inline GradNormResult modelGradNormFinish(const std::vector<double> &partials,
                                          double initial, double maxNorm) {
  double total = initial;
  for (double p : partials)
    total = total + p;
  float norm = float(std::sqrt(total));
  float clip = maxNorm > 0
                   ? float(std::min(1.0, maxNorm / (double(norm) + 1e-6)))
                   : 1.0f;
  return {total, norm, clip};
}

/// The bits of an f64, for the finish's maxNormBits slot.
inline I doubleBits(double v) {
  I bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

/// The bytes of an f32 buffer, for sameBits.
inline std::vector<uint8_t> rawBytes(const std::vector<float> &f) {
  std::vector<uint8_t> b(f.size() * sizeof(float));
  std::memcpy(b.data(), f.data(), b.size());
  return b;
}

/// The reference RMSNorm forward of a [rows, dim] x with row stride xs into
/// a contiguous y and rstd.
inline Status referenceRmsNorm(kg::ElemType t, const void *x, const void *w,
                               void *y, float *rstd, I rows, I dim, I xs,
                               bool zc) {
  RmsNormForwardArgs a;
  a.dtype = dtypeOf(t);
  a.x = x;
  a.w = w;
  a.y = y;
  a.rstd = rstd;
  a.rows = rows;
  a.dim = dim;
  a.xStride = xs;
  a.eps = 1e-6;
  a.zeroCentered = zc;
  return rmsNormForward(kHost, a);
}

} // namespace ap::kernelgen::test

#endif // ACTPLACE_TEST_UNIT_KERNELGEN_KERNELGEN_TEST_UTIL_H
