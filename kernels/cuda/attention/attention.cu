//===- attention.cu - flash-style causal attention on CUDA ------*- C++ -*-===//
//
// Causal GQA/MLA attention, BF16 storage, FP32 accumulation and softmax,
// mma.sync m16n8k16 tensor-core tiles (portable to sm_80+). On Hopper, for
// head dims whose accumulators fit in registers (DV <= 128, DQK <= 192: the
// MLA shapes), sm_90a builds run wgmma versions of the forward, dK/dV and
// dQ-from-dS kernels instead (section "Hopper path" below; same algorithms,
// outputs and determinism). FlashAttention-2 structure:
//
//  forward   one block per (q tile of 64 rows, q head, batch); 4 warps own 16
//            query rows each; K/V tiles of 64 keys stream through shared
//            memory (cp.async; the V load overlaps Q K^T, the next K load
//            overlaps P V); online softmax in the exp2 domain; lse saved.
//  backward  three deterministic passes instead of FA2's atomic dQ:
//            1. D = rowsum(dO * O) (fp32, one warp per row),
//            2. dK/dV: one block per (kv tile, q head, batch) walks the q
//               tiles it sees; P^T and dS^T go through shared memory so that
//               8 warps can split the D columns of the dK/dV accumulators,
//            3. dQ: one block per (q tile, q head, batch) walks its kv tiles
//               and either multiplies the bf16 dS tiles that pass 2 stored
//               by K (StoredDs, the default) or recomputes S and dP
//               (RecomputeDq: two extra GEMMs, no scratch); either way no
//               float atomics.
//            With GQA each q head writes fp32 dK/dV partials to the workspace
//            and a last pass sums a group's partials in increasing head
//            order, so no thread ever races on an output.
// Blocks are ordered heaviest first (long causal rows start first) because
// grids are dispatched in linear block order.
//
// Shared-memory tiles hold rows of D bf16 split into 16-byte chunks; chunk c
// of row r is stored at chunk c ^ (r & 7), so the 8 row addresses of an
// ldmatrix phase hit 8 distinct bank groups.
//
//===----------------------------------------------------------------------===//
#include "kernels/cuda/attention/wgmma_sm90.cuh"
#include "kernels/cuda/documents.h"
#include "kernels/kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

namespace ap::kernels::cuda {
namespace {

#define AP_ATTN_CUDA_CHECK(call)                                               \
  do {                                                                         \
    cudaError_t err_ = (call);                                                 \
    if (err_ != cudaSuccess) {                                                 \
      std::fprintf(stderr, "actplace attention: %s failed: %s\n", #call,       \
                   cudaGetErrorString(err_));                                  \
      return Status::BackendError;                                             \
    }                                                                          \
  } while (0)

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

//===----------------------------------------------------------------------===//
// PTX wrappers
//===----------------------------------------------------------------------===//

__device__ __forceinline__ uint32_t smemAddr(const void *p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte async copy; when !valid the destination is zero-filled (src-size
/// 0), which is how rows past T enter the tiles.
__device__ __forceinline__ void cpAsync16(uint32_t dst, const void *src,
                                          bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(src), "r"(valid ? 16 : 0));
}
/// 4-byte async copy (zero-filled when !valid).
__device__ __forceinline__ void cpAsync4(uint32_t dst, const void *src,
                                         bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst),
               "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(addr));
}

/// d += a * b, 16x8x16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t packBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

//===----------------------------------------------------------------------===//
// Swizzled shared-memory tiles
//===----------------------------------------------------------------------===//

/// Byte offset of element (r, c) in a tile whose rows hold D bf16.
template <int D> __device__ __forceinline__ uint32_t swz(int r, int c) {
  return r * (D * 2) + ((((c >> 3) ^ (r & 7))) << 4) + (c & 7) * 2;
}

/// A operand (16x16) at (r0, k0) of a row-major tile: rows are M, cols are K.
template <int D>
__device__ __forceinline__ uint32_t addrA(uint32_t base, int r0, int k0,
                                          int lane) {
  return base + swz<D>(r0 + (lane & 15), k0 + ((lane >> 4) << 3));
}
/// B operand for two n-tiles (n0, n0+8) x k16 from a tile stored [n][k]
/// (plain ldmatrix): regs 0,1 -> n-tile n0, regs 2,3 -> n-tile n0+8.
template <int D>
__device__ __forceinline__ uint32_t addrBn(uint32_t base, int n0, int k0,
                                           int lane) {
  return base + swz<D>(n0 + ((lane >> 4) << 3) + (lane & 7),
                       k0 + (((lane >> 3) & 1) << 3));
}
/// B operand for two n-tiles x k16 from a tile stored [k][n] (ldmatrix.trans).
template <int D>
__device__ __forceinline__ uint32_t addrBt(uint32_t base, int k0, int n0,
                                           int lane) {
  return base + swz<D>(k0 + (((lane >> 3) & 1) << 3) + (lane & 7),
                       n0 + ((lane >> 4) << 3));
}

/// A operand (16x16) at (m0, k0) from a tile stored [k][m] (ldmatrix.trans).
template <int D>
__device__ __forceinline__ uint32_t addrAt(uint32_t base, int m0, int k0,
                                           int lane) {
  return base + swz<D>(k0 + ((lane >> 4) << 3) + (lane & 7),
                       m0 + (((lane >> 3) & 1) << 3));
}

/// Async copy of `rows` rows of D bf16 (row r at g + r*stride elements) into a
/// swizzled tile (PANELS: the 128-byte panels of the wgmma path, see
/// wgmma_sm90.cuh); rows at or past `valid` are zero-filled.
template <int ROWS, int D, int NT, bool PANELS = false>
__device__ __forceinline__ void loadTile(uint32_t dst, const __nv_bfloat16 *g,
                                         int64_t stride, int valid, int tid) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int idx = tid; idx < ROWS * kChunks; idx += NT) {
    int r = idx / kChunks, c = idx % kChunks;
    bool ok = r < valid;
    const __nv_bfloat16 *src = ok ? g + r * stride + c * 8 : g;
    cpAsync16(dst + (PANELS ? sm90::pan<ROWS>(r, c * 8) : swz<D>(r, c * 8)),
              src, ok);
  }
}

struct Params {
  const __nv_bfloat16 *q, *k, *v, *o, *dO;
  __nv_bfloat16 *oOut, *dq, *dk, *dv;
  float *lse;             // forward output
  const float *lseIn;     // backward input
  float *Dd;              // [B, Hq, T]
  float *dkPart, *dvPart; // [B, Hq, T, D] when group > 1
  /// dS tiles (StoredDs backward): per (batch, q head) of the launched chunk,
  /// the causal 64x64 tiles (i >= j) at index i(i+1)/2 + j, each stored as
  /// dS^T [kv][q] with the shared-memory swizzle (a raw copy of the tile).
  __nv_bfloat16 *dsBuf;
  int bhOffset; // first (batch * Hq + head) of this launch
  int B, T, Hq, Hkv, group;
  /// Distance between consecutive (batch, head) rows of lse: T, or the
  /// packed row's length when the launch covers one document of it.
  int64_t lsePitch;
  float scale, scaleLog2;
};

/// One (batch, q head)'s rows of every tensor (row r of q at q + r*qStride,
/// and so on) and of lse and D.
template <int DQK, int DV> struct HeadRows {
  int64_t qStride, kStride, vStride, oStride;
  const __nv_bfloat16 *q, *dO, *k, *v;
  const float *lse, *D;
  __device__ HeadRows(const Params &p, int b, int h, int hk)
      : qStride(int64_t(p.Hq) * DQK), kStride(int64_t(p.Hkv) * DQK),
        vStride(int64_t(p.Hkv) * DV), oStride(int64_t(p.Hq) * DV),
        q(p.q + (int64_t(b) * p.T * p.Hq + h) * DQK),
        dO(p.dO + (int64_t(b) * p.T * p.Hq + h) * DV),
        k(p.k + (int64_t(b) * p.T * p.Hkv + hk) * DQK),
        v(p.v + (int64_t(b) * p.T * p.Hkv + hk) * DV),
        lse(p.lseIn + (int64_t(b) * p.Hq + h) * p.lsePitch),
        D(p.Dd + (int64_t(b) * p.Hq + h) * p.T) {}
};

//===----------------------------------------------------------------------===//
// Forward
//===----------------------------------------------------------------------===//

template <int DQK, int DV> struct FwdCfg {
  /// Query m16 tiles per warp. Two tiles let every K/V fragment read from
  /// shared memory feed twice the MMAs (shared-memory bandwidth bounds this
  /// kernel); they need 2 x DV/2 accumulator registers, so only DV <= 128.
  static constexpr int kMt = DV <= 128 ? 2 : 1;
  static constexpr int kThreads = 128, kBr = 64 * kMt, kBc = 64;
  static constexpr int kSmem = (kBr * DQK + kBc * DQK + kBc * DV) * 2;
};

template <int DQK, int DV>
__global__ void __launch_bounds__(128) attnFwdKernel(Params p) {
  using C = FwdCfg<DQK, DV>;
  constexpr int BR = C::kBr, BC = C::kBc, MT = C::kMt;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smemAddr(smem);
  const uint32_t sK = sQ + BR * DQK * 2;
  const uint32_t sV = sK + BC * DQK * 2;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.x;
  const int b = bh / p.Hq, h = bh % p.Hq, hk = h / p.group;
  const int numQ = (p.T + BR - 1) / BR;
  const int qt = numQ - 1 - blockIdx.y; // heaviest tiles first
  const int q0 = qt * BR;
  const int T = p.T;
  const int wRow0 = warp * 16 * MT; // first row of this warp in the tile

  const HeadRows<DQK, DV> hr(p, b, h, hk);

  const int numK = min((T + BC - 1) / BC, (q0 + BR - 1) / BC + 1);

  loadTile<BR, DQK, 128>(sQ, hr.q + q0 * hr.qStride, hr.qStride, T - q0, tid);
  loadTile<BC, DQK, 128>(sK, hr.k, hr.kStride, T, tid);
  cpAsyncCommit();

  float oAcc[MT][DV / 8][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int i = 0; i < DV / 8; ++i)
      oAcc[m][i][0] = oAcc[m][i][1] = oAcc[m][i][2] = oAcc[m][i][3] = 0.f;
  float mRow[MT][2], lRow[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    mRow[m][0] = mRow[m][1] = -INFINITY;
    lRow[m][0] = lRow[m][1] = 0.f;
  }

  for (int kt = 0; kt < numK; ++kt) {
    const int k0 = kt * BC;
    cpAsyncWait<0>();
    __syncthreads(); // K tile ready; every warp is done with the last V
    loadTile<BC, DV, 128>(sV, hr.v + k0 * hr.vStride, hr.vStride, T - k0, tid);
    cpAsyncCommit();

    float s[MT][BC / 8][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int i = 0; i < BC / 8; ++i)
        s[m][i][0] = s[m][i][1] = s[m][i][2] = s[m][i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m)
        ldsm4(a[m], addrA<DQK>(sQ, wRow0 + m * 16, kk * 16, lane));
#pragma unroll
      for (int nn = 0; nn < BC / 16; ++nn) {
        uint32_t bb[4];
        ldsm4(bb, addrBn<DQK>(sK, nn * 16, kk * 16, lane));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma16816(s[m][2 * nn], a[m], bb[0], bb[1]);
          mma16816(s[m][2 * nn + 1], a[m], bb[2], bb[3]);
        }
      }
    }

    if (k0 + BC - 1 > q0 + wRow0 || k0 + BC > T) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            int col = k0 + nt * 8 + 2 * t4 + (c & 1);
            int row = q0 + wRow0 + m * 16 + g + 8 * (c >> 1);
            if (col > row || col >= T)
              s[m][nt][c] = -INFINITY;
          }
    }

#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt)
          mx = fmaxf(mx, fmaxf(s[m][nt][2 * hf], s[m][nt][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // Column 0 of the first tile is visible to every row, so mNew is
        // finite from the first tile on.
        const float mNew = fmaxf(mRow[m][hf], mx * p.scaleLog2);
        const float alpha = exp2f(mRow[m][hf] - mNew);
        mRow[m][hf] = mNew;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float pv = exp2f(fmaf(s[m][nt][2 * hf + e], p.scaleLog2, -mNew));
            s[m][nt][2 * hf + e] = pv;
            sum += pv;
          }
        lRow[m][hf] = lRow[m][hf] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < DV / 8; ++dt) {
          oAcc[m][dt][2 * hf] *= alpha;
          oAcc[m][dt][2 * hf + 1] *= alpha;
        }
      }

    cpAsyncWait<0>();
    __syncthreads(); // V tile ready; every warp is done with this K
    if (kt + 1 < numK) {
      const int kn = k0 + BC;
      loadTile<BC, DQK, 128>(sK, hr.k + kn * hr.kStride, hr.kStride, T - kn,
                             tid);
      cpAsyncCommit();
    }

#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        a[m][0] = packBf16(s[m][2 * kk][0], s[m][2 * kk][1]);
        a[m][1] = packBf16(s[m][2 * kk][2], s[m][2 * kk][3]);
        a[m][2] = packBf16(s[m][2 * kk + 1][0], s[m][2 * kk + 1][1]);
        a[m][3] = packBf16(s[m][2 * kk + 1][2], s[m][2 * kk + 1][3]);
      }
#pragma unroll
      for (int nn = 0; nn < DV / 16; ++nn) {
        uint32_t bb[4];
        ldsm4t(bb, addrBt<DV>(sV, kk * 16, nn * 16, lane));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          mma16816(oAcc[m][2 * nn], a[m], bb[0], bb[1]);
          mma16816(oAcc[m][2 * nn + 1], a[m], bb[2], bb[3]);
        }
      }
    }
  }

#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = lRow[m][hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = q0 + wRow0 + m * 16 + g + 8 * hf;
      if (row < T) {
        const float inv = 1.f / l;
        __nv_bfloat16 *gO = p.oOut + ((int64_t(b) * T + row) * p.Hq + h) * DV;
#pragma unroll
        for (int dt = 0; dt < DV / 8; ++dt)
          *reinterpret_cast<uint32_t *>(gO + dt * 8 + 2 * t4) = packBf16(
              oAcc[m][dt][2 * hf] * inv, oAcc[m][dt][2 * hf + 1] * inv);
        if (t4 == 0)
          p.lse[(int64_t(b) * p.Hq + h) * p.lsePitch + row] =
              mRow[m][hf] * kLn2 + logf(l);
      }
    }
}

//===----------------------------------------------------------------------===//
// Backward pass 1: D = rowsum(dO * O)
//===----------------------------------------------------------------------===//

template <int DV> __global__ void attnBwdDotKernel(Params p) {
  const int64_t rows = int64_t(p.B) * p.T * p.Hq;
  const int64_t row =
      int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows)
    return;
  const __nv_bfloat16 *o = p.o + row * DV, *d = p.dO + row * DV;
  float acc = 0.f;
  for (int c = lane * 8; c < DV; c += 32 * 8) {
    uint4 ov = *reinterpret_cast<const uint4 *>(o + c);
    uint4 dv = *reinterpret_cast<const uint4 *>(d + c);
    const __nv_bfloat162 *o2 = reinterpret_cast<const __nv_bfloat162 *>(&ov);
    const __nv_bfloat162 *d2 = reinterpret_cast<const __nv_bfloat162 *>(&dv);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float2 of = __bfloat1622float2(o2[e]), df = __bfloat1622float2(d2[e]);
      acc = fmaf(of.x, df.x, acc);
      acc = fmaf(of.y, df.y, acc);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) {
    // row enumerates [B, T, Hq]; D is stored [B, Hq, T] like lse.
    const int h = row % p.Hq;
    const int64_t bt = row / p.Hq;
    const int tt = bt % p.T;
    const int64_t bb = bt / p.T;
    p.Dd[(bb * p.Hq + h) * p.T + tt] = acc;
  }
}

//===----------------------------------------------------------------------===//
// Backward pass 2: dK, dV
//===----------------------------------------------------------------------===//

template <int DQK, int DV> struct BwdCfg {
  static constexpr int kThreads = 256, kBr = 64, kBc = 64;
  // dKdV: K, V, 2x(Q, dO), P^T, dS^T, 2x(lse, D)
  static constexpr int kSmemKV =
      (kBc * DQK + kBc * DV + 2 * kBr * DQK + 2 * kBr * DV + 2 * kBc * kBr) *
          2 +
      4 * kBr * 4;
  // dQ: Q, dO, 2x(K, V), dS, lse, D
  static constexpr int kSmemQ =
      (kBr * DQK + kBr * DV + 2 * kBc * DQK + 2 * kBc * DV + kBr * kBc) * 2 +
      2 * kBr * 4;
};

__device__ __forceinline__ void storePair(__nv_bfloat16 *dst, float a,
                                          float b) {
  *reinterpret_cast<uint32_t *>(dst) = packBf16(a, b);
}
__device__ __forceinline__ void storePair(float *dst, float a, float b) {
  *reinterpret_cast<float2 *>(dst) = make_float2(a, b);
}

/// Stores key row kv of dK (times scale) and dV, columns colK (colV) + 8 nt +
/// 2 t4 (+1) from the accumulator pairs (x[nt][2 hf], x[nt][2 hf + 1]): bf16
/// outputs without GQA, else this q head's fp32 partials.
template <int DQK, int DV, int NK, int NV>
__device__ __forceinline__ void
storeDkDvRow(const Params &p, int b, int h, int hk, int kv, int hf, int t4,
             int colK, int colV, const float (&dk)[NK][4],
             const float (&dv)[NV][4]) {
  auto row = [&](auto *gk, auto *gv) {
#pragma unroll
    for (int nt = 0; nt < NK; ++nt)
      storePair(gk + colK + nt * 8 + 2 * t4, dk[nt][2 * hf] * p.scale,
                dk[nt][2 * hf + 1] * p.scale);
#pragma unroll
    for (int nt = 0; nt < NV; ++nt)
      storePair(gv + colV + nt * 8 + 2 * t4, dv[nt][2 * hf],
                dv[nt][2 * hf + 1]);
  };
  const int64_t out = (int64_t(b) * p.T + kv) * p.Hkv + hk;
  const int64_t part = (int64_t(b) * p.Hq + h) * p.T + kv;
  if (p.group == 1)
    row(p.dk + out * DQK, p.dv + out * DV);
  else
    row(p.dkPart + part * DQK, p.dvPart + part * DV);
}

template <int DQK, int DV, bool STORE_DS>
__global__ void __launch_bounds__(256) attnBwdKVKernel(Params p) {
  using C = BwdCfg<DQK, DV>;
  constexpr int BR = C::kBr, BC = C::kBc;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sK = smemAddr(smem);
  const uint32_t sV = sK + BC * DQK * 2;
  const uint32_t sQ0 = sV + BC * DV * 2;       // two buffers of BR*DQK
  const uint32_t sO0 = sQ0 + 2 * BR * DQK * 2; // dO: two buffers of BR*DV
  const uint32_t sP = sO0 + 2 * BR * DV * 2;
  const uint32_t sS = sP + BC * BR * 2;
  float *stats = reinterpret_cast<float *>(smem + (sS + BC * BR * 2 - sK));
  // stats: [buf][lse(BR) | D(BR)]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int wr = warp & 3, wc = warp >> 2;
  const int bh = p.bhOffset + blockIdx.x;
  const int b = bh / p.Hq, h = bh % p.Hq, hk = h / p.group;
  const int kt = blockIdx.y; // low kv tiles see the most q tiles: first
  const int k0 = kt * BC;
  const int T = p.T;
  const int numQ = (T + BR - 1) / BR;
  const int qtStart = k0 / BR;

  const HeadRows<DQK, DV> hr(p, b, h, hk);

  // lse and D rows (64 floats each) are read into registers when the next q
  // tile is prefetched and stored to shared memory at the end of the step,
  // so their global latency hides under the step's math like cp.async does.
  auto loadQ = [&](int qt, int buf) {
    const int q0 = qt * BR;
    loadTile<BR, DQK, 256>(sQ0 + buf * BR * DQK * 2, hr.q + q0 * hr.qStride,
                           hr.qStride, T - q0, tid);
    loadTile<BR, DV, 256>(sO0 + buf * BR * DV * 2, hr.dO + q0 * hr.oStride,
                          hr.oStride, T - q0, tid);
  };
  auto loadStat = [&](int qt) {
    const int r = qt * BR + (tid & (BR - 1));
    if (tid >= 2 * BR || r >= T)
      return 0.f;
    return tid < BR ? hr.lse[r] : hr.D[r];
  };

  loadTile<BC, DQK, 256>(sK, hr.k + k0 * hr.kStride, hr.kStride, T - k0, tid);
  loadTile<BC, DV, 256>(sV, hr.v + k0 * hr.vStride, hr.vStride, T - k0, tid);
  loadQ(qtStart, 0);
  cpAsyncCommit();
  if (tid < 2 * BR)
    stats[tid] = loadStat(qtStart); // buffer 0: [lse | D]

  // Phase 2 splits the 64 x D accumulators over 2 row groups of 32 (two m16
  // tiles) x 4 column quarters, so that each dO/Q fragment read from shared
  // memory feeds two MMAs.
  const int pr = warp >> 2, pc = warp & 3;
  constexpr int NK = DQK / 4 / 8, NV = DV / 4 / 8; // n-tiles per warp
  float dkAcc[2][NK][4], dvAcc[2][NV][4];
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int i = 0; i < NK; ++i)
      dkAcc[m][i][0] = dkAcc[m][i][1] = dkAcc[m][i][2] = dkAcc[m][i][3] = 0.f;
#pragma unroll
    for (int i = 0; i < NV; ++i)
      dvAcc[m][i][0] = dvAcc[m][i][1] = dvAcc[m][i][2] = dvAcc[m][i][3] = 0.f;
  }

  // When they fit (MLA: 48 registers), this warp's K rows stay in registers
  // as MMA A fragments for the whole loop, so S^T reads only Q from shared
  // memory. Keeping V too (32 more) spilled at 255 registers.
  constexpr bool kRegK = DQK + DV <= 320;
  uint32_t kF[kRegK ? DQK / 16 : 1][4];
  if constexpr (kRegK) {
    cpAsyncWait<0>();
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk)
      ldsm4(kF[kk], addrA<DQK>(sK, wr * 16, kk * 16, lane));
  }

  for (int qt = qtStart; qt < numQ; ++qt) {
    const int buf = (qt - qtStart) & 1;
    const int q0 = qt * BR;
    // The only copies in flight are this step's. After the barrier every
    // warp is done with the previous step, so its buffers (the ones the next
    // tile goes to) and P^T/dS^T are free: two barriers per step, not three.
    cpAsyncWait<0>();
    __syncthreads();
    float statNext = 0.f;
    if (qt + 1 < numQ) {
      loadQ(qt + 1, buf ^ 1);
      cpAsyncCommit();
      statNext = loadStat(qt + 1);
    }
    const uint32_t sQ = sQ0 + buf * BR * DQK * 2;
    const uint32_t sO = sO0 + buf * BR * DV * 2;
    const float *sLse = stats + buf * 2 * BR;
    const float *sD = sLse + BR;

    // Phase 1: S^T and dP^T for kv rows wr*16.., q cols wc*32..
    float st[4][4], dpt[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        st[i][c] = dpt[i][c] = 0.f;
    if constexpr (kRegK) {
#pragma unroll
      for (int kk = 0; kk < DQK / 16; ++kk)
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          uint32_t bb[4];
          ldsm4(bb, addrBn<DQK>(sQ, wc * 32 + nn * 16, kk * 16, lane));
          mma16816(st[2 * nn], kF[kk], bb[0], bb[1]);
          mma16816(st[2 * nn + 1], kF[kk], bb[2], bb[3]);
        }
#pragma unroll 4
      for (int kk = 0; kk < DV / 16; ++kk) {
        uint32_t a[4];
        ldsm4(a, addrA<DV>(sV, wr * 16, kk * 16, lane));
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          uint32_t bb[4];
          ldsm4(bb, addrBn<DV>(sO, wc * 32 + nn * 16, kk * 16, lane));
          mma16816(dpt[2 * nn], a, bb[0], bb[1]);
          mma16816(dpt[2 * nn + 1], a, bb[2], bb[3]);
        }
      }
    } else {
      // Unrolled by 4, not fully: full unrolling hoisted every fragment and
      // spilled at 255 registers; by 4 it needs ~240 (D = 256).
#pragma unroll 4
      for (int kk = 0; kk < DQK / 16; ++kk) {
        uint32_t a[4];
        ldsm4(a, addrA<DQK>(sK, wr * 16, kk * 16, lane));
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          uint32_t bb[4];
          ldsm4(bb, addrBn<DQK>(sQ, wc * 32 + nn * 16, kk * 16, lane));
          mma16816(st[2 * nn], a, bb[0], bb[1]);
          mma16816(st[2 * nn + 1], a, bb[2], bb[3]);
        }
      }
#pragma unroll 4
      for (int kk = 0; kk < DV / 16; ++kk) {
        uint32_t a[4];
        ldsm4(a, addrA<DV>(sV, wr * 16, kk * 16, lane));
#pragma unroll
        for (int nn = 0; nn < 2; ++nn) {
          uint32_t bb[4];
          ldsm4(bb, addrBn<DV>(sO, wc * 32 + nn * 16, kk * 16, lane));
          mma16816(dpt[2 * nn], a, bb[0], bb[1]);
          mma16816(dpt[2 * nn + 1], a, bb[2], bb[3]);
        }
      }
    }
    unsigned char *smemBase = smem;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = wr * 16 + g + 8 * hf; // kv row in tile
        const int kv = k0 + r;
        float pv[2], ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = wc * 32 + nt * 8 + 2 * t4 + e; // q col in tile
          const int qi = q0 + c;
          const bool keep = kv <= qi && qi < T;
          const float lse2 = sLse[c] * kLog2e;
          float pe = exp2f(fmaf(st[nt][2 * hf + e], p.scaleLog2, -lse2));
          pe = keep ? pe : 0.f;
          pv[e] = pe;
          ds[e] = keep ? pe * (dpt[nt][2 * hf + e] - sD[c]) : 0.f;
        }
        const int c0 = wc * 32 + nt * 8 + 2 * t4;
        *reinterpret_cast<uint32_t *>(smemBase + (sP - sK) + swz<BR>(r, c0)) =
            packBf16(pv[0], pv[1]);
        *reinterpret_cast<uint32_t *>(smemBase + (sS - sK) + swz<BR>(r, c0)) =
            packBf16(ds[0], ds[1]);
      }
    }
    __syncthreads();

    if constexpr (STORE_DS) {
      // Raw copy of the swizzled dS^T tile for the dQ pass (8 KB, 2 chunks of
      // 16 bytes per thread).
      const int64_t tile = int64_t(blockIdx.x) * ((numQ * (numQ + 1)) / 2) +
                           (qt * (qt + 1)) / 2 + kt;
      const uint4 *src = reinterpret_cast<const uint4 *>(smem + (sS - sK));
      uint4 *dst = reinterpret_cast<uint4 *>(p.dsBuf + tile * (BC * BR));
#pragma unroll
      for (int c = tid; c < BC * BR / 8; c += 256)
        dst[c] = src[c];
    }

    // Phase 2: dV += P^T dO, dK += dS^T Q for kv rows pr*32.., column
    // quarter pc.
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m)
        ldsm4(a[m], addrA<BR>(sP, pr * 32 + m * 16, kk * 16, lane));
#pragma unroll
      for (int nn = 0; nn < NV / 2; ++nn) {
        uint32_t bb[4];
        ldsm4t(bb, addrBt<DV>(sO, kk * 16, pc * (DV / 4) + nn * 16, lane));
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          mma16816(dvAcc[m][2 * nn], a[m], bb[0], bb[1]);
          mma16816(dvAcc[m][2 * nn + 1], a[m], bb[2], bb[3]);
        }
      }
#pragma unroll
      for (int m = 0; m < 2; ++m)
        ldsm4(a[m], addrA<BR>(sS, pr * 32 + m * 16, kk * 16, lane));
#pragma unroll
      for (int nn = 0; nn < NK / 2; ++nn) {
        uint32_t bb[4];
        ldsm4t(bb, addrBt<DQK>(sQ, kk * 16, pc * (DQK / 4) + nn * 16, lane));
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          mma16816(dkAcc[m][2 * nn], a[m], bb[0], bb[1]);
          mma16816(dkAcc[m][2 * nn + 1], a[m], bb[2], bb[3]);
        }
      }
    }
    if (tid < 2 * BR)
      stats[(buf ^ 1) * 2 * BR + tid] = statNext; // last read one step ago
  }

  // Epilogue: rows kv = k0 + pr*32 + m*16 + g (+8), column quarter pc.
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int kv = k0 + pr * 32 + m * 16 + g + 8 * hf;
      if (kv >= T)
        continue;
      storeDkDvRow<DQK, DV>(p, b, h, hk, kv, hf, t4, pc * (DQK / 4),
                            pc * (DV / 4), dkAcc[m], dvAcc[m]);
    }
}

/// Sums a GQA group's fp32 dK/dV partials in increasing q-head order.
template <int DQK, int DV> __global__ void attnBwdGroupSumKernel(Params p) {
  const int64_t perRow = DQK + DV;
  const int64_t total = int64_t(p.B) * p.T * p.Hkv * perRow;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
       idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    const int d = idx % perRow;
    const int64_t row = idx / perRow; // [B, T, Hkv]
    const int hk = row % p.Hkv;
    const int64_t bt = row / p.Hkv;
    const int tt = bt % p.T;
    const int64_t bb = bt / p.T;
    float acc = 0.f;
    for (int r = 0; r < p.group; ++r) {
      const int64_t hrow = (bb * p.Hq + hk * p.group + r) * p.T + tt;
      acc += d < DQK ? p.dkPart[hrow * DQK + d] : p.dvPart[hrow * DV + d - DQK];
    }
    if (d < DQK)
      p.dk[row * DQK + d] = __float2bfloat16_rn(acc);
    else
      p.dv[row * DV + d - DQK] = __float2bfloat16_rn(acc);
  }
}

//===----------------------------------------------------------------------===//
// Backward pass 3: dQ
//===----------------------------------------------------------------------===//

template <int DQK, int DV>
__global__ void __launch_bounds__(256) attnBwdQKernel(Params p) {
  using C = BwdCfg<DQK, DV>;
  constexpr int BR = C::kBr, BC = C::kBc;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smemAddr(smem);
  const uint32_t sO = sQ + BR * DQK * 2;
  const uint32_t sK0 = sO + BR * DV * 2;       // two buffers of BC*DQK
  const uint32_t sV0 = sK0 + 2 * BC * DQK * 2; // two buffers of BC*DV
  const uint32_t sS = sV0 + 2 * BC * DV * 2;
  float *sLse = reinterpret_cast<float *>(smem + (sS + BR * BC * 2 - sQ));
  float *sD = sLse + BR;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  const int wr = warp & 3, wc = warp >> 2;
  const int bh = p.bhOffset + blockIdx.x;
  const int b = bh / p.Hq, h = bh % p.Hq, hk = h / p.group;
  const int T = p.T;
  const int numQ = (T + BR - 1) / BR;
  const int qt = numQ - 1 - blockIdx.y;
  const int q0 = qt * BR;
  const int numK = min((T + BC - 1) / BC, (q0 + BR - 1) / BC + 1);

  const HeadRows<DQK, DV> hr(p, b, h, hk);

  auto loadKV = [&](int kt, int buf) {
    const int k0 = kt * BC;
    loadTile<BC, DQK, 256>(sK0 + buf * BC * DQK * 2, hr.k + k0 * hr.kStride,
                           hr.kStride, T - k0, tid);
    loadTile<BC, DV, 256>(sV0 + buf * BC * DV * 2, hr.v + k0 * hr.vStride,
                          hr.vStride, T - k0, tid);
  };
  loadTile<BR, DQK, 256>(sQ, hr.q + q0 * hr.qStride, hr.qStride, T - q0, tid);
  loadTile<BR, DV, 256>(sO, hr.dO + q0 * hr.oStride, hr.oStride, T - q0, tid);
  if (tid < 2 * BR) {
    const int r = q0 + (tid & (BR - 1));
    const float *src = tid < BR ? hr.lse : hr.D;
    sLse[tid] = r < T ? src[r] : 0.f; // sD follows sLse
  }
  loadKV(0, 0);
  cpAsyncCommit();

  constexpr int NQ = DQK / 2 / 8;
  float dqAcc[NQ][4];
#pragma unroll
  for (int i = 0; i < NQ; ++i)
    dqAcc[i][0] = dqAcc[i][1] = dqAcc[i][2] = dqAcc[i][3] = 0.f;

  for (int kt = 0; kt < numK; ++kt) {
    const int buf = kt & 1;
    const int k0 = kt * BC;
    if (kt + 1 < numK) {
      loadKV(kt + 1, buf ^ 1);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    const uint32_t sK = sK0 + buf * BC * DQK * 2;
    const uint32_t sV = sV0 + buf * BC * DV * 2;

    // Phase 1: S and dP for q rows wr*16.., kv cols wc*32..
    float s[4][4], dp[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        s[i][c] = dp[i][c] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DQK / 16; ++kk) {
      uint32_t a[4];
      ldsm4(a, addrA<DQK>(sQ, wr * 16, kk * 16, lane));
#pragma unroll
      for (int nn = 0; nn < 2; ++nn) {
        uint32_t bb[4];
        ldsm4(bb, addrBn<DQK>(sK, wc * 32 + nn * 16, kk * 16, lane));
        mma16816(s[2 * nn], a, bb[0], bb[1]);
        mma16816(s[2 * nn + 1], a, bb[2], bb[3]);
      }
    }
#pragma unroll
    for (int kk = 0; kk < DV / 16; ++kk) {
      uint32_t a[4];
      ldsm4(a, addrA<DV>(sO, wr * 16, kk * 16, lane));
#pragma unroll
      for (int nn = 0; nn < 2; ++nn) {
        uint32_t bb[4];
        ldsm4(bb, addrBn<DV>(sV, wc * 32 + nn * 16, kk * 16, lane));
        mma16816(dp[2 * nn], a, bb[0], bb[1]);
        mma16816(dp[2 * nn + 1], a, bb[2], bb[3]);
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = wr * 16 + g + 8 * hf; // q row in tile
      const int qi = q0 + r;
      const float lse2 = sLse[r] * kLog2e;
      const float Dr = sD[r];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        float ds[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int kv = k0 + wc * 32 + nt * 8 + 2 * t4 + e;
          const bool keep = kv <= qi && qi < T;
          float pe = exp2f(fmaf(s[nt][2 * hf + e], p.scaleLog2, -lse2));
          ds[e] = keep ? pe * (dp[nt][2 * hf + e] - Dr) : 0.f;
        }
        const int c0 = wc * 32 + nt * 8 + 2 * t4;
        *reinterpret_cast<uint32_t *>(smem + (sS - sQ) + swz<BC>(r, c0)) =
            packBf16(ds[0], ds[1]);
      }
    }
    __syncthreads();

    // Phase 2: dQ += dS K for q rows wr*16.., column half wc.
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t a[4];
      ldsm4(a, addrA<BC>(sS, wr * 16, kk * 16, lane));
#pragma unroll
      for (int nn = 0; nn < NQ / 2; ++nn) {
        uint32_t bb[4];
        ldsm4t(bb, addrBt<DQK>(sK, kk * 16, wc * (DQK / 2) + nn * 16, lane));
        mma16816(dqAcc[2 * nn], a, bb[0], bb[1]);
        mma16816(dqAcc[2 * nn + 1], a, bb[2], bb[3]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int qi = q0 + wr * 16 + g + 8 * hf;
    if (qi >= T)
      continue;
    __nv_bfloat16 *dq = p.dq + ((int64_t(b) * T + qi) * p.Hq + h) * DQK;
#pragma unroll
    for (int nt = 0; nt < NQ; ++nt)
      *reinterpret_cast<uint32_t *>(dq + wc * (DQK / 2) + nt * 8 + 2 * t4) =
          packBf16(dqAcc[nt][2 * hf] * p.scale,
                   dqAcc[nt][2 * hf + 1] * p.scale);
  }
}

/// Query rows per block of the dQ-from-dS pass. This pass streams a K tile
/// and the stored dS tiles from L2/HBM for every (q tile, kv tile) pair and is
/// bound by that traffic; 128 rows halve the K traffic per FLOP. With D = 256
/// the 128 x 256 accumulator would need 128 registers per thread and one
/// block per SM, so that shape keeps 64 rows.
template <int DQK> constexpr int dqRows() { return DQK <= 192 ? 128 : 64; }

/// dQ from the dS tiles the dK/dV pass stored: one block per (q tile, q
/// head, batch), dQ = scale sum_j dS_ij K_j over j ascending. A q tile of
/// BR = 64 * S rows reads S stored 64x64 tiles per kv tile (zeros where a
/// tile lies above the diagonal or past T).
/// Two blocks per SM (at most 128 registers per thread) to keep more loads
/// in flight.
template <int DQK>
__global__ void __launch_bounds__(256, 2) attnBwdQFromDsKernel(Params p) {
  constexpr int BR = dqRows<DQK>(), BC = 64, S = BR / 64;
  constexpr int RG = BR / 32, CG = 8 / RG; // warp row groups x column groups
  constexpr int NQ = DQK / CG / 8;         // n-tiles per warp
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sK0 = smemAddr(smem);         // two buffers of BC*DQK
  const uint32_t sS0 = sK0 + 2 * BC * DQK * 2; // two buffers of S tiles
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t4 = lane & 3;
  // Row groups of 32 (two m16 tiles) x column groups: each K fragment read
  // from shared memory feeds two MMAs.
  const int pr = warp / CG, pc = warp % CG;
  const int bh = p.bhOffset + blockIdx.x;
  const int b = bh / p.Hq, h = bh % p.Hq, hk = h / p.group;
  const int T = p.T;
  const int numT = (T + 63) / 64; // stored tiles per side
  const int numQ = (T + BR - 1) / BR;
  const int qt = numQ - 1 - blockIdx.y;
  const int q0 = qt * BR;
  const int numK = min(numT, (q0 + BR - 1) / BC + 1);
  const int64_t kStride = int64_t(p.Hkv) * DQK;
  const __nv_bfloat16 *gK = p.k + (int64_t(b) * T * p.Hkv + hk) * DQK;
  const int64_t tileBase = int64_t(blockIdx.x) * ((numT * (numT + 1)) / 2);

  auto load = [&](int kt, int buf) {
    const int k0 = kt * BC;
    loadTile<BC, DQK, 256>(sK0 + buf * BC * DQK * 2, gK + k0 * kStride, kStride,
                           T - k0, tid);
#pragma unroll
    for (int st = 0; st < S; ++st) {
      const int i = qt * S + st; // stored tile row
      const bool exists = i < numT && kt <= i;
      const __nv_bfloat16 *src =
          exists ? p.dsBuf + (tileBase + (i * (i + 1)) / 2 + kt) * (64 * 64)
                 : p.dsBuf;
      const uint32_t dst = sS0 + (buf * S + st) * (64 * 64 * 2);
#pragma unroll
      for (int c = tid; c < 64 * 64 / 8; c += 256)
        cpAsync16(dst + c * 16, exists ? src + c * 8 : src, exists);
    }
  };
  load(0, 0);
  cpAsyncCommit();

  float dqAcc[2][NQ][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int i = 0; i < NQ; ++i)
      dqAcc[m][i][0] = dqAcc[m][i][1] = dqAcc[m][i][2] = dqAcc[m][i][3] = 0.f;

  for (int kt = 0; kt < numK; ++kt) {
    const int buf = kt & 1;
    // As in the dK/dV pass: the barrier frees the previous step's buffers,
    // so the next tile's copy is issued after it and one barrier suffices.
    cpAsyncWait<0>();
    __syncthreads();
    if (kt + 1 < numK) {
      load(kt + 1, buf ^ 1);
      cpAsyncCommit();
    }
    const uint32_t sK = sK0 + buf * BC * DQK * 2;
    // This row group's stored tile, dS^T [kv][q] with the 64-wide swizzle.
    const uint32_t sS = sS0 + (buf * S + (pr * 32) / 64) * (64 * 64 * 2);
    const int r0 = (pr * 32) % 64;
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk) {
      uint32_t a[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m)
        ldsm4t(a[m], addrAt<64>(sS, r0 + m * 16, kk * 16, lane));
#pragma unroll
      for (int nn = 0; nn < NQ / 2; ++nn) {
        uint32_t bb[4];
        ldsm4t(bb, addrBt<DQK>(sK, kk * 16, pc * (DQK / CG) + nn * 16, lane));
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          mma16816(dqAcc[m][2 * nn], a[m], bb[0], bb[1]);
          mma16816(dqAcc[m][2 * nn + 1], a[m], bb[2], bb[3]);
        }
      }
    }
  }

#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int qi = q0 + pr * 32 + m * 16 + g + 8 * hf;
      if (qi >= T)
        continue;
      __nv_bfloat16 *dq =
          p.dq + ((int64_t(b) * T + qi) * p.Hq + h) * DQK + pc * (DQK / CG);
#pragma unroll
      for (int nt = 0; nt < NQ; ++nt)
        *reinterpret_cast<uint32_t *>(dq + nt * 8 + 2 * t4) = packBf16(
            dqAcc[m][nt][2 * hf] * p.scale, dqAcc[m][nt][2 * hf + 1] * p.scale);
    }
}

//===----------------------------------------------------------------------===//
// Hopper path (sm_90a): warpgroup MMA
//===----------------------------------------------------------------------===//
//
// Same algorithms and outputs as the kernels above, with the products issued
// as wgmma from 128-byte-swizzled panels (wgmma_sm90.cuh): B operands are
// read by the tensor cores straight from shared memory instead of through
// ldmatrix, and a probability or dS tile goes from the accumulators into the
// next product's A registers without a trip through shared memory. Two
// warpgroups per block, each owning 64 rows of the tile; cp.async double
// buffering and one barrier per step as in the portable kernels.

/// Base of the dynamic shared memory rounded up to the 1024 bytes that a
/// swizzled panel's descriptor assumes (the kernels ask for 1 KB more).
__device__ __forceinline__ uint32_t smemBase1k(const void *smem) {
  return (smemAddr(smem) + 1023u) & ~1023u;
}

/// K-major operand: 16 columns at k0 of rows r0.. of a panel tile of R rows.
template <int R>
__device__ __forceinline__ uint64_t descK(uint32_t tile, int r0, int k0) {
  return sm90::desc(tile + (k0 >> 6) * (R * 128) + r0 * 128 + (k0 & 63) * 2, 16,
                    1024);
}
/// MN-major operand: rows k0..k0+15 (the K of the product) of a panel tile
/// of R rows, all its columns as N.
template <int R>
__device__ __forceinline__ uint64_t descMN(uint32_t tile, int k0) {
  return sm90::desc(tile + k0 * 128, R * 128, 1024);
}

/// d = A B^T over K = KD: A = rows a0.. of panel tile `a` (RA rows), B = the
/// first N rows of panel tile `b` (RB rows), both K-major. Issued, not waited.
template <int N, int KD, int RA, int RB>
__device__ __forceinline__ void mmaTilesK(float (&d)[N / 2], uint32_t a, int a0,
                                          uint32_t b) {
#pragma unroll
  for (int kk = 0; kk < KD / 16; ++kk)
    sm90::mmaSS<N>(d, descK<RA>(a, a0, kk * 16), descK<RB>(b, 0, kk * 16),
                   kk > 0);
}
/// d (+)= A B over K = 16 KS: A from registers, B = rows 0..16 KS of panel
/// tile `b` (R rows, MN-major); accumulate = 0 overwrites d. Issued, not
/// waited.
template <int N, int R, int KS>
__device__ __forceinline__ void mmaRegsMN(float (&d)[N / 2],
                                          const uint32_t (&a)[KS][4],
                                          uint32_t b, int accumulate = 1) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
    sm90::mmaRSt<N>(d, a[kk], descMN<R>(b, kk * 16), kk > 0 || accumulate);
}
/// Commits the issued products and waits for them; d is then readable.
template <int N> __device__ __forceinline__ void mmaFinish(float (&d)[N]) {
  sm90::commit();
  sm90::wait<0>();
  sm90::pin(d);
}

/// Start of a step of the double-buffered loops: waits for this step's
/// copies and makes them visible to every thread and to wgmma, then (more)
/// issues the next step's copies into the buffers the barrier freed.
template <typename Load>
__device__ __forceinline__ void stepStart(bool more, Load &&load) {
  cpAsyncWait<0>();
  sm90::fenceProxyAsync();
  __syncthreads();
  if (more) {
    load();
    cpAsyncCommit();
  }
}

template <int N> __device__ __forceinline__ void zero(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    d[i] = 0.f;
}

/// Packs the m64 x 16 slice kk of an m64nN accumulator into a wgmma A
/// fragment (the layouts match, as with mma.sync).
template <int N>
__device__ __forceinline__ void packA(uint32_t (&a)[4], const float (&d)[N],
                                      int kk) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    a[j] = packBf16(d[8 * kk + 2 * j], d[8 * kk + 2 * j + 1]);
}

template <int DQK, int DV> struct FwdSm90Cfg {
  static constexpr int kThreads = 256, kBr = 128, kBc = 128;
  static constexpr int kSmem = (kBr * DQK + 2 * kBc * (DQK + DV)) * 2 + 1024;
};

/// Forward: one block per (128 query rows, q head, batch); warpgroup wg owns
/// rows 64 wg.., keys stream in tiles of 128.
template <int DQK, int DV>
__global__ void __launch_bounds__(256, 1) attnFwdSm90Kernel(Params p) {
#if AP_WGMMA_ENABLED
  using C = FwdSm90Cfg<DQK, DV>;
  constexpr int BR = C::kBr, BC = C::kBc;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smemBase1k(smem);
  const uint32_t sK0 = sQ + BR * DQK * 2;      // two buffers of BC x DQK
  const uint32_t sV0 = sK0 + 2 * BC * DQK * 2; // two buffers of BC x DV

  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int bh = blockIdx.x;
  const int b = bh / p.Hq, h = bh % p.Hq, hk = h / p.group;
  const int T = p.T;
  const int numQ = (T + BR - 1) / BR;
  const int qt = numQ - 1 - blockIdx.y; // heaviest tiles first
  const int q0 = qt * BR;
  const int row0 = q0 + wg * 64 + ((tid >> 5) & 3) * 16 + g; // and row0 + 8
  const int numK = min((T + BC - 1) / BC, (q0 + BR - 1) / BC + 1);

  const HeadRows<DQK, DV> hr(p, b, h, hk);
  auto loadKV = [&](int kt, int buf) {
    const int k0 = kt * BC;
    loadTile<BC, DQK, 256, true>(sK0 + buf * BC * DQK * 2,
                                 hr.k + k0 * hr.kStride, hr.kStride, T - k0,
                                 tid);
    loadTile<BC, DV, 256, true>(sV0 + buf * BC * DV * 2, hr.v + k0 * hr.vStride,
                                hr.vStride, T - k0, tid);
  };
  loadTile<BR, DQK, 256, true>(sQ, hr.q + q0 * hr.qStride, hr.qStride, T - q0,
                               tid);
  loadKV(0, 0);
  cpAsyncCommit();

  float o[DV / 2], s[BC / 2];
  zero(o);
  zero(s);
  float mRow[2] = {-INFINITY, -INFINITY}, lRow[2] = {0.f, 0.f};

  for (int kt = 0; kt < numK; ++kt) {
    const int buf = kt & 1, k0 = kt * BC;
    // Tiles kt landed; every warp is done with tiles kt - 1.
    stepStart(kt + 1 < numK, [&] { loadKV(kt + 1, buf ^ 1); });
    const uint32_t sK = sK0 + buf * BC * DQK * 2;
    const uint32_t sV = sV0 + buf * BC * DV * 2;

    sm90::fence();
    mmaTilesK<BC, DQK, BR, BC>(s, sQ, wg * 64, sK);
    mmaFinish(s);

    if (k0 + BC - 1 > q0 + wg * 64 || k0 + BC > T) {
#pragma unroll
      for (int i = 0; i < BC / 2; ++i) {
        const int col = k0 + (i >> 2) * 8 + 2 * t4 + (i & 1);
        const int row = row0 + 8 * ((i >> 1) & 1);
        if (col > row || col >= T)
          s[i] = -INFINITY;
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < BC / 8; ++nt)
        mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * hf], s[4 * nt + 2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // Key 0 of the first tile is visible to every row: mNew is finite.
      const float mNew = fmaxf(mRow[hf], mx * p.scaleLog2);
      const float alpha = exp2f(mRow[hf] - mNew);
      mRow[hf] = mNew;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float &x = s[4 * nt + 2 * hf + e];
          x = exp2f(fmaf(x, p.scaleLog2, -mNew));
          sum += x;
        }
      lRow[hf] = lRow[hf] * alpha + sum;
#pragma unroll
      for (int dt = 0; dt < DV / 8; ++dt) {
        o[4 * dt + 2 * hf] *= alpha;
        o[4 * dt + 2 * hf + 1] *= alpha;
      }
    }

    uint32_t pa[BC / 16][4];
#pragma unroll
    for (int kk = 0; kk < BC / 16; ++kk)
      packA(pa[kk], s, kk);
    sm90::fence();
    mmaRegsMN<DV, BC>(o, pa, sV);
    mmaFinish(o);
  }

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = lRow[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int row = row0 + 8 * hf;
    if (row < T) {
      const float inv = 1.f / l;
      __nv_bfloat16 *gO = p.oOut + ((int64_t(b) * T + row) * p.Hq + h) * DV;
#pragma unroll
      for (int dt = 0; dt < DV / 8; ++dt)
        *reinterpret_cast<uint32_t *>(gO + dt * 8 + 2 * t4) =
            packBf16(o[4 * dt + 2 * hf] * inv, o[4 * dt + 2 * hf + 1] * inv);
      if (t4 == 0)
        p.lse[(int64_t(b) * p.Hq + h) * p.lsePitch + row] =
            mRow[hf] * kLn2 + logf(l);
    }
  }
#endif
}

template <int DQK, int DV> struct BwdSm90Cfg {
  static constexpr int kThreads = 256, kBc = 128, kBr = 64;
  /// Query-side buffers: three, so that a step's dK product can still read
  /// its Q tile while the next step runs and the one after loads.
  static constexpr int kStages = 3;
  // K, V, stages x (Q, dO, lse, D)
  static constexpr int kSmem =
      (kBc + kStages * kBr) * (DQK + DV) * 2 + kStages * 2 * kBr * 4 + 1024;
};

/// dK/dV: one block per (128-key tile, q head, batch); warpgroup wg owns
/// keys 64 wg.. and walks the 64-row query tiles. Per step: S^T = K Q^T,
/// P^T (registers, bf16) -> dV += P^T dO; dP^T = V dO^T, dS^T = P^T (dP^T -
/// D) -> dK += dS^T Q, and (STORE_DS) the bf16 dS^T tile for the dQ pass,
/// written from registers in the layout attnBwdQFromDsKernel reads. The dV
/// product runs under the dS math, and it and dK are left running into the
/// next step (its barrier, copies and S^T), whose first wait collects them.
template <int DQK, int DV, bool STORE_DS>
__global__ void __launch_bounds__(256, 1) attnBwdKVSm90Kernel(Params p) {
#if AP_WGMMA_ENABLED
  using C = BwdSm90Cfg<DQK, DV>;
  constexpr int BR = C::kBr, BC = C::kBc;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sK = smemBase1k(smem);
  const uint32_t sV = sK + BC * DQK * 2;
  const uint32_t sQ0 = sV + BC * DV * 2;                // stages of BR x DQK
  const uint32_t sO0 = sQ0 + C::kStages * BR * DQK * 2; // dO: of BR x DV
  const uint32_t sSt = sO0 + C::kStages * BR * DV * 2;  // of [lse | D]
  const float *stats =
      reinterpret_cast<const float *>(smem + (sSt - smemAddr(smem)));

  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
  const int w = (tid >> 5) & 3, g = lane >> 2, t4 = lane & 3;
  const int bh = p.bhOffset + blockIdx.x;
  const int b = bh / p.Hq, h = bh % p.Hq, hk = h / p.group;
  const int kt = blockIdx.y; // low key tiles see the most query tiles: first
  const int k0 = kt * BC;
  const int T = p.T;
  const int numQ = (T + BR - 1) / BR;
  const int qtStart = k0 / BR;
  const int jt = kt * 2 + wg;                  // this warpgroup's 64-key tile
  const int kvRow = k0 + wg * 64 + w * 16 + g; // and kvRow + 8

  const HeadRows<DQK, DV> hr(p, b, h, hk);

  auto loadQ = [&](int qt, int buf) {
    const int q0 = qt * BR;
    loadTile<BR, DQK, 256, true>(sQ0 + buf * BR * DQK * 2,
                                 hr.q + q0 * hr.qStride, hr.qStride, T - q0,
                                 tid);
    loadTile<BR, DV, 256, true>(sO0 + buf * BR * DV * 2,
                                hr.dO + q0 * hr.oStride, hr.oStride, T - q0,
                                tid);
    if (tid < 2 * BR) {
      const int r = q0 + (tid & (BR - 1));
      const float *src = tid < BR ? hr.lse : hr.D;
      cpAsync4(sSt + (buf * 2 * BR + tid) * 4, r < T ? src + r : src, r < T);
    }
  };
  loadTile<BC, DQK, 256, true>(sK, hr.k + k0 * hr.kStride, hr.kStride, T - k0,
                               tid);
  loadTile<BC, DV, 256, true>(sV, hr.v + k0 * hr.vStride, hr.vStride, T - k0,
                              tid);
  loadQ(qtStart, 0);
  cpAsyncCommit();

  // The accumulators get their first values from wgmmas that overwrite: a
  // zeroing store here would sit inside the pipeline stage that the loop's
  // back edge leaves open (dV and dK still running), and ptxas would then
  // serialize the wgmmas.
  float dk[DQK / 2], dv[DV / 2], acc[BR / 2];
  const int64_t tileBase = int64_t(blockIdx.x) * ((numQ * (numQ + 1)) / 2);

  for (int qt = qtStart, buf = 0; qt < numQ; ++qt) {
    const int q0 = qt * BR, next = buf == C::kStages - 1 ? 0 : buf + 1;
    // Step qt landed; every warp is past step qt - 1's waits (its dK product
    // may still read its buffer, which the copies below do not touch).
    stepStart(qt + 1 < numQ, [&] { loadQ(qt + 1, next); });
    const uint32_t sQ = sQ0 + buf * BR * DQK * 2;
    const uint32_t sO = sO0 + buf * BR * DV * 2;
    const float *sLse = stats + buf * 2 * BR;
    const float *sD = sLse + BR;

    // S^T = K Q^T (keys x queries); the wait also collects step qt - 1's dV
    // and dK.
    sm90::fence();
    mmaTilesK<BR, DQK, BC, BR>(acc, sK, wg * 64, sQ);
    mmaFinish(acc);
    sm90::pin(dk);
    sm90::pin(dv);

    // P^T, rounded to bf16: the A operand of dV and the P of dS.
    uint32_t pa[BR / 16][4];
#pragma unroll
    for (int i = 0; i < BR / 2; ++i) {
      const int c = (i >> 2) * 8 + 2 * t4 + (i & 1); // query in tile
      const int qi = q0 + c;
      const int kv = kvRow + 8 * ((i >> 1) & 1);
      const float pe = exp2f(fmaf(acc[i], p.scaleLog2, -sLse[c] * kLog2e));
      acc[i] = kv <= qi && qi < T ? pe : 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk)
      packA(pa[kk], acc, kk);

    // dP^T = V dO^T; dV += P^T dO, left running like dK.
    sm90::fence();
    mmaTilesK<BR, DV, BC, BR>(acc, sV, wg * 64, sO);
    sm90::commit();
    mmaRegsMN<DV, BR>(dv, pa, sO, qt > qtStart);
    sm90::commit();
    sm90::wait<1>(); // dP^T
    sm90::pin(acc);

    // dS^T = P^T (dP^T - D), packed as the A operand of dK.
    uint32_t sa[BR / 16][4];
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 8 * kk + 2 * j;
        const int c = (i >> 2) * 8 + 2 * t4;
        const float2 pf = __bfloat1622float2(
            *reinterpret_cast<const __nv_bfloat162 *>(&pa[kk][j]));
        sa[kk][j] =
            packBf16(pf.x * (acc[i] - sD[c]), pf.y * (acc[i + 1] - sD[c + 1]));
      }
    if constexpr (STORE_DS) {
      if (qt >= jt) {
        unsigned char *tile = reinterpret_cast<unsigned char *>(
            p.dsBuf + (tileBase + (qt * (qt + 1)) / 2 + jt) * (64 * 64));
#pragma unroll
        for (int kk = 0; kk < BR / 16; ++kk)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            *reinterpret_cast<uint32_t *>(
                tile + swz<64>(w * 16 + g + 8 * (j & 1),
                               16 * kk + 8 * (j >> 1) + 2 * t4)) = sa[kk][j];
      }
    }

    // dK += dS^T Q, collected by the next step's first wait.
    sm90::fence();
    mmaRegsMN<DQK, BR>(dk, sa, sQ, qt > qtStart);
    sm90::commit();
    buf = next;
  }
  sm90::wait<0>();
  sm90::pin(dk);
  sm90::pin(dv);

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int kv = kvRow + 8 * hf;
    if (kv >= T)
      continue;
    using DkRows = const float[DQK / 8][4];
    using DvRows = const float[DV / 8][4];
    storeDkDvRow<DQK, DV>(p, b, h, hk, kv, hf, t4, 0, 0,
                          reinterpret_cast<DkRows &>(dk),
                          reinterpret_cast<DvRows &>(dv));
  }
#endif
}

template <int DQK> struct DqSm90Cfg {
  /// Four warpgroups (256 query rows) share each K tile read, halving the K
  /// traffic of 128 rows; three stages keep two steps of copies in flight.
  static constexpr int kWgs = 4, kThreads = 128 * kWgs, kBr = 64 * kWgs;
  static constexpr int kBc = 64, kStages = 3;
  static constexpr int kStage = (kBc * DQK + kWgs * 64 * 64) * 2; // K + dS
  static constexpr int kSmem = kStages * kStage + 1024;
};

/// dQ from the stored dS tiles: one block per (256 query rows, q head,
/// batch); warpgroup wg owns stored tile row i = 4 qt + wg and per 64-key step
/// adds dS K, both operands straight from their copies in shared memory: the
/// stored dS^T tile [key][query] is the M-major A (one 128-byte panel), K
/// [key][d] the N-major B.
template <int DQK>
__global__ void __launch_bounds__(DqSm90Cfg<DQK>::kThreads, 1)
    attnBwdQFromDsSm90Kernel(Params p) {
#if AP_WGMMA_ENABLED
  using C = DqSm90Cfg<DQK>;
  constexpr int BR = C::kBr, BC = C::kBc, NW = C::kWgs, NT = C::kThreads;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s0 = smemBase1k(smem); // stages of [K | NW dS tiles]
  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
  const int bh = p.bhOffset + blockIdx.x;
  const int b = bh / p.Hq, h = bh % p.Hq, hk = h / p.group;
  const int T = p.T;
  const int numT = (T + 63) / 64; // stored tiles per side
  const int numQ = (T + BR - 1) / BR;
  const int qt = numQ - 1 - blockIdx.y; // heaviest tiles first
  const int i = NW * qt + wg;           // this warpgroup's stored tile row
  const int numK = min(numT, NW * qt + NW);
  const int64_t kStride = int64_t(p.Hkv) * DQK;
  const __nv_bfloat16 *gK = p.k + (int64_t(b) * T * p.Hkv + hk) * DQK;
  const int64_t tileBase = int64_t(blockIdx.x) * ((numT * (numT + 1)) / 2);

  auto load = [&](int kt) {
    const uint32_t st = s0 + (kt % C::kStages) * C::kStage;
    const int k0 = kt * BC;
    loadTile<BC, DQK, NT, true>(st, gK + k0 * kStride, kStride, T - k0, tid);
#pragma unroll
    for (int c = tid; c < NW * 512; c += NT) {
      const int r = NW * qt + (c >> 9); // stored tile row
      const bool exists = r < numT && kt <= r;
      const __nv_bfloat16 *src =
          exists ? p.dsBuf + (tileBase + (r * (r + 1)) / 2 + kt) * (64 * 64) +
                       (c & 511) * 8
                 : p.dsBuf;
      cpAsync16(st + BC * DQK * 2 + c * 16, src, exists);
    }
  };
  // Two steps in flight: one commit group per step, empty past the end.
  load(0);
  cpAsyncCommit();
  if (numK > 1)
    load(1);
  cpAsyncCommit();

  float dq[DQK / 2];
  zero(dq);
  for (int kt = 0; kt < numK; ++kt) {
    cpAsyncWait<1>(); // step kt landed (kt + 1 may still be in flight)
    sm90::fenceProxyAsync();
    __syncthreads(); // ... for every thread; all are done with step kt - 1
    if (kt + 2 < numK)
      load(kt + 2); // into step kt - 1's stage
    cpAsyncCommit();
    if (kt <= i && i < numT) { // uniform over the warpgroup
      const uint32_t sK = s0 + (kt % C::kStages) * C::kStage;
      const uint32_t sS = sK + BC * DQK * 2 + wg * (64 * 64 * 2);
      sm90::fence();
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk)
        sm90::mmaSStt<DQK>(dq, descMN<64>(sS, kk * 16), descMN<BC>(sK, kk * 16),
                           1);
      mmaFinish(dq);
    }
  }

  const int row0 = qt * BR + wg * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int qi = row0 + 8 * hf;
    if (qi >= T)
      continue;
    __nv_bfloat16 *gq = p.dq + ((int64_t(b) * T + qi) * p.Hq + h) * DQK;
#pragma unroll
    for (int nt = 0; nt < DQK / 8; ++nt)
      storePair(gq + nt * 8 + 2 * (lane & 3), dq[4 * nt + 2 * hf] * p.scale,
                dq[4 * nt + 2 * hf + 1] * p.scale);
  }
#endif
}

//===----------------------------------------------------------------------===//
// Host side
//===----------------------------------------------------------------------===//

Params makeParams(const AttentionShape &s) {
  Params p{};
  p.B = s.batch;
  p.T = s.seqLen;
  p.lsePitch = s.seqLen;
  p.Hq = s.numQHeads;
  p.Hkv = s.numKvHeads;
  p.group = s.numQHeads / s.numKvHeads;
  p.scale = static_cast<float>(s.softmaxScale);
  p.scaleLog2 = static_cast<float>(s.softmaxScale * 1.4426950408889634);
  return p;
}

/// Head dims with wgmma kernels: the accumulators live in registers (the
/// forward's 64 x DV output; dK/dV's 64 x (DQK + DV)), so D = 256 (Qwen3.5)
/// stays on the mma.sync kernels.
template <int DQK, int DV> constexpr bool hasSm90Fwd() {
  return DQK % 64 == 0 && DQK <= 256 && (DV == 64 || DV == 128);
}
template <int DQK, int DV> constexpr bool hasSm90Bwd() {
  return (DQK == 64 || DQK == 128 || DQK == 192) && (DV == 64 || DV == 128);
}
template <int DQK> constexpr bool hasSm90Dq() {
  return DQK == 64 || DQK == 128 || DQK == 192;
}

bool validKernels(AttentionKernels k) {
  return k == AttentionKernels::Fastest || k == AttentionKernels::Portable;
}

/// Whether the sm_90a kernel `kernel` runs here: the call asks for the
/// fastest kernels (AttentionKernels) and the loaded binary is sm_90 (the
/// project builds sm_90a, whose device pass emits the wgmma bodies) on a
/// compute capability 9.0 device.
bool useSm90(const void *kernel, AttentionKernels kernels) {
  if (kernels == AttentionKernels::Portable)
    return false;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) !=
          cudaSuccess ||
      major != 9) {
    cudaGetLastError();
    return false;
  }
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.binaryVersion == 90;
}

/// Sets the kernel's dynamic shared memory and launches it.
template <typename Kernel>
Status launch(Kernel kernel, dim3 grid, int threads, int smemBytes,
              cudaStream_t stream, const Params &p) {
  AP_ATTN_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smemBytes));
  kernel<<<grid, threads, smemBytes, stream>>>(p);
  AP_ATTN_CUDA_CHECK(cudaGetLastError());
  return Status::Ok;
}

template <int DQK, int DV>
Status launchForward(cudaStream_t stream, const Params &p,
                     AttentionKernels kernels) {
  if constexpr (hasSm90Fwd<DQK, DV>()) {
    using C = FwdSm90Cfg<DQK, DV>;
    auto kernel = attnFwdSm90Kernel<DQK, DV>;
    if (useSm90(reinterpret_cast<const void *>(kernel), kernels))
      return launch(kernel, dim3(p.B * p.Hq, (p.T + C::kBr - 1) / C::kBr),
                    C::kThreads, C::kSmem, stream, p);
  }
  using C = FwdCfg<DQK, DV>;
  return launch(attnFwdKernel<DQK, DV>,
                dim3(p.B * p.Hq, (p.T + C::kBr - 1) / C::kBr), C::kThreads,
                C::kSmem, stream, p);
}

/// The dK/dV pass for the (batch, q head) pairs p.bhOffset.. p.bhOffset + n.
template <int DQK, int DV, bool STORE_DS>
Status launchKV(cudaStream_t stream, const Params &p, int64_t n,
                AttentionKernels kernels) {
  if constexpr (hasSm90Bwd<DQK, DV>()) {
    using C = BwdSm90Cfg<DQK, DV>;
    auto kernel = attnBwdKVSm90Kernel<DQK, DV, STORE_DS>;
    if (useSm90(reinterpret_cast<const void *>(kernel), kernels))
      return launch(kernel, dim3(n, (p.T + C::kBc - 1) / C::kBc), C::kThreads,
                    C::kSmem, stream, p);
  }
  using C = BwdCfg<DQK, DV>;
  return launch(attnBwdKVKernel<DQK, DV, STORE_DS>,
                dim3(n, (p.T + C::kBc - 1) / C::kBc), C::kThreads, C::kSmemKV,
                stream, p);
}

/// The dQ-from-dS pass for the (batch, q head) pairs p.bhOffset.. + n.
template <int DQK>
Status launchDq(cudaStream_t stream, const Params &p, int64_t n,
                AttentionKernels kernels) {
  if constexpr (hasSm90Dq<DQK>()) {
    using C = DqSm90Cfg<DQK>;
    auto kernel = attnBwdQFromDsSm90Kernel<DQK>;
    if (useSm90(reinterpret_cast<const void *>(kernel), kernels))
      return launch(kernel, dim3(n, (p.T + C::kBr - 1) / C::kBr), C::kThreads,
                    C::kSmem, stream, p);
  }
  constexpr int kRows = dqRows<DQK>();
  return launch(attnBwdQFromDsKernel<DQK>, dim3(n, (p.T + kRows - 1) / kRows),
                256, 2 * (64 * DQK + kRows * 64) * 2, stream, p);
}

template <int DQK, int DV>
Status launchBackward(cudaStream_t stream, Params p, AttentionBackwardAlgo algo,
                      int64_t dsChunk, AttentionKernels kernels) {
  using C = BwdCfg<DQK, DV>;
  const int64_t rows = int64_t(p.B) * p.T * p.Hq;
  attnBwdDotKernel<DV><<<(rows + 7) / 8, 256, 0, stream>>>(p);
  AP_ATTN_CUDA_CHECK(cudaGetLastError());
  const int numTiles = (p.T + C::kBr - 1) / C::kBr;
  const int64_t pairs = int64_t(p.B) * p.Hq;

  if (algo == AttentionBackwardAlgo::RecomputeDq) {
    p.bhOffset = 0;
    if (Status st = launchKV<DQK, DV, false>(stream, p, pairs, kernels);
        st != Status::Ok)
      return st;
    if (Status st = launch(attnBwdQKernel<DQK, DV>, dim3(pairs, numTiles),
                           C::kThreads, C::kSmemQ, stream, p);
        st != Status::Ok)
      return st;
  } else {
    // Chunks of (batch, head) pairs share one dS buffer, in order.
    for (int64_t first = 0; first < pairs; first += dsChunk) {
      const int64_t n = std::min<int64_t>(dsChunk, pairs - first);
      p.bhOffset = static_cast<int>(first);
      if (Status st = launchKV<DQK, DV, true>(stream, p, n, kernels);
          st != Status::Ok)
        return st;
      if (Status st = launchDq<DQK>(stream, p, n, kernels); st != Status::Ok)
        return st;
    }
  }

  if (p.group > 1) {
    const int64_t total = int64_t(p.B) * p.T * p.Hkv * (DQK + DV);
    const int64_t blocks = std::min<int64_t>((total + 255) / 256, 65535);
    attnBwdGroupSumKernel<DQK, DV><<<blocks, 256, 0, stream>>>(p);
    AP_ATTN_CUDA_CHECK(cudaGetLastError());
  }
  return Status::Ok;
}

/// Calls fn.template operator()<DQK, DV>() for the supported head dims.
template <typename Fn> Status dispatchDims(const AttentionShape &s, Fn &&fn) {
  if (s.headDimQk == 256 && s.headDimV == 256)
    return fn.template operator()<256, 256>();
  if (s.headDimQk == 192 && s.headDimV == 128)
    return fn.template operator()<192, 128>();
  if (s.headDimQk == 128 && s.headDimV == 128)
    return fn.template operator()<128, 128>();
  if (s.headDimQk == 64 && s.headDimV == 64)
    return fn.template operator()<64, 64>();
  return Status::Unsupported;
}

struct FwdLauncher {
  cudaStream_t stream;
  const Params &p;
  AttentionKernels kernels;
  template <int DQK, int DV> Status operator()() const {
    return launchForward<DQK, DV>(stream, p, kernels);
  }
};
struct BwdLauncher {
  cudaStream_t stream;
  const Params &p;
  AttentionBackwardAlgo algo;
  int64_t dsChunk;
  AttentionKernels kernels;
  template <int DQK, int DV> Status operator()() const {
    return launchBackward<DQK, DV>(stream, p, algo, dsChunk, kernels);
  }
};

} // namespace

namespace {

/// Element offsets of one document of a packed call (kernels/cuda/
/// documents.h) in the [B, T, H, D] tensors and the [B, Hq, T] lse.
struct DocOffsets {
  int64_t q, kv, vv, o, lse;
  DocOffsets(const AttentionShape &s, const cudadocs::Document &doc) {
    const int64_t tok = doc.row * s.seqLen + doc.start;
    q = tok * s.numQHeads * s.headDimQk;
    kv = tok * s.numKvHeads * s.headDimQk;
    vv = tok * s.numKvHeads * s.headDimV;
    o = tok * s.numQHeads * s.headDimV;
    lse = doc.row * s.numQHeads * s.seqLen + doc.start;
  }
};

template <typename T> T *shift(T *p, int64_t elements) {
  using E = std::conditional_t<std::is_const_v<T>, const __nv_bfloat16,
                               __nv_bfloat16>;
  return p ? (T *)((E *)p + elements) : p;
}
template <typename T> T *shiftF(T *p, int64_t elements) {
  using E = std::conditional_t<std::is_const_v<T>, const float, float>;
  return p ? (T *)((E *)p + elements) : p;
}

Status forwardImpl(const KernelContext &ctx, const AttentionForwardArgs &a,
                   int64_t lsePitch);
Status backwardImpl(const KernelContext &ctx, const AttentionBackwardArgs &a,
                    AttentionBackwardAlgo algo, int64_t lsePitch);

/// One document of a packed call as a batch-1 call over its own tokens
/// (kernels/cuda/documents.h), so that its bits are those of the document
/// alone; lse keeps the packed row's pitch (the caller passes it). The
/// fields of both directions; the backward's gradients are shifted below.
template <typename Args>
Args documentArgs(const Args &a, const cudadocs::Document &doc) {
  const DocOffsets off(a.shape, doc);
  Args d = a;
  d.docStart = nullptr;
  d.shape.batch = 1;
  d.shape.seqLen = static_cast<int32_t>(doc.length);
  d.q = shift(a.q, off.q);
  d.k = shift(a.k, off.kv);
  d.v = shift(a.v, off.vv);
  d.o = shift(a.o, off.o);
  d.lse = shiftF(a.lse, off.lse);
  return d;
}

template <typename Args>
Status readDocuments(const KernelContext &ctx, const Args &a,
                     std::vector<cudadocs::Document> &docs) {
  return cudadocs::readDocuments(static_cast<cudaStream_t>(ctx.stream),
                                 a.docStart, a.shape.batch, a.shape.seqLen,
                                 docs);
}

Status forwardPacked(const KernelContext &ctx, const AttentionForwardArgs &a) {
  std::vector<cudadocs::Document> docs;
  if (Status st = readDocuments(ctx, a, docs); st != Status::Ok)
    return st;
  for (const cudadocs::Document &doc : docs)
    if (Status st = forwardImpl(ctx, documentArgs(a, doc), a.shape.seqLen);
        st != Status::Ok)
      return st;
  return Status::Ok;
}

/// algo: the one every document takes, or, when null, per document the
/// default of its own shape (as alone) where that fits the workspace the
/// packed call's shape asks for, else RecomputeDq (linear scratch). Both are
/// functions of the shape and the document lengths only.
Status backwardPacked(const KernelContext &ctx, const AttentionBackwardArgs &a,
                      const AttentionBackwardAlgo *algo) {
  std::vector<cudadocs::Document> docs;
  if (Status st = readDocuments(ctx, a, docs); st != Status::Ok)
    return st;
  const size_t packedNeed = detail::attentionBackwardWorkspaceBytesFor(
      a.shape, detail::attentionBackwardDefaultAlgo(a.shape));
  for (const cudadocs::Document &doc : docs) {
    const DocOffsets off(a.shape, doc);
    AttentionBackwardArgs d = documentArgs(a, doc);
    d.dO = shift(a.dO, off.o);
    d.dq = shift(a.dq, off.q);
    d.dk = shift(a.dk, off.kv);
    d.dv = shift(a.dv, off.vv);
    AttentionBackwardAlgo use;
    if (algo) {
      use = *algo;
    } else {
      use = detail::attentionBackwardDefaultAlgo(d.shape);
      if (detail::attentionBackwardWorkspaceBytesFor(d.shape, use) > packedNeed)
        use = AttentionBackwardAlgo::RecomputeDq;
    }
    if (Status st = backwardImpl(ctx, d, use, a.shape.seqLen); st != Status::Ok)
      return st;
  }
  return Status::Ok;
}

} // namespace

Status attentionForward(const KernelContext &ctx,
                        const AttentionForwardArgs &a) {
  if (Status st = attentionValidate(a.shape, a.dtype); st != Status::Ok)
    return st;
  if (!a.docStart)
    return forwardImpl(ctx, a, a.shape.seqLen);
  if (!a.q || !a.k || !a.v || !a.o || !a.lse)
    return Status::InvalidArgument;
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  return forwardPacked(ctx, a);
}

Status attentionBackwardWithAlgo(const KernelContext &ctx,
                                 const AttentionBackwardArgs &a,
                                 AttentionBackwardAlgo algo) {
  if (Status st = attentionValidate(a.shape, a.dtype); st != Status::Ok)
    return st;
  if (!a.docStart)
    return backwardImpl(ctx, a, algo, a.shape.seqLen);
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  return backwardPacked(ctx, a, &algo);
}

Status attentionBackward(const KernelContext &ctx,
                         const AttentionBackwardArgs &a) {
  if (a.docStart) {
    if (Status st = attentionValidate(a.shape, a.dtype); st != Status::Ok)
      return st;
    if (a.dtype != DType::BF16)
      return Status::Unsupported;
    return backwardPacked(ctx, a, nullptr);
  }
  return attentionBackwardWithAlgo(
      ctx, a, detail::attentionBackwardDefaultAlgo(a.shape));
}

namespace {

Status forwardImpl(const KernelContext &ctx, const AttentionForwardArgs &a,
                   int64_t lsePitch) {
  if (Status st = attentionValidate(a.shape, a.dtype); st != Status::Ok)
    return st;
  if (!a.q || !a.k || !a.v || !a.o || !a.lse)
    return Status::InvalidArgument;
  if (!validKernels(a.kernels))
    return Status::InvalidArgument;
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  Params p = makeParams(a.shape);
  p.q = static_cast<const __nv_bfloat16 *>(a.q);
  p.k = static_cast<const __nv_bfloat16 *>(a.k);
  p.v = static_cast<const __nv_bfloat16 *>(a.v);
  p.oOut = static_cast<__nv_bfloat16 *>(a.o);
  p.lse = static_cast<float *>(a.lse);
  p.lsePitch = lsePitch;
  return dispatchDims(
      a.shape,
      FwdLauncher{static_cast<cudaStream_t>(ctx.stream), p, a.kernels});
}

Status backwardImpl(const KernelContext &ctx, const AttentionBackwardArgs &a,
                    AttentionBackwardAlgo algo, int64_t lsePitch) {
  if (Status st = attentionValidate(a.shape, a.dtype); st != Status::Ok)
    return st;
  if (!a.q || !a.k || !a.v || !a.o || !a.lse || !a.dO || !a.dq || !a.dk ||
      !a.dv)
    return Status::InvalidArgument;
  if (!validKernels(a.kernels))
    return Status::InvalidArgument;
  if (a.dtype != DType::BF16)
    return Status::Unsupported;
  const AttentionShape &s = a.shape;
  const size_t need = detail::attentionBackwardWorkspaceBytesFor(s, algo);
  if (ctx.workspaceBytes < need || !ctx.workspace)
    return Status::InvalidArgument;
  Params p = makeParams(s);
  p.q = static_cast<const __nv_bfloat16 *>(a.q);
  p.k = static_cast<const __nv_bfloat16 *>(a.k);
  p.v = static_cast<const __nv_bfloat16 *>(a.v);
  p.o = static_cast<const __nv_bfloat16 *>(a.o);
  p.dO = static_cast<const __nv_bfloat16 *>(a.dO);
  p.lseIn = static_cast<const float *>(a.lse);
  p.lsePitch = lsePitch;
  p.dq = static_cast<__nv_bfloat16 *>(a.dq);
  p.dk = static_cast<__nv_bfloat16 *>(a.dk);
  p.dv = static_cast<__nv_bfloat16 *>(a.dv);
  // Workspace layout mirrors detail::attentionBackwardWorkspaceBytesFor.
  auto align = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t rows = size_t(s.batch) * s.seqLen;
  unsigned char *ws = static_cast<unsigned char *>(ctx.workspace);
  size_t off = 0;
  p.Dd = reinterpret_cast<float *>(ws);
  off += align(rows * s.numQHeads * sizeof(float));
  if (s.numQHeads != s.numKvHeads) {
    p.dkPart = reinterpret_cast<float *>(ws + off);
    off += align(rows * s.numQHeads * s.headDimQk * sizeof(float));
    p.dvPart = reinterpret_cast<float *>(ws + off);
    off += align(rows * s.numQHeads * s.headDimV * sizeof(float));
  }
  if (algo == AttentionBackwardAlgo::StoredDs)
    p.dsBuf = reinterpret_cast<__nv_bfloat16 *>(ws + off);
  return dispatchDims(s, BwdLauncher{static_cast<cudaStream_t>(ctx.stream), p,
                                     algo, detail::attentionStoredDsChunk(s),
                                     a.kernels});
}

} // namespace

} // namespace ap::kernels::cuda
