//===- gdn_chunk.cuh - chunked gated delta rule, shared pieces --*- C++ -*-===//
//
// What the per-chunk kernels (gdn_chunk.cu) and the register-state
// sequential passes (gdn_state.cu) share: the problem dimensions, tile loads
// and the launchers of the sequential passes.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_CUDA_GDN_GDN_CHUNK_CUH
#define ACTPLACE_KERNELS_CUDA_GDN_GDN_CHUNK_CUH

#include "kernels/cuda/gdn/gdn_common.cuh"

#include <cstdint>
#include <type_traits>

namespace ap::kernels::gdncuda {

constexpr int C = kGdnChunk;
constexpr int kThreads = 256;
constexpr int kTP = C + 8; // pitch of 64x64 bf16 tiles
constexpr int kFP = C + 1; // pitch of 64x64 fp32 tiles

struct Dims {
  int B, T, Hk, Hv, dk, dv, NT, r;
  long qs, ks, vs;
  float scale;
  /// 16-byte loads possible for q, k, v, dO, tMat (stride % 8 == 0 and a
  /// 16-byte aligned base). Only the load instructions differ, never the
  /// values.
  bool vq, vk, vv, vo, vt;
  /// GdnChunkArgs::stateSplit / stateSlicesPerCta (0: by shape).
  int split, slices;
};

inline Dims dimsOf(const GdnChunkArgs &a) {
  Dims d;
  d.B = int(a.batch);
  d.T = int(a.seqLen);
  d.Hk = a.keyHeads;
  d.Hv = a.valueHeads;
  d.dk = a.keyDim;
  d.dv = a.valueDim;
  d.NT = (d.T + C - 1) / C;
  d.r = d.Hv / d.Hk;
  d.qs = a.qStride ? a.qStride : long(d.Hk) * d.dk;
  d.ks = a.kStride ? a.kStride : long(d.Hk) * d.dk;
  d.vs = a.vStride ? a.vStride : long(d.Hv) * d.dv;
  d.scale = a.scale;
  auto al = [](const void *p, long stride) {
    return p && stride % 8 == 0 && (reinterpret_cast<uintptr_t>(p) & 15) == 0;
  };
  d.vq = al(a.q, d.qs);
  d.vk = al(a.k, d.ks);
  d.vv = al(a.v, d.vs);
  d.vo = al(a.dO, long(d.Hv) * d.dv);
  d.vt = al(a.tMat, long(d.Hv) * C);
  d.split = a.stateSplit;
  d.slices = a.stateSlicesPerCta;
  return d;
}

__device__ __forceinline__ int chunkLen(int T, int n) {
  return min(C, T - n * C);
}

/// Calls f(r, c) for every element of a rows x cols tile, element r*cols+c
/// on thread (r*cols+c) % blockDim.x, with no division per element.
template <typename F>
__device__ __forceinline__ void forTile(int rows, int cols, F &&f) {
  const int q = blockDim.x / cols, rem = blockDim.x - q * cols;
  int r = threadIdx.x / cols, c = threadIdx.x - r * cols;
  while (r < rows) {
    f(r, c);
    r += q;
    c += rem;
    if (c >= cols) {
      c -= cols;
      ++r;
    }
  }
}

/// Copies rows [0, rows) x [0, cols) (row r at src + r*stride) into a bf16
/// tile [rows][pitch], zero rows >= valid. With vec, 16-byte cp.async (the
/// caller commits and waits); otherwise plain element loads. When a row is
/// a power-of-two number of 16-byte pieces (which then divides blockDim.x,
/// a multiple of 32), each thread keeps one piece column and walks the rows:
/// no division per copy.
__device__ __forceinline__ void loadTile(bf *dst, int pitch, const bf *src,
                                         long stride, int rows, int valid,
                                         int cols, bool vec) {
  if (vec) {
    const int per = cols >> 3;
    if ((per & (per - 1)) == 0 && per <= 32) {
      const int sh = __ffs(per) - 1, step = blockDim.x >> sh;
      const int r0 = threadIdx.x >> sh, c = (threadIdx.x & (per - 1)) << 3;
      const bf *s = src + long(r0) * stride + c;
      bf *o = dst + r0 * pitch + c;
      const long sStep = long(step) * stride;
      const int oStep = step * pitch;
      for (int r = r0; r < rows; r += step, s += sStep, o += oStep) {
        const bool in = r < valid;
        cpAsync16(o, in ? s : src, in ? 16 : 0);
      }
      return;
    }
    for (int i = threadIdx.x; i < rows * per; i += blockDim.x) {
      int r = i / per, c = (i - r * per) << 3;
      bool in = r < valid;
      cpAsync16(dst + r * pitch + c, src + (in ? long(r) * stride + c : 0),
                in ? 16 : 0);
    }
    return;
  }
  for (int i = threadIdx.x; i < rows * cols; i += blockDim.x) {
    int r = i / cols, c = i - r * cols;
    dst[r * pitch + c] = r < valid ? src[long(r) * stride + c] : f2b(0.f);
  }
}

/// Stores rows [0, rows) x [0, cols) of a bf16 tile [.][pitch] to global
/// rows dst + r*stride with 16-byte stores (cols % 8 == 0; 16-byte aligned
/// rows on both sides).
__device__ __forceinline__ void storeTile(bf *dst, long stride, const bf *src,
                                          int pitch, int rows, int cols) {
  const int per = cols >> 3;
  for (int i = threadIdx.x; i < rows * per; i += blockDim.x) {
    int r = i / per, c = (i - r * per) << 3;
    *reinterpret_cast<uint4 *>(dst + long(r) * stride + c) =
        *reinterpret_cast<const uint4 *>(src + r * pitch + c);
  }
}

/// The 64 rows of one chunk (rows >= L zero).
__device__ __forceinline__ void loadRows(bf *dst, int pitch, const bf *src,
                                         long stride, int L, int d, bool vec) {
  loadTile(dst, pitch, src, stride, C, L, d, vec);
}

//===----------------------------------------------------------------------===//
// Register-state sequential passes (gdn_state.cu), dk <= kRegStateMaxDk
//===----------------------------------------------------------------------===//
//
// Workspace layouts they use (per (b, h) and chunk n, "chunk block"
// cb = (b*Hv + h)*NT + n):
//   W   bf16 [cb][64][dk]     UT  bf16 [cb][dv][64] (U transposed)
//   P   bf16 [cb][64][64]     P[r][s] = scale (q_r . k_s) exp(G_r - G_s),
//                             s <= r < L, else 0
//   hT  bf16 [cb][dv][dk]     chunk start state, transposed
//   VnT bf16 [cb][dv][64]     Vnew transposed
//   dhT bf16 [cb][dv][dk]     gradient of the chunk end state, transposed
//   dVnT bf16 [cb][dv][64]    dVnew transposed

constexpr int kRegStateMaxDk = 128;

/// Calls f(std::integral_constant<int, DKc>) with DKc = dk for the key widths
/// that have their own kernel instantiations (compile-time ldmatrix offsets,
/// loop trip counts and tile maps), else DKc = 0 (dk read at run time).
template <typename F> Status withDk(int dk, F &&f) {
  switch (dk) {
  case 128:
    return f(std::integral_constant<int, 128>{});
  case 64:
    return f(std::integral_constant<int, 64>{});
  default:
    return f(std::integral_constant<int, 0>{});
  }
}

/// Whether d.split / d.slices name a work split the passes have (GdnChunkArgs
/// stateSplit, stateSlicesPerCta).
bool stateSplitOk(const Dims &d);

/// Forward pass over the chunks. With o set (the forward): writes o (and
/// finalState when set); q and P are read. Otherwise (backward recompute):
/// writes hT and VnT.
Status runStateForwardReg(const Dims &d, cudaStream_t s, int smCount,
                          const bf *q, const bf *k, const float *gCum,
                          const bf *W, const bf *UT, const bf *P,
                          const float *h0, bf *o, float *finalState, bf *hT,
                          bf *VnT);

/// Reverse pass over the chunks: dhT, dVnT and dInit (when set).
Status runStateBackwardReg(const Dims &d, cudaStream_t s, int smCount,
                           const bf *q, const bf *k, const float *gCum,
                           const bf *W, const bf *P, const bf *dO,
                           const float *dFinal, bf *dhT, bf *dVnT,
                           float *dInit);

} // namespace ap::kernels::gdncuda

#endif // ACTPLACE_KERNELS_CUDA_GDN_GDN_CHUNK_CUH
