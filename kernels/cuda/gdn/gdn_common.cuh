//===- gdn_common.cuh - GDN cuda helpers ------------------------*- C++ -*-===//
//
// Status checking, bf16 helpers and a CTA-level tensor-core matmul on shared
// memory operands (mma.sync m16n8k16, bf16 in, fp32 accumulate) shared by the
// GDN cuda kernels.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_CUDA_GDN_GDN_COMMON_CUH
#define ACTPLACE_KERNELS_CUDA_GDN_GDN_COMMON_CUH

#include "kernels/kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>

namespace ap::kernels::gdncuda {

/// Checks a CUDA runtime call; on failure prints the call and returns
/// BackendError from the enclosing function.
#define AP_GDN_CUDA_CHECK(call)                                                \
  do {                                                                         \
    cudaError_t err_ = (call);                                                 \
    if (err_ != cudaSuccess) {                                                 \
      std::fprintf(stderr, "gdn cuda: %s failed: %s (%s:%d)\n", #call,          \
                   cudaGetErrorString(err_), __FILE__, __LINE__);              \
      return Status::BackendError;                                             \
    }                                                                          \
  } while (0)

/// Checks the last launch.
#define AP_GDN_LAUNCH_CHECK(name) AP_GDN_CUDA_CHECK(cudaGetLastError())

using bf = __nv_bfloat16;

__device__ __forceinline__ float b2f(bf x) { return __bfloat162float(x); }
__device__ __forceinline__ bf f2b(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float sigmoidf_(float x) {
  return 1.f / (1.f + __expf(-x));
}

/// A bf16 matrix view in shared memory: element (r, c) at p[r*rs + c*cs].
/// Transposes are views with swapped strides.
struct SMat {
  const bf *p;
  int rs, cs;
  __device__ __forceinline__ uint32_t pair(int r, int c) const {
    // Two consecutive elements along the column index, low half first.
    if (cs == 1)
      return *reinterpret_cast<const uint32_t *>(p + r * rs + c);
    uint16_t lo = __bfloat16_as_ushort(p[r * rs + c * cs]);
    uint16_t hi = __bfloat16_as_ushort(p[r * rs + (c + 1) * cs]);
    return uint32_t(lo) | (uint32_t(hi) << 16);
  }
  /// Two consecutive elements along the row index (for B fragments).
  __device__ __forceinline__ uint32_t pairRows(int r, int c) const {
    if (rs == 1)
      return *reinterpret_cast<const uint32_t *>(p + r + c * cs);
    uint16_t lo = __bfloat16_as_ushort(p[r * rs + c * cs]);
    uint16_t hi = __bfloat16_as_ushort(p[(r + 1) * rs + c * cs]);
    return uint32_t(lo) | (uint32_t(hi) << 16);
  }
};

__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4],
                                         const uint32_t b[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                 "r"(b[1]));
}

/// C[M,N] = A[M,K] B[K,N] over the CTA's warps (M, N, K multiples of 16),
/// each warp taking 16x16 output tiles round-robin; the epilogue ep(m, n, v)
/// is called once per output element. The tile -> thread map depends only
/// on (M, N), so two calls of the same shape hand element (m, n) to the same
/// thread, and the k-order of the sum is fixed: results are deterministic.
template <typename Ep>
__device__ __forceinline__ void ctaGemm(int M, int N, int K, SMat A, SMat B,
                                        Ep &&ep) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tilesN = N >> 4, tiles = (M >> 4) * tilesN;
  for (int tile = warp; tile < tiles; tile += nwarps) {
    const int m0 = (tile / tilesN) << 4, n0 = (tile % tilesN) << 4;
    float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k0 = 0; k0 < K; k0 += 16) {
      uint32_t a[4], b0[2], b1[2];
      a[0] = A.pair(m0 + g, k0 + 2 * t);
      a[1] = A.pair(m0 + g + 8, k0 + 2 * t);
      a[2] = A.pair(m0 + g, k0 + 2 * t + 8);
      a[3] = A.pair(m0 + g + 8, k0 + 2 * t + 8);
      b0[0] = B.pairRows(k0 + 2 * t, n0 + g);
      b0[1] = B.pairRows(k0 + 2 * t + 8, n0 + g);
      b1[0] = B.pairRows(k0 + 2 * t, n0 + 8 + g);
      b1[1] = B.pairRows(k0 + 2 * t + 8, n0 + 8 + g);
      mma16816(c0, a, b0);
      mma16816(c1, a, b1);
    }
    ep(m0 + g, n0 + 2 * t, c0[0]);
    ep(m0 + g, n0 + 2 * t + 1, c0[1]);
    ep(m0 + g + 8, n0 + 2 * t, c0[2]);
    ep(m0 + g + 8, n0 + 2 * t + 1, c0[3]);
    ep(m0 + g, n0 + 8 + 2 * t, c1[0]);
    ep(m0 + g, n0 + 8 + 2 * t + 1, c1[1]);
    ep(m0 + g + 8, n0 + 8 + 2 * t, c1[2]);
    ep(m0 + g + 8, n0 + 8 + 2 * t + 1, c1[3]);
  }
}

} // namespace ap::kernels::gdncuda

#endif // ACTPLACE_KERNELS_CUDA_GDN_GDN_COMMON_CUH
