//===- gdn_state.cu - register-state sequential chunk passes ----*- C++ -*-===//
//
// The two sequential passes of the chunked gated delta rule (dk <= 128) with
// the recurrent state held in mma accumulator registers. Each warp owns 16
// value columns and keeps its slice of the state transposed, S^T [16 x dk]
// fp32. Transposed, every product of the recurrence keeps the state (or the
// chunk's Vnew^T / dVnew^T) as the A operand: an m16n8k16 accumulator
// fragment of rows x (k, k+1) is the A fragment of the next product after a
// bf16 conversion, so a warp walks all chunks without exchanging anything
// with the other warps. Shared memory holds only the per-chunk inputs (W, K,
// Q, P, U^T / dO), fetched with cp.async one chunk ahead; one CTA barrier
// per chunk hands the buffers over.
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

/// The state slice of a warp, X[j][e] = X^T[v0 + g + 8 (e >> 1)][8j + 2t +
/// (e & 1)], from / to a [dk][dv] fp32 state (the ABI layout of initial and
/// final states and their gradients); nullptr reads as zeros.
__device__ __forceinline__ void loadStateT(float (&X)[2 * KT][4],
                                           const float *src, int nk, int dv,
                                           int v0, bool active) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < 2 * KT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int v = v0 + g + 8 * (e >> 1), kk = 8 * j + 2 * t + (e & 1);
      X[j][e] = (src && active && j < 2 * nk) ? src[long(kk) * dv + v] : 0.f;
    }
}
__device__ __forceinline__ void
storeStateT(float *dst, const float (&X)[2 * KT][4], int nk, int dv, int v0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < 2 * KT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int v = v0 + g + 8 * (e >> 1), kk = 8 * j + 2 * t + (e & 1);
      if (j < 2 * nk)
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

/// Shared-memory plan: nw warps (16 value columns each) per CTA, two stages.
struct RegPlan {
  int nw;
  size_t stage, smem;
};

/// Four warps per CTA (one per SM sub-partition) unless that leaves more
/// CTAs than SMs, then eight; never more warps than 16-column slices.
RegPlan regPlan(const Dims &d, int smCount,
                size_t (*stageOf)(const Dims &, int)) {
  int nw = std::min(4, d.dv / 16);
  if (long(d.B) * d.Hv * ((d.dv + 63) / 64) > std::max(smCount, 1) &&
      d.dv >= 128)
    nw = 8;
  RegPlan p;
  p.nw = nw;
  p.stage = stageOf(d, 16 * nw);
  p.smem = 2 * p.stage;
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
/// are immediates and the k loops have fixed trip counts.
template <bool kOut, int DKc>
__global__ void __launch_bounds__(256, 1)
    stateFwdRegKernel(Dims d, int stageBytes, const bf *q, const bf *k,
                      const float *gCum, const bf *Wg, const bf *UTg,
                      const bf *Pg, const float *h0, bf *o, float *finalState,
                      bf *hT, bf *VnT) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int nw = blockDim.x >> 5, dvb = 16 * nw;
  const int jb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / d.r, j0 = jb * dvb;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int lr = lane & 7, lsel = (lane >> 3) & 1, lhi = lane >> 4;
  const int v0 = j0 + 16 * warp; // this warp's first value column
  const bool active = v0 < d.dv;
  const int dk = DKc ? DKc : d.dk, nk = dk >> 4, pk = dk + 8;
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

  float S[2 * KT][4]; // S^T slice (loadStateT's layout)
  loadStateT(S, h0 ? h0 + bh * dk * d.dv : nullptr, nk, d.dv, v0, active);

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
      storeTilesBf16(hT + (cb * d.dv + v0) * dk, dk, S, 2 * nk);
    // acc = S^T W^T (and S^T Q^T): A from the state registers.
    float V[8][4], O[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        V[j][e] = O[j][e] = 0.f;
#pragma unroll
    for (int i = 0; i < KT; ++i) {
      if (i >= nk)
        break;
      uint32_t a[4];
      accToA(a, S, i);
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        const int off = (16 * jp + lr + 8 * lhi) * pk + 16 * i + 8 * lsel;
        uint32_t bw[4];
        ldsm4(bw, Ws_ + off);
        mma16816(V[2 * jp], a, bw);
        mma16816(V[2 * jp + 1], a, bw + 2);
        if (kOut) {
          uint32_t bq[4];
          ldsm4(bq, Qst(buf) + off);
          mma16816(O[2 * jp], a, bq);
          mma16816(O[2 * jp + 1], a, bq + 2);
        }
      }
    }
    // Vnew^T = U^T - acc.
    {
      const bf *u = Us + (16 * warp + g) * kTP + 2 * t;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float2 u0 = unpack2(*(const uint32_t *)(u + 8 * j));
        float2 u1 = unpack2(*(const uint32_t *)(u + 8 * kTP + 8 * j));
        V[j][0] = u0.x - V[j][0];
        V[j][1] = u0.y - V[j][1];
        V[j][2] = u1.x - V[j][2];
        V[j][3] = u1.y - V[j][3];
      }
    }
    if (!kOut)
      storeTilesBf16(VnT + (cb * d.dv + v0) * C, C, V, 8);
    if (kOut) {
      // o^T = acc_Q diag(scale e^G) + Vnew^T P^T, rows >= L never stored.
      const float scale = d.scale;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int s = 8 * j + 2 * t;
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
        accToA(a, V, kk);
#pragma unroll
        for (int jp = 0; jp < 4; ++jp) {
          uint32_t bp[4];
          ldsm4(bp, Ps + (16 * jp + lr + 8 * lhi) * kTP + 16 * kk + 8 * lsel);
          mma16816(O[2 * jp], a, bp);
          mma16816(O[2 * jp + 1], a, bp + 2);
        }
      }
      // Element (j, e) is token 8j + 2t + (e & 1), column v0 + g + 8 (e >> 1).
      const long rs = long(d.Hv) * d.dv;
      bf *ob = o + ((tok0 + 2 * t) * d.Hv + h) * d.dv + v0 + g;
      if (L == C) {
#pragma unroll
        for (int j = 0; j < 8; ++j, ob += 8 * rs) {
          ob[0] = f2b(O[j][0]);
          ob[rs] = f2b(O[j][1]);
          ob[8] = f2b(O[j][2]);
          ob[rs + 8] = f2b(O[j][3]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j, ob += 8 * rs) {
          const int r = 8 * j + 2 * t;
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
    // S^T = e^{G_L} S^T + (Vnew^T diag(e^{G_L - G})) K.
    const float gam = __expf(gl);
#pragma unroll
    for (int j = 0; j < 2 * KT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        S[j][e] *= gam;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int s = 16 * kk + 2 * t;
      const float e0 = s < L ? __expf(gl - G[s]) : 0.f;
      const float e1 = s + 1 < L ? __expf(gl - G[s + 1]) : 0.f;
      const float e8 = s + 8 < L ? __expf(gl - G[s + 8]) : 0.f;
      const float e9 = s + 9 < L ? __expf(gl - G[s + 9]) : 0.f;
      uint32_t a[4];
      a[0] = pack2(V[2 * kk][0] * e0, V[2 * kk][1] * e1);
      a[1] = pack2(V[2 * kk][2] * e0, V[2 * kk][3] * e1);
      a[2] = pack2(V[2 * kk + 1][0] * e8, V[2 * kk + 1][1] * e9);
      a[3] = pack2(V[2 * kk + 1][2] * e8, V[2 * kk + 1][3] * e9);
#pragma unroll
      for (int jp = 0; jp < KT; ++jp) {
        if (jp >= nk)
          break;
        uint32_t bk[4];
        ldsm4t(bk, Ks + (16 * kk + lr + 8 * lsel) * pk + 16 * jp + 8 * lhi);
        mma16816(S[2 * jp], a, bk);
        mma16816(S[2 * jp + 1], a, bk + 2);
      }
    }
  }
  if (finalState && active)
    storeStateT(finalState + bh * dk * d.dv, S, nk, d.dv, v0);
}

template <int DKc>
__global__ void __launch_bounds__(256, 1)
    stateBwdRegKernel(Dims d, int stageBytes, const bf *q, const bf *k,
                      const float *gCum, const bf *Wg, const bf *Pg,
                      const bf *dO, const float *dFinal, bf *dhT, bf *dVnT,
                      float *dInit) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int nw = blockDim.x >> 5, dvb = 16 * nw, pdo = dvb + 8;
  const int jb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / d.r, j0 = jb * dvb;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = lane & 3;
  const int lr = lane & 7, lsel = (lane >> 3) & 1, lhi = lane >> 4;
  const int v0 = j0 + 16 * warp;
  const bool active = v0 < d.dv;
  const int dk = DKc ? DKc : d.dk, nk = dk >> 4, pk = dk + 8;
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

  float H[2 * KT][4]; // dH^T slice (loadStateT's layout)
  loadStateT(H, dFinal ? dFinal + bh * dk * d.dv : nullptr, nk, d.dv, v0,
             active);

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
    storeTilesBf16(dhT + (cb * d.dv + v0) * dk, dk, H, 2 * nk);
    // D = dH^T K^T, then columns times e^{G_L - G}.
    float D[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        D[j][e] = 0.f;
#pragma unroll
    for (int i = 0; i < KT; ++i) {
      if (i >= nk)
        break;
      uint32_t a[4];
      accToA(a, H, i);
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        uint32_t bk[4];
        ldsm4(bk, Ks + (16 * jp + lr + 8 * lhi) * pk + 16 * i + 8 * lsel);
        mma16816(D[2 * jp], a, bk);
        mma16816(D[2 * jp + 1], a, bk + 2);
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int s = 8 * j + 2 * t;
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
    for (int kk = 0; kk < 4; ++kk)
      ldsm4t(aO[kk],
             Os + (16 * kk + lr + 8 * lhi) * pdo + 16 * warp + 8 * lsel);
      // dVnew^T += dO^T P.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        uint32_t bp[4];
        ldsm4t(bp, Ps + (16 * kk + lr + 8 * lsel) * kTP + 16 * jp + 8 * lhi);
        mma16816(D[2 * jp], aO[kk], bp);
        mma16816(D[2 * jp + 1], aO[kk], bp + 2);
      }
    storeTilesBf16(dVnT + (cb * d.dv + v0) * C, C, D, 8);
    // dH^T = e^{G_L} dH^T + (dO^T diag(scale e^G)) Q - dVnew^T W.
    const float gam = __expf(gl);
#pragma unroll
    for (int j = 0; j < 2 * KT; ++j)
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
      accToA(a2, D, kk, -1.f);
#pragma unroll
      for (int jp = 0; jp < KT; ++jp) {
        if (jp >= nk)
          break;
        const int off = (16 * kk + lr + 8 * lsel) * pk + 16 * jp + 8 * lhi;
        uint32_t bq[4], bw[4];
        ldsm4t(bq, Qs + off);
        ldsm4t(bw, Ws_ + off);
        mma16816(H[2 * jp], a1, bq);
        mma16816(H[2 * jp + 1], a1, bq + 2);
        mma16816(H[2 * jp], a2, bw);
        mma16816(H[2 * jp + 1], a2, bw + 2);
      }
    }
  }
  if (dInit && active)
    storeStateT(dInit + bh * dk * d.dv, H, nk, d.dv, v0);
}

template <typename K> Status setSmem(K kernel, size_t bytes) {
  AP_GDN_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  return Status::Ok;
}

} // namespace

Status runStateForwardReg(const Dims &d, cudaStream_t s, int smCount,
                          const bf *q, const bf *k, const float *gCum,
                          const bf *W, const bf *UT, const bf *P,
                          const float *h0, bf *o, float *finalState, bf *hT,
                          bf *VnT) {
  const bool out = o != nullptr;
  RegPlan p = regPlan(d, smCount, out ? fwdStageOut : fwdStageSave);
  dim3 grid((d.dv + 16 * p.nw - 1) / (16 * p.nw), d.Hv, d.B);
  return withDk(d.dk, [&](auto dkc) {
    constexpr int DKc = decltype(dkc)::value;
    if (out) {
      if (Status st = setSmem(stateFwdRegKernel<true, DKc>, p.smem);
          st != Status::Ok)
        return st;
      stateFwdRegKernel<true, DKc><<<grid, 32 * p.nw, p.smem, s>>>(
          d, int(p.stage), q, k, gCum, W, UT, P, h0, o, finalState, nullptr,
          nullptr);
    } else {
      if (Status st = setSmem(stateFwdRegKernel<false, DKc>, p.smem);
          st != Status::Ok)
        return st;
      stateFwdRegKernel<false, DKc>
          <<<grid, 32 * p.nw, p.smem, s>>>(d, int(p.stage), q, k, gCum, W, UT,
                                           P, h0, nullptr, finalState, hT, VnT);
    }
    AP_GDN_LAUNCH_CHECK(stateFwdRegKernel);
    return Status::Ok;
  });
}

Status runStateBackwardReg(const Dims &d, cudaStream_t s, int smCount,
                           const bf *q, const bf *k, const float *gCum,
                           const bf *W, const bf *P, const bf *dO,
                           const float *dFinal, bf *dhT, bf *dVnT,
                           float *dInit) {
  RegPlan p = regPlan(d, smCount, bwdStage);
  dim3 grid((d.dv + 16 * p.nw - 1) / (16 * p.nw), d.Hv, d.B);
  return withDk(d.dk, [&](auto dkc) {
    constexpr int DKc = decltype(dkc)::value;
    if (Status st = setSmem(stateBwdRegKernel<DKc>, p.smem); st != Status::Ok)
      return st;
    stateBwdRegKernel<DKc><<<grid, 32 * p.nw, p.smem, s>>>(
        d, int(p.stage), q, k, gCum, W, P, dO, dFinal, dhT, dVnT, dInit);
    AP_GDN_LAUNCH_CHECK(stateBwdRegKernel);
    return Status::Ok;
  });
}

} // namespace ap::kernels::gdncuda
