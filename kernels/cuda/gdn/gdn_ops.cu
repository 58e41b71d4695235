//===- gdn_ops.cu - GDN short conv, gates, L2 norm, gated norm --*- C++ -*-===//
//
// Element- and row-wise GDN ops on the cuda backend (bf16 storage, fp32
// math). Weight-gradient reductions are two-pass: fixed per-block partials in
// the workspace, then one ordered sum per weight element; no atomics.
//
//===----------------------------------------------------------------------===//
#include "kernels/cuda/gdn/gdn_common.cuh"
#include "kernels/cuda/gdn/gdn_layout.h"
#include "kernels/cuda/rowwise.cuh"

#include <cstdlib>
#include <type_traits>

namespace ap::kernels::gdncuda {
namespace {

#include "kernels/cuda/gdn/gdn_conv_kernels.cuh"

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

__device__ __forceinline__ float softplus20(float x) {
  return x > 20.f ? x : log1pf(__expf(x));
}

__global__ void gatesFwdKernel(long N, int H, const bf *a, const bf *b,
                               const float *aLog, const float *dtb, float *g,
                               bf *beta) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N * H;
       i += long(gridDim.x) * blockDim.x) {
    int h = int(i % H);
    g[i] = -expf(aLog[h]) * softplus20(b2f(a[i]) + dtb[h]);
    beta[i] = f2b(sigmoidf_(b2f(b[i])));
  }
}

/// One CTA per head: da, db elementwise, dA_log / d dt_bias by a fixed-order
/// strided sum and tree reduction.
__global__ void gatesBwdKernel(long N, int H, const bf *a, const bf *beta,
                               const float *aLog, const float *dtb,
                               const float *dg, const bf *dbeta, bf *da, bf *db,
                               float *dALog, float *dDtBias) {
  __shared__ float r0[256], r1[256];
  int h = blockIdx.x;
  float e = expf(aLog[h]), s0 = 0.f, s1 = 0.f;
  for (long n = threadIdx.x; n < N; n += blockDim.x) {
    long i = n * H + h;
    float x = b2f(a[i]) + dtb[h];
    float sp = softplus20(x), dsp = x > 20.f ? 1.f : sigmoidf_(x);
    float dav = dg[i] * (-e) * dsp;
    da[i] = f2b(dav);
    s0 += dav;
    s1 += dg[i] * (-e * sp);
    float bt = b2f(beta[i]);
    db[i] = f2b(b2f(dbeta[i]) * bt * (1.f - bt));
  }
  r0[threadIdx.x] = s0;
  r1[threadIdx.x] = s1;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      r0[threadIdx.x] += r0[threadIdx.x + s];
      r1[threadIdx.x] += r1[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    dDtBias[h] += r0[0];
    dALog[h] += r1[0];
  }
}

__device__ __forceinline__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kRowThreads = 32 * rowwise::kWarps;

/// Row r of a [N, H, d] view with token stride ts.
__device__ __forceinline__ long headRow(long r, int H, int d, long ts) {
  return r / H * ts + (r % H) * long(d);
}

/// L2 norm of rows up to rowwise::kMaxDim wide, held in the registers of a
/// lane group (rowwise.cuh): x is read once.
template <int G, int V>
__global__ void __launch_bounds__(kRowThreads)
    l2FwdRowKernel(long rows, int H, int d, long xs, long ys, float eps,
                   const bf *x, bf *y, float *rstd, bool vec) {
  const int lane = threadIdx.x & 31, gl = lane % G;
  const long row = rowwise::groupRow<G>(lane);
  if (row >= rows)
    return;
  const bf *xr = x + headRow(row, H, d, xs);
  float xv[V][8];
  const float ss = rowwise::loadRowSquares<G, V>(xr, gl, d, vec, xv);
  const float r = rsqrtf(rowwise::groupSum<G>(ss) + eps);
  if (gl == 0)
    rstd[row] = r;
  bf *yr = y + headRow(row, H, d, ys);
#pragma unroll
  for (int k = 0; k < V; ++k) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      xv[k][i] *= r;
    rowwise::store8(yr, rowwise::vecStart<G>(k, gl), d, vec, xv[k]);
  }
}

/// dx = rstd (dy - (dy . y) y); y and dy are read once.
template <int G, int V>
__global__ void __launch_bounds__(kRowThreads)
    l2BwdRowKernel(long rows, int H, int d, long xs, long ys, const bf *y,
                   const float *rstd, const bf *dy, bf *dx, bool vec) {
  const int lane = threadIdx.x & 31, gl = lane % G;
  const long row = rowwise::groupRow<G>(lane);
  if (row >= rows)
    return;
  const long yo = headRow(row, H, d, ys);
  float yv[V][8], dv[V][8];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    rowwise::load8(y + yo, rowwise::vecStart<G>(k, gl), d, vec, yv[k]);
    rowwise::load8(dy + yo, rowwise::vecStart<G>(k, gl), d, vec, dv[k]);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      s += yv[k][i] * dv[k][i];
  }
  s = rowwise::groupSum<G>(s);
  const float r = rstd[row];
  bf *dxr = dx + headRow(row, H, d, xs);
#pragma unroll
  for (int k = 0; k < V; ++k) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      dv[k][i] = r * (dv[k][i] - s * yv[k][i]);
    rowwise::store8(dxr, rowwise::vecStart<G>(k, gl), d, vec, dv[k]);
  }
}

/// y = w x rstd z sigmoid(z), multiplied left to right with a rounding at
/// each step (no adds, so nothing contracts): the forward and a backward
/// that rebuilds y from the saved rstd write the same bits.
__device__ __forceinline__ float gatedNormValue(float w, float x, float r,
                                                float z, float s) {
  return w * x * r * z * s;
}

/// Gated RMSNorm forward of rows up to rowwise::kMaxDim wide: x and z are
/// read once.
template <int G, int V>
__global__ void __launch_bounds__(kRowThreads)
    gatedNormFwdRowKernel(long rows, int d, float eps, const bf *x, const bf *z,
                          const bf *w, bf *y, float *rstd, bool vec) {
  const int lane = threadIdx.x & 31, gl = lane % G;
  const long row = rowwise::groupRow<G>(lane);
  if (row >= rows)
    return;
  float xv[V][8];
  const float ss = rowwise::loadRowSquares<G, V>(x + row * d, gl, d, vec, xv);
  const float r = rsqrtf(rowwise::groupSum<G>(ss) / float(d) + eps);
  if (gl == 0)
    rstd[row] = r;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int e = rowwise::vecStart<G>(k, gl);
    float zv[8], wv[8];
    rowwise::load8(z + row * d, e, d, vec, zv);
    rowwise::load8(w, e, d, vec, wv);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      zv[i] = gatedNormValue(wv[i], xv[k][i], r, zv[i], sigmoidf_(zv[i]));
    rowwise::store8(y + row * d, e, d, vec, zv);
  }
}

/// Gated RMSNorm backward of rows up to rowwise::kMaxDim wide: x, z and dy
/// are read once; dw terms stay in registers over the block's rows (row
/// order per lane), then rowwise::blockPartial folds lanes and warps in a
/// fixed order. Rows of a block: base + (pass * kWarps + warp) * (32 / G) +
/// group.
template <int G, int V>
__global__ void __launch_bounds__(kRowThreads)
    gatedNormBwdRowKernel(long rows, int d, const bf *x, const bf *z,
                          const bf *w, const float *rstd, const bf *dy, bf *dx,
                          bf *dz, bf *y, float *partial, int passes, bool vec) {
  constexpr int RPW = 32 / G;
  const int lane = threadIdx.x & 31, gl = lane % G, warp = threadIdx.x >> 5;
  float acc[V][8] = {};
  const long base = long(blockIdx.x) * passes * rowwise::kWarps * RPW;
  for (int p = 0; p < passes; ++p) {
    const long row = base + (long(p) * rowwise::kWarps + warp) * RPW + lane / G;
    if (row >= rows)
      continue; // the whole group skips: its shuffles stay inside it
    const float r = rstd[row];
    float xh[V][8], dyh[V][8], wv[V][8];
    float mean = 0.f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int e = rowwise::vecStart<G>(k, gl);
      float zv[8], dv[8], dzv[8], yv[8];
      rowwise::load8(x + row * d, e, d, vec, xh[k]);
      rowwise::load8(z + row * d, e, d, vec, zv);
      rowwise::load8(dy + row * d, e, d, vec, dv);
      rowwise::load8(w, e, d, vec, wv[k]);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float s = sigmoidf_(zv[i]);
        // The forward's output (train-fuse-recompute): its expression, in
        // its order, from the raw x.
        yv[i] = gatedNormValue(wv[k][i], xh[k][i], r, zv[i], s);
        xh[k][i] *= r;
        dyh[k][i] = dv[i] * zv[i] * s;
        dzv[i] = dv[i] * wv[k][i] * xh[k][i] * s * (1.f + zv[i] * (1.f - s));
        acc[k][i] += dyh[k][i] * xh[k][i];
        mean += wv[k][i] * dyh[k][i] * xh[k][i];
      }
      rowwise::store8(dz + row * d, e, d, vec, dzv);
      if (y)
        rowwise::store8(y + row * d, e, d, vec, yv);
    }
    mean = rowwise::groupSum<G>(mean) / float(d);
#pragma unroll
    for (int k = 0; k < V; ++k) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        xh[k][i] = r * (wv[k][i] * dyh[k][i] - xh[k][i] * mean);
      rowwise::store8(dx + row * d, rowwise::vecStart<G>(k, gl), d, vec, xh[k]);
    }
  }
  rowwise::blockPartial<G, V>(acc, d, partial);
}

/// Rows wider than rowwise::kMaxDim: one warp per (token, head) row.
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

/// Rows wider than rowwise::kMaxDim: one warp per row.
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
    y[row * d + i] =
        f2b(gatedNormValue(b2f(w[i]), b2f(xr[i]), r, zv, sigmoidf_(zv)));
  }
}

/// Rows wider than rowwise::kMaxDim: 8 warps x 8 rows per block; dw partial
/// per block in fixed order.
__global__ void gatedNormBwdKernel(long rows, int d, const bf *x, const bf *z,
                                   const bf *w, const float *rstd, const bf *dy,
                                   bf *dx, bf *dz, bf *y, float *partial) {
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
      if (y)
        y[row * d + i] = f2b(gatedNormValue(wv, b2f(x[row * d + i]), r, zv, s));
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

int gridFor(long n, int threads) {
  long b = (n + threads - 1) / threads;
  return int(b < 1 ? 1 : (b > 65535 * 4 ? 65535 * 4 : b));
}

} // namespace

/// Keeps this object file linked whenever the cuda entries are used.
void opsAnchor() {}

/// Whether `a` runs the windowed conv kernels: what GdnConvKernels::Fastest
/// asks for (bitwise equal to the per-element kernels on the H200 at the
/// Qwen shape, the step 17 % faster) unless the tokens do not fit the
/// grid: the windowed kernels put runs of tokens on grid.y, so more than
/// 65535 runs (about 2M tokens forward) take the per-element ones.
bool convWindowed(const GdnConvArgs &a, long tokens) {
  // Packed documents (docStart) take the per-element kernels.
  return a.kernels != GdnConvKernels::PerElement && !a.docStart &&
         (tokens + kConvFwdRows - 1) / kConvFwdRows <= 65535;
}

/// Whether the forward or backward of `a` (windowed) can run staged: tiles of
/// kConvStagedChannels channels that each lie in one output group, every
/// access 16-byte aligned.
bool convStaged(const GdnConvArgs &a, bool backward) {
  auto aligned = [](const void *p) { return uintptr_t(p) % 16 == 0; };
  if (a.kernels != GdnConvKernels::Staged ||
      a.channels % kConvStagedChannels != 0 || !aligned(a.x) ||
      (backward && !aligned(a.dx)))
    return false;
  if (a.splits == 0)
    return aligned(backward ? a.dy : a.y);
  for (int s = 0; s < a.splits; ++s)
    if (a.splitChannels[s] % kConvStagedChannels != 0 ||
        !aligned(backward ? a.dys[s] : a.ys[s]))
      return false;
  return true;
}

/// The conv output layout of `a`: its groups, or the dense buffer as one.
template <typename P, typename Q>
ConvGroups<P> groupsOf(const GdnConvArgs &a, Q dense, Q const *groups) {
  ConvGroups<P> g{};
  g.n = a.splits == 0 ? 1 : a.splits;
  g.start[0] = 0;
  for (int s = 0; s < g.n; ++s) {
    g.ptr[s] = static_cast<P>(a.splits == 0 ? dense : groups[s]);
    g.start[s + 1] =
        g.start[s] + int(a.splits == 0 ? a.channels : a.splitChannels[s]);
  }
  return g;
}

Status convForward(const KernelContext &ctx, const GdnConvArgs &a) {
  if (a.dtype != DType::BF16 || a.kernelSize < 1 || a.kernelSize > 8)
    return Status::Unsupported;
  if (!gdnConvSplitsValid(a) || (a.kernels != GdnConvKernels::Fastest &&
                                 a.kernels != GdnConvKernels::PerElement &&
                                 a.kernels != GdnConvKernels::Staged))
    return Status::InvalidArgument;
  long N = a.batch * a.seqLen;
  if (convWindowed(a, N) && convStaged(a, false)) {
    dim3 grid(unsigned(a.channels / kConvStagedChannels),
              unsigned((N + kConvRows - 1) / kConvRows));
    withKernelSize(a.kernelSize, [&](auto k) {
      constexpr int K = decltype(k)::value;
      convStagedFwdKernel<K>
          <<<grid, kConvStagedThreads, 0, (cudaStream_t)ctx.stream>>>(
              N, int(a.seqLen), int(a.channels), (const bf *)a.x,
              (const bf *)a.w, groupsOf<bf *>(a, a.y, a.ys));
    });
    AP_GDN_LAUNCH_CHECK(convStagedFwdKernel);
    return Status::Ok;
  }
  if (convWindowed(a, N)) {
    dim3 grid(unsigned((a.channels + 127) / 128),
              unsigned((N + kConvFwdRows - 1) / kConvFwdRows));
    withKernelSize(a.kernelSize, [&](auto k) {
      constexpr int K = decltype(k)::value;
      convWindowFwdKernel<K><<<grid, 128, 0, (cudaStream_t)ctx.stream>>>(
          N, int(a.seqLen), int(a.channels), (const bf *)a.x, (const bf *)a.w,
          groupsOf<bf *>(a, a.y, a.ys));
    });
    AP_GDN_LAUNCH_CHECK(convWindowFwdKernel);
    return Status::Ok;
  }
  convFwdKernel<<<gridFor(N * a.channels, 256), 256, 0,
                  (cudaStream_t)ctx.stream>>>(
      N, int(a.seqLen), int(a.channels), a.kernelSize, (const bf *)a.x,
      (const bf *)a.w, groupsOf<bf *>(a, a.y, a.ys), a.docStart);
  AP_GDN_LAUNCH_CHECK(convFwdKernel);
  return Status::Ok;
}

Status convBackward(const KernelContext &ctx, const GdnConvArgs &a) {
  if (a.dtype != DType::BF16 || a.kernelSize < 1 || a.kernelSize > 8)
    return Status::Unsupported;
  if (!gdnConvSplitsValid(a) || (a.kernels != GdnConvKernels::Fastest &&
                                 a.kernels != GdnConvKernels::PerElement &&
                                 a.kernels != GdnConvKernels::Staged))
    return Status::InvalidArgument;
  if (ctx.workspaceBytes < gdnConvBackwardWorkspaceBytes(Backend::Cuda, a))
    return Status::InvalidArgument;
  cudaStream_t s = (cudaStream_t)ctx.stream;
  long N = a.batch * a.seqLen;
  int T = int(a.seqLen), Cc = int(a.channels), K = a.kernelSize;
  if (convWindowed(a, N)) {
    long nb = (N + kConvRows - 1) / kConvRows;
    float *partial = (float *)ctx.workspace;
    if (convStaged(a, true)) {
      dim3 grid(unsigned(Cc / kConvStagedChannels), unsigned(nb));
      Status st = Status::Ok;
      withKernelSize(K, [&](auto k) {
        constexpr int KK = decltype(k)::value;
        constexpr int bytes = int(ConvStagedTile<KK>::smemBytes);
        // Over the 48 KB a launch gets without asking (once per process and
        // device is enough; asking again is harmless).
        if (cudaFuncSetAttribute(convStagedBwdKernel<KK>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 bytes) != cudaSuccess) {
          st = Status::BackendError;
          return;
        }
        convStagedBwdKernel<KK><<<grid, kConvStagedThreads, bytes, s>>>(
            N, T, Cc, (const bf *)a.x, (const bf *)a.w,
            groupsOf<const bf *>(a, a.dy, a.dys), (bf *)a.dx, partial);
      });
      if (st != Status::Ok)
        return st;
      AP_GDN_LAUNCH_CHECK(convStagedBwdKernel);
    } else {
      dim3 grid(unsigned((Cc + 127) / 128), unsigned(nb));
      withKernelSize(K, [&](auto k) {
        constexpr int KK = decltype(k)::value;
        convWindowBwdKernel<KK><<<grid, 128, 0, s>>>(
            N, T, Cc, (const bf *)a.x, (const bf *)a.w,
            groupsOf<const bf *>(a, a.dy, a.dys), (bf *)a.dx, partial);
      });
      AP_GDN_LAUNCH_CHECK(convWindowBwdKernel);
    }
    sumPartialsKernel<<<gridFor(long(Cc) * K, 256), 256, 0, s>>>(
        nb, long(Cc) * K, partial, (float *)a.dw);
    AP_GDN_LAUNCH_CHECK(sumPartialsKernel);
    return Status::Ok;
  }
  convDxKernel<<<gridFor(N * Cc, 256), 256, 0, s>>>(
      N, T, Cc, K, (const bf *)a.x, (const bf *)a.w,
      groupsOf<const bf *>(a, a.dy, a.dys), (bf *)a.dx, a.docStart);
  AP_GDN_LAUNCH_CHECK(convDxKernel);
  long nb = (N + kConvRows - 1) / kConvRows;
  float *partial = (float *)ctx.workspace;
  convDwPartialKernel<<<dim3(unsigned(nb), (Cc + 127) / 128), 128, 0, s>>>(
      N, T, Cc, K, (const bf *)a.x, (const bf *)a.w,
      groupsOf<const bf *>(a, a.dy, a.dys), partial, a.docStart);
  AP_GDN_LAUNCH_CHECK(convDwPartialKernel);
  sumPartialsKernel<<<gridFor(long(Cc) * K, 256), 256, 0, s>>>(
      nb, long(Cc) * K, partial, (float *)a.dw);
  AP_GDN_LAUNCH_CHECK(sumPartialsKernel);
  return Status::Ok;
}

Status gatesForward(const KernelContext &ctx, const GdnGatesArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  gatesFwdKernel<<<gridFor(a.tokens * a.heads, 256), 256, 0,
                   (cudaStream_t)ctx.stream>>>(
      a.tokens, a.heads, (const bf *)a.a, (const bf *)a.b,
      (const float *)a.aLog, (const float *)a.dtBias, (float *)a.g,
      (bf *)a.beta);
  AP_GDN_LAUNCH_CHECK(gatesFwdKernel);
  return Status::Ok;
}

Status gatesBackward(const KernelContext &ctx, const GdnGatesArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  gatesBwdKernel<<<a.heads, 256, 0, (cudaStream_t)ctx.stream>>>(
      a.tokens, a.heads, (const bf *)a.a, (const bf *)a.beta,
      (const float *)a.aLog, (const float *)a.dtBias, (const float *)a.dg,
      (const bf *)a.dbeta, (bf *)a.da, (bf *)a.db, (float *)a.dALog,
      (float *)a.dDtBias);
  AP_GDN_LAUNCH_CHECK(gatesBwdKernel);
  return Status::Ok;
}

Status l2NormForward(const KernelContext &ctx, const GdnL2NormArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  long rows = a.tokens * a.heads, hd = long(a.heads) * a.dim;
  long xs = a.xStride ? a.xStride : hd, ys = a.yStride ? a.yStride : hd;
  cudaStream_t s = (cudaStream_t)ctx.stream;
  if (a.dim <= rowwise::kMaxDim) {
    const bool vec = rowwise::vectorizable(a.dim, {xs, ys}, {a.x, a.y});
    const long per = long(rowwise::rowsPerPass(a.dim));
    rowwise::withLayout(a.dim, [&](auto g, auto v) {
      l2FwdRowKernel<g.value, v.value>
          <<<unsigned((rows + per - 1) / per), kRowThreads, 0, s>>>(
              rows, a.heads, a.dim, xs, ys, a.eps, (const bf *)a.x, (bf *)a.y,
              (float *)a.rstd, vec);
    });
    AP_GDN_LAUNCH_CHECK(l2FwdRowKernel);
    return Status::Ok;
  }
  l2FwdKernel<<<gridFor(rows * 32, 256), 256, 0, s>>>(
      rows, a.heads, a.dim, xs, ys, a.eps, (const bf *)a.x, (bf *)a.y,
      (float *)a.rstd);
  AP_GDN_LAUNCH_CHECK(l2FwdKernel);
  return Status::Ok;
}

Status l2NormBackward(const KernelContext &ctx, const GdnL2NormArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  long rows = a.tokens * a.heads, hd = long(a.heads) * a.dim;
  long xs = a.xStride ? a.xStride : hd, ys = a.yStride ? a.yStride : hd;
  cudaStream_t s = (cudaStream_t)ctx.stream;
  if (a.dim <= rowwise::kMaxDim) {
    const bool vec = rowwise::vectorizable(a.dim, {xs, ys}, {a.y, a.dy, a.dx});
    const long per = long(rowwise::rowsPerPass(a.dim));
    rowwise::withLayout(a.dim, [&](auto g, auto v) {
      l2BwdRowKernel<g.value, v.value>
          <<<unsigned((rows + per - 1) / per), kRowThreads, 0, s>>>(
              rows, a.heads, a.dim, xs, ys, (const bf *)a.y,
              (const float *)a.rstd, (const bf *)a.dy, (bf *)a.dx, vec);
    });
    AP_GDN_LAUNCH_CHECK(l2BwdRowKernel);
    return Status::Ok;
  }
  l2BwdKernel<<<gridFor(rows * 32, 256), 256, 0, s>>>(
      rows, a.heads, a.dim, xs, ys, (const bf *)a.y, (const float *)a.rstd,
      (const bf *)a.dy, (bf *)a.dx);
  AP_GDN_LAUNCH_CHECK(l2BwdKernel);
  return Status::Ok;
}

Status gatedNormForward(const KernelContext &ctx, const GdnGatedNormArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  long rows = a.tokens * a.heads;
  cudaStream_t s = (cudaStream_t)ctx.stream;
  if (a.dim <= rowwise::kMaxDim) {
    const bool vec = rowwise::vectorizable(a.dim, {}, {a.x, a.z, a.w, a.y});
    const long per = long(rowwise::rowsPerPass(a.dim));
    rowwise::withLayout(a.dim, [&](auto g, auto v) {
      gatedNormFwdRowKernel<g.value, v.value>
          <<<unsigned((rows + per - 1) / per), kRowThreads, 0, s>>>(
              rows, a.dim, a.eps, (const bf *)a.x, (const bf *)a.z,
              (const bf *)a.w, (bf *)a.y, (float *)a.rstd, vec);
    });
    AP_GDN_LAUNCH_CHECK(gatedNormFwdRowKernel);
    return Status::Ok;
  }
  gatedNormFwdKernel<<<gridFor(rows * 32, 256), 256, 0, s>>>(
      rows, a.dim, a.eps, (const bf *)a.x, (const bf *)a.z, (const bf *)a.w,
      (bf *)a.y, (float *)a.rstd);
  AP_GDN_LAUNCH_CHECK(gatedNormFwdKernel);
  return Status::Ok;
}

Status gatedNormBackward(const KernelContext &ctx, const GdnGatedNormArgs &a) {
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  if (ctx.workspaceBytes < gdnGatedNormBackwardWorkspaceBytes(Backend::Cuda, a))
    return Status::InvalidArgument;
  cudaStream_t s = (cudaStream_t)ctx.stream;
  long rows = a.tokens * a.heads;
  long nb = gatedNormPartials(rows, a.dim);
  float *partial = (float *)ctx.workspace;
  if (a.dim <= rowwise::kMaxDim) {
    const bool vec = rowwise::vectorizable(
        a.dim, {}, {a.x, a.z, a.w, a.dy, a.dx, a.dz, a.y});
    const int passes = int(rowwise::passesPerBlock(rows, a.dim));
    rowwise::withLayout(a.dim, [&](auto g, auto v) {
      gatedNormBwdRowKernel<g.value, v.value>
          <<<unsigned(nb), kRowThreads, 0, s>>>(
              rows, a.dim, (const bf *)a.x, (const bf *)a.z, (const bf *)a.w,
              (const float *)a.rstd, (const bf *)a.dy, (bf *)a.dx, (bf *)a.dz,
              (bf *)a.y, partial, passes, vec);
    });
    AP_GDN_LAUNCH_CHECK(gatedNormBwdRowKernel);
    if (a.dw) {
      rowwise::columnSumKernel<<<rowwise::columnSumBlocks(a.dim),
                                 rowwise::kColCols * rowwise::kColSegs, 0, s>>>(
          partial, (float *)a.dw, nb, a.dim);
      AP_GDN_LAUNCH_CHECK(columnSumKernel);
    }
    return Status::Ok;
  }
  gatedNormBwdKernel<<<unsigned(nb), 256, 8 * a.dim * sizeof(float), s>>>(
      rows, a.dim, (const bf *)a.x, (const bf *)a.z, (const bf *)a.w,
      (const float *)a.rstd, (const bf *)a.dy, (bf *)a.dx, (bf *)a.dz,
      (bf *)a.y, partial);
  AP_GDN_LAUNCH_CHECK(gatedNormBwdKernel);
  sumPartialsKernel<<<gridFor(a.dim, 256), 256, 0, s>>>(nb, a.dim, partial,
                                                        (float *)a.dw);
  AP_GDN_LAUNCH_CHECK(sumPartialsKernel);
  return Status::Ok;
}

} // namespace ap::kernels::gdncuda
