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
      std::fprintf(stderr, "gdn cuda: %s failed: %s (%s:%d)\n", #call,         \
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

/// A bf16 matrix view in shared memory: element (r, c) at p[r*rs + c*cs],
/// where one of rs, cs is 1 (row-major, or a transposed view of a row-major
/// tile). Pitches are multiples of 8 elements and tiles 16-byte aligned, so
/// fragments load with ldmatrix (8 rows of 16 bytes per 8x8 matrix).
struct SMat {
  const bf *p;
  int rs, cs;
  __device__ __forceinline__ bool trans() const { return cs != 1; }
  __device__ __forceinline__ int ld() const { return cs != 1 ? cs : rs; }
};

__device__ __forceinline__ void ldsm4(uint32_t r[4], const bf *p) {
  uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm4t(uint32_t r[4], const bf *p) {
  uint32_t a = uint32_t(__cvta_generic_to_shared(p));
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(a));
}

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
  const int j = lane & 7, lo = (lane >> 3) & 1, hi = lane >> 4;
  const int tilesN = N >> 4, tiles = (M >> 4) * tilesN;
  const bool at = A.trans(), bt = B.trans();
  const int lda = A.ld(), ldb = B.ld();
  for (int tile = warp; tile < tiles; tile += nwarps) {
    const int m0 = (tile / tilesN) << 4, n0 = (tile % tilesN) << 4;
    float c0[4] = {0.f, 0.f, 0.f, 0.f}, c1[4] = {0.f, 0.f, 0.f, 0.f};
    // Per-lane row addresses of the four 8x8 matrices (see PTX ldmatrix):
    // A as (m 0-7|8-15) x (k 0-7|8-15); B as (n 0-7|8-15) x (k 0-7|8-15).
    const bf *pa = at ? A.p + (j + hi * 8) * lda + m0 + lo * 8
                      : A.p + (m0 + j + lo * 8) * lda + hi * 8;
    const bf *pb = bt ? B.p + (n0 + j + hi * 8) * ldb + lo * 8
                      : B.p + (j + lo * 8) * ldb + n0 + hi * 8;
    const int stepA = at ? 16 * lda : 16, stepB = bt ? 16 : 16 * ldb;
    for (int k0 = 0; k0 < K; k0 += 16) {
      uint32_t a[4], b[4];
      if (at)
        ldsm4t(a, pa);
      else
        ldsm4(a, pa);
      if (bt)
        ldsm4(b, pb);
      else
        ldsm4t(b, pb);
      pa += stepA;
      pb += stepB;
      mma16816(c0, a, b);
      mma16816(c1, a, b + 2);
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

/// ctaGemm accumulating into registers: acc[i] is this warp's i-th 16x16
/// tile (tile = warp + i * nwarps; elements ordered as tileElem gives them).
/// NT >= ceil(tiles / nwarps); slots past the last tile are left alone.
template <int NT>
__device__ __forceinline__ void ctaGemmAcc(int M, int N, int K, SMat A, SMat B,
                                           float (&acc)[NT][8]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int j = lane & 7, lo = (lane >> 3) & 1, hi = lane >> 4;
  const int tilesN = N >> 4, tiles = (M >> 4) * tilesN;
  const bool at = A.trans(), bt = B.trans();
  const int lda = A.ld(), ldb = B.ld();
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const int tile = warp + i * nwarps;
    if (tile >= tiles)
      break;
    const int m0 = (tile / tilesN) << 4, n0 = (tile % tilesN) << 4;
    const bf *pa = at ? A.p + (j + hi * 8) * lda + m0 + lo * 8
                      : A.p + (m0 + j + lo * 8) * lda + hi * 8;
    const bf *pb = bt ? B.p + (n0 + j + hi * 8) * ldb + lo * 8
                      : B.p + (j + lo * 8) * ldb + n0 + hi * 8;
    const int stepA = at ? 16 * lda : 16, stepB = bt ? 16 : 16 * ldb;
    for (int k0 = 0; k0 < K; k0 += 16) {
      uint32_t a[4], b[4];
      if (at)
        ldsm4t(a, pa);
      else
        ldsm4(a, pa);
      if (bt)
        ldsm4(b, pb);
      else
        ldsm4t(b, pb);
      pa += stepA;
      pb += stepB;
      mma16816(&acc[i][0], a, b);
      mma16816(&acc[i][4], a, b + 2);
    }
  }
}

/// Whether register tile i of this thread exists for an (M, N) product, and
/// its origin.
__device__ __forceinline__ bool tileOrigin(int M, int N, int i, int &m0,
                                           int &n0) {
  const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int tilesN = N >> 4, tile = warp + i * nwarps;
  if (tile >= (M >> 4) * tilesN)
    return false;
  m0 = (tile / tilesN) << 4;
  n0 = (tile % tilesN) << 4;
  return true;
}
/// Row and column of element e (0..7) of a register tile at (m0, n0).
__device__ __forceinline__ int tileRow(int m0, int e) {
  return m0 + ((threadIdx.x & 31) >> 2) + ((e >> 1) & 1) * 8;
}
__device__ __forceinline__ int tileCol(int n0, int e) {
  return n0 + ((e >> 2) & 1) * 8 + 2 * (threadIdx.x & 3) + (e & 1);
}

/// Asynchronous 16-byte global -> shared copy; srcBytes 0 zero-fills.
__device__ __forceinline__ void cpAsync16(void *dst, const void *src,
                                          int srcBytes) {
  uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d),
               "l"(src), "r"(srcBytes));
}
__device__ __forceinline__ void cpAsync4(void *dst, const void *src) {
  uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n");
}
template <int N> __device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

} // namespace ap::kernels::gdncuda

#endif // ACTPLACE_KERNELS_CUDA_GDN_GDN_COMMON_CUH
