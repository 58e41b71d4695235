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

__device__ __forceinline__ void ldsm4s(uint32_t r[4], uint32_t a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm4ts(uint32_t r[4], uint32_t a) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(a));
}

/// Warps of every CTA that calls ctaGemm / ctaGemmAcc (256 threads).
constexpr int kGemmWarps = 8;

/// Shared-memory addresses of this lane's ldmatrix rows for the 16x16 output
/// tile `tile` of an (M, N) product, and the per-k-step advance.
struct TileAddr {
  uint32_t a, b;
};
__device__ __forceinline__ TileAddr tileAddr(int tile, int tilesN, SMat A,
                                             SMat B) {
  const int lane = threadIdx.x & 31;
  const int j = lane & 7, lo = (lane >> 3) & 1, hi = lane >> 4;
  const int m0 = (tile / tilesN) << 4, n0 = (tile % tilesN) << 4;
  const int lda = A.ld(), ldb = B.ld();
  // Per-lane row addresses of the four 8x8 matrices (see PTX ldmatrix):
  // A as (m 0-7|8-15) x (k 0-7|8-15); B as (n 0-7|8-15) x (k 0-7|8-15).
  const bf *pa = A.trans() ? A.p + (j + hi * 8) * lda + m0 + lo * 8
                           : A.p + (m0 + j + lo * 8) * lda + hi * 8;
  const bf *pb = B.trans() ? B.p + (n0 + j + hi * 8) * ldb + lo * 8
                           : B.p + (j + lo * 8) * ldb + n0 + hi * 8;
  return {uint32_t(__cvta_generic_to_shared(pa)),
          uint32_t(__cvta_generic_to_shared(pb))};
}

/// One k step (16) of a 16x16 tile: c[0..3] columns n0..n0+7, c[4..7]
/// n0+8..n0+15.
__device__ __forceinline__ void tileStep(float c[8], TileAddr &t, bool at,
                                         bool bt, uint32_t stepA,
                                         uint32_t stepB) {
  uint32_t a[4], b[4];
  if (at)
    ldsm4ts(a, t.a);
  else
    ldsm4s(a, t.a);
  if (bt)
    ldsm4s(b, t.b);
  else
    ldsm4ts(b, t.b);
  t.a += stepA;
  t.b += stepB;
  mma16816(c, a, b);
  mma16816(c + 4, a, b + 2);
}

/// C[M,N] = A[M,K] B[K,N] over the CTA's kGemmWarps warps (M, N, K multiples
/// of 16), warp w taking the 16x16 output tiles w, w + kGemmWarps, ...; two
/// tiles at a time, their k steps interleaved (independent mma chains). The
/// epilogue ep(m, n, v) is called once per output element. The tile ->
/// thread map depends only on (M, N), so two calls of the same shape hand
/// element (m, n) to the same thread, and the k-order of the sum is fixed:
/// results are deterministic.
template <typename Ep>
__device__ __forceinline__ void ctaGemm(int M, int N, int K, SMat A, SMat B,
                                        Ep &&ep) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int tilesN = N >> 4, tiles = (M >> 4) * tilesN;
  const bool at = A.trans(), bt = B.trans();
  const uint32_t stepA = 2 * (at ? 16 * A.ld() : 16);
  const uint32_t stepB = 2 * (bt ? 16 : 16 * B.ld());
  for (int tile0 = warp; tile0 < tiles; tile0 += 2 * kGemmWarps) {
    const int tile1 = tile0 + kGemmWarps;
    const bool two = tile1 < tiles;
    TileAddr ta[2] = {tileAddr(tile0, tilesN, A, B),
                      tileAddr(two ? tile1 : tile0, tilesN, A, B)};
    float c[2][8] = {};
    for (int k0 = 0; k0 < K; k0 += 16) {
      tileStep(c[0], ta[0], at, bt, stepA, stepB);
      if (two)
        tileStep(c[1], ta[1], at, bt, stepA, stepB);
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if (u == 1 && !two)
        break;
      const int tile = u ? tile1 : tile0;
      const int m0 = (tile / tilesN) << 4, n0 = (tile % tilesN) << 4;
      ep(m0 + g, n0 + 2 * t, c[u][0]);
      ep(m0 + g, n0 + 2 * t + 1, c[u][1]);
      ep(m0 + g + 8, n0 + 2 * t, c[u][2]);
      ep(m0 + g + 8, n0 + 2 * t + 1, c[u][3]);
      ep(m0 + g, n0 + 8 + 2 * t, c[u][4]);
      ep(m0 + g, n0 + 8 + 2 * t + 1, c[u][5]);
      ep(m0 + g + 8, n0 + 8 + 2 * t, c[u][6]);
      ep(m0 + g + 8, n0 + 8 + 2 * t + 1, c[u][7]);
    }
  }
}

/// ctaGemm accumulating into registers: acc[i] is this warp's i-th 16x16
/// tile (tile = warp + i * kGemmWarps; elements ordered as tileElem gives
/// them), all NT tiles' k steps interleaved. NT >= ceil(tiles / kGemmWarps);
/// slots past the last tile are left alone.
template <int NT>
__device__ __forceinline__ void ctaGemmAcc(int M, int N, int K, SMat A, SMat B,
                                           float (&acc)[NT][8]) {
  const int warp = threadIdx.x >> 5;
  const int tilesN = N >> 4, tiles = (M >> 4) * tilesN;
  const bool at = A.trans(), bt = B.trans();
  const uint32_t stepA = 2 * (at ? 16 * A.ld() : 16);
  const uint32_t stepB = 2 * (bt ? 16 : 16 * B.ld());
  TileAddr ta[NT];
  bool has[NT];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const int tile = warp + i * kGemmWarps;
    has[i] = tile < tiles;
    ta[i] = tileAddr(has[i] ? tile : warp, tilesN, A, B);
  }
  for (int k0 = 0; k0 < K; k0 += 16) {
#pragma unroll
    for (int i = 0; i < NT; ++i)
      if (has[i])
        tileStep(acc[i], ta[i], at, bt, stepA, stepB);
  }
}

/// Whether register tile i of this thread exists for an (M, N) product, and
/// its origin.
__device__ __forceinline__ bool tileOrigin(int M, int N, int i, int &m0,
                                           int &n0) {
  const int warp = threadIdx.x >> 5;
  const int tilesN = N >> 4, tile = warp + i * kGemmWarps;
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
