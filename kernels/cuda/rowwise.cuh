//===- rowwise.cuh - register-tiled row kernels: device helpers -*- C++ -*-===//
//
// Shared by the norm kernels of the dense and GDN families (RMSNorm, L2 norm,
// gated RMSNorm). A row lives in registers of a group of lanes
// (row_layout.h), read once with 16-byte loads, so a backward reads its
// inputs once instead of twice; row sums are butterflies inside the group.
//
// Vector or scalar access: 16-byte accesses need dim and strides in
// multiples of 8 elements and 16-byte aligned bases; otherwise the same
// kernel moves the same elements one at a time. The arithmetic, its order
// and so every bit of the results are the same either way: the access width
// may follow the pointers, the results never do.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_CUDA_ROWWISE_CUH
#define ACTPLACE_KERNELS_CUDA_ROWWISE_CUH

#include "kernels/cuda/row_layout.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace ap::kernels::rowwise {

using bf16v = __nv_bfloat16;

/// The eight bf16 of a 16-byte word, as float.
__device__ __forceinline__ void unpack8(uint4 u, float (&v)[8]) {
  const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

/// v rounded to bf16, as one 16-byte word.
__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  uint4 u;
  __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  return u;
}

/// Eight consecutive elements of a row from element e, as float; zeros past
/// dim (so they add nothing to a row sum).
__device__ __forceinline__ void load8(const bf16v *row, int e, int dim,
                                      bool vec, float (&v)[8]) {
  if (vec) {
    if (e < dim) {
      unpack8(*reinterpret_cast<const uint4 *>(row + e), v);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        v[i] = 0.f;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
    v[i] = e + i < dim ? __bfloat162float(row[e + i]) : 0.f;
}

/// Rounds and stores the elements of v that fall inside the row.
__device__ __forceinline__ void store8(bf16v *row, int e, int dim, bool vec,
                                       const float (&v)[8]) {
  if (vec) {
    if (e < dim)
      *reinterpret_cast<uint4 *>(row + e) = pack8(v);
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (e + i < dim)
      row[e + i] = __float2bfloat16_rn(v[i]);
}

/// Lanes of the calling lane's group of G.
template <int G> __device__ __forceinline__ unsigned groupMask() {
  if constexpr (G == 32)
    return 0xffffffffu;
  else
    return ((1u << G) - 1u) << ((threadIdx.x & 31) / G * G);
}

/// Sum over the group of G lanes by a butterfly: every lane ends with the
/// same bits (each step adds the same two values, in either order).
template <int G> __device__ __forceinline__ float groupSum(float v) {
  const unsigned mask = groupMask<G>();
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1)
    v += __shfl_xor_sync(mask, v, o);
  return v;
}

/// The row of the group of `lane` (threadIdx.x & 31) when each warp of a
/// block holds 32 / G rows, one per group, and each block kWarps warps' rows.
template <int G> __device__ __forceinline__ int64_t groupRow(int lane) {
  return (int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * (32 / G) +
         lane / G;
}

/// First element of the k-th vector of lane `gl` of a group of G.
template <int G> __device__ __forceinline__ int vecStart(int k, int gl) {
  return (k * G + gl) * 8;
}

/// Loads lane `gl`'s V vectors of a row into v and returns the lane's sum of
/// their squares, added in element order (the forward norms' first pass).
template <int G, int V>
__device__ __forceinline__ float
loadRowSquares(const bf16v *row, int gl, int dim, bool vec, float (&v)[V][8]) {
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    load8(row, vecStart<G>(k, gl), dim, vec, v[k]);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      ss += v[k][i] * v[k][i];
  }
  return ss;
}

/// Folds a block's per-lane weight-gradient sums into partial[blockIdx.x]:
/// the row groups of each warp by a butterfly, then the warps in order
/// through shared memory. Called by every thread of the block.
template <int G, int V>
__device__ __forceinline__ void blockPartial(float (&acc)[V][8], int dim,
                                             float *partial) {
  __shared__ float sm[kWarps][G * V * 8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gl = lane % G;
#pragma unroll
  for (int o = G; o < 32; o <<= 1)
#pragma unroll
    for (int k = 0; k < V; ++k)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        acc[k][i] += __shfl_xor_sync(0xffffffffu, acc[k][i], o);
  if (lane < G)
#pragma unroll
    for (int k = 0; k < V; ++k)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        int e = vecStart<G>(k, gl) + i;
        if (e < dim)
          sm[warp][e] = acc[k][i];
      }
  __syncthreads();
  for (int j = threadIdx.x; j < dim; j += blockDim.x) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      s += sm[w][j];
    partial[int64_t(blockIdx.x) * dim + j] = s;
  }
}

// Each including translation unit gets its own copy of the kernel.
namespace {

/// Threads of columnSumKernel: 8 columns (one 32-byte sector of a partial
/// row) by 32 fixed segments of the partials.
constexpr int kColCols = 8, kColSegs = 32;

/// dw[j] += sum over p of partial[p][j]: each of 32 contiguous segments of p
/// summed in order, then the segment sums in segment order.
__global__ void __launch_bounds__(kColCols *kColSegs)
    columnSumKernel(const float *partial, float *dw, int64_t parts, int dim) {
  __shared__ float seg[kColSegs][kColCols];
  const int tx = threadIdx.x % kColCols, ty = threadIdx.x / kColCols;
  const int64_t j = int64_t(blockIdx.x) * kColCols + tx;
  const int64_t len = (parts + kColSegs - 1) / kColSegs;
  const int64_t p0 = ty * len, p1 = p0 + len < parts ? p0 + len : parts;
  float s = 0.f;
  if (j < dim)
    for (int64_t p = p0; p < p1; ++p)
      s += partial[p * dim + j];
  seg[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && j < dim) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < kColSegs; ++k)
      t += seg[k][tx];
    dw[j] += t;
  }
}

} // namespace

inline unsigned columnSumBlocks(int64_t dim) {
  return unsigned((dim + kColCols - 1) / kColCols);
}

/// True when 16-byte accesses fit every view: dim and the strides multiples
/// of 8 elements, every (non-null) base 16-byte aligned.
inline bool vectorizable(int64_t dim, std::initializer_list<int64_t> strides,
                         std::initializer_list<const void *> ptrs) {
  if (dim % 8)
    return false;
  for (int64_t s : strides)
    if (s % 8)
      return false;
  for (const void *p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16)
      return false;
  return true;
}

/// Calls f(integral_constant<G>, integral_constant<V>) with the layout of
/// dim (dim <= kMaxDim).
template <class F> void withLayout(int64_t dim, F &&f) {
  using std::integral_constant;
  Layout l = layout(dim);
  if (l.vecs == 4)
    f(integral_constant<int, 32>{}, integral_constant<int, 4>{});
  else if (l.vecs == 2)
    f(integral_constant<int, 32>{}, integral_constant<int, 2>{});
  else if (l.lanes == 32)
    f(integral_constant<int, 32>{}, integral_constant<int, 1>{});
  else if (l.lanes == 16)
    f(integral_constant<int, 16>{}, integral_constant<int, 1>{});
  else if (l.lanes == 8)
    f(integral_constant<int, 8>{}, integral_constant<int, 1>{});
  else
    f(integral_constant<int, 4>{}, integral_constant<int, 1>{});
}

} // namespace ap::kernels::rowwise

#endif // ACTPLACE_KERNELS_CUDA_ROWWISE_CUH
