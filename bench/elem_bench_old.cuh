//===- elem_bench_old.cuh - row kernels before elem-kernels -*- C++ -*-===//
//
// The row-wise and elementwise kernels as they were at b9a54af (dense.cu,
// gdn_ops.cu, movement.cu), kept only so that bench/elem_bench.cu times old
// and new in one run on the same card. Not part of any library.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_BENCH_ELEM_BENCH_OLD_CUH
#define ACTPLACE_BENCH_ELEM_BENCH_OLD_CUH

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace old {

using bf = __nv_bfloat16;
constexpr int64_t kRmsNormRowsPerPartial = 32;
namespace ref {
using old::kRmsNormRowsPerPartial;
} // namespace ref

__device__ __forceinline__ float ld(const bf *p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ bf st(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ float sigmoidf(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float b2f(bf x) { return __bfloat162float(x); }
__device__ __forceinline__ bf f2b(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float sigmoidf_(float x) {
  return 1.f / (1.f + __expf(-x));
}
__device__ __forceinline__ float warpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kNormWarps = 8;

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
    yr[j] = st(__fmul_rn(__fmul_rn(ld(xr + j), rs), we));
  }
}

/// dx per row (a warp each, ref::kRmsNormRowsPerPartial warps per block)
/// and the partial dw of the block's rows, summed in row order.
constexpr int kNormBwdThreads = 32 * int(ref::kRmsNormRowsPerPartial);

__global__ void __launch_bounds__(kNormBwdThreads)
    rmsNormBwdKernel(const bf *x, const bf *w, const float *rstd, const bf *dy,
                     bf *dx, float *partial, int64_t rows, int64_t dim,
                     int64_t xs, int64_t dys, int64_t dxs, bool zc) {
  constexpr int64_t R = ref::kRmsNormRowsPerPartial;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t r0 = int64_t(blockIdx.x) * R;
  int64_t r = r0 + warp;
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

/// dw[j] += sum of partial[p][j] over p: 32 fixed contiguous segments of p
/// per column (one thread each), then the segment sums in segment order.
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

constexpr int kEwThreads = 256;

/// W consecutive bf16 of a row: W = 2 uses 4-byte loads. Elementwise results
/// do not depend on W (each output is computed alone), so choosing W from
/// alignment cannot change a bit.
template <int W> struct Pack {
  float v[W];
  __device__ __forceinline__ void load(const bf *p) {
    if constexpr (W == 2) {
      __nv_bfloat162 t = *reinterpret_cast<const __nv_bfloat162 *>(p);
      v[0] = __low2float(t);
      v[1] = __high2float(t);
    } else {
      v[0] = ld(p);
    }
  }
  __device__ __forceinline__ void store(bf *p) const {
    if constexpr (W == 2)
      *reinterpret_cast<__nv_bfloat162 *>(p) =
          __floats2bfloat162_rn(v[0], v[1]);
    else
      p[0] = st(v[0]);
  }
};

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
      out.v[k] = __fmul_rn(__fmul_rn(gv.v[k], sigmoidf(gv.v[k])), uv.v[k]);
    out.store(y + r * ys + c);
  }
}

template <int W>
__global__ void swiGluBwdKernel(const bf *g, const bf *u, const bf *dy, bf *dg,
                                bf *du, int64_t rows, int64_t cols, int64_t gs,
                                int64_t us, int64_t dys, int64_t dgs,
                                int64_t dus) {
  int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * W;
  if (c >= cols)
    return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    Pack<W> gv, uv, d, og, ou;
    gv.load(g + r * gs + c);
    uv.load(u + r * us + c);
    d.load(dy + r * dys + c);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      float s = sigmoidf(gv.v[k]);
      og.v[k] = d.v[k] * uv.v[k] * s * (1.0f + gv.v[k] * (1.0f - s));
      ou.v[k] = d.v[k] * (gv.v[k] * s);
    }
    if (dg)
      og.store(dg + r * dgs + c);
    if (du)
      ou.store(du + r * dus + c);
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
inline EwLaunch ewLaunch(int64_t rows, int64_t cols, int w) {
  int64_t threadsX = (cols + w - 1) / w;
  int block = int(std::min<int64_t>(kEwThreads, (threadsX + 31) / 32 * 32));
  int64_t gx = (threadsX + block - 1) / block;
  int64_t gy = std::min<int64_t>(rows, std::max<int64_t>(1, 4096 / gx));
  return {dim3(unsigned(gx), unsigned(gy)), dim3(unsigned(block))};
}

/// out[i] += sum_b partial[b][i], b in order.
__global__ void sumPartialsKernel(long nBlocks, long width,
                                  const float *partial, float *out) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < width;
       i += long(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (long b = 0; b < nBlocks; ++b)
      s += partial[b * width + i];
    out[i] += s;
  }
}

/// One warp per (token, head) row.
__global__ void l2FwdKernel(long rows, int H, int d, long xs, long ys,
                            float eps, const bf *x, bf *y, float *rstd) {
  long row = (blockIdx.x * long(blockDim.x) + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (row >= rows)
    return;
  long n = row / H;
  int h = int(row % H);
  const bf *xr = x + n * xs + long(h) * d;
  float ss = 0.f;
  for (int i = lane; i < d; i += 32) {
    float v = b2f(xr[i]);
    ss += v * v;
  }
  float r = rsqrtf(warpSum(ss) + eps);
  if (lane == 0)
    rstd[row] = r;
  bf *yr = y + n * ys + long(h) * d;
  for (int i = lane; i < d; i += 32)
    yr[i] = f2b(b2f(xr[i]) * r);
}

__global__ void l2BwdKernel(long rows, int H, int d, long xs, long ys,
                            const bf *y, const float *rstd, const bf *dy,
                            bf *dx) {
  long row = (blockIdx.x * long(blockDim.x) + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (row >= rows)
    return;
  long n = row / H;
  int h = int(row % H);
  const bf *yr = y + n * ys + long(h) * d, *dyr = dy + n * ys + long(h) * d;
  float s = 0.f;
  for (int i = lane; i < d; i += 32)
    s += b2f(yr[i]) * b2f(dyr[i]);
  s = warpSum(s);
  float r = rstd[row];
  bf *dxr = dx + n * xs + long(h) * d;
  for (int i = lane; i < d; i += 32)
    dxr[i] = f2b(r * (b2f(dyr[i]) - s * b2f(yr[i])));
}

__global__ void gatedNormFwdKernel(long rows, int d, float eps, const bf *x,
                                   const bf *z, const bf *w, bf *y,
                                   float *rstd) {
  long row = (blockIdx.x * long(blockDim.x) + threadIdx.x) >> 5;
  int lane = threadIdx.x & 31;
  if (row >= rows)
    return;
  const bf *xr = x + row * d, *zr = z + row * d;
  float ss = 0.f;
  for (int i = lane; i < d; i += 32) {
    float v = b2f(xr[i]);
    ss += v * v;
  }
  float r = rsqrtf(warpSum(ss) / float(d) + eps);
  if (lane == 0)
    rstd[row] = r;
  for (int i = lane; i < d; i += 32) {
    float zv = b2f(zr[i]);
    y[row * d + i] = f2b(b2f(w[i]) * b2f(xr[i]) * r * zv * sigmoidf_(zv));
  }
}

constexpr int kNormRowsPerBlock = 64;

/// 8 warps x 8 rows per block; dw partial per block in fixed order.
__global__ void gatedNormBwdKernel(long rows, int d, const bf *x, const bf *z,
                                   const bf *w, const float *rstd, const bf *dy,
                                   bf *dx, bf *dz, float *partial) {
  extern __shared__ float wpart[]; // [8][d]
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < 8 * d; i += blockDim.x)
    wpart[i] = 0.f;
  __syncthreads();
  for (int k = 0; k < kNormRowsPerBlock / 8; ++k) {
    long row = long(blockIdx.x) * kNormRowsPerBlock +
               warp * (kNormRowsPerBlock / 8) + k;
    if (row >= rows)
      break;
    const float r = rstd[row];
    float mean = 0.f;
    for (int i = lane; i < d; i += 32) {
      float xh = b2f(x[row * d + i]) * r, wv = b2f(w[i]);
      float zv = b2f(z[row * d + i]), s = sigmoidf_(zv),
            dyv = b2f(dy[row * d + i]);
      float dyh = dyv * zv * s;
      dz[row * d + i] = f2b(dyv * wv * xh * s * (1.f + zv * (1.f - s)));
      wpart[warp * d + i] += dyh * xh;
      mean += wv * dyh * xh;
    }
    mean = warpSum(mean) / float(d);
    for (int i = lane; i < d; i += 32) {
      float xh = b2f(x[row * d + i]) * r, wv = b2f(w[i]);
      float zv = b2f(z[row * d + i]);
      float dyh = b2f(dy[row * d + i]) * zv * sigmoidf_(zv);
      dx[row * d + i] = f2b(r * (wv * dyh - xh * mean));
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float s = 0.f;
    for (int k = 0; k < 8; ++k)
      s += wpart[k * d + i];
    partial[long(blockIdx.x) * d + i] = s;
  }
}

inline int gridFor(long n, int threads) {
  long b = (n + threads - 1) / threads;
  return int(b < 1 ? 1 : (b > 65535 * 4 ? 65535 * 4 : b));
}

/// One (outer, repeat) row per block-stride step; W-byte words within a row.
/// All sizes are in words of W.
template <class W>
__global__ void copyRowsKernel(const W *src, W *dst, int64_t rows,
                               int64_t repeats, int64_t rowWords,
                               int64_t srcPitch, int64_t dstPitch) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    int64_t o = row / repeats, r = row - o * repeats;
    const W *s = src + o * srcPitch;
    W *d = dst + o * dstPitch + r * rowWords;
    for (int64_t i = threadIdx.x; i < rowWords; i += blockDim.x)
      d[i] = s[i];
  }
}

/// One block per token: the cos/sin of its position (angle in double,
/// rounded to float) are computed once into shared memory and used by every
/// head.
constexpr int kRopeMaxHalf = 512;

__global__ void ropeKernel(const bf *x, bf *y, int64_t seq, int64_t heads,
                           int64_t headDim, int64_t offset, int64_t rd,
                           double theta, bool backward) {
  __shared__ float cs[kRopeMaxHalf], sn[kRopeMaxHalf];
  const int64_t tok = blockIdx.x;
  const int64_t t = tok % seq;
  const int64_t h = rd / 2;
  for (int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    double invFreq = pow(theta, -2.0 * double(i) / double(rd));
    double ang = double(t) * invFreq;
    cs[i] = float(cos(ang));
    float sv = float(sin(ang));
    sn[i] = backward ? -sv : sv;
  }
  __syncthreads();
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

} // namespace old

#endif // ACTPLACE_BENCH_ELEM_BENCH_OLD_CUH
