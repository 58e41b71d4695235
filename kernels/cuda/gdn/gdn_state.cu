//===- gdn_state.cu - register-state sequential chunk passes ----*- C++ -*-===//
//
// The two sequential passes of the chunked gated delta rule (dk <= 128) with
// the recurrent state held in mma accumulator registers. Each warp owns 16
// value columns and keeps its slice of the state transposed, S^T [16 x dk]
// fp32. Transposed, every product of the recurrence keeps the state (or the
// chunk's Vnew^T / dVnew^T) as the A operand: an m16n8k16 accumulator
// fragment of rows x (k, k+1) is the A fragment of the next product after a
// bf16 conversion, so a warp walks all chunks without exchanging anything
// with the other warps. Shared memory holds the per-chunk inputs (W, K, Q,
// P, U^T / dO), fetched with cp.async one chunk ahead; one CTA barrier per
// chunk hands the buffers over. When a batch has too few slices to give
// every SM scheduler a warp, 2 or 4 warps share a slice ("The split" below),
// exchanging bf16 operand fragments through shared memory.
//
// Forward, per chunk (G the chunk-local g cumsum, L its length):
//   Vnew^T = U^T - S^T W^T
//   o^T    = (S^T Q^T) diag(scale e^G) + Vnew^T P^T           (forward only)
//   S^T    = e^{G_L} S^T + (Vnew^T diag(e^{G_L - G})) K
// Reverse, per chunk (dH^T the gradient of the chunk end state):
//   dVnew^T = (dH^T K^T) diag(e^{G_L - G}) + dO^T P
//   dH^T    = e^{G_L} dH^T + dO^T diag(scale e^G) Q - dVnew^T W
// All products bf16 x bf16 -> fp32 with a fixed k order: deterministic.
//
//===----------------------------------------------------------------------===//
#include "kernels/cuda/gdn/gdn_chunk.cuh"

#include <algorithm>

namespace ap::kernels::gdncuda {
namespace {

constexpr int KT = kRegStateMaxDk / 16; // k steps over dk, at most

__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ float2 unpack2(uint32_t u) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u));
}

/// A fragment (16 rows x k 16i..16i+15) of the accumulator tiles acc[2i],
/// acc[2i+1] (16 x 8 each), converted to bf16 and multiplied by f.
template <int N>
__device__ __forceinline__ void accToA(uint32_t a[4], const float (&acc)[N][4],
                                       int i, float f = 1.f) {
  a[0] = pack2(f * acc[2 * i][0], f * acc[2 * i][1]);
  a[1] = pack2(f * acc[2 * i][2], f * acc[2 * i][3]);
  a[2] = pack2(f * acc[2 * i + 1][0], f * acc[2 * i + 1][1]);
  a[3] = pack2(f * acc[2 * i + 1][2], f * acc[2 * i + 1][3]);
}

/// The state slice of a warp, X[j][e] = X^T[v0 + g + 8 (e >> 1)][k0 + 8j + 2t
/// + (e & 1)] for j < 2 nSteps, from / to a [dk][dv] fp32 state (the ABI
/// layout of initial and final states and their gradients); nullptr reads as
/// zeros.
template <int N>
__device__ __forceinline__ void loadStateT(float (&X)[N][4], const float *src,
                                           int k0, int nSteps, int dv, int v0,
                                           bool active) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int v = v0 + g + 8 * (e >> 1), kk = k0 + 8 * j + 2 * t + (e & 1);
      X[j][e] =
          (src && active && j < 2 * nSteps) ? src[long(kk) * dv + v] : 0.f;
    }
}
template <int N>
__device__ __forceinline__ void storeStateT(float *dst, const float (&X)[N][4],
                                            int k0, int nSteps, int dv,
                                            int v0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int v = v0 + g + 8 * (e >> 1), kk = k0 + 8 * j + 2 * t + (e & 1);
      if (j < 2 * nSteps)
        dst[long(kk) * dv + v] = X[j][e];
    }
}

/// Accumulator tiles X[0..nt) (16 rows x 8 columns each) of a warp to a bf16
/// row-major [16][pitch] block at dst, as bf16 pairs.
template <int N>
__device__ __forceinline__ void storeTilesBf16(bf *dst, int pitch,
                                               const float (&X)[N][4], int nt) {
  bf *p = dst + ((threadIdx.x & 31) >> 2) * pitch + 2 * (threadIdx.x & 3);
#pragma unroll
  for (int j = 0; j < N; ++j)
    if (j < nt) {
      *(uint32_t *)(p + 8 * j) = pack2(X[j][0], X[j][1]);
      *(uint32_t *)(p + 8 * pitch + 8 * j) = pack2(X[j][2], X[j][3]);
    }
}

//===----------------------------------------------------------------------===//
// The split: KS warps share one 16-column state slice.
//===----------------------------------------------------------------------===//
//
// With KS = 1 a warp does every product of its slice. With KS = 2 or 4 (dk a
// compile-time 64 or 128), warp kw of a slice owns
//   - positions [64 kw / KS, 64 (kw + 1) / KS) of the chunk: its tiles of the
//     products whose columns are chunk positions (S^T W^T, S^T Q^T, o^T,
//     dH^T K^T, dVnew^T), each over the whole k range;
//   - key columns [dk kw / KS, dk (kw + 1) / KS): its tiles of the state and
//     of the state update.
// The A operands every warp needs whole (the state, Vnew^T and dVnew^T as
// bf16 fragments) go through shared memory: each warp writes the fragments
// of its part, exactly the values it would have converted in registers, and
// reads the others'. Every output tile is computed by one warp with the same
// operands in the same k order as with KS = 1, so every split gives the same
// bits. Per chunk, one named barrier per slice hands over Vnew^T (dVnew^T);
// the chunk loop's CTA barrier hands over the updated state.

/// Per slice: the state's fragments (one uint4 per lane and k step, KT
/// steps at most), then two sets of 4 (one per 16 chunk positions).
constexpr int kXchgU4 = (KT + 8) * 32;
constexpr size_t kXchgBytes = size_t(kXchgU4) * 16;

/// bar.sync on barrier 1 + slice by the slice's KS warps (id 0 is
/// __syncthreads').
template <int KS> __device__ __forceinline__ void sliceSync(int slice) {
  if constexpr (KS > 1)
    asm volatile("bar.sync %0, %1;\n" ::"r"(slice + 1), "r"(KS * 32)
                 : "memory");
}

__device__ __forceinline__ void putA(uint4 *x, const uint32_t a[4]) {
  *x = make_uint4(a[0], a[1], a[2], a[3]);
}
__device__ __forceinline__ void getA(uint32_t a[4], const uint4 *x) {
  const uint4 u = *x;
  a[0] = u.x;
  a[1] = u.y;
  a[2] = u.z;
  a[3] = u.w;
}

/// What a warp owns under a split (see above) and its exchange region.
template <int DKc, int KS> struct Part {
  static_assert(KS == 1 || KS == 2 || KS == 4, "split of 1, 2 or 4 warps");
  static_assert(KS == 1 || (DKc > 0 && DKc % (16 * KS) == 0),
                "a split needs a compile-time dk of whole k steps per warp");
  /// 8-position tiles and 16-position k steps of the chunk per warp.
  static constexpr int kTiles = 8 / KS, kSteps = 4 / KS;
  /// Key-column k steps per warp (KS = 1: up to KT, run time).
  static constexpr int kKeySteps = KS > 1 ? DKc / 16 / KS : KT;
  int slice, kw, tile0, step0, key0; // key0 in k steps
  uint4 *x;                          // the slice's exchange region
  __device__ Part(unsigned char *xchg) {
    const int warp = threadIdx.x >> 5;
    slice = warp / KS;
    kw = warp % KS;
    tile0 = kw * kTiles;
    step0 = kw * kSteps;
    key0 = kw * (KS > 1 ? kKeySteps : 0);
    x = reinterpret_cast<uint4 *>(xchg) + size_t(slice) * kXchgU4 +
        (threadIdx.x & 31);
  }
  __device__ uint4 *state(int i) const { return x + i * 32; }
  __device__ uint4 *first(int kk) const { return x + (KT + kk) * 32; }
  __device__ uint4 *second(int kk) const { return x + (KT + 4 + kk) * 32; }
  /// This warp's key k steps of the state X as bf16 A fragments, for the
  /// other warps' next chunk (ordered by the chunk loop's CTA barrier).
  template <int N> __device__ void publishState(const float (&X)[N][4]) const {
    if constexpr (KS > 1)
#pragma unroll
      for (int il = 0; il < kKeySteps; ++il) {
        uint32_t a[4];
        accToA(a, X, il);
        putA(state(key0 + il), a);
      }
  }
  /// The A fragment of k step i of the whole state.
  template <int N>
  __device__ void stateA(uint32_t a[4], const float (&X)[N][4], int i) const {
    if constexpr (KS > 1)
      getA(a, state(i));
    else
      accToA(a, X, i);
  }
};

/// Shared-memory plan: nw slices (16 value columns each) of ks warps per CTA,
/// two stages, then the exchange regions when ks > 1.
struct RegPlan {
  int nw, ks;
  size_t stage, smem;
};

constexpr int kMaxStateWarps = 8; // __launch_bounds__(256)

bool splittable(const Dims &d) { return d.dk == 64 || d.dk == 128; }

/// KS: 4 when four warps a slice still fit about four warps an SM over the
/// whole grid (a batch of one sequence at the Qwen shape: 128 slices), 2 when
/// two do, else 1 (every SM already has a warp per scheduler). Slices per CTA:
/// with KS = 1 four (one warp per SM sub-partition) unless that leaves more
/// CTAs than SMs, then eight; with a split the fewest that keep the CTAs
/// within one wave (each CTA loads the chunk's tiles once for its slices, but
/// a slice per SM is fastest while the SMs last: bench/notes/gdn.md). Never
/// more slices than the head has. An explicit d.split / d.slices wins
/// (validated by stateSplitOk).
RegPlan regPlan(const Dims &d, int smCount,
                size_t (*stageOf)(const Dims &, int)) {
  const long sms = std::max(smCount, 1);
  const long slices = long(d.B) * d.Hv * ((d.dv + 15) / 16);
  int ks = 1;
  if (d.split)
    ks = d.split;
  else if (splittable(d))
    ks = slices * 4 <= 4 * sms ? 4 : slices * 2 <= 4 * sms ? 2 : 1;
  int nw;
  if (d.slices)
    nw = d.slices;
  else if (ks == 1) {
    nw = std::min(4, d.dv / 16);
    if (long(d.B) * d.Hv * ((d.dv + 63) / 64) > sms && d.dv >= 128)
      nw = 8;
  } else
    nw = int(std::max(1L, std::min({long(kMaxStateWarps / ks), long(d.dv / 16),
                                    (slices + sms - 1) / sms})));
  RegPlan p;
  p.nw = nw;
  p.ks = ks;
  p.stage = stageOf(d, 16 * nw);
  p.smem = 2 * p.stage + (ks > 1 ? size_t(nw) * kXchgBytes : 0);
  return p;
}

size_t fwdStage(const Dims &d, int dvb, bool out) {
  const size_t pk = d.dk + 8;
  return ((out ? 3 : 2) * C * pk + (out ? C * kTP : 0) + size_t(dvb) * kTP) *
             2 +
         C * 4;
}
size_t fwdStageOut(const Dims &d, int dvb) { return fwdStage(d, dvb, true); }
size_t fwdStageSave(const Dims &d, int dvb) { return fwdStage(d, dvb, false); }
size_t bwdStage(const Dims &d, int dvb) {
  const size_t pk = d.dk + 8;
  return (3 * C * pk + C * kTP + size_t(C) * (dvb + 8)) * 2 + C * 4;
}

/// DKc: dk known at compile time (0: run time), so that ldmatrix addresses
/// are immediates and the k loops have fixed trip counts. KS: warps a slice.
template <bool kOut, int DKc, int KS>
__global__ void __launch_bounds__(256, 1)
    stateFwdRegKernel(Dims d, int stageBytes, const bf *q, const bf *k,
                      const float *gCum, const bf *Wg, const bf *UTg,
                      const bf *Pg, const float *h0, bf *o, float *finalState,
                      bf *hT, bf *VnT) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Pt = Part<DKc, KS>;
  const int nw = (blockDim.x >> 5) / KS, dvb = 16 * nw;
  const int jb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / d.r, j0 = jb * dvb;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int lr = lane & 7, lsel = (lane >> 3) & 1, lhi = lane >> 4;
  const Pt pt(smem + 2 * size_t(stageBytes));
  const int v0 = j0 + 16 * pt.slice; // this warp's first value column
  const bool active = v0 < d.dv;
  const int dk = DKc ? DKc : d.dk, nk = dk >> 4, pk = dk + 8;
  const int nkw = KS > 1 ? Pt::kKeySteps : nk; // key k steps of this warp
  const long bh = long(b) * d.Hv + h;
  auto stage = [&](int buf) { return smem + size_t(buf) * stageBytes; };
  // Stage layout: W [64][pk], K [64][pk], (Q [64][pk], P [64][kTP]),
  // U^T [dvb][kTP], G [64].
  auto Wst = [&](int buf) { return (bf *)stage(buf); };
  auto Kst = [&](int buf) { return Wst(buf) + C * pk; };
  auto Qst = [&](int buf) { return Kst(buf) + C * pk; };
  auto Pst = [&](int buf) { return Qst(buf) + C * pk; };
  auto Ust = [&](int buf) {
    return kOut ? Pst(buf) + C * kTP : Kst(buf) + C * pk;
  };
  auto Gst = [&](int buf) { return (float *)(Ust(buf) + dvb * kTP); };

  const int vRows = min(dvb, d.dv - j0);
  auto issue = [&](int n, int buf) {
    const int L = chunkLen(d.T, n);
    const long tok0 = long(b) * d.T + n * C, cb = bh * d.NT + n;
    loadTile(Wst(buf), pk, Wg + cb * C * dk, dk, C, C, dk, true);
    loadTile(Kst(buf), pk, k + tok0 * d.ks + long(hk) * dk, d.ks, C, L, dk,
             d.vk);
    if (kOut) {
      loadTile(Qst(buf), pk, q + tok0 * d.qs + long(hk) * dk, d.qs, C, L, dk,
               d.vq);
      loadTile(Pst(buf), kTP, Pg + cb * C * C, C, C, C, C, true);
    }
    loadTile(Ust(buf), kTP, UTg + (cb * d.dv + j0) * C, C, vRows, vRows, C,
             true);
    for (int r = threadIdx.x; r < L; r += blockDim.x)
      cpAsync4(Gst(buf) + r, gCum + (tok0 + r) * d.Hv + h);
  };

  float S[2 * Pt::kKeySteps][4]; // this warp's S^T tiles (loadStateT's layout)
  loadStateT(S, h0 ? h0 + bh * dk * d.dv : nullptr, 16 * pt.key0, nkw, d.dv, v0,
             active);
  if (active)
    pt.publishState(S);

  issue(0, 0);
  cpAsyncCommit();
  for (int n = 0; n < d.NT; ++n) {
    const int buf = n & 1;
    cpAsyncWait<0>();
    __syncthreads();
    if (n + 1 < d.NT)
      issue(n + 1, buf ^ 1);
    cpAsyncCommit();
    if (!active)
      continue;
    const int L = chunkLen(d.T, n);
    const long tok0 = long(b) * d.T + n * C, cb = bh * d.NT + n;
    const float *G = Gst(buf);
    const float gl = G[L - 1];
    const bf *Ws_ = Wst(buf), *Ks = Kst(buf), *Us = Ust(buf);
    if (!kOut)
      storeTilesBf16(hT + (cb * d.dv + v0) * dk + 16 * pt.key0, dk, S, 2 * nkw);
    // acc = S^T W^T (and S^T Q^T) on this warp's positions: A from the state.
    float V[Pt::kTiles][4], O[Pt::kTiles][4];
#pragma unroll
    for (int j = 0; j < Pt::kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        V[j][e] = O[j][e] = 0.f;
#pragma unroll
    for (int i = 0; i < KT; ++i) {
      if (i >= nk)
        break;
      uint32_t a[4];
      pt.stateA(a, S, i);
#pragma unroll
      for (int jl = 0; jl < Pt::kSteps; ++jl) {
        const int off =
            (16 * (pt.step0 + jl) + lr + 8 * lhi) * pk + 16 * i + 8 * lsel;
        uint32_t bw[4];
        ldsm4(bw, Ws_ + off);
        mma16816(V[2 * jl], a, bw);
        mma16816(V[2 * jl + 1], a, bw + 2);
        if (kOut) {
          uint32_t bq[4];
          ldsm4(bq, Qst(buf) + off);
          mma16816(O[2 * jl], a, bq);
          mma16816(O[2 * jl + 1], a, bq + 2);
        }
      }
    }
    // Vnew^T = U^T - acc.
    {
      const bf *u = Us + (16 * pt.slice + g) * kTP + 2 * t + 8 * pt.tile0;
#pragma unroll
      for (int j = 0; j < Pt::kTiles; ++j) {
        float2 u0 = unpack2(*(const uint32_t *)(u + 8 * j));
        float2 u1 = unpack2(*(const uint32_t *)(u + 8 * kTP + 8 * j));
        V[j][0] = u0.x - V[j][0];
        V[j][1] = u0.y - V[j][1];
        V[j][2] = u1.x - V[j][2];
        V[j][3] = u1.y - V[j][3];
      }
    }
    if (!kOut)
      storeTilesBf16(VnT + (cb * d.dv + v0) * C + 8 * pt.tile0, C, V,
                     Pt::kTiles);
    // The A fragments of Vnew^T diag(e^{G_L - G}) for the state update, and
    // (forward) of Vnew^T for o, on 16 positions each.
    auto vnewE = [&](uint32_t a[4], int kk, int kl) {
      const int s = 16 * kk + 2 * t;
      const float e0 = s < L ? __expf(gl - G[s]) : 0.f;
      const float e1 = s + 1 < L ? __expf(gl - G[s + 1]) : 0.f;
      const float e8 = s + 8 < L ? __expf(gl - G[s + 8]) : 0.f;
      const float e9 = s + 9 < L ? __expf(gl - G[s + 9]) : 0.f;
      a[0] = pack2(V[2 * kl][0] * e0, V[2 * kl][1] * e1);
      a[1] = pack2(V[2 * kl][2] * e0, V[2 * kl][3] * e1);
      a[2] = pack2(V[2 * kl + 1][0] * e8, V[2 * kl + 1][1] * e9);
      a[3] = pack2(V[2 * kl + 1][2] * e8, V[2 * kl + 1][3] * e9);
    };
    if constexpr (KS > 1) {
#pragma unroll
      for (int kl = 0; kl < Pt::kSteps; ++kl) {
        uint32_t a[4];
        vnewE(a, pt.step0 + kl, kl);
        putA(pt.second(pt.step0 + kl), a);
        if (kOut) {
          accToA(a, V, kl);
          putA(pt.first(pt.step0 + kl), a);
        }
      }
      sliceSync<KS>(pt.slice);
    }
    if (kOut) {
      // o^T = acc_Q diag(scale e^G) + Vnew^T P^T, rows >= L never stored.
      const float scale = d.scale;
#pragma unroll
      for (int j = 0; j < Pt::kTiles; ++j) {
        const int s = 8 * (pt.tile0 + j) + 2 * t;
        const float f0 = s < L ? scale * __expf(G[s]) : 0.f;
        const float f1 = s + 1 < L ? scale * __expf(G[s + 1]) : 0.f;
        O[j][0] *= f0;
        O[j][1] *= f1;
        O[j][2] *= f0;
        O[j][3] *= f1;
      }
      const bf *Ps = Pst(buf);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t a[4];
        if constexpr (KS > 1)
          getA(a, pt.first(kk));
        else
          accToA(a, V, kk);
#pragma unroll
        for (int jl = 0; jl < Pt::kSteps; ++jl) {
          uint32_t bp[4];
          ldsm4(bp, Ps + (16 * (pt.step0 + jl) + lr + 8 * lhi) * kTP + 16 * kk +
                        8 * lsel);
          mma16816(O[2 * jl], a, bp);
          mma16816(O[2 * jl + 1], a, bp + 2);
        }
      }
      // Element (j, e) is token 8j + 2t + (e & 1), column v0 + g + 8 (e >> 1).
      const long rs = long(d.Hv) * d.dv;
      bf *ob = o + ((tok0 + 8 * pt.tile0 + 2 * t) * d.Hv + h) * d.dv + v0 + g;
      if (L == C) {
#pragma unroll
        for (int j = 0; j < Pt::kTiles; ++j, ob += 8 * rs) {
          ob[0] = f2b(O[j][0]);
          ob[rs] = f2b(O[j][1]);
          ob[8] = f2b(O[j][2]);
          ob[rs + 8] = f2b(O[j][3]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < Pt::kTiles; ++j, ob += 8 * rs) {
          const int r = 8 * (pt.tile0 + j) + 2 * t;
          if (r < L) {
            ob[0] = f2b(O[j][0]);
            ob[8] = f2b(O[j][2]);
          }
          if (r + 1 < L) {
            ob[rs] = f2b(O[j][1]);
            ob[rs + 8] = f2b(O[j][3]);
          }
        }
      }
    }
    // S^T = e^{G_L} S^T + (Vnew^T diag(e^{G_L - G})) K on this warp's keys.
    const float gam = __expf(gl);
#pragma unroll
    for (int j = 0; j < 2 * Pt::kKeySteps; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        S[j][e] *= gam;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[4];
      if constexpr (KS > 1)
        getA(a, pt.second(kk));
      else
        vnewE(a, kk, kk);
#pragma unroll
      for (int jl = 0; jl < Pt::kKeySteps; ++jl) {
        if (jl >= nkw)
          break;
        uint32_t bk[4];
        ldsm4t(bk, Ks + (16 * kk + lr + 8 * lsel) * pk + 16 * (pt.key0 + jl) +
                       8 * lhi);
        mma16816(S[2 * jl], a, bk);
        mma16816(S[2 * jl + 1], a, bk + 2);
      }
    }
    pt.publishState(S);
  }
  if (finalState && active)
    storeStateT(finalState + bh * dk * d.dv, S, 16 * pt.key0, nkw, d.dv, v0);
}

template <int DKc, int KS>
__global__ void __launch_bounds__(256, 1)
    stateBwdRegKernel(Dims d, int stageBytes, const bf *q, const bf *k,
                      const float *gCum, const bf *Wg, const bf *Pg,
                      const bf *dO, const float *dFinal, bf *dhT, bf *dVnT,
                      float *dInit) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Pt = Part<DKc, KS>;
  const int nw = (blockDim.x >> 5) / KS, dvb = 16 * nw, pdo = dvb + 8;
  const int jb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / d.r, j0 = jb * dvb;
  const int lane = threadIdx.x & 31;
  const int t = lane & 3;
  const int lr = lane & 7, lsel = (lane >> 3) & 1, lhi = lane >> 4;
  const Pt pt(smem + 2 * size_t(stageBytes));
  const int v0 = j0 + 16 * pt.slice;
  const bool active = v0 < d.dv;
  const int dk = DKc ? DKc : d.dk, nk = dk >> 4, pk = dk + 8;
  const int nkw = KS > 1 ? Pt::kKeySteps : nk;
  const long bh = long(b) * d.Hv + h;
  const float scale = d.scale;
  // Stage layout: Q, K, W [64][pk], P [64][kTP], dO [64][pdo], G [64].
  auto Qst = [&](int buf) { return (bf *)(smem + size_t(buf) * stageBytes); };
  auto Kst = [&](int buf) { return Qst(buf) + C * pk; };
  auto Wst = [&](int buf) { return Kst(buf) + C * pk; };
  auto Pst = [&](int buf) { return Wst(buf) + C * pk; };
  auto Ost = [&](int buf) { return Pst(buf) + C * kTP; };
  auto Gst = [&](int buf) { return (float *)(Ost(buf) + C * pdo); };

  const int vCols = min(dvb, d.dv - j0);
  auto issue = [&](int n, int buf) {
    const int L = chunkLen(d.T, n);
    const long tok0 = long(b) * d.T + n * C, cb = bh * d.NT + n;
    loadTile(Qst(buf), pk, q + tok0 * d.qs + long(hk) * dk, d.qs, C, L, dk,
             d.vq);
    loadTile(Kst(buf), pk, k + tok0 * d.ks + long(hk) * dk, d.ks, C, L, dk,
             d.vk);
    loadTile(Wst(buf), pk, Wg + cb * C * dk, dk, C, C, dk, true);
    loadTile(Pst(buf), kTP, Pg + cb * C * C, C, C, C, C, true);
    loadTile(Ost(buf), pdo, dO + (tok0 * d.Hv + h) * d.dv + j0,
             long(d.Hv) * d.dv, C, L, vCols, d.vo);
    for (int r = threadIdx.x; r < L; r += blockDim.x)
      cpAsync4(Gst(buf) + r, gCum + (tok0 + r) * d.Hv + h);
  };

  float H[2 * Pt::kKeySteps][4]; // this warp's dH^T tiles (loadStateT's)
  loadStateT(H, dFinal ? dFinal + bh * dk * d.dv : nullptr, 16 * pt.key0, nkw,
             d.dv, v0, active);
  if (active)
    pt.publishState(H);

  issue(d.NT - 1, 0);
  cpAsyncCommit();
  for (int it = 0; it < d.NT; ++it) {
    const int n = d.NT - 1 - it, buf = it & 1;
    cpAsyncWait<0>();
    __syncthreads();
    if (n > 0)
      issue(n - 1, buf ^ 1);
    cpAsyncCommit();
    if (!active)
      continue;
    const int L = chunkLen(d.T, n);
    const long cb = bh * d.NT + n;
    const float *G = Gst(buf);
    const float gl = G[L - 1];
    const bf *Qs = Qst(buf), *Ks = Kst(buf), *Ws_ = Wst(buf), *Ps = Pst(buf),
             *Os = Ost(buf);
    storeTilesBf16(dhT + (cb * d.dv + v0) * dk + 16 * pt.key0, dk, H, 2 * nkw);
    // D = dH^T K^T on this warp's positions, then columns times e^{G_L - G}.
    float D[Pt::kTiles][4];
#pragma unroll
    for (int j = 0; j < Pt::kTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        D[j][e] = 0.f;
#pragma unroll
    for (int i = 0; i < KT; ++i) {
      if (i >= nk)
        break;
      uint32_t a[4];
      pt.stateA(a, H, i);
#pragma unroll
      for (int jl = 0; jl < Pt::kSteps; ++jl) {
        uint32_t bk[4];
        ldsm4(bk, Ks + (16 * (pt.step0 + jl) + lr + 8 * lhi) * pk + 16 * i +
                      8 * lsel);
        mma16816(D[2 * jl], a, bk);
        mma16816(D[2 * jl + 1], a, bk + 2);
      }
    }
#pragma unroll
    for (int j = 0; j < Pt::kTiles; ++j) {
      const int s = 8 * (pt.tile0 + j) + 2 * t;
      const float e0 = s < L ? __expf(gl - G[s]) : 0.f;
      const float e1 = s + 1 < L ? __expf(gl - G[s + 1]) : 0.f;
      D[j][0] *= e0;
      D[j][1] *= e1;
      D[j][2] *= e0;
      D[j][3] *= e1;
    }
    // dO^T fragments (A operand, k = chunk rows) straight from the dO tile.
    uint32_t aO[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      ldsm4t(aO[kk],
             Os + (16 * kk + lr + 8 * lhi) * pdo + 16 * pt.slice + 8 * lsel);
    }
    // dVnew^T += dO^T P.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int jl = 0; jl < Pt::kSteps; ++jl) {
        uint32_t bp[4];
        ldsm4t(bp, Ps + (16 * kk + lr + 8 * lsel) * kTP + 16 * (pt.step0 + jl) +
                       8 * lhi);
        mma16816(D[2 * jl], aO[kk], bp);
        mma16816(D[2 * jl + 1], aO[kk], bp + 2);
      }
    storeTilesBf16(dVnT + (cb * d.dv + v0) * C + 8 * pt.tile0, C, D,
                   Pt::kTiles);
    if constexpr (KS > 1) {
#pragma unroll
      for (int kl = 0; kl < Pt::kSteps; ++kl) {
        uint32_t a[4];
        accToA(a, D, kl, -1.f);
        putA(pt.first(pt.step0 + kl), a);
      }
      sliceSync<KS>(pt.slice);
    }
    // dH^T = e^{G_L} dH^T + (dO^T diag(scale e^G)) Q - dVnew^T W.
    const float gam = __expf(gl);
#pragma unroll
    for (int j = 0; j < 2 * Pt::kKeySteps; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        H[j][e] *= gam;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int s = 16 * kk + 2 * t;
      const float f0 = s < L ? scale * __expf(G[s]) : 0.f;
      const float f1 = s + 1 < L ? scale * __expf(G[s + 1]) : 0.f;
      const float f8 = s + 8 < L ? scale * __expf(G[s + 8]) : 0.f;
      const float f9 = s + 9 < L ? scale * __expf(G[s + 9]) : 0.f;
      uint32_t a1[4], a2[4];
      {
        float2 x0 = unpack2(aO[kk][0]), x1 = unpack2(aO[kk][1]),
               x2 = unpack2(aO[kk][2]), x3 = unpack2(aO[kk][3]);
        a1[0] = pack2(x0.x * f0, x0.y * f1);
        a1[1] = pack2(x1.x * f0, x1.y * f1);
        a1[2] = pack2(x2.x * f8, x2.y * f9);
        a1[3] = pack2(x3.x * f8, x3.y * f9);
      }
      if constexpr (KS > 1)
        getA(a2, pt.first(kk));
      else
        accToA(a2, D, kk, -1.f);
#pragma unroll
      for (int jl = 0; jl < Pt::kKeySteps; ++jl) {
        if (jl >= nkw)
          break;
        const int off =
            (16 * kk + lr + 8 * lsel) * pk + 16 * (pt.key0 + jl) + 8 * lhi;
        uint32_t bq[4], bw[4];
        ldsm4t(bq, Qs + off);
        ldsm4t(bw, Ws_ + off);
        mma16816(H[2 * jl], a1, bq);
        mma16816(H[2 * jl + 1], a1, bq + 2);
        mma16816(H[2 * jl], a2, bw);
        mma16816(H[2 * jl + 1], a2, bw + 2);
      }
    }
    pt.publishState(H);
  }
  if (dInit && active)
    storeStateT(dInit + bh * dk * d.dv, H, 16 * pt.key0, nkw, d.dv, v0);
}

template <typename K> Status setSmem(K kernel, size_t bytes) {
  AP_GDN_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  return Status::Ok;
}

/// Calls f(std::integral_constant<int, KS>) for the plan's split; splits
/// above 1 exist only for a compile-time dk (regPlan never picks them
/// otherwise, stateSplitOk refuses them).
template <int DKc, typename F> Status withSplit(int ks, F &&f) {
  if constexpr (DKc > 0) {
    if (ks == 4)
      return f(std::integral_constant<int, 4>{});
    if (ks == 2)
      return f(std::integral_constant<int, 2>{});
  }
  if (ks != 1)
    return Status::InvalidArgument;
  return f(std::integral_constant<int, 1>{});
}

} // namespace

bool stateSplitOk(const Dims &d) {
  if (d.split != 0 && d.split != 1 && d.split != 2 && d.split != 4)
    return false;
  if (d.split > 1 && !splittable(d))
    return false;
  if (d.slices < 0 || d.slices > kMaxStateWarps)
    return false;
  return std::max(d.split, 1) * std::max(d.slices, 1) <= kMaxStateWarps;
}

Status runStateForwardReg(const Dims &d, cudaStream_t s, int smCount,
                          const bf *q, const bf *k, const float *gCum,
                          const bf *W, const bf *UT, const bf *P,
                          const float *h0, bf *o, float *finalState, bf *hT,
                          bf *VnT) {
  const bool out = o != nullptr;
  RegPlan p = regPlan(d, smCount, out ? fwdStageOut : fwdStageSave);
  dim3 grid((d.dv + 16 * p.nw - 1) / (16 * p.nw), d.Hv, d.B);
  const unsigned threads = 32 * p.nw * p.ks;
  return withDk(d.dk, [&](auto dkc) {
    constexpr int DKc = decltype(dkc)::value;
    return withSplit<DKc>(p.ks, [&](auto ksc) {
      constexpr int KS = decltype(ksc)::value;
      auto kernel = out ? stateFwdRegKernel<true, DKc, KS>
                        : stateFwdRegKernel<false, DKc, KS>;
      if (Status st = setSmem(kernel, p.smem); st != Status::Ok)
        return st;
      kernel<<<grid, threads, p.smem, s>>>(
          d, int(p.stage), q, k, gCum, W, UT, P, h0, o, finalState,
          out ? nullptr : hT, out ? nullptr : VnT);
      AP_GDN_LAUNCH_CHECK(stateFwdRegKernel);
      return Status::Ok;
    });
  });
}

Status runStateBackwardReg(const Dims &d, cudaStream_t s, int smCount,
                           const bf *q, const bf *k, const float *gCum,
                           const bf *W, const bf *P, const bf *dO,
                           const float *dFinal, bf *dhT, bf *dVnT,
                           float *dInit) {
  RegPlan p = regPlan(d, smCount, bwdStage);
  dim3 grid((d.dv + 16 * p.nw - 1) / (16 * p.nw), d.Hv, d.B);
  const unsigned threads = 32 * p.nw * p.ks;
  return withDk(d.dk, [&](auto dkc) {
    constexpr int DKc = decltype(dkc)::value;
    return withSplit<DKc>(p.ks, [&](auto ksc) {
      constexpr int KS = decltype(ksc)::value;
      if (Status st = setSmem(stateBwdRegKernel<DKc, KS>, p.smem);
          st != Status::Ok)
        return st;
      stateBwdRegKernel<DKc, KS><<<grid, threads, p.smem, s>>>(
          d, int(p.stage), q, k, gCum, W, P, dO, dFinal, dhT, dVnT, dInit);
      AP_GDN_LAUNCH_CHECK(stateBwdRegKernel);
      return Status::Ok;
    });
  });
}

} // namespace ap::kernels::gdncuda
