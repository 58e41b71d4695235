//===- dense.cu - dense CUDA kernels ----------------------------*- C++ -*-===//
//
// CUDA implementations of the dense op family (kernels/dense.h) for bf16
// storage: RMSNorm, RoPE, SwiGLU, sigmoid gate, residual add, embedding,
// chunked LM-head cross-entropy, grad norm, AdamW; and the document starts of
// packed sequences. Deterministic throughout: reductions run in a fixed order
// (warp butterflies, fixed shared-memory trees, per-block partials summed in
// index order), nothing uses float atomics, and no launch shape depends on
// pointer values.
//
//===----------------------------------------------------------------------===//
#include "kernels/cuda/dense/dense_cuda.h"
#include "kernels/cuda/rowwise.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

/// Pulled in by kernels/dense.h from every ACTPLACE_HAVE_CUDA translation
/// unit, so that this archive member (and the hooks it defines) is linked.
extern "C" {
int actplaceDenseCudaAnchor = 0;
}

namespace ap::kernels::cuda {
namespace {

using bf = __nv_bfloat16;

__device__ __forceinline__ float ld(const bf *p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ bf st(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ float sigmoidf(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

inline int64_t strideOr(int64_t s, int64_t cols) { return s ? s : cols; }
inline cudaStream_t streamOf(const KernelContext &ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}
inline unsigned gridFor(int64_t n, int threads, int64_t cap = 1 << 20) {
  return unsigned(
      std::max<int64_t>(1, std::min((n + threads - 1) / threads, cap)));
}

//===----------------------------------------------------------------------===//
// RMSNorm. Rows up to rowwise::kMaxDim wide sit in the registers of a lane
// group (rowwise.cuh); wider rows take one warp per row.
//===----------------------------------------------------------------------===//

constexpr int kNormWarps = 8;

/// y = x * rstd * w_eff, rounded step by step (no contraction): the forward
/// and a backward that rebuilds y from the saved rstd write the same bits.
__device__ __forceinline__ float rmsNormValue(float x, float rs, float we) {
  return __fmul_rn(__fmul_rn(x, rs), we);
}
constexpr int kRowThreads = 32 * rowwise::kWarps;

/// y = x * rstd * (1 + w) or x * rstd * w; the row is read once.
template <int G, int V>
__global__ void __launch_bounds__(kRowThreads)
    rmsNormFwdRowKernel(const bf *x, const bf *w, bf *y, float *rstd,
                        int64_t rows, int dim, int64_t xs, int64_t ys,
                        float eps, bool zc, bool vec) {
  const int lane = threadIdx.x & 31, gl = lane % G;
  const int64_t r = rowwise::groupRow<G>(lane);
  if (r >= rows)
    return;
  const bf *xr = x + r * xs;
  float xv[V][8];
  float ss =
      rowwise::groupSum<G>(rowwise::loadRowSquares<G, V>(xr, gl, dim, vec, xv));
  const float rs = 1.0f / sqrtf(ss / float(dim) + eps);
  if (rstd && gl == 0)
    rstd[r] = rs;
  bf *yr = y + r * ys;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int e = rowwise::vecStart<G>(k, gl);
    float wv[8], out[8];
    rowwise::load8(w, e, dim, vec, wv);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      out[i] = rmsNormValue(xv[k][i], rs, zc ? 1.0f + wv[i] : wv[i]);
    rowwise::store8(yr, e, dim, vec, out);
  }
}

/// dx per row and the block's partial dw. x and dy are read once: each lane
/// keeps its columns' dw terms in registers over the block's rows (in row
/// order), then rowwise::blockPartial folds lanes and warps in a fixed order.
/// Rows r of a block: base + (pass * kWarps + warp) * (32 / G) + group.
template <int G, int V>
__global__ void __launch_bounds__(kRowThreads)
    rmsNormBwdRowKernel(const bf *x, const bf *w, const float *rstd,
                        const bf *dy, bf *dx, bf *y, float *partial,
                        int64_t rows, int dim, int64_t xs, int64_t dys,
                        int64_t dxs, int64_t ys, int passes, bool zc,
                        bool vec) {
  constexpr int RPW = 32 / G;
  const int lane = threadIdx.x & 31, gl = lane % G, warp = threadIdx.x >> 5;
  float acc[V][8] = {};
  const int64_t base = int64_t(blockIdx.x) * passes * rowwise::kWarps * RPW;
  for (int p = 0; p < passes; ++p) {
    const int64_t r =
        base + (int64_t(p) * rowwise::kWarps + warp) * RPW + lane / G;
    if (r >= rows)
      continue; // the whole group skips: its shuffles stay inside it
    const bf *xr = x + r * xs, *dyr = dy + r * dys;
    const float rs = rstd[r];
    float xv[V][8], dv[V][8];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      rowwise::load8(xr, rowwise::vecStart<G>(k, gl), dim, vec, xv[k]);
      rowwise::load8(dyr, rowwise::vecStart<G>(k, gl), dim, vec, dv[k]);
    }
    if (dx || y) {
      float we[V][8];
      float dot = 0.f;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        rowwise::load8(w, rowwise::vecStart<G>(k, gl), dim, vec, we[k]);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          we[k][i] = zc ? 1.0f + we[k][i] : we[k][i];
          dot += dv[k][i] * we[k][i] * xv[k][i];
        }
      }
      if (y)
#pragma unroll
        for (int k = 0; k < V; ++k) {
          float out[8];
#pragma unroll
          for (int i = 0; i < 8; ++i)
            out[i] = rmsNormValue(xv[k][i], rs, we[k][i]);
          rowwise::store8(y + r * ys, rowwise::vecStart<G>(k, gl), dim, vec,
                          out);
        }
      dot = rowwise::groupSum<G>(dot);
      const float c = dot * rs * rs * rs / float(dim);
      if (dx)
#pragma unroll
        for (int k = 0; k < V; ++k) {
          float out[8];
#pragma unroll
          for (int i = 0; i < 8; ++i)
            out[i] = rs * we[k][i] * dv[k][i] - c * xv[k][i];
          rowwise::store8(dx + r * dxs, rowwise::vecStart<G>(k, gl), dim, vec,
                          out);
        }
    }
    if (partial)
#pragma unroll
      for (int k = 0; k < V; ++k)
#pragma unroll
        for (int i = 0; i < 8; ++i)
          acc[k][i] += dv[k][i] * xv[k][i] * rs;
  }
  if (partial)
    rowwise::blockPartial<G, V>(acc, dim, partial);
}

__global__ void rmsNormFwdKernel(const bf *x, const bf *w, bf *y, float *rstd,
                                 int64_t rows, int64_t dim, int64_t xs,
                                 int64_t ys, float eps, bool zc) {
  int lane = threadIdx.x & 31;
  int64_t r = int64_t(blockIdx.x) * kNormWarps + (threadIdx.x >> 5);
  if (r >= rows)
    return;
  const bf *xr = x + r * xs;
  float ss = 0.f;
  for (int64_t j = lane; j < dim; j += 32) {
    float v = ld(xr + j);
    ss += v * v;
  }
  ss = warpSum(ss);
  float rs = 1.0f / sqrtf(ss / float(dim) + eps);
  if (rstd && lane == 0)
    rstd[r] = rs;
  bf *yr = y + r * ys;
  for (int64_t j = lane; j < dim; j += 32) {
    float wv = ld(w + j);
    float we = zc ? 1.0f + wv : wv;
    yr[j] = st(rmsNormValue(ld(xr + j), rs, we));
  }
}

/// Rows wider than rowwise::kMaxDim: dx per row (a warp each,
/// ref::kRmsNormRowsPerPartial warps per block) and the partial dw of the
/// block's rows, summed in row order.
constexpr int kNormBwdThreads = 32 * int(ref::kRmsNormRowsPerPartial);

__global__ void __launch_bounds__(kNormBwdThreads)
    rmsNormBwdKernel(const bf *x, const bf *w, const float *rstd, const bf *dy,
                     bf *dx, bf *y, float *partial, int64_t rows, int64_t dim,
                     int64_t xs, int64_t dys, int64_t dxs, int64_t ys,
                     bool zc) {
  constexpr int64_t R = ref::kRmsNormRowsPerPartial;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t r0 = int64_t(blockIdx.x) * R;
  int64_t r = r0 + warp;
  if (y && r < rows)
    for (int64_t j = lane; j < dim; j += 32) {
      float wv = ld(w + j);
      y[r * ys + j] =
          st(rmsNormValue(ld(x + r * xs + j), rstd[r], zc ? 1.0f + wv : wv));
    }
  if (dx && r < rows) {
    const bf *xr = x + r * xs, *dyr = dy + r * dys;
    float rs = rstd[r];
    float dot = 0.f;
    for (int64_t j = lane; j < dim; j += 32) {
      float wv = ld(w + j);
      float we = zc ? 1.0f + wv : wv;
      dot += ld(dyr + j) * we * ld(xr + j);
    }
    dot = warpSum(dot);
    float c = dot * rs * rs * rs / float(dim);
    for (int64_t j = lane; j < dim; j += 32) {
      float wv = ld(w + j);
      float we = zc ? 1.0f + wv : wv;
      dx[r * dxs + j] = st(rs * we * ld(dyr + j) - c * ld(xr + j));
    }
  }
  if (partial) {
    int64_t r1 = std::min<int64_t>(rows, r0 + R);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      float s = 0.f;
      for (int64_t q = r0; q < r1; ++q)
        s += ld(dy + q * dys + j) * ld(x + q * xs + j) * rstd[q];
      partial[blockIdx.x * dim + j] = s;
    }
  }
}

/// Rows wider than rowwise::kMaxDim: dw[j] += sum of partial[p][j] over p,
/// 32 fixed contiguous segments of p per column (one thread each), then the
/// segment sums in segment order.
__global__ void __launch_bounds__(1024)
    columnSumKernel(const float *partial, float *dw, int64_t parts,
                    int64_t dim) {
  __shared__ float seg[32][33];
  int64_t j = int64_t(blockIdx.x) * 32 + threadIdx.x;
  int64_t len = (parts + 31) / 32;
  int64_t p0 = threadIdx.y * len, p1 = std::min<int64_t>(parts, p0 + len);
  float s = 0.f;
  if (j < dim)
    for (int64_t p = p0; p < p1; ++p)
      s += partial[p * dim + j];
  seg[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < dim) {
    float t = 0.f;
    for (int k = 0; k < 32; ++k)
      t += seg[k][threadIdx.x];
    dw[j] += t;
  }
}

//===----------------------------------------------------------------------===//
// RoPE: one block per (token, head) row.
//===----------------------------------------------------------------------===//

/// One block per token: the cos/sin of its position (angle in double,
/// rounded to float) are computed once into shared memory and used by every
/// head.
constexpr int kRopeMaxHalf = 512;

/// cs[i], sn[i] = cos, sin (negated for the backward) of position t's angle
/// for pair i < rd / 2, then a block barrier. Called by every thread.
/// I is the kernel's index type.
template <class I>
__device__ __forceinline__ void ropeTable(float *cs, float *sn, int64_t t, I rd,
                                          double theta, bool backward) {
  const I h = rd / 2;
  for (I i = threadIdx.x; i < h; i += blockDim.x) {
    double invFreq = pow(theta, -2.0 * double(i) / double(rd));
    double ang = double(t) * invFreq;
    cs[i] = float(cos(ang));
    float sv = float(sin(ang));
    sn[i] = backward ? -sv : sv;
  }
  __syncthreads();
}

/// Token `tok`'s position: within its row, or within its document when the
/// row packs several (kernels/kernels.h, docStart).
__device__ __forceinline__ int64_t ropePosition(int64_t tok, int64_t seq,
                                                const int32_t *docStart) {
  return tok % seq - (docStart ? int64_t(docStart[tok]) : 0);
}

__global__ void ropeKernel(const bf *x, bf *y, int64_t seq, int64_t heads,
                           int64_t headDim, int64_t offset, int64_t rd,
                           double theta, bool backward,
                           const int32_t *docStart) {
  __shared__ float cs[kRopeMaxHalf], sn[kRopeMaxHalf];
  const int64_t tok = blockIdx.x;
  ropeTable(cs, sn, ropePosition(tok, seq, docStart), rd, theta, backward);
  const int64_t h = rd / 2;
  const bf *xt = x + tok * heads * headDim;
  bf *yt = y + tok * heads * headDim;
  const int64_t n = heads * headDim;
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    int64_t j = e % headDim;
    if (j >= offset && j < offset + h) {
      int64_t i = j - offset;
      float c = cs[i], sv = sn[i];
      float x1 = ld(xt + e), x2 = ld(xt + e + h);
      yt[e] = st(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sv)));
      yt[e + h] = st(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sv)));
    } else if ((j < offset || j >= offset + rd) && x != y) {
      yt[e] = xt[e];
    }
  }
}

/// The same rotation with 16-byte accesses, one block per token: a thread
/// takes 8 rotation pairs (x[i, i+8) with x[i+h, i+h+8)) or 8 pass-through
/// elements of one head. Same cos/sin and the same operations per element as
/// ropeKernel, so the results are its bits. Needs offset, rotaryDim / 2 and
/// headDim in multiples of 8 and 16-byte aligned x and y.
__global__ void ropeVecKernel(const bf *x, bf *y, int64_t seq, int heads,
                              int headDim, int offset, int rd, double theta,
                              bool backward, const int32_t *docStart) {
  __shared__ float cs[kRopeMaxHalf], sn[kRopeMaxHalf];
  const int64_t tok = blockIdx.x;
  ropeTable(cs, sn, ropePosition(tok, seq, docStart), rd, theta, backward);
  const int h = rd / 2;
  // In place, the pass-through elements are already where they belong.
  const int pairItems = h / 8, copyItems = x != y ? (headDim - rd) / 8 : 0;
  const int perHead = pairItems + copyItems;
  const bf *xt = x + tok * heads * headDim;
  bf *yt = y + tok * heads * headDim;
  for (int it = threadIdx.x; it < heads * perHead; it += blockDim.x) {
    const int head = it / perHead, k = it - head * perHead;
    const bf *xh = xt + head * headDim;
    bf *yh = yt + head * headDim;
    if (k < pairItems) {
      const int i = k * 8;
      float x1[8], x2[8], y1[8], y2[8];
      rowwise::load8(xh + offset + i, 0, 8, true, x1);
      rowwise::load8(xh + offset + i + h, 0, 8, true, x2);
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const float c = cs[i + q], sv = sn[i + q];
        y1[q] = __fsub_rn(__fmul_rn(x1[q], c), __fmul_rn(x2[q], sv));
        y2[q] = __fadd_rn(__fmul_rn(x2[q], c), __fmul_rn(x1[q], sv));
      }
      rowwise::store8(yh + offset + i, 0, 8, true, y1);
      rowwise::store8(yh + offset + i + h, 0, 8, true, y2);
    } else {
      const int j = (k - pairItems) * 8, e = j < offset ? j : j + rd;
      *reinterpret_cast<uint4 *>(yh + e) =
          *reinterpret_cast<const uint4 *>(xh + e);
    }
  }
}

//===----------------------------------------------------------------------===//
// Document starts of packed sequences: one block per row.
//===----------------------------------------------------------------------===//

constexpr int kDocThreads = 256;

/// docStart[t] = max over s <= t of (tokens[s-1] == separator ? s : 0): an
/// inclusive prefix max over the row, a tile of kDocThreads tokens at a time
/// (warp scans, then the warps before and the tiles before as carry). Max of
/// integers is exact, so the result is the host loop's whatever the order.
__global__ void __launch_bounds__(kDocThreads)
    documentStartsKernel(const int32_t *tokens, int32_t *docStart, int64_t seq,
                         int32_t separator) {
  __shared__ int32_t warpMax[kDocThreads / 32];
  __shared__ int32_t carry;
  const int64_t row = blockIdx.x;
  const int32_t *tok = tokens + row * seq;
  int32_t *ds = docStart + row * seq;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0)
    carry = 0;
  __syncthreads();
  for (int64_t t0 = 0; t0 < seq; t0 += kDocThreads) {
    const int64_t t = t0 + threadIdx.x;
    int32_t v = t > 0 && t < seq && tok[t - 1] == separator ? int32_t(t) : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int32_t u = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o)
        v = max(v, u);
    }
    if (lane == 31)
      warpMax[warp] = v;
    __syncthreads();
    int32_t before = carry;
    for (int w = 0; w < warp; ++w)
      before = max(before, warpMax[w]);
    v = max(v, before);
    if (t < seq)
      ds[t] = v;
    // Every thread has read carry and warpMax before the next tile's.
    __syncthreads();
    if (threadIdx.x == kDocThreads - 1)
      carry = v;
    __syncthreads();
  }
}

//===----------------------------------------------------------------------===//
// Elementwise over [rows, cols] views: blockIdx.y strides rows.
//===----------------------------------------------------------------------===//

constexpr int kEwThreads = 256;

/// W consecutive bf16 of a row: W = 8 uses 16-byte, W = 2 4-byte accesses.
/// Elementwise results do not depend on W (each output is computed alone),
/// so choosing W from alignment cannot change a bit.
template <int W> struct Pack {
  float v[W];
  __device__ __forceinline__ void load(const bf *p) {
    if constexpr (W == 8) {
      rowwise::unpack8(*reinterpret_cast<const uint4 *>(p), v);
    } else if constexpr (W == 2) {
      __nv_bfloat162 t = *reinterpret_cast<const __nv_bfloat162 *>(p);
      v[0] = __low2float(t);
      v[1] = __high2float(t);
    } else {
      v[0] = ld(p);
    }
  }
  __device__ __forceinline__ void store(bf *p) const {
    if constexpr (W == 8)
      *reinterpret_cast<uint4 *>(p) = rowwise::pack8(v);
    else if constexpr (W == 2)
      *reinterpret_cast<__nv_bfloat162 *>(p) =
          __floats2bfloat162_rn(v[0], v[1]);
    else
      p[0] = st(v[0]);
  }
};

/// y = silu(g) * u, rounded step by step (no contraction), so the forward
/// and a backward that rebuilds y write the same bits.
__device__ __forceinline__ float swiGluValue(float g, float s, float u) {
  return __fmul_rn(__fmul_rn(g, s), u);
}

template <int W>
__global__ void swiGluFwdKernel(const bf *g, const bf *u, bf *y, int64_t rows,
                                int64_t cols, int64_t gs, int64_t us,
                                int64_t ys) {
  int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W;
  if (c >= cols)
    return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    Pack<W> gv, uv, out;
    gv.load(g + r * gs + c);
    uv.load(u + r * us + c);
#pragma unroll
    for (int k = 0; k < W; ++k)
      out.v[k] = swiGluValue(gv.v[k], sigmoidf(gv.v[k]), uv.v[k]);
    out.store(y + r * ys + c);
  }
}

template <int W>
__global__ void swiGluBwdKernel(const bf *g, const bf *u, const bf *dy, bf *dg,
                                bf *du, bf *y, int64_t rows, int64_t cols,
                                int64_t gs, int64_t us, int64_t dys,
                                int64_t dgs, int64_t dus, int64_t ys) {
  int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W;
  if (c >= cols)
    return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    Pack<W> gv, uv, d, og, ou, oy;
    gv.load(g + r * gs + c);
    uv.load(u + r * us + c);
    d.load(dy + r * dys + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float s = sigmoidf(gv.v[k]);
      og.v[k] = d.v[k] * uv.v[k] * s * (1.0f + gv.v[k] * (1.0f - s));
      ou.v[k] = d.v[k] * (gv.v[k] * s);
      oy.v[k] = swiGluValue(gv.v[k], s, uv.v[k]);
    }
    if (dg)
      og.store(dg + r * dgs + c);
    if (du)
      ou.store(du + r * dus + c);
    if (y)
      oy.store(y + r * ys + c);
  }
}

template <int W>
__global__ void gateFwdKernel(const bf *o, const bf *g, bf *y, int64_t rows,
                              int64_t cols, int64_t os, int64_t gs,
                              int64_t ys) {
  int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W;
  if (c >= cols)
    return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    Pack<W> ov, gv, out;
    ov.load(o + r * os + c);
    gv.load(g + r * gs + c);
#pragma unroll
    for (int k = 0; k < W; ++k)
      out.v[k] = __fmul_rn(ov.v[k], sigmoidf(gv.v[k]));
    out.store(y + r * ys + c);
  }
}

template <int W>
__global__ void gateBwdKernel(const bf *o, const bf *g, const bf *dy, bf *dO,
                              bf *dg, int64_t rows, int64_t cols, int64_t os,
                              int64_t gs, int64_t dys, int64_t dos,
                              int64_t dgs) {
  int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W;
  if (c >= cols)
    return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    Pack<W> ov, gv, d, odo, odg;
    ov.load(o + r * os + c);
    gv.load(g + r * gs + c);
    d.load(dy + r * dys + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float sg = sigmoidf(gv.v[k]);
      odo.v[k] = __fmul_rn(d.v[k], sg);
      odg.v[k] = d.v[k] * ov.v[k] * sg * (1.0f - sg);
    }
    if (dO)
      odo.store(dO + r * dos + c);
    if (dg)
      odg.store(dg + r * dgs + c);
  }
}

template <int W>
__global__ void addKernel(const bf *a, const bf *b, bf *y, int64_t n) {
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W; i < n;
       i += int64_t(gridDim.x) * blockDim.x * W) {
    Pack<W> x, z, out;
    x.load(a + i);
    z.load(b + i);
#pragma unroll
    for (int k = 0; k < W; ++k)
      out.v[k] = __fadd_rn(x.v[k], z.v[k]);
    out.store(y + i);
  }
}

/// Launch shape of the [rows, cols] elementwise kernels with W columns per
/// thread: a few thousand blocks, each striding over rows.
struct EwLaunch {
  dim3 grid, block;
};
EwLaunch ewLaunch(int64_t rows, int64_t cols, int w) {
  int64_t threadsX = (cols + w - 1) / w;
  int block = int(std::min<int64_t>(kEwThreads, (threadsX + 31) / 32 * 32));
  int64_t gx = (threadsX + block - 1) / block;
  int64_t gy = std::min<int64_t>(rows, std::max<int64_t>(1, 4096 / gx));
  return {dim3(unsigned(gx), unsigned(gy)), dim3(unsigned(block))};
}

/// The widest access (8, 2 or 1 elements) that every view allows: columns
/// and strides multiples of it, every (non-null) base aligned to its bytes.
int ewWidth(int64_t cols, std::initializer_list<int64_t> strides,
            std::initializer_list<const void *> ptrs) {
  for (int w : {8, 2}) {
    bool ok = cols % w == 0;
    for (int64_t s : strides)
      ok = ok && s % w == 0;
    for (const void *p : ptrs)
      ok = ok && (!p || reinterpret_cast<uintptr_t>(p) % (2 * w) == 0);
    if (ok)
      return w;
  }
  return 1;
}

/// Calls f(integral_constant<W>) for the access width w (8, 2 or 1).
template <class F> void withWidth(int w, F &&f) {
  if (w == 8)
    f(std::integral_constant<int, 8>{});
  else if (w == 2)
    f(std::integral_constant<int, 2>{});
  else
    f(std::integral_constant<int, 1>{});
}

//===----------------------------------------------------------------------===//
// Embedding.
//===----------------------------------------------------------------------===//

/// w holds the table's rows [offset, offset + vocab) (offset 0 unless the
/// vocabulary is split); ids of other rows give zero rows.
__global__ void embedFwdKernel(const int32_t *ids, const bf *w, bf *y,
                               int64_t vocab, int64_t dim, int64_t offset) {
  int64_t n = blockIdx.x;
  int64_t id = int64_t(ids[n]) - offset;
  bool ok = id >= 0 && id < vocab;
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x)
    y[n * dim + d] = ok ? w[id * dim + d] : st(0.f);
}

constexpr int kEmbThreads = 256;
constexpr int64_t kEmbRowsPerOwner = 512;

/// Each block owns kEmbRowsPerOwner vocab rows. It scans the ids in token
/// order, compacts the tokens that hit its rows (order kept), and adds their
/// dy rows; the thread that owns column d of the block adds every term of
/// that column, in token order, so the sums are fixed. dw holds the table's
/// rows [offset, offset + vocab); tokens of other rows are skipped.
__global__ void embedBwdKernel(const int32_t *ids, const bf *dy, float *dw,
                               int64_t tokens, int64_t vocab, int64_t dim,
                               int64_t offset) {
  __shared__ int32_t hits[kEmbThreads];
  __shared__ int warpCount[kEmbThreads / 32];
  const int64_t v0 = int64_t(blockIdx.x) * kEmbRowsPerOwner;
  const int64_t v1 = std::min<int64_t>(vocab, v0 + kEmbRowsPerOwner);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t n0 = 0; n0 < tokens; n0 += kEmbThreads) {
    int64_t n = n0 + threadIdx.x;
    bool mine = false;
    if (n < tokens) {
      int64_t id = int64_t(ids[n]) - offset;
      mine = id >= v0 && id < v1;
    }
    unsigned mask = __ballot_sync(0xffffffffu, mine);
    if (lane == 0)
      warpCount[warp] = __popc(mask);
    __syncthreads();
    int before = 0, total = 0;
    for (int k = 0; k < kEmbThreads / 32; ++k) {
      before += k < warp ? warpCount[k] : 0;
      total += warpCount[k];
    }
    if (mine)
      hits[before + __popc(mask & ((1u << lane) - 1u))] = int32_t(n);
    __syncthreads();
    for (int e = 0; e < total; ++e) {
      int64_t tok = hits[e];
      float *row = dw + (int64_t(ids[tok]) - offset) * dim;
      const bf *src = dy + tok * dim;
      for (int64_t d = threadIdx.x; d < dim; d += kEmbThreads)
        row[d] += ld(src + d);
    }
    __syncthreads();
  }
}

//===----------------------------------------------------------------------===//
// Cross-entropy pieces.
//===----------------------------------------------------------------------===//

constexpr int kCeThreads = 512;

/// Online (max, sum) merge; fixed operand order.
__device__ __forceinline__ void lseMerge(float &m, float &s, float m2,
                                         float s2) {
  float mn = fmaxf(m, m2);
  if (mn == -INFINITY)
    return;
  s = s * expf(m - mn) + s2 * expf(m2 - mn);
  m = mn;
}

/// Eight bf16 logits from one 16-byte load, as floats.
__device__ __forceinline__ void ceUnpack8(uint4 q, float (&x)[8]) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    __nv_bfloat162 t = *reinterpret_cast<const __nv_bfloat162 *>(&w[k]);
    x[2 * k] = __low2float(t);
    x[2 * k + 1] = __high2float(t);
  }
}

/// Adds eight logits to a running (max, sum of exp): the max of the eight
/// first, the sum rescaled once if it grew, then their exps in order. A NaN
/// logit makes the sum NaN (its exp is NaN whatever the max).
__device__ __forceinline__ void lseAdd8(float &m, float &s, uint4 q) {
  float x[8];
  ceUnpack8(q, x);
  float mx = x[0];
#pragma unroll
  for (int k = 1; k < 8; ++k)
    mx = fmaxf(mx, x[k]);
  if (mx > m) {
    s = s * expf(m - mx);
    m = mx;
  }
#pragma unroll
  for (int k = 0; k < 8; ++k)
    s += expf(x[k] - m);
}

/// Whether a row of `vocab` bf16 logits at l can be read (and its gradient
/// written) eight elements at a time: every row of the chunk then starts
/// 16-byte aligned, since rows are vocab * 2 bytes apart.
__device__ __forceinline__ bool ceRowVectors(const bf *l, int64_t vocab) {
  return vocab % 8 == 0 && reinterpret_cast<uintptr_t>(l) % 16 == 0;
}

/// The running (max, sum of exp) of one row l[0, vocab) of bf16 logits in a
/// fixed order: each thread over its strided slice (where the row is
/// 16-byte aligned, groups of eight consecutive logits, four groups loaded
/// before any is added so that enough bytes are in flight; otherwise element
/// by element), then the lanes of a warp pairwise in lane order, then the
/// warps in order by thread 0, which alone calls finish(max, sum). The path
/// depends on the shape and alignment only, so a row's bits do not change
/// between calls. Every thread of the block must call it.
template <class Finish>
__device__ __forceinline__ void ceRowStats(const bf *l, int64_t vocab,
                                           Finish &&finish) {
  __shared__ float sm[kCeThreads / 32], ss[kCeThreads / 32];
  float m = -INFINITY, s = 0.f;
  if (ceRowVectors(l, vocab)) {
    const uint4 *l8 = reinterpret_cast<const uint4 *>(l);
    const int64_t n8 = vocab / 8;
    int64_t v = threadIdx.x;
    for (; v + 3 * kCeThreads < n8; v += 4 * kCeThreads) {
      uint4 a = l8[v], b = l8[v + kCeThreads], c = l8[v + 2 * kCeThreads],
            d = l8[v + 3 * kCeThreads];
      lseAdd8(m, s, a);
      lseAdd8(m, s, b);
      lseAdd8(m, s, c);
      lseAdd8(m, s, d);
    }
    for (; v < n8; v += kCeThreads)
      lseAdd8(m, s, l8[v]);
  } else {
    for (int64_t v = threadIdx.x; v < vocab; v += kCeThreads) {
      float x = ld(l + v);
      if (x > m) {
        s = s * expf(m - x) + 1.0f;
        m = x;
      } else {
        s += expf(x - m);
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o);
    float s2 = __shfl_xor_sync(0xffffffffu, s, o);
    // Both lanes of a pair must compute the same value: merge in lane order.
    if ((threadIdx.x & o) == 0)
      lseMerge(m, s, m2, s2);
    else {
      float mm = m2, sss = s2;
      lseMerge(mm, sss, m, s);
      m = mm;
      s = sss;
    }
  }
  int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = sm[0], S = ss[0];
    for (int k = 1; k < kCeThreads / 32; ++k)
      lseMerge(M, S, sm[k], ss[k]);
    finish(M, S);
  }
}

/// A token row's outputs from its log-sum-exp and its label's logit: the
/// lse (chunk and, when asked, the whole step's) and the [loss, valid] pair.
__device__ __forceinline__ void ceRowOutputs(float lse, float labelLogit,
                                             bool valid, int64_t r,
                                             int64_t rowBase, float *lseOut,
                                             float *lseChunk, float *rowLoss) {
  lseChunk[r] = lse;
  if (lseOut)
    lseOut[rowBase + r] = lse;
  rowLoss[2 * r] = valid ? lse - labelLogit : 0.f;
  rowLoss[2 * r + 1] = valid ? 1.f : 0.f;
}

/// One block per token row of the chunk: lse, per-token loss and validity.
__global__ void ceLseKernel(const bf *logits, const int32_t *labels,
                            int64_t vocab, int32_t ignoreIndex, float *lseOut,
                            float *lseChunk, float *rowLoss, int64_t rowBase) {
  const int64_t r = blockIdx.x;
  const bf *l = logits + r * vocab;
  ceRowStats(l, vocab, [&](float M, float S) {
    int32_t lab = labels[rowBase + r];
    bool valid = lab != ignoreIndex && lab >= 0 && lab < vocab;
    ceRowOutputs(M + logf(S), valid ? ld(l + lab) : 0.f, valid, r, rowBase,
                 lseOut, lseChunk, rowLoss);
  });
}

/// A split vocabulary, one block per token row of the chunk: the row's
/// statistics over this rank's logits (ceLseKernel's merge order) into
/// stats[r][ref::kCeStats]: max, sum of exp, and the label's logit if this
/// rank holds the label's row (the table's rows [offset, offset + vocab)),
/// else 0.
__global__ void ceStatsKernel(const bf *logits, const int32_t *labels,
                              int64_t vocab, int64_t offset, float *stats,
                              int64_t rowBase) {
  const int64_t r = blockIdx.x;
  const bf *l = logits + r * vocab;
  ceRowStats(l, vocab, [&](float M, float S) {
    int64_t lab = int64_t(labels[rowBase + r]) - offset;
    float *o = stats + r * ref::kCeStats;
    o[0] = M;
    o[1] = S;
    o[2] = lab >= 0 && lab < vocab ? ld(l + lab) : 0.f;
  });
}

/// A split vocabulary, one thread per token row: merges the ranks' gathered
/// statistics (gathered[rank][rows][ref::kCeStats]) in rank order, from rank
/// 0's, into the row's lse, loss and validity (ceLseKernel's outputs); the
/// label's logit is the sum of the ranks' (one is nonzero), labels are valid
/// in [0, labelBound).
__global__ void ceMergeKernel(const float *gathered, int32_t ranks,
                              int64_t rows, const int32_t *labels,
                              int64_t labelBound, int32_t ignoreIndex,
                              float *lseOut, float *lseChunk, float *rowLoss,
                              int64_t rowBase) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const float *first = gathered + r * ref::kCeStats;
    float M = first[0], S = first[1], t = first[2];
    for (int32_t k = 1; k < ranks; ++k) {
      const float *o = gathered + (k * rows + r) * ref::kCeStats;
      lseMerge(M, S, o[0], o[1]);
      t += o[2];
    }
    int32_t lab = labels[rowBase + r];
    bool valid = lab != ignoreIndex && lab >= 0 && lab < labelBound;
    ceRowOutputs(M + logf(S), t, valid, r, rowBase, lseOut, lseChunk, rowLoss);
  }
}

/// One logit's gradient: scale * (softmax - onehot), 0 for ignored tokens.
__device__ __forceinline__ float ceGradValue(float logit, float ls, bool hot,
                                             bool valid, float scale) {
  return valid ? scale * (expf(logit - ls) - (hot ? 1.0f : 0.0f)) : 0.f;
}

/// dlogits = scale * (softmax - onehot), 0 for ignored tokens, written in
/// bf16 over the logits it is computed from (each element is read and
/// written by the same thread). Rows stride by gridDim.y (at most
/// ceGradGridRows), so a chunk of more rows than grid.y holds is covered.
/// Where the rows are 16-byte aligned a thread takes groups of eight
/// logits (one 16-byte load and store), else single logits; every element
/// is computed alone, so neither the stride nor the path changes a bit.
/// Column v is the table's row v + vocabOffset (0 unless the vocabulary is
/// split); labels are valid in [0, labelBound).
__global__ void ceGradKernel(bf *logits, const int32_t *labels,
                             const float *lse, int64_t rows, int64_t vocab,
                             int32_t ignoreIndex, float scale, int64_t rowBase,
                             int64_t vocabOffset, int64_t labelBound) {
  const bool vectors = ceRowVectors(logits, vocab);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    int32_t lab = labels[rowBase + r];
    bool valid = lab != ignoreIndex && lab >= 0 && lab < labelBound;
    float ls = lse[r];
    // The label's column in this rank's block (may be outside it).
    const int64_t hot = int64_t(lab) - vocabOffset;
    bf *row = logits + r * vocab;
    if (vectors) {
      uint4 *row8 = reinterpret_cast<uint4 *>(row);
      for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
           q < vocab / 8; q += step) {
        float x[8];
        ceUnpack8(row8[q], x);
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int64_t v = 8 * q + 2 * k;
          __nv_bfloat162 t = __floats2bfloat162_rn(
              ceGradValue(x[2 * k], ls, v == hot, valid, scale),
              ceGradValue(x[2 * k + 1], ls, v + 1 == hot, valid, scale));
          w[k] = *reinterpret_cast<uint32_t *>(&t);
        }
        row8[q] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else {
      for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
           v < vocab; v += step)
        row[v] = st(ceGradValue(ld(row + v), ls, v == hot, valid, scale));
    }
  }
}

/// Sums the chunk's per-token losses and counts in a fixed tree and adds them
/// to the running totals (the first chunk overwrites).
__global__ void ceSumKernel(const float *rowLoss, int64_t rows, float *lossSum,
                            int32_t *count, bool first) {
  __shared__ float sl[1024];
  __shared__ float sc[1024];
  float l = 0.f, c = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    l += rowLoss[2 * r];
    c += rowLoss[2 * r + 1];
  }
  sl[threadIdx.x] = l;
  sc[threadIdx.x] = c;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      sl[threadIdx.x] += sl[threadIdx.x + s];
      sc[threadIdx.x] += sc[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *lossSum = first ? sl[0] : *lossSum + sl[0];
    if (count)
      *count = first ? int32_t(sc[0]) : *count + int32_t(sc[0]);
  }
}

//===----------------------------------------------------------------------===//
// Optimizer.
//===----------------------------------------------------------------------===//

constexpr int kNormThreads = 256;

__device__ __forceinline__ float gradAt(const float *p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float gradAt(const bf *p, int64_t i) {
  return ld(p + i);
}

/// The tensor of a batched launch that block `blk` works on: the last t
/// with firstBlock[t] <= blk (firstBlock: the blocks before each tensor's,
/// non-decreasing). Every thread of the block computes the same answer.
__device__ __forceinline__ int batchTensorOf(const int64_t *firstBlock,
                                             int count, int64_t blk) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (firstBlock[mid] <= blk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/// The grad norm's partial sums, many tensors a launch. A step's norm covers
/// every parameter (hundreds of tensors, most of them a few thousand
/// elements): one launch each left the GPU waiting on the host's launches
/// for longer than the whole read takes. A launch covers up to
/// kNormBatchTensors tensors of one element type; each CUDA block finds its
/// tensor by a binary search over the batch's block prefix (the same for
/// every thread of the block) and writes the partial of its 65536-element
/// block into that block's slot of the list order, so how tensors are
/// grouped into launches never changes a partial or the final sum.
constexpr int kNormBatchTensors = 256;
struct NormBatch {
  const void *data[kNormBatchTensors];
  int64_t n[kNormBatchTensors];
  /// The slot of the tensor's first partial in the list-order partials.
  int64_t partialOffset[kNormBatchTensors];
  /// The batch's CUDA blocks before each tensor's; firstBlock[count] is the
  /// launch's grid size.
  int64_t firstBlock[kNormBatchTensors + 1];
  int32_t count;
};

/// T: float or bf (a bf16 main grad, widened exactly; same blocking). Thread
/// t of a block sums elements b0 + t, b0 + t + 256, ... in that order (a
/// float or bf16 squared is exact in double, so contraction cannot change a
/// bit), then the block adds the 256 sums in a fixed tree. A full block
/// issues its loads eight at a time ahead of the sums, which keeps enough
/// bytes in flight to run at the copy rate; the order of the sums stays the
/// same.
template <typename T>
__global__ void __launch_bounds__(kNormThreads)
    sqPartialKernel(const __grid_constant__ NormBatch batch, double *partial) {
  __shared__ double sh[kNormThreads];
  const int64_t blk = blockIdx.x;
  const int lo = batchTensorOf(batch.firstBlock, batch.count, blk);
  const T *p = static_cast<const T *>(batch.data[lo]);
  const int64_t n = batch.n[lo];
  const int64_t local = blk - batch.firstBlock[lo];
  const int64_t b0 = local * ref::kGradNormBlock;
  const int64_t b1 = std::min<int64_t>(n, b0 + ref::kGradNormBlock);
  double s = 0;
  if (b1 - b0 == ref::kGradNormBlock) {
    constexpr int kPerThread = int(ref::kGradNormBlock) / kNormThreads;
    constexpr int kAhead = 8;
    static_assert(kPerThread % kAhead == 0, "whole rounds of loads");
    const T *q = p + b0 + threadIdx.x;
#pragma unroll 1
    for (int r = 0; r < kPerThread; r += kAhead) {
      float v[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u)
        v[u] = gradAt(q, int64_t(r + u) * kNormThreads);
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        double d = v[u];
        s += d * d;
      }
    }
  } else {
    for (int64_t i = b0 + threadIdx.x; i < b1; i += kNormThreads) {
      double v = gradAt(p, i);
      s += v * v;
    }
  }
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int k = kNormThreads / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k)
      sh[threadIdx.x] += sh[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    partial[batch.partialOffset[lo] + local] = sh[0];
}

/// One running sum over the block partials in list order, started from
/// `initial`: a pipeline stage continuing the previous stages' sum gets the
/// bits of one pass over all their tensors (a tree over the partials would
/// not). The block stages the partials in shared memory a chunk at a time
/// and one thread adds them in order: the adds stay one dependent chain
/// (about 0.75B parameters give 11,500 of them), but none waits on a load
/// from global memory.
constexpr int kNormFinishChunk = 2048;
__global__ void __launch_bounds__(kNormThreads)
    normFinishKernel(const double *partial, int64_t parts, double maxNorm,
                     float *norm, float *clipCoef, const double *initial,
                     double *squares) {
  __shared__ double chunk[kNormFinishChunk];
  double total = initial ? *initial : 0.0;
  for (int64_t c0 = 0; c0 < parts; c0 += kNormFinishChunk) {
    const int m = int(std::min<int64_t>(kNormFinishChunk, parts - c0));
    for (int i = threadIdx.x; i < m; i += blockDim.x)
      chunk[i] = partial[c0 + i];
    __syncthreads();
    if (threadIdx.x == 0)
      for (int i = 0; i < m; ++i)
        total = __dadd_rn(total, chunk[i]);
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (squares)
      *squares = total;
    float nv = float(sqrt(total));
    *norm = nv;
    if (clipCoef)
      *clipCoef =
          maxNorm > 0 ? float(fmin(1.0, maxNorm / (double(nv) + 1e-6))) : 1.0f;
  }
}

/// AdamW's constants for one launch; `cc` is the clip coefficient read from
/// the device.
struct AdamWConsts {
  float cc, stepSize, bc2Sqrt, decay, b1, b2, ob1, ob2, eps;
};

/// One element's update: the same operations, in the same order and without
/// contraction, as the reference, so the results are bitwise equal to it.
/// Both kernels below go through this one function.
__device__ __forceinline__ void adamWElement(const AdamWConsts &k, float grad,
                                             float &p, float &m, float &v) {
  float g = __fmul_rn(grad, k.cc);
  float q = __fmul_rn(p, k.decay);
  float mi = __fadd_rn(__fmul_rn(k.b1, m), __fmul_rn(k.ob1, g));
  float vi = __fadd_rn(__fmul_rn(k.b2, v), __fmul_rn(k.ob2, __fmul_rn(g, g)));
  float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2Sqrt), k.eps);
  p = __fsub_rn(q, __fmul_rn(k.stepSize, __fdiv_rn(mi, denom)));
  m = mi;
  v = vi;
}

__device__ __forceinline__ AdamWConsts adamWConsts(const float *clipCoef,
                                                   float stepSize,
                                                   float bc2Sqrt, float decay,
                                                   float b1, float b2,
                                                   float eps) {
  return {clipCoef ? *clipCoef : 1.0f,
          stepSize,
          bc2Sqrt,
          decay,
          b1,
          b2,
          1.0f - b1,
          1.0f - b2,
          eps};
}

template <bool ToBf16>
__device__ __forceinline__ void adamWStoreCopy(void *copy, int64_t i, float p) {
  if (ToBf16)
    static_cast<bf *>(copy)[i] = st(p);
  else
    static_cast<float *>(copy)[i] = p;
}

/// Element i read, updated and written back, with its compute copy.
template <bool ToBf16, typename G>
__device__ __forceinline__ void adamWAt(const AdamWConsts &k, float *master,
                                        float *m, float *v, const G *grad,
                                        void *copy, int64_t i) {
  float p = master[i], mi = m[i], vi = v[i];
  adamWElement(k, gradAt(grad, i), p, mi, vi);
  master[i] = p;
  m[i] = mi;
  v[i] = vi;
  if (copy)
    adamWStoreCopy<ToBf16>(copy, i, p);
}

/// Element by element (any alignment). G: the main grad's element type
/// (float or bf, widened exactly).
template <bool ToBf16, typename G>
__global__ void adamWKernel(float *master, float *m, float *v, const G *grad,
                            const float *clipCoef, void *copy, int64_t n,
                            float stepSize, float bc2Sqrt, float decay,
                            float b1, float b2, float eps) {
  const AdamWConsts k =
      adamWConsts(clipCoef, stepSize, bc2Sqrt, decay, b1, b2, eps);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    adamWAt<ToBf16>(k, master, m, v, grad, copy, i);
  }
}

/// Four grad elements, read as one 16-byte (f32) or 8-byte (bf16) load.
__device__ __forceinline__ float4 loadGrad4(const float *g, int64_t quad) {
  return reinterpret_cast<const float4 *>(g)[quad];
}
__device__ __forceinline__ float4 loadGrad4(const bf *g, int64_t quad) {
  const uint2 u = reinterpret_cast<const uint2 *>(g)[quad];
  // A bf16 is the upper half of its float: widening is exact.
  return make_float4(
      __uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
      __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

/// Four updated masters' compute copy, one 8-byte (bf16) or 16-byte store.
template <bool ToBf16>
__device__ __forceinline__ void adamWStoreCopy4(void *copy, int64_t quad,
                                                float4 p) {
  if (ToBf16) {
    __nv_bfloat162 lo = __halves2bfloat162(st(p.x), st(p.y));
    __nv_bfloat162 hi = __halves2bfloat162(st(p.z), st(p.w));
    uint2 u;
    u.x = *reinterpret_cast<uint32_t *>(&lo);
    u.y = *reinterpret_cast<uint32_t *>(&hi);
    reinterpret_cast<uint2 *>(copy)[quad] = u;
  } else {
    reinterpret_cast<float4 *>(copy)[quad] = p;
  }
}

__device__ __forceinline__ void zeroGrad4(float *g, int64_t quad) {
  reinterpret_cast<float4 *>(g)[quad] = make_float4(0.f, 0.f, 0.f, 0.f);
}
__device__ __forceinline__ void zeroGrad4(bf *g, int64_t quad) {
  reinterpret_cast<uint2 *>(g)[quad] = make_uint2(0u, 0u);
}

/// Quad q of one tensor read, updated and written back (and its compute
/// copy); with `zero` the grad's four elements are zeroed once read (only
/// adamWSteps passes it, whose grads are writable).
template <bool ToBf16, typename G>
__device__ __forceinline__ void adamWQuadAt(const AdamWConsts &k, float4 *P,
                                            float4 *M, float4 *V, const G *grad,
                                            void *copy, int64_t q, bool zero) {
  float4 p = P[q], mi = M[q], vi = V[q];
  const float4 g = loadGrad4(grad, q);
  if (zero)
    zeroGrad4(const_cast<G *>(grad), q);
  adamWElement(k, g.x, p.x, mi.x, vi.x);
  adamWElement(k, g.y, p.y, mi.y, vi.y);
  adamWElement(k, g.z, p.z, mi.z, vi.z);
  adamWElement(k, g.w, p.w, mi.w, vi.w);
  P[q] = p;
  M[q] = mi;
  V[q] = vi;
  if (copy)
    adamWStoreCopy4<ToBf16>(copy, q, p);
}

/// Four elements a thread with 16-byte loads and stores (8-byte for bf16),
/// where every buffer is aligned for them: the update is memory-bound (30
/// bytes an element with a bf16 copy), and the element-by-element kernel's
/// 4-byte accesses keep too few bytes in flight to reach the copy rate. The
/// n % 4 last elements go element by element in block 0. Each element's
/// arithmetic is adamWElement's, so the bits are the same as adamWKernel's.
template <bool ToBf16, typename G>
__global__ void
adamWQuadKernel(float *master, float *m, float *v, const G *grad,
                const float *clipCoef, void *copy, int64_t n, float stepSize,
                float bc2Sqrt, float decay, float b1, float b2, float eps) {
  const AdamWConsts k =
      adamWConsts(clipCoef, stepSize, bc2Sqrt, decay, b1, b2, eps);
  const int64_t quads = n / 4;
  auto *P = reinterpret_cast<float4 *>(master);
  auto *M = reinterpret_cast<float4 *>(m);
  auto *V = reinterpret_cast<float4 *>(v);
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < quads;
       q += int64_t(gridDim.x) * blockDim.x) {
    adamWQuadAt<ToBf16>(k, P, M, V, grad, copy, q, false);
  }
  if (blockIdx.x == 0 && threadIdx.x < n - quads * 4) {
    const int64_t i = quads * 4 + threadIdx.x;
    adamWAt<ToBf16>(k, master, m, v, grad, copy, i);
  }
}

/// AdamW over up to kAdamWBatchTensors tensors a launch (adamWSteps), each
/// with its own scalars and buffers, all aligned for the quad kernel's
/// accesses. A block takes kAdamWQuadsPerBlock quads of one tensor (found
/// by a binary search over the batch's block prefix, as the grad norm's
/// partials are), a thread four of them 256 quads apart; the tensor's last
/// block also takes its n % 4 last elements. With zeroGrad the grad's
/// elements are zeroed once read.
constexpr int kAdamWBatchTensors = 96;
constexpr int kAdamWThreads = 256;
constexpr int64_t kAdamWQuadsPerBlock = 4 * kAdamWThreads;
struct AdamWBatchTensor {
  float *master, *m, *v;
  void *grad; // written only with zeroGrad
  const float *clipCoef;
  void *copy;
  int64_t n;
  float stepSize, bc2Sqrt, decay, b1, b2, eps;
};
struct AdamWBatch {
  AdamWBatchTensor t[kAdamWBatchTensors];
  /// The batch's blocks before each tensor's; firstBlock[count] is the grid.
  int64_t firstBlock[kAdamWBatchTensors + 1];
  int32_t count;
  bool zeroGrad;
};

__device__ __forceinline__ void zeroGradAt(float *g, int64_t i) { g[i] = 0.f; }
__device__ __forceinline__ void zeroGradAt(bf *g, int64_t i) {
  g[i] = __ushort_as_bfloat16(0);
}

template <bool ToBf16, typename G>
__global__ void __launch_bounds__(kAdamWThreads)
    adamWBatchKernel(const __grid_constant__ AdamWBatch batch) {
  const int64_t blk = blockIdx.x;
  const int lo = batchTensorOf(batch.firstBlock, batch.count, blk);
  const AdamWBatchTensor &t = batch.t[lo];
  const AdamWConsts k = adamWConsts(t.clipCoef, t.stepSize, t.bc2Sqrt, t.decay,
                                    t.b1, t.b2, t.eps);
  const int64_t local = blk - batch.firstBlock[lo];
  const int64_t quads = t.n / 4;
  G *grad = static_cast<G *>(t.grad);
  auto *P = reinterpret_cast<float4 *>(t.master);
  auto *M = reinterpret_cast<float4 *>(t.m);
  auto *V = reinterpret_cast<float4 *>(t.v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t q =
        local * kAdamWQuadsPerBlock + j * kAdamWThreads + threadIdx.x;
    if (q >= quads)
      break;
    adamWQuadAt<ToBf16>(k, P, M, V, grad, t.copy, q, batch.zeroGrad);
  }
  const int64_t lastBlock = batch.firstBlock[lo + 1] - 1 - batch.firstBlock[lo];
  if (local == lastBlock && threadIdx.x < t.n - quads * 4) {
    const int64_t i = quads * 4 + threadIdx.x;
    adamWAt<ToBf16>(k, t.master, t.m, t.v, grad, t.copy, i);
    if (batch.zeroGrad)
      zeroGradAt(grad, i);
  }
}

} // namespace

//===----------------------------------------------------------------------===//
// Hooks.
//===----------------------------------------------------------------------===//

Status rmsNormForward(const KernelContext &ctx, const RmsNormForwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  auto x = static_cast<const bf *>(a.x), w = static_cast<const bf *>(a.w);
  auto y = static_cast<bf *>(a.y);
  auto rstd = static_cast<float *>(a.rstd);
  const int64_t xs = strideOr(a.xStride, a.dim),
                ys = strideOr(a.yStride, a.dim);
  if (a.dim <= rowwise::kMaxDim) {
    const bool vec = rowwise::vectorizable(a.dim, {xs, ys}, {x, w, y});
    const unsigned grid = unsigned((a.rows + rowwise::rowsPerPass(a.dim) - 1) /
                                   rowwise::rowsPerPass(a.dim));
    rowwise::withLayout(a.dim, [&](auto g, auto v) {
      rmsNormFwdRowKernel<g.value, v.value>
          <<<grid, kRowThreads, 0, streamOf(ctx)>>>(
              x, w, y, rstd, a.rows, int(a.dim), xs, ys, float(a.eps),
              a.zeroCentered, vec);
    });
    AP_CUDA_CHECK_LAUNCH(rmsNormFwdRowKernel);
    return Status::Ok;
  }
  rmsNormFwdKernel<<<gridFor(a.rows, kNormWarps), kNormWarps * 32, 0,
                     streamOf(ctx)>>>(x, w, y, rstd, a.rows, a.dim, xs, ys,
                                      float(a.eps), a.zeroCentered);
  AP_CUDA_CHECK_LAUNCH(rmsNormFwdKernel);
  return Status::Ok;
}

Status rmsNormBackward(const KernelContext &ctx, const RmsNormBackwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  const int64_t parts = ref::rmsNormBackwardPartials(a.rows, a.dim);
  float *partial = nullptr;
  if (a.dw) {
    size_t need = rmsNormBackwardWorkspaceBytes(Backend::Cuda, a);
    if (!ctx.workspace || ctx.workspaceBytes < need)
      return Status::InvalidArgument;
    partial = static_cast<float *>(ctx.workspace);
  }
  auto x = static_cast<const bf *>(a.x), w = static_cast<const bf *>(a.w);
  auto dy = static_cast<const bf *>(a.dy);
  auto dx = static_cast<bf *>(a.dx), y = static_cast<bf *>(a.y);
  auto rstd = static_cast<const float *>(a.rstd);
  const int64_t xs = strideOr(a.xStride, a.dim),
                dys = strideOr(a.dyStride, a.dim),
                dxs = strideOr(a.dxStride, a.dim),
                ys = strideOr(a.yStride, a.dim);
  if (a.dim <= rowwise::kMaxDim) {
    const bool vec =
        rowwise::vectorizable(a.dim, {xs, dys, dxs, ys}, {x, w, dy, dx, y});
    const int passes = int(rowwise::passesPerBlock(a.rows, a.dim));
    rowwise::withLayout(a.dim, [&](auto g, auto v) {
      rmsNormBwdRowKernel<g.value, v.value>
          <<<unsigned(parts), kRowThreads, 0, streamOf(ctx)>>>(
              x, w, rstd, dy, dx, y, partial, a.rows, int(a.dim), xs, dys, dxs,
              ys, passes, a.zeroCentered, vec);
    });
    AP_CUDA_CHECK_LAUNCH(rmsNormBwdRowKernel);
    if (a.dw) {
      rowwise::columnSumKernel<<<rowwise::columnSumBlocks(a.dim),
                                 rowwise::kColCols * rowwise::kColSegs, 0,
                                 streamOf(ctx)>>>(
          partial, static_cast<float *>(a.dw), parts, int(a.dim));
      AP_CUDA_CHECK_LAUNCH(columnSumKernel);
    }
    return Status::Ok;
  }
  rmsNormBwdKernel<<<unsigned(parts), kNormBwdThreads, 0, streamOf(ctx)>>>(
      x, w, rstd, dy, dx, y, partial, a.rows, a.dim, xs, dys, dxs, ys,
      a.zeroCentered);
  AP_CUDA_CHECK_LAUNCH(rmsNormBwdKernel);
  if (a.dw) {
    columnSumKernel<<<unsigned((a.dim + 31) / 32), dim3(32, 32), 0,
                      streamOf(ctx)>>>(partial, static_cast<float *>(a.dw),
                                       parts, a.dim);
    AP_CUDA_CHECK_LAUNCH(columnSumKernel);
  }
  return Status::Ok;
}

static Status ropeLaunch(const KernelContext &ctx, const RopeArgs &a,
                         bool backward) {
  if (a.dtype != DType::BF16 || a.rotaryDim / 2 > kRopeMaxHalf)
    return Status::Unsupported;
  int64_t tokens = a.batch * a.seq;
  if (a.offset % 8 == 0 && a.rotaryDim % 16 == 0 && a.headDim % 8 == 0 &&
      rowwise::vectorizable(8, {}, {a.x, a.y})) {
    // One thread per work item of the token where that fills a block.
    int64_t items =
        a.heads *
        (a.rotaryDim / 16 + (a.x != a.y ? (a.headDim - a.rotaryDim) / 8 : 0));
    int threads = int(std::clamp<int64_t>((items + 31) / 32 * 32, 64, 256));
    ropeVecKernel<<<unsigned(tokens), threads, 0, streamOf(ctx)>>>(
        static_cast<const bf *>(a.x), static_cast<bf *>(a.y), a.seq,
        int(a.heads), int(a.headDim), int(a.offset), int(a.rotaryDim), a.theta,
        backward, a.docStart);
    AP_CUDA_CHECK_LAUNCH(ropeVecKernel);
    return Status::Ok;
  }
  ropeKernel<<<unsigned(tokens), 256, 0, streamOf(ctx)>>>(
      static_cast<const bf *>(a.x), static_cast<bf *>(a.y), a.seq, a.heads,
      a.headDim, a.offset, a.rotaryDim, a.theta, backward, a.docStart);
  AP_CUDA_CHECK_LAUNCH(ropeKernel);
  return Status::Ok;
}
Status ropeForward(const KernelContext &ctx, const RopeArgs &a) {
  return ropeLaunch(ctx, a, false);
}
Status ropeBackward(const KernelContext &ctx, const RopeArgs &a) {
  return ropeLaunch(ctx, a, true);
}

Status documentStarts(const KernelContext &ctx, const DocumentStartsArgs &a) {
  if (a.batch > int64_t(0x7fffffff)) // grid.x limit
    return Status::Unsupported;
  documentStartsKernel<<<unsigned(a.batch), kDocThreads, 0, streamOf(ctx)>>>(
      a.tokens, a.docStart, a.seq, a.separator);
  AP_CUDA_CHECK_LAUNCH(documentStartsKernel);
  return Status::Ok;
}

Status swiGluForward(const KernelContext &ctx, const SwiGluForwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  auto g = static_cast<const bf *>(a.gate);
  auto u = static_cast<const bf *>(a.up);
  auto y = static_cast<bf *>(a.y);
  int64_t gs = strideOr(a.gateStride, a.cols),
          us = strideOr(a.upStride, a.cols), ys = strideOr(a.yStride, a.cols);
  withWidth(ewWidth(a.cols, {gs, us, ys}, {g, u, y}), [&](auto w) {
    EwLaunch l = ewLaunch(a.rows, a.cols, w.value);
    swiGluFwdKernel<w.value><<<l.grid, l.block, 0, streamOf(ctx)>>>(
        g, u, y, a.rows, a.cols, gs, us, ys);
  });
  AP_CUDA_CHECK_LAUNCH(swiGluFwdKernel);
  return Status::Ok;
}

Status swiGluBackward(const KernelContext &ctx, const SwiGluBackwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  auto g = static_cast<const bf *>(a.gate);
  auto u = static_cast<const bf *>(a.up);
  auto dy = static_cast<const bf *>(a.dy);
  auto dg = static_cast<bf *>(a.dgate);
  auto du = static_cast<bf *>(a.dup);
  auto y = static_cast<bf *>(a.y);
  int64_t gs = strideOr(a.gateStride, a.cols),
          us = strideOr(a.upStride, a.cols), dys = strideOr(a.dyStride, a.cols),
          dgs = strideOr(a.dgateStride, a.cols),
          dus = strideOr(a.dupStride, a.cols), ys = strideOr(a.yStride, a.cols);
  withWidth(ewWidth(a.cols, {gs, us, dys, dgs, dus, ys}, {g, u, dy, dg, du, y}),
            [&](auto w) {
              EwLaunch l = ewLaunch(a.rows, a.cols, w.value);
              swiGluBwdKernel<w.value><<<l.grid, l.block, 0, streamOf(ctx)>>>(
                  g, u, dy, dg, du, y, a.rows, a.cols, gs, us, dys, dgs, dus,
                  ys);
            });
  AP_CUDA_CHECK_LAUNCH(swiGluBwdKernel);
  return Status::Ok;
}

Status sigmoidGateForward(const KernelContext &ctx,
                          const SigmoidGateForwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  auto o = static_cast<const bf *>(a.o);
  auto g = static_cast<const bf *>(a.gate);
  auto y = static_cast<bf *>(a.y);
  int64_t os = strideOr(a.oStride, a.cols), gs = strideOr(a.gateStride, a.cols),
          ys = strideOr(a.yStride, a.cols);
  withWidth(ewWidth(a.cols, {os, gs, ys}, {o, g, y}), [&](auto w) {
    EwLaunch l = ewLaunch(a.rows, a.cols, w.value);
    gateFwdKernel<w.value><<<l.grid, l.block, 0, streamOf(ctx)>>>(
        o, g, y, a.rows, a.cols, os, gs, ys);
  });
  AP_CUDA_CHECK_LAUNCH(gateFwdKernel);
  return Status::Ok;
}

Status sigmoidGateBackward(const KernelContext &ctx,
                           const SigmoidGateBackwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  auto o = static_cast<const bf *>(a.o);
  auto g = static_cast<const bf *>(a.gate);
  auto dy = static_cast<const bf *>(a.dy);
  auto dO = static_cast<bf *>(a.dout);
  auto dg = static_cast<bf *>(a.dgate);
  int64_t os = strideOr(a.oStride, a.cols), gs = strideOr(a.gateStride, a.cols),
          dys = strideOr(a.dyStride, a.cols),
          dos = strideOr(a.doStride, a.cols),
          dgs = strideOr(a.dgateStride, a.cols);
  withWidth(ewWidth(a.cols, {os, gs, dys, dos, dgs}, {o, g, dy, dO, dg}),
            [&](auto w) {
              EwLaunch l = ewLaunch(a.rows, a.cols, w.value);
              gateBwdKernel<w.value><<<l.grid, l.block, 0, streamOf(ctx)>>>(
                  o, g, dy, dO, dg, a.rows, a.cols, os, gs, dys, dos, dgs);
            });
  AP_CUDA_CHECK_LAUNCH(gateBwdKernel);
  return Status::Ok;
}

Status residualAddForward(const KernelContext &ctx, const ResidualAddArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  auto x = static_cast<const bf *>(a.a);
  auto z = static_cast<const bf *>(a.b);
  auto y = static_cast<bf *>(a.y);
  withWidth(ewWidth(a.n, {}, {x, z, y}), [&](auto w) {
    addKernel<w.value>
        <<<gridFor(a.n / w.value, 256, 4096), 256, 0, streamOf(ctx)>>>(x, z, y,
                                                                       a.n);
  });
  AP_CUDA_CHECK_LAUNCH(addKernel);
  return Status::Ok;
}

Status residualAddBackward(const KernelContext &ctx,
                           const ResidualAddBackwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  for (void *d : {a.da, a.db})
    if (d && d != a.dy)
      AP_CUDA_CHECK(cudaMemcpyAsync(d, a.dy, size_t(a.n) * sizeof(bf),
                                    cudaMemcpyDeviceToDevice, streamOf(ctx)));
  return Status::Ok;
}

Status embeddingForward(const KernelContext &ctx,
                        const EmbeddingForwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  embedFwdKernel<<<unsigned(a.tokens), 256, 0, streamOf(ctx)>>>(
      a.ids, static_cast<const bf *>(a.w), static_cast<bf *>(a.y), a.vocab,
      a.dim, ref::vocabOffset(a.group));
  AP_CUDA_CHECK_LAUNCH(embedFwdKernel);
  return Status::Ok;
}

Status embeddingBackward(const KernelContext &ctx,
                         const EmbeddingBackwardArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  unsigned owners =
      unsigned((a.vocab + kEmbRowsPerOwner - 1) / kEmbRowsPerOwner);
  embedBwdKernel<<<owners, kEmbThreads, 0, streamOf(ctx)>>>(
      a.ids, static_cast<const bf *>(a.dy), static_cast<float *>(a.dw),
      a.tokens, a.vocab, a.dim, ref::vocabOffset(a.group));
  AP_CUDA_CHECK_LAUNCH(embedBwdKernel);
  return Status::Ok;
}

static Status lmHeadCe(const KernelContext &ctx,
                       const LmHeadCrossEntropyArgs &a, bool backward) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  size_t need = lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, a);
  if (!ctx.workspace || ctx.workspaceBytes < need)
    return Status::InvalidArgument;
  const int64_t N = a.tokens, D = a.dim, V = a.vocab;
  const int64_t chunk = std::min(a.chunkTokens, N);
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  char *ws = static_cast<char *>(ctx.workspace);
  // The chunk's bf16 logits, overwritten by their gradient.
  bf *logits = reinterpret_cast<bf *>(ws);
  ws += up(size_t(chunk) * V * 2);
  bf *dl = logits;
  // Per chunk row: [loss, valid] pairs, then the row lse.
  float *rowLoss = reinterpret_cast<float *>(ws);
  float *lseChunk = rowLoss + 2 * chunk;
  ws += up(size_t(chunk) * 12);
  // A split vocabulary: each row's statistics sent, and every rank's
  // gathered (kernels/workspace.cpp sizes the same regions).
  const VocabGroup &group = a.group;
  const bool split = group.ranks > 1;
  const int64_t offset = ref::vocabOffset(group);
  const int64_t bound = ref::vocabBound(group, V);
  if (split && !group.allGather)
    return Status::InvalidArgument;
  float *statsSend = nullptr, *statsRecv = nullptr;
  if (split) {
    statsSend = reinterpret_cast<float *>(ws);
    ws += up(size_t(chunk) * ref::kCeStats * 4);
    statsRecv = reinterpret_cast<float *>(ws);
    ws += up(size_t(group.ranks) * size_t(chunk) * ref::kCeStats * 4);
  }
  void *gemmWs = ws;
  const bf *h = static_cast<const bf *>(a.hidden);
  const bf *w = static_cast<const bf *>(a.weight);
  bf *dh = backward ? static_cast<bf *>(a.dHidden) : nullptr;
  float *dW = backward ? static_cast<float *>(a.dWeight) : nullptr;
  float *lossSum = static_cast<float *>(a.lossSum);
  cudaStream_t stream = streamOf(ctx);
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t cn = std::min(chunk, N - n0);
    // logits^T (V x cn) = op_T(W stored D x V) * h^T (stored D x cn),
    // accumulated in fp32 and rounded to bf16 (the row statistics and the
    // gradient compute in fp32 from them).
    GemmShape s;
    s.transA = true;
    s.m = V;
    s.n = cn;
    s.k = D;
    s.lda = D;
    s.ldb = D;
    s.ldd = V;
    Status st = gemm(ctx, s, w, h + n0 * D, logits, gemmWs);
    if (st != Status::Ok)
      return st;
    if (split) {
      ceStatsKernel<<<unsigned(cn), kCeThreads, 0, stream>>>(
          logits, a.labels, V, offset, statsSend, n0);
      AP_CUDA_CHECK_LAUNCH(ceStatsKernel);
      // Ordered on the stream between the two kernels.
      group.allGather(group.self, ctx, statsSend, statsRecv,
                      cn * ref::kCeStats);
      ceMergeKernel<<<gridFor(cn, 256), 256, 0, stream>>>(
          statsRecv, group.ranks, cn, a.labels, bound, a.ignoreIndex,
          static_cast<float *>(a.lse), lseChunk, rowLoss, n0);
      AP_CUDA_CHECK_LAUNCH(ceMergeKernel);
    } else {
      ceLseKernel<<<unsigned(cn), kCeThreads, 0, stream>>>(
          logits, a.labels, V, a.ignoreIndex, static_cast<float *>(a.lse),
          lseChunk, rowLoss, n0);
      AP_CUDA_CHECK_LAUNCH(ceLseKernel);
    }
    ceSumKernel<<<1, 1024, 0, stream>>>(rowLoss, cn, lossSum, a.validCount,
                                        n0 == 0);
    AP_CUDA_CHECK_LAUNCH(ceSumKernel);
    if (!dh && !dW)
      continue;
    // Columns per thread pass: groups of eight where the rows are aligned
    // (the kernel decides; a grid sized for groups still covers single
    // logits, with more passes).
    const int64_t items = V % 8 == 0 ? V / 8 : V;
    dim3 grid(unsigned(std::min<int64_t>((items + 1023) / 1024, 64)),
              unsigned(ref::ceGradGridRows(cn)));
    ceGradKernel<<<grid, 1024, 0, stream>>>(logits, a.labels, lseChunk, cn, V,
                                            a.ignoreIndex, float(a.gradScale),
                                            n0, offset, bound);
    AP_CUDA_CHECK_LAUNCH(ceGradKernel);
    if (dh) {
      // dh^T (D x cn) = W^T (stored D x V) * dl^T (stored V x cn).
      GemmShape g;
      g.m = D;
      g.n = cn;
      g.k = V;
      g.lda = D;
      g.ldb = V;
      g.ldd = D;
      st = gemm(ctx, g, w, dl, dh + n0 * D, gemmWs);
      if (st != Status::Ok)
        return st;
    }
    if (dW) {
      // dW^T (D x V) += h^T (stored D x cn) * op_T(dl^T stored V x cn).
      GemmShape g;
      g.transB = true;
      g.m = D;
      g.n = V;
      g.k = cn;
      g.lda = D;
      g.ldb = V;
      g.ldd = D;
      g.dType = GemmType::F32;
      g.accumulate = true;
      st = gemm(ctx, g, h + n0 * D, dl, dW, gemmWs);
      if (st != Status::Ok)
        return st;
    }
  }
  return Status::Ok;
}

Status lmHeadCrossEntropyForward(const KernelContext &ctx,
                                 const LmHeadCrossEntropyArgs &a) {
  return lmHeadCe(ctx, a, false);
}
Status lmHeadCrossEntropyBackward(const KernelContext &ctx,
                                  const LmHeadCrossEntropyArgs &a) {
  return lmHeadCe(ctx, a, true);
}

Status gradNorm(const KernelContext &ctx, const GradNormArgs &a) {
  size_t need = gradNormWorkspaceBytes(Backend::Cuda, a);
  if (!ctx.workspace || ctx.workspaceBytes < need)
    return Status::InvalidArgument;
  for (int64_t t = 0; t < a.numTensors; ++t)
    if (a.tensors[t].n > 0 && !a.tensors[t].data)
      return Status::InvalidArgument;
  double *partial = static_cast<double *>(ctx.workspace);
  // One batch per element type, launched whenever it fills; each tensor's
  // partials keep their list-order slots (off), whatever batch it is in.
  NormBatch batches[2];
  for (NormBatch &b : batches) {
    b.count = 0;
    b.firstBlock[0] = 0;
  }
  auto launch = [&](NormBatch &b, bool isBf16) -> Status {
    if (b.count == 0)
      return Status::Ok;
    const unsigned grid = unsigned(b.firstBlock[b.count]);
    if (isBf16)
      sqPartialKernel<bf><<<grid, kNormThreads, 0, streamOf(ctx)>>>(b, partial);
    else
      sqPartialKernel<float>
          <<<grid, kNormThreads, 0, streamOf(ctx)>>>(b, partial);
    AP_CUDA_CHECK_LAUNCH(sqPartialKernel);
    b.count = 0;
    return Status::Ok;
  };
  int64_t off = 0;
  for (int64_t t = 0; t < a.numTensors; ++t) {
    const int64_t n = a.tensors[t].n;
    if (n <= 0)
      continue;
    const bool isBf16 = a.tensors[t].dtype == DType::BF16;
    NormBatch &b = batches[isBf16 ? 1 : 0];
    const int64_t blocks = gradNormParts(n);
    b.data[b.count] = a.tensors[t].data;
    b.n[b.count] = n;
    b.partialOffset[b.count] = off;
    b.firstBlock[b.count + 1] = b.firstBlock[b.count] + blocks;
    ++b.count;
    off += blocks;
    // A grid's x dimension holds 2^31 - 1 blocks: 1.4e14 elements, far past
    // any device; a full batch goes now.
    if (b.count == kNormBatchTensors)
      if (Status st = launch(b, isBf16); st != Status::Ok)
        return st;
  }
  if (Status st = launch(batches[0], false); st != Status::Ok)
    return st;
  if (Status st = launch(batches[1], true); st != Status::Ok)
    return st;
  normFinishKernel<<<1, kNormThreads, 0, streamOf(ctx)>>>(
      partial, off, a.maxNorm, a.norm, a.clipCoef, a.initialSquares, a.squares);
  AP_CUDA_CHECK_LAUNCH(normFinishKernel);
  return Status::Ok;
}

Status adamWStep(const KernelContext &ctx, const AdamWArgs &a) {
  if (a.n == 0)
    return Status::Ok;
  const AdamWScalars k = adamWScalars(a);
  auto aligned = [](const void *p, uintptr_t bytes) {
    return p == nullptr || uintptr_t(p) % bytes == 0;
  };
  const bool gradBf16 = a.gradDType == DType::BF16,
             copyBf16 = a.computeDType == DType::BF16;
  const bool quads = aligned(a.master, 16) && aligned(a.expAvg, 16) &&
                     aligned(a.expAvgSq, 16) &&
                     aligned(a.grad, gradBf16 ? 8 : 16) &&
                     aligned(a.computeCopy, copyBf16 ? 8 : 16);
  auto run = [&](auto toBf16, auto *grad) {
    constexpr bool kBf16 = decltype(toBf16)::value;
    if (quads)
      adamWQuadKernel<kBf16>
          <<<gridFor(std::max<int64_t>(1, a.n / 4), 256, int64_t(132) * 16),
             256, 0, streamOf(ctx)>>>(
              a.master, a.expAvg, a.expAvgSq, grad, a.clipCoef, a.computeCopy,
              a.n, k.stepSize, k.bc2Sqrt, k.decay, k.beta1, k.beta2, k.eps);
    else
      adamWKernel<kBf16>
          <<<gridFor(a.n, 256, int64_t(132) * 16), 256, 0, streamOf(ctx)>>>(
              a.master, a.expAvg, a.expAvgSq, grad, a.clipCoef, a.computeCopy,
              a.n, k.stepSize, k.bc2Sqrt, k.decay, k.beta1, k.beta2, k.eps);
  };
  auto withGrad = [&](auto toBf16) {
    if (a.gradDType == DType::BF16)
      run(toBf16, static_cast<const bf *>(a.grad));
    else
      run(toBf16, static_cast<const float *>(a.grad));
  };
  if (a.computeDType == DType::BF16)
    withGrad(std::true_type{});
  else
    withGrad(std::false_type{});
  AP_CUDA_CHECK_LAUNCH(adamWKernel);
  return Status::Ok;
}

Status adamWSteps(const KernelContext &ctx, const AdamWBatchArgs &a) {
  auto aligned = [](const void *p, uintptr_t bytes) {
    return p == nullptr || uintptr_t(p) % bytes == 0;
  };
  // One batch per (grad type, copy type); tensors the quad accesses cannot
  // take run alone through adamWStep, their grads zeroed after.
  AdamWBatch batches[4];
  for (AdamWBatch &b : batches) {
    b.count = 0;
    b.firstBlock[0] = 0;
    b.zeroGrad = a.zeroGrads;
  }
  auto launch = [&](int group) -> Status {
    AdamWBatch &b = batches[group];
    if (b.count == 0)
      return Status::Ok;
    const unsigned grid = unsigned(b.firstBlock[b.count]);
    switch (group) {
    case 0:
      adamWBatchKernel<false, float>
          <<<grid, kAdamWThreads, 0, streamOf(ctx)>>>(b);
      break;
    case 1:
      adamWBatchKernel<true, float>
          <<<grid, kAdamWThreads, 0, streamOf(ctx)>>>(b);
      break;
    case 2:
      adamWBatchKernel<false, bf><<<grid, kAdamWThreads, 0, streamOf(ctx)>>>(b);
      break;
    default:
      adamWBatchKernel<true, bf><<<grid, kAdamWThreads, 0, streamOf(ctx)>>>(b);
      break;
    }
    AP_CUDA_CHECK_LAUNCH(adamWBatchKernel);
    b.count = 0;
    return Status::Ok;
  };
  for (int64_t i = 0; i < a.numTensors; ++i) {
    const AdamWArgs &x = a.tensors[i];
    if (x.n == 0)
      continue;
    const bool gradBf16 = x.gradDType == DType::BF16,
               copyBf16 = x.computeDType == DType::BF16;
    const size_t gradBytes = gradBf16 ? 2 : 4;
    if (!(aligned(x.master, 16) && aligned(x.expAvg, 16) &&
          aligned(x.expAvgSq, 16) && aligned(x.grad, 4 * gradBytes) &&
          aligned(x.computeCopy, copyBf16 ? 8 : 16))) {
      if (Status st = cuda::adamWStep(ctx, x); st != Status::Ok)
        return st;
      if (a.zeroGrads)
        AP_CUDA_CHECK(cudaMemsetAsync(const_cast<void *>(x.grad), 0,
                                      size_t(x.n) * gradBytes, streamOf(ctx)));
      continue;
    }
    const int group = (gradBf16 ? 2 : 0) + (copyBf16 ? 1 : 0);
    AdamWBatch &b = batches[group];
    const AdamWScalars k = adamWScalars(x);
    b.t[b.count] = {
        x.master,   x.expAvg,      x.expAvgSq, const_cast<void *>(x.grad),
        x.clipCoef, x.computeCopy, x.n,        k.stepSize,
        k.bc2Sqrt,  k.decay,       k.beta1,    k.beta2,
        k.eps};
    const int64_t quads = x.n / 4;
    const int64_t blocks = std::max<int64_t>(
        1, (quads + kAdamWQuadsPerBlock - 1) / kAdamWQuadsPerBlock);
    b.firstBlock[b.count + 1] = b.firstBlock[b.count] + blocks;
    ++b.count;
    if (b.count == kAdamWBatchTensors)
      if (Status st = launch(group); st != Status::Ok)
        return st;
  }
  for (int group = 0; group < 4; ++group)
    if (Status st = launch(group); st != Status::Ok)
      return st;
  return Status::Ok;
}

} // namespace ap::kernels::cuda
