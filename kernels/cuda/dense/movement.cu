//===- movement.cu - data movement CUDA kernels -------------------*- C++
//-*-===//
//
// copyRows, sumRepeats and convertDType (kernels/dense.h) on the device: the
// view ops of the train dialect and the storage <-> acc staging of the GDN
// gates run on the compute stream instead of through host memory. Copies are
// exact whatever the access width, so the width may follow alignment; the
// repeat sum runs in a fixed order (r increasing) with no atomics.
//
//===----------------------------------------------------------------------===//
#include "kernels/cuda/dense/dense_cuda.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

/// Pulled in by kernels/dense.h from every ACTPLACE_HAVE_CUDA translation
/// unit, so that this archive member (and the hooks it defines) is linked.
extern "C" {
int actplaceMovementCudaAnchor = 0;
}

namespace ap::kernels::cuda {
namespace {

using bf = __nv_bfloat16;

inline unsigned gridFor(int64_t n, int threads, int64_t cap = 1 << 16) {
  return unsigned(
      std::max<int64_t>(1, std::min((n + threads - 1) / threads, cap)));
}

/// Words of a row one thread moves per row step: its loads are all issued
/// before its stores, so each thread keeps several requests in flight.
constexpr int kCopyUnroll = 4;
constexpr int kCopyThreads = 256;

/// Rows of (outer, repeat) pairs; W-byte words within a row; all sizes in
/// words of W. A row takes 2^tShift threads (enough for its words in
/// kCopyUnroll steps, at most the block), so a block moves several short
/// rows at once instead of leaving most of its threads idle.
template <class W>
__global__ void __launch_bounds__(kCopyThreads)
    copyRowsKernel(const W *src, W *dst, int64_t rows, int64_t repeats,
                   int64_t rowWords, int64_t srcPitch, int64_t dstPitch,
                   int tShift) {
  const int t = threadIdx.x & ((1 << tShift) - 1);
  const int rowsPerBlock = kCopyThreads >> tShift;
  const int64_t step = int64_t(1) << tShift;
  for (int64_t row =
           int64_t(blockIdx.x) * rowsPerBlock + (threadIdx.x >> tShift);
       row < rows; row += int64_t(gridDim.x) * rowsPerBlock) {
    int64_t o = row / repeats, r = row - o * repeats;
    const W *s = src + o * srcPitch;
    W *d = dst + o * dstPitch + r * rowWords;
    for (int64_t i0 = t; i0 < rowWords; i0 += step * kCopyUnroll) {
      W v[kCopyUnroll];
#pragma unroll
      for (int k = 0; k < kCopyUnroll; ++k)
        if (i0 + k * step < rowWords)
          v[k] = s[i0 + k * step];
#pragma unroll
      for (int k = 0; k < kCopyUnroll; ++k)
        if (i0 + k * step < rowWords)
          d[i0 + k * step] = v[k];
    }
  }
}

template <class W>
Status launchCopyRows(const CopyRowsArgs &a, cudaStream_t s) {
  constexpr int64_t w = sizeof(W);
  const int64_t rows = a.outer * a.repeats, rowWords = a.rowBytes / w;
  int tShift = 0;
  while ((int64_t(1) << tShift) * kCopyUnroll < rowWords &&
         (1 << tShift) < kCopyThreads)
    ++tShift;
  const int64_t rowsPerBlock = kCopyThreads >> tShift;
  copyRowsKernel<W><<<unsigned(std::min<int64_t>(
                          (rows + rowsPerBlock - 1) / rowsPerBlock, 1 << 16)),
                      kCopyThreads, 0, s>>>(
      static_cast<const W *>(a.src), static_cast<W *>(a.dst), rows, a.repeats,
      rowWords, a.srcPitch / w, a.dstPitch / w, tShift);
  AP_CUDA_CHECK_LAUNCH(copyRowsKernel);
  return Status::Ok;
}

template <class T> __device__ __forceinline__ float toAcc(T v) {
  return float(v);
}
template <> __device__ __forceinline__ float toAcc<bf>(bf v) {
  return __bfloat162float(v);
}
template <class T> __device__ __forceinline__ T fromAcc(float v) {
  return T(v);
}
template <> __device__ __forceinline__ bf fromAcc<bf>(float v) {
  return __float2bfloat16_rn(v);
}

template <class T>
__global__ void sumRepeatsKernel(const T *x, T *y, int64_t outer,
                                 int64_t repeats, int64_t inner) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
       j < outer * inner; j += int64_t(gridDim.x) * blockDim.x) {
    int64_t o = j / inner, i = j - o * inner;
    const T *p = x + o * repeats * inner + i;
    float s = 0.f;
    for (int64_t r = 0; r < repeats; ++r)
      s += toAcc(p[r * inner]);
    y[j] = fromAcc<T>(s);
  }
}

template <class From, class To>
__global__ void convertKernel(const From *x, To *y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = fromAcc<To>(toAcc(x[i]));
}

} // namespace

Status copyRows(const KernelContext &ctx, const CopyRowsArgs &a) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  // The widest word that divides every size and both base addresses.
  uint64_t all = uint64_t(a.rowBytes) | uint64_t(a.srcPitch) |
                 uint64_t(a.dstPitch) | reinterpret_cast<uintptr_t>(a.src) |
                 reinterpret_cast<uintptr_t>(a.dst);
  if (all % 16 == 0)
    return launchCopyRows<uint4>(a, s);
  if (all % 8 == 0)
    return launchCopyRows<uint2>(a, s);
  if (all % 4 == 0)
    return launchCopyRows<uint32_t>(a, s);
  if (all % 2 == 0)
    return launchCopyRows<uint16_t>(a, s);
  return launchCopyRows<uint8_t>(a, s);
}

Status sumRepeats(const KernelContext &ctx, const SumRepeatsArgs &a) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  int64_t n = a.outer * a.inner;
  if (n == 0)
    return Status::Ok;
  if (a.dtype == DType::BF16)
    sumRepeatsKernel<bf><<<gridFor(n, 256), 256, 0, s>>>(
        static_cast<const bf *>(a.x), static_cast<bf *>(a.y), a.outer,
        a.repeats, a.inner);
  else if (a.dtype == DType::F32)
    sumRepeatsKernel<float><<<gridFor(n, 256), 256, 0, s>>>(
        static_cast<const float *>(a.x), static_cast<float *>(a.y), a.outer,
        a.repeats, a.inner);
  else
    return Status::Unsupported;
  AP_CUDA_CHECK_LAUNCH(sumRepeatsKernel);
  return Status::Ok;
}

Status convertDType(const KernelContext &ctx, const ConvertArgs &a) {
  cudaStream_t s = static_cast<cudaStream_t>(ctx.stream);
  if (a.n == 0)
    return Status::Ok;
  unsigned grid = gridFor(a.n, 256);
  if (a.from == DType::BF16 && a.to == DType::F32)
    convertKernel<bf, float><<<grid, 256, 0, s>>>(
        static_cast<const bf *>(a.x), static_cast<float *>(a.y), a.n);
  else if (a.from == DType::F32 && a.to == DType::BF16)
    convertKernel<float, bf><<<grid, 256, 0, s>>>(
        static_cast<const float *>(a.x), static_cast<bf *>(a.y), a.n);
  else if (a.from == a.to && a.from != DType::F64)
    AP_CUDA_CHECK(cudaMemcpyAsync(a.y, a.x,
                                  size_t(a.n) * (a.from == DType::BF16 ? 2 : 4),
                                  cudaMemcpyDeviceToDevice, s));
  else
    return Status::Unsupported;
  AP_CUDA_CHECK_LAUNCH(convertKernel);
  return Status::Ok;
}

} // namespace ap::kernels::cuda
