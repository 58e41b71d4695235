//===- gdn_chunk.cu - chunked gated delta rule, cuda ------------*- C++ -*-===//
//
// Forward: (1) intra-chunk kernel per (b, h, chunk): g cumsum, A, T=(I+A)^-1,
// W, U (and P = scale (Q K^T) * D); (2) for dk <= 128 the register-state
// pass of gdn_state.cu, which also writes o; wider keys: a shared-memory
// state kernel per (b, h, dv block), sequential over chunks (chunk start
// states h[n] and Vnew), then (3) an output kernel per (b, h, chunk).
// Backward: (1) and (2) again (W, U, h, Vnew are recomputed from the saved
// T and g cumsum), (3') reverse state pass: dh_end[n], dVnew and d initial
// state; (4) per-chunk gradient kernel; (5) for grouped heads (or dk > 128)
// the sum of q/k gradients over each group of value heads, in head order.
// Every matmul runs on tensor cores (bf16 operands, fp32 accumulation);
// states and gradient accumulators are fp32; no atomics.
//
//===----------------------------------------------------------------------===//
#include "kernels/cuda/documents.h"
#include "kernels/cuda/gdn/gdn_chunk.cuh"

#include <algorithm>
#include <cstdint>

namespace ap::kernels::gdncuda {
namespace {

/// Workspace carve-up (each region 256-byte aligned); its size is
/// gdnChunk{Forward,Backward}WorkspaceBytes (kernels/workspace.cpp), which
/// lists the same regions.
struct Ws {
  bf *W, *U, *Vn;      // [B*Hv][NT*64][dk | dv | dv]
  bf *P;               // [B*Hv][NT][64][64]
  float *h, *dh;       // [B*Hv][NT][dk][dv]
  float *dVn;          // [B*Hv][NT*64][dv]
  float *dQ, *dK, *dW; // [B*Hv][NT*64][dk]
};
size_t align256(size_t x) { return (x + 255) & ~size_t(255); }
size_t carve(const Dims &d, bool backward, char *base, Ws *w) {
  size_t rows = size_t(d.B) * d.Hv * d.NT * C;
  size_t states = size_t(d.B) * d.Hv * d.NT * d.dk * d.dv;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char *p = base ? base + off : nullptr;
    off += align256(bytes);
    return p;
  };
  Ws tmp;
  Ws &x = w ? *w : tmp;
  x.W = (bf *)take(rows * d.dk * 2);
  x.U = (bf *)take(rows * d.dv * 2);
  x.Vn = (bf *)take(rows * d.dv * 2);
  x.P = (bf *)take(rows * C * 2);
  x.h = (float *)take(states * 4);
  if (backward) {
    x.dh = (float *)take(states * 4);
    x.dVn = (float *)take(rows * d.dv * 4);
    x.dQ = (float *)take(rows * d.dk * 4);
    x.dK = (float *)take(rows * d.dk * 4);
    x.dW = (float *)take(rows * d.dk * 4);
  }
  return off;
}

/// [rows][d] fp32 (row stride `stride`) -> bf16 [rows][pitch], float4 loads
/// (d % 4 == 0, 16-byte aligned rows).
__device__ void loadF32Rows(bf *dst, int pitch, const float *src, long stride,
                            int rows, int d) {
  const int per = d >> 2;
  for (int i = threadIdx.x; i < rows * per; i += blockDim.x) {
    int r = i / per, c = (i - r * per) << 2;
    float4 x = *reinterpret_cast<const float4 *>(src + long(r) * stride + c);
    bf *o = dst + r * pitch + c;
    o[0] = f2b(x.x);
    o[1] = f2b(x.y);
    o[2] = f2b(x.z);
    o[3] = f2b(x.w);
  }
}

//===----------------------------------------------------------------------===//
// (1) intra-chunk: g cumsum, A, T, W, U
//===----------------------------------------------------------------------===//

/// reg: the layouts of the register-state passes (gdn_chunk.cuh): U
/// transposed, and P = scale (Q K^T) * D as well (from q). Otherwise U is
/// row-major [64][dv] and P is not written. Outputs leave through shared
/// staging tiles as 16-byte stores (W and U only when `stage`: they fit in
/// the Q, A and T area).
__global__ void __launch_bounds__(kThreads, 2)
    intraKernel(Dims d, const bf *q, const bf *k, const bf *v, const float *g,
                const float *beta, float *gCum, bf *tMat, bool recompute,
                bool reg, bool stage, bf *Wout, bf *Uout, bf *Pout) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / d.r, L = chunkLen(d.T, n), t0 = n * C;
  const int pk = d.dk + 8, pv = d.dv + 8, tid = threadIdx.x;
  bf *Ks = (bf *)smem;                // [64][pk]
  bf *Vs = Ks + C * pk;               // [64][pv]
  bf *Ts = Vs + C * pv;               // [64][kTP]
  bf *Qs = Ts + C * kTP;              // [64][pk] (reg only)
  float *Af = (float *)(Qs + C * pk); // [64][kFP] A, then [64][kFP] T
  float *Tf = Af + C * kFP;
  bf *Pstg = (bf *)Tf; // [64][kTP] P staging, before T is built
  bf *Wstg = Qs;       // [64][pk] then U^T [dv][kTP] or U [64][pv]: after T
  bf *Ustg = Wstg + C * pk;
  float *G = Tf + C * kFP, *Bt = G + C, *Gam = Bt + C;

  const long tok0 = long(b) * d.T + t0;
  const long cb = (long(b) * d.Hv + h) * d.NT + n;
  bf *tOut = tMat + (tok0 * d.Hv + h) * C; // row r at + r*Hv*64
  loadRows(Ks, pk, k + tok0 * d.ks + long(hk) * d.dk, d.ks, L, d.dk, d.vk);
  loadRows(Vs, pv, v + tok0 * d.vs + long(h) * d.dv, d.vs, L, d.dv, d.vv);
  if (reg)
    loadRows(Qs, pk, q + tok0 * d.qs + long(hk) * d.dk, d.qs, L, d.dk, d.vq);
  if (recompute)
    loadRows(Ts, kTP, tOut, long(d.Hv) * C, L, C, d.vt);
  cpAsyncCommit();
  // g cumsum: two warps, each an inclusive shuffle scan of 32 rows, then the
  // second adds the first's total. Rows past L add 0, so they repeat G_{L-1}
  // and every exponent below stays <= 0.
  const long si = (tok0 + min(tid, L - 1)) * d.Hv + h;
  if (tid < C) {
    float x;
    if (recompute) {
      x = gCum[si];
    } else {
      x = tid < L ? g[si] : 0.f;
      for (int off = 1; off < 32; off <<= 1) {
        float y = __shfl_up_sync(0xffffffffu, x, off);
        if ((tid & 31) >= off)
          x += y;
      }
    }
    G[tid] = x;
    Bt[tid] = tid < L ? beta[si] : 0.f;
  }
  __syncthreads();
  if (tid < C) {
    if (!recompute && tid >= 32)
      G[tid] += G[31];
    Gam[tid] = __expf(G[tid]);
    if (!recompute && tid < L)
      gCum[si] = G[tid];
  }
  cpAsyncWait<0>();
  __syncthreads();

  if (reg) {
    // P[r,s] = scale (q_r . k_s) exp(G_r - G_s), s <= r < L (mask first).
    const float scale = d.scale;
    ctaGemm(C, C, d.dk, SMat{Qs, pk, 1}, SMat{Ks, 1, pk},
            [&](int m, int c, float x) {
              Pstg[m * kTP + c] = f2b(
                  (c <= m && m < L) ? scale * x * __expf(G[m] - G[c]) : 0.f);
            });
  }
  if (!recompute) {
    // A[r,s] = beta_r (k_r . k_s) exp(G_r - G_s), strictly lower; the mask
    // is applied before the exponential.
    ctaGemm(C, C, d.dk, SMat{Ks, pk, 1}, SMat{Ks, 1, pk},
            [&](int m, int c, float x) {
              Af[m * kFP + c] =
                  (c < m && m < L) ? Bt[m] * x * __expf(G[m] - G[c]) : 0.f;
            });
  }
  __syncthreads();
  if (reg) {
    storeTile(Pout + cb * C * C, C, Pstg, kTP, C, C);
    __syncthreads();
  }
  if (!recompute) {
    // T = (I + A)^-1, blockwise. The four 16x16 diagonal blocks by forward
    // substitution, one column per thread (a column of T depends only on
    // the same column above it: no barrier).
    if (tid < C) {
      const int c = tid, end = (c & ~15) + 16;
      Tf[c * kFP + c] = 1.f;
      for (int i = c + 1; i < end; ++i) {
        float val = -Af[i * kFP + c];
        for (int m = c + 1; m < i; ++m)
          val -= Af[i * kFP + m] * Tf[m * kFP + c];
        Tf[i * kFP + c] = val;
      }
    }
    __syncthreads();
    // Then merges: for lower unit-triangular [[M_C, 0], [A_RC, M_R]] the
    // inverse's lower-left block is -T_R (A_RC T_C). X = A_RC T_C goes,
    // transposed, to A's (unused) upper triangle.
    auto mergeX = [&](int r0, int c0, int lgN, int e) {
      const int nn = 1 << lgN, r = e >> lgN, c = e & (nn - 1);
      float x = 0.f;
      for (int m = c; m < nn; ++m)
        x += Af[(r0 + r) * kFP + c0 + m] * Tf[(c0 + m) * kFP + c0 + c];
      Af[(c0 + c) * kFP + r0 + r] = x;
    };
    auto mergeT = [&](int r0, int c0, int lgN, int e) {
      const int nn = 1 << lgN, r = e >> lgN, c = e & (nn - 1);
      float x = 0.f;
      for (int m = 0; m <= r; ++m)
        x -= Tf[(r0 + r) * kFP + r0 + m] * Af[(c0 + c) * kFP + r0 + m];
      Tf[(r0 + r) * kFP + c0 + c] = x;
    };
    // 16 -> 32: blocks (16, 0) and (48, 32).
    for (int e = tid; e < 512; e += blockDim.x)
      mergeX(16 + 32 * (e >> 8), 32 * (e >> 8), 4, e & 255);
    __syncthreads();
    for (int e = tid; e < 512; e += blockDim.x)
      mergeT(16 + 32 * (e >> 8), 32 * (e >> 8), 4, e & 255);
    __syncthreads();
    // 32 -> 64: block (32, 0).
    for (int e = tid; e < 1024; e += blockDim.x)
      mergeX(32, 0, 5, e);
    __syncthreads();
    for (int e = tid; e < 1024; e += blockDim.x)
      mergeT(32, 0, 5, e);
    __syncthreads();
    forTile(C, C, [&](int r, int c) {
      float x = (r < L && c < L)
                    ? (r == c ? 1.f : (c < r ? Tf[r * kFP + c] : 0.f))
                    : 0.f;
      Ts[r * kTP + c] = f2b(x);
    });
    __syncthreads();
    if (d.vt)
      storeTile(tOut, long(d.Hv) * C, Ts, kTP, L, C);
    else
      forTile(L, C, [&](int r, int c) {
        tOut[long(r) * d.Hv * C + c] = Ts[r * kTP + c];
      });
  }
  // Scale K rows by beta*Gam and V rows by beta (in place, pairs).
  forTile(C, d.dk >> 1, [&](int r, int c2) {
    auto *p = reinterpret_cast<__nv_bfloat162 *>(Ks + r * pk) + c2;
    float2 x = __bfloat1622float2(*p);
    const float f = Bt[r] * Gam[r];
    *p = __floats2bfloat162_rn(x.x * f, x.y * f);
  });
  forTile(C, d.dv >> 1, [&](int r, int c2) {
    auto *p = reinterpret_cast<__nv_bfloat162 *>(Vs + r * pv) + c2;
    float2 x = __bfloat1622float2(*p);
    *p = __floats2bfloat162_rn(x.x * Bt[r], x.y * Bt[r]);
  });
  __syncthreads();
  bf *Wc = Wout + cb * C * d.dk;
  bf *Uc = Uout + cb * C * d.dv;
  if (!stage) {
    ctaGemm(C, d.dk, C, SMat{Ts, kTP, 1}, SMat{Ks, pk, 1},
            [&](int m, int c, float x) { Wc[long(m) * d.dk + c] = f2b(x); });
    if (reg) // U^T[v][r] = sum_s V[s][v] T[r][s]
      ctaGemm(d.dv, C, C, SMat{Vs, 1, pv}, SMat{Ts, 1, kTP},
              [&](int m, int c, float x) { Uc[long(m) * C + c] = f2b(x); });
    else
      ctaGemm(C, d.dv, C, SMat{Ts, kTP, 1}, SMat{Vs, pv, 1},
              [&](int m, int c, float x) { Uc[long(m) * d.dv + c] = f2b(x); });
    return;
  }
  ctaGemm(C, d.dk, C, SMat{Ts, kTP, 1}, SMat{Ks, pk, 1},
          [&](int m, int c, float x) { Wstg[m * pk + c] = f2b(x); });
  if (reg)
    ctaGemm(d.dv, C, C, SMat{Vs, 1, pv}, SMat{Ts, 1, kTP},
            [&](int m, int c, float x) { Ustg[m * kTP + c] = f2b(x); });
  else
    ctaGemm(C, d.dv, C, SMat{Ts, kTP, 1}, SMat{Vs, pv, 1},
            [&](int m, int c, float x) { Ustg[m * pv + c] = f2b(x); });
  __syncthreads();
  storeTile(Wc, d.dk, Wstg, pk, C, d.dk);
  if (reg)
    storeTile(Uc, C, Ustg, kTP, d.dv, C);
  else
    storeTile(Uc, d.dv, Ustg, pv, C, d.dv);
}

/// Whether W and U fit the intra kernel's staging area (Q, A and T tiles).
bool intraStages(const Dims &d, bool reg) {
  const size_t pk = d.dk + 8, pv = d.dv + 8;
  const size_t need = C * pk + (reg ? size_t(d.dv) * kTP : C * pv);
  return need * 2 <= C * pk * 2 + 2 * size_t(C) * kFP * 4;
}

size_t intraSmem(const Dims &d) {
  return size_t(C) * (d.dk + 8) * 2 * 2 + size_t(C) * (d.dv + 8) * 2 +
         size_t(C) * kTP * 2 + 2 * size_t(C) * kFP * 4 + 3 * C * 4;
}

//===----------------------------------------------------------------------===//
// (2) forward state pass
//===----------------------------------------------------------------------===//

/// Shared-memory plan of the sequential passes: nbuf (1 or 2) copies of the
/// per-chunk inputs, so that chunk n+1 is fetched (cp.async) while chunk n is
/// computed when two fit.
struct SeqPlan {
  int dvb, nbuf;
  size_t smem;
};

__global__ void __launch_bounds__(kThreads, 1)
    stateKernel(Dims d, SeqPlan plan, const bf *k, const float *gCum,
                const bf *Wg, const bf *Ug, const float *h0, float *hOut,
                bf *VnOut, float *finalState) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int dvb = plan.dvb, nbuf = plan.nbuf;
  const int jb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / d.r, j0 = jb * dvb;
  const int pk = d.dk + 8, pb = dvb + 8;
  float *S = (float *)smem;    // [dk][dvb]
  float *Gb = S + d.dk * dvb;  // [nbuf][64]
  bf *Sb = (bf *)(Gb + 2 * C); // [dk][pb]
  bf *Vb = Sb + d.dk * pb;     // [64][pb]
  bf *Wb = Vb + C * pb;        // [nbuf][64][pk]
  bf *Kb = Wb + nbuf * C * pk; // [nbuf][64][pk]
  bf *Ub = Kb + nbuf * C * pk; // [nbuf][64][pb]

  const long bh = long(b) * d.Hv + h;
  auto issue = [&](int n, int buf) {
    const int L = chunkLen(d.T, n);
    const long tok0 = long(b) * d.T + n * C;
    const long wrow = bh * d.NT * C + long(n) * C;
    loadRows(Wb + buf * C * pk, pk, Wg + wrow * d.dk, d.dk, C, d.dk, true);
    loadRows(Ub + buf * C * pb, pb, Ug + wrow * d.dv + j0, d.dv, C, dvb, true);
    loadRows(Kb + buf * C * pk, pk, k + tok0 * d.ks + long(hk) * d.dk, d.ks, L,
             d.dk, d.vk);
    if (threadIdx.x < L)
      cpAsync4(Gb + buf * C + threadIdx.x,
               gCum + (tok0 + threadIdx.x) * d.Hv + h);
  };
  for (int i = threadIdx.x; i < d.dk * dvb; i += blockDim.x) {
    int r = i / dvb, c = i % dvb;
    S[i] = h0 ? h0[(bh * d.dk + r) * d.dv + j0 + c] : 0.f;
  }
  if (nbuf == 2) {
    issue(0, 0);
    cpAsyncCommit();
  }
  for (int n = 0; n < d.NT; ++n) {
    const int buf = nbuf == 2 ? (n & 1) : 0;
    if (nbuf == 2) {
      if (n + 1 < d.NT)
        issue(n + 1, buf ^ 1);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      issue(n, 0);
      cpAsyncCommit();
      cpAsyncWait<0>();
    }
    __syncthreads();
    const int L = chunkLen(d.T, n);
    const long wrow = bh * d.NT * C + long(n) * C;
    const float *G = Gb + buf * C;
    bf *Ws_ = Wb + buf * C * pk, *Kd = Kb + buf * C * pk,
       *Us = Ub + buf * C * pb;
    const float gl = G[L - 1];
    float *hn = hOut + ((bh * d.NT + n) * d.dk) * d.dv + j0;
    forTile(d.dk, dvb, [&](int r, int c) {
      float x = S[r * dvb + c];
      hn[long(r) * d.dv + c] = x;
      Sb[r * pb + c] = f2b(x);
    });
    // K rows scaled in place by exp(G_last - G_r) (rows >= L are zero).
    forTile(L, d.dk, [&](int r, int c) {
      Kd[r * pk + c] = f2b(b2f(Kd[r * pk + c]) * __expf(gl - G[r]));
    });
    __syncthreads();
    // Vnew = U - W S0.
    bf *vn = VnOut + wrow * d.dv + j0;
    ctaGemm(C, dvb, d.dk, SMat{Ws_, pk, 1}, SMat{Sb, pb, 1},
            [&](int m, int c, float x) {
              bf y = f2b(b2f(Us[m * pb + c]) - x);
              Vb[m * pb + c] = y;
              vn[long(m) * d.dv + c] = y;
            });
    // S <- Gam_last S (no gemm above reads S).
    const float gam = __expf(gl);
    for (int i = threadIdx.x; i < d.dk * dvb; i += blockDim.x)
      S[i] *= gam;
    __syncthreads();
    // S += (K exp(G_last - G))^T Vnew.
    ctaGemm(d.dk, dvb, C, SMat{Kd, 1, pk}, SMat{Vb, pb, 1},
            [&](int m, int c, float x) { S[m * dvb + c] += x; });
    __syncthreads();
  }
  if (finalState)
    for (int i = threadIdx.x; i < d.dk * dvb; i += blockDim.x) {
      int r = i / dvb, c = i % dvb;
      finalState[(bh * d.dk + r) * d.dv + j0 + c] = S[i];
    }
}

size_t stateSmem(const Dims &d, int dvb, int nbuf) {
  return size_t(d.dk) * dvb * 4 + 2 * C * 4 + size_t(d.dk) * (dvb + 8) * 2 +
         size_t(C) * (dvb + 8) * 2 +
         nbuf * (2 * size_t(C) * (d.dk + 8) * 2 + size_t(C) * (dvb + 8) * 2);
}

//===----------------------------------------------------------------------===//
// (3) forward output
//===----------------------------------------------------------------------===//

__global__ void __launch_bounds__(kThreads, 1)
    outputKernel(Dims d, const bf *q, const bf *k, const float *gCum,
                 const float *hS, const bf *Vn, bf *o) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / d.r, L = chunkLen(d.T, n), t0 = n * C;
  const int pk = d.dk + 8, VB = 64, pb = VB + 8;
  bf *Qs = (bf *)smem;                // [64][pk]
  bf *Ks = Qs + C * pk;               // [64][pk]
  bf *Ps = Ks + C * pk;               // [64][kTP]
  bf *Hb = Ps + C * kTP;              // [dk][pb]
  bf *Vb = Hb + d.dk * pb;            // [64][pb]
  float *Of = (float *)(Vb + C * pb); // [64][VB]
  float *G = Of + C * VB;

  const long tok0 = long(b) * d.T + t0, bh = long(b) * d.Hv + h;
  if (threadIdx.x < C)
    G[threadIdx.x] = gCum[(tok0 + min(int(threadIdx.x), L - 1)) * d.Hv + h];
  loadRows(Qs, pk, q + tok0 * d.qs + long(hk) * d.dk, d.qs, L, d.dk, d.vq);
  loadRows(Ks, pk, k + tok0 * d.ks + long(hk) * d.dk, d.ks, L, d.dk, d.vk);
  cpAsyncCommit();
  cpAsyncWait<0>();
  __syncthreads();
  const float scale = d.scale;
  ctaGemm(C, C, d.dk, SMat{Qs, pk, 1}, SMat{Ks, 1, pk},
          [&](int m, int c, float x) {
            Ps[m * kTP + c] =
                f2b((c <= m && m < L) ? scale * x * __expf(G[m] - G[c]) : 0.f);
          });
  const float *hn = hS + (bh * d.NT + n) * long(d.dk) * d.dv;
  const bf *vn = Vn + (bh * d.NT * C + long(n) * C) * d.dv;
  for (int j0 = 0; j0 < d.dv; j0 += VB) {
    const int vb = min(VB, d.dv - j0);
    __syncthreads();
    loadRows(Vb, pb, vn + j0, d.dv, C, vb, true);
    cpAsyncCommit();
    loadF32Rows(Hb, pb, hn + j0, d.dv, d.dk, vb);
    cpAsyncWait<0>();
    __syncthreads();
    ctaGemm(C, vb, d.dk, SMat{Qs, pk, 1}, SMat{Hb, pb, 1},
            [&](int m, int c, float x) {
              Of[m * VB + c] = scale * __expf(G[m]) * x;
            });
    // Same (M, N): each element returns to the thread that wrote it.
    ctaGemm(C, vb, C, SMat{Ps, kTP, 1}, SMat{Vb, pb, 1},
            [&](int m, int c, float x) {
              if (m < L)
                o[((tok0 + m) * d.Hv + h) * d.dv + j0 + c] =
                    f2b(Of[m * VB + c] + x);
            });
  }
}

size_t outputSmem(const Dims &d) {
  return 2 * size_t(C) * (d.dk + 8) * 2 + size_t(C) * kTP * 2 +
         size_t(d.dk) * 72 * 2 + size_t(C) * 72 * 2 + size_t(C) * 64 * 4 +
         C * 4;
}

//===----------------------------------------------------------------------===//
// (3') backward state pass: dh_end[n], dVnew, dS0
//===----------------------------------------------------------------------===//

__global__ void __launch_bounds__(kThreads, 1)
    stateBwdKernel(Dims d, SeqPlan plan, const bf *q, const bf *k,
                   const float *gCum, const bf *Wg, const bf *dO,
                   const float *dFinal, float *dhOut, float *dVnOut,
                   float *dInit) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int dvb = plan.dvb, nbuf = plan.nbuf;
  const int jb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / d.r, j0 = jb * dvb;
  const int pk = d.dk + 8, pb = dvb + 8;
  float *dH = (float *)smem;       // [dk][dvb]
  float *Gb = dH + d.dk * dvb;     // [2][64]
  float *dVf = Gb + 2 * C;         // [64][dvb]
  bf *dHb = (bf *)(dVf + C * dvb); // [dk][pb]
  bf *dVb = dHb + d.dk * pb;       // [64][pb]
  bf *Pt = dVb + C * pb;           // [64][kTP]
  bf *Qb = Pt + C * kTP;           // [nbuf][64][pk]
  bf *Kb = Qb + nbuf * C * pk;     // [nbuf][64][pk]
  bf *Wb = Kb + nbuf * C * pk;     // [nbuf][64][pk]
  bf *dOb = Wb + nbuf * C * pk;    // [nbuf][64][pb]

  const long bh = long(b) * d.Hv + h;
  const float scale = d.scale;
  auto issue = [&](int n, int buf) {
    const int L = chunkLen(d.T, n);
    const long tok0 = long(b) * d.T + n * C;
    const long wrow = bh * d.NT * C + long(n) * C;
    loadRows(Qb + buf * C * pk, pk, q + tok0 * d.qs + long(hk) * d.dk, d.qs, L,
             d.dk, d.vq);
    loadRows(Kb + buf * C * pk, pk, k + tok0 * d.ks + long(hk) * d.dk, d.ks, L,
             d.dk, d.vk);
    loadRows(Wb + buf * C * pk, pk, Wg + wrow * d.dk, d.dk, C, d.dk, true);
    loadRows(dOb + buf * C * pb, pb, dO + (tok0 * d.Hv + h) * d.dv + j0,
             long(d.Hv) * d.dv, L, dvb, d.vo);
    if (threadIdx.x < L)
      cpAsync4(Gb + buf * C + threadIdx.x,
               gCum + (tok0 + threadIdx.x) * d.Hv + h);
  };
  for (int i = threadIdx.x; i < d.dk * dvb; i += blockDim.x) {
    int r = i / dvb, c = i % dvb;
    dH[i] = dFinal ? dFinal[(bh * d.dk + r) * d.dv + j0 + c] : 0.f;
  }
  if (nbuf == 2) {
    issue(d.NT - 1, 0);
    cpAsyncCommit();
  }
  for (int n = d.NT - 1, it = 0; n >= 0; --n, ++it) {
    const int buf = nbuf == 2 ? (it & 1) : 0;
    if (nbuf == 2) {
      if (n > 0)
        issue(n - 1, buf ^ 1);
      cpAsyncCommit();
      cpAsyncWait<1>();
    } else {
      issue(n, 0);
      cpAsyncCommit();
      cpAsyncWait<0>();
    }
    __syncthreads();
    const int L = chunkLen(d.T, n);
    const long wrow = bh * d.NT * C + long(n) * C;
    const float *G = Gb + buf * C;
    bf *Qs = Qb + buf * C * pk, *Ks = Kb + buf * C * pk,
       *Ws_ = Wb + buf * C * pk;
    bf *dOs = dOb + buf * C * pb;
    const float gl = G[L - 1];
    float *dhn = dhOut + ((bh * d.NT + n) * d.dk) * d.dv + j0;
    forTile(d.dk, dvb, [&](int r, int c) {
      float x = dH[r * dvb + c];
      dhn[long(r) * d.dv + c] = x;
      dHb[r * pb + c] = f2b(x);
    });
    // Pt[s, r] = scale (k_s . q_r) exp(G_r - G_s) for s <= r < L.
    ctaGemm(C, C, d.dk, SMat{Ks, pk, 1}, SMat{Qs, 1, pk},
            [&](int s, int r, float x) {
              Pt[s * kTP + r] = f2b(
                  (s <= r && r < L) ? scale * x * __expf(G[r] - G[s]) : 0.f);
            });
    __syncthreads();
    // In place: K <- K exp(G_last - G), Q <- scale Gam Q (rows < L).
    forTile(L, d.dk, [&](int r, int c) {
      Ks[r * pk + c] = f2b(b2f(Ks[r * pk + c]) * __expf(gl - G[r]));
      Qs[r * pk + c] = f2b(b2f(Qs[r * pk + c]) * scale * __expf(G[r]));
    });
    __syncthreads();
    // dVnew = Pt dO + Kd dH.
    ctaGemm(C, dvb, C, SMat{Pt, kTP, 1}, SMat{dOs, pb, 1},
            [&](int m, int c, float x) { dVf[m * dvb + c] = x; });
    float *dvn = dVnOut + wrow * d.dv + j0;
    ctaGemm(C, dvb, d.dk, SMat{Ks, pk, 1}, SMat{dHb, pb, 1},
            [&](int m, int c, float x) {
              float y = dVf[m * dvb + c] + x;
              dvn[long(m) * d.dv + c] = y;
              dVb[m * pb + c] = f2b(y);
            });
    const float gam = __expf(gl);
    for (int i = threadIdx.x; i < d.dk * dvb; i += blockDim.x)
      dH[i] *= gam;
    __syncthreads();
    // dH += Qg^T dO - W^T dVnew (same (M, N): one thread per element).
    ctaGemm(d.dk, dvb, C, SMat{Qs, 1, pk}, SMat{dOs, pb, 1},
            [&](int m, int c, float x) { dH[m * dvb + c] += x; });
    ctaGemm(d.dk, dvb, C, SMat{Ws_, 1, pk}, SMat{dVb, pb, 1},
            [&](int m, int c, float x) { dH[m * dvb + c] -= x; });
    __syncthreads();
  }
  if (dInit)
    for (int i = threadIdx.x; i < d.dk * dvb; i += blockDim.x) {
      int r = i / dvb, c = i % dvb;
      dInit[(bh * d.dk + r) * d.dv + j0 + c] = dH[i];
    }
}

size_t stateBwdSmem(const Dims &d, int dvb, int nbuf) {
  return size_t(d.dk) * dvb * 4 + 2 * C * 4 + size_t(C) * dvb * 4 +
         size_t(d.dk) * (dvb + 8) * 2 + size_t(C) * (dvb + 8) * 2 +
         size_t(C) * kTP * 2 +
         nbuf * (3 * size_t(C) * (d.dk + 8) * 2 + size_t(C) * (dvb + 8) * 2);
}

/// Row sums over n columns of f(r, c) for the 64 rows of a chunk, four
/// threads per row (256 threads), combined in a fixed shuffle order.
template <typename F> __device__ __forceinline__ float rowSum4(int n, F &&f) {
  const int r = threadIdx.x >> 2, part = threadIdx.x & 3;
  float s = 0.f;
  for (int c = part; c < n; c += 4)
    s += f(r, c);
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  return s;
}

//===----------------------------------------------------------------------===//
// (4) per-chunk gradients
//===----------------------------------------------------------------------===//

__global__ void __launch_bounds__(kThreads, 1)
    chunkBwdKernel(Dims d, int VB, const bf *q, const bf *k, const bf *v,
                   const float *gCum, const float *beta, const bf *tMat,
                   const bf *dO, const float *hS, const float *dhS,
                   const bf *Vn, const float *dVn, float *dQg, float *dKg,
                   float *dWg, bf *dvOut, float *dgOut, float *dbetaOut) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / d.r, L = chunkLen(d.T, n), t0 = n * C;
  const int pk = d.dk + 8, pb = VB + 8;
  const size_t r3 = max(size_t(2) * d.dk * pb, size_t(C) * pk);
  const size_t r4 = max(size_t(4) * C * pb, size_t(4) * C * kTP);
  float *G = (float *)smem, *Bt = G + C, *Gam = Bt + C, *dG = Gam + C,
        *dB = dG + C, *red = dB + C; // red: [kThreads]
  float *dSf = red + kThreads;       // [64][kFP]
  float *dTf = dSf + C * kFP;
  float *Yf = dTf + C * kFP;
  bf *Qs = (bf *)(Yf + C * kFP); // [64][pk]
  bf *Ks = Qs + C * pk;
  bf *Ts = Ks + C * pk; // [64][kTP]
  bf *R3 = Ts + C * kTP;
  bf *R4 = R3 + r3;
  bf *S0b = R3, *dHb = R3 + d.dk * pb; // [dk][pb] each, during the dv loop
  bf *dWb = R3;                        // [64][pk] after it
  bf *dOb = R4, *Vnb = R4 + C * pb, *dVb = Vnb + C * pb, *Vb = dVb + C * pb;
  bf *dSb = R4, *dTb = R4 + C * kTP, *M1b = dTb + C * kTP, *dPb = M1b + C * kTP;
  bf *dPbb = dSb; // after dSb's last use

  const long tok0 = long(b) * d.T + t0, bh = long(b) * d.Hv + h;
  const long wrow = bh * d.NT * C + long(n) * C;
  const float scale = d.scale;
  float *dQc = dQg + wrow * d.dk, *dKc = dKg + wrow * d.dk,
        *dWc = dWg + wrow * d.dk;
  if (threadIdx.x < C) {
    int r = threadIdx.x;
    long si = (tok0 + min(r, L - 1)) * d.Hv + h;
    G[r] = gCum[si];
    Bt[r] = r < L ? beta[si] : 0.f;
    Gam[r] = __expf(G[r]);
    dB[r] = 0.f;
  }
  loadRows(Qs, pk, q + tok0 * d.qs + long(hk) * d.dk, d.qs, L, d.dk, d.vq);
  loadRows(Ks, pk, k + tok0 * d.ks + long(hk) * d.dk, d.ks, L, d.dk, d.vk);
  cpAsyncCommit();
  const bf *tIn = tMat + (tok0 * d.Hv + h) * C;
  for (int i = threadIdx.x; i < C * C; i += blockDim.x) {
    int r = i / C, c = i % C;
    Ts[r * kTP + c] = r < L ? tIn[long(r) * d.Hv * C + c] : f2b(0.f);
    dSf[r * kFP + c] = 0.f;
    dTf[r * kFP + c] = 0.f;
  }
  for (int i = threadIdx.x; i < C * d.dk; i += blockDim.x) {
    dQc[i] = 0.f;
    dKc[i] = 0.f;
    dWc[i] = 0.f;
  }
  float extraS = 0.f; // this thread's share of sum(S0 * dh_end)
  const float *hn = hS + (bh * d.NT + n) * long(d.dk) * d.dv;
  const float *dhn = dhS + (bh * d.NT + n) * long(d.dk) * d.dv;
  const bf *vnc = Vn + wrow * d.dv;
  const float *dvnc = dVn + wrow * d.dv;
  for (int j0 = 0; j0 < d.dv; j0 += VB) {
    const int vb = min(VB, d.dv - j0);
    __syncthreads();
    loadRows(dOb, pb, dO + (tok0 * d.Hv + h) * d.dv + j0, long(d.Hv) * d.dv, L,
             vb, d.vo);
    loadRows(Vnb, pb, vnc + j0, d.dv, C, vb, true);
    loadRows(Vb, pb, v + tok0 * d.vs + long(h) * d.dv + j0, d.vs, L, vb, d.vv);
    cpAsyncCommit();
    {
      const int per = vb >> 2;
      for (int i = threadIdx.x; i < d.dk * per; i += blockDim.x) {
        int r = i / per, c = (i - r * per) << 2;
        float4 s0 =
            *reinterpret_cast<const float4 *>(hn + long(r) * d.dv + j0 + c);
        float4 dh =
            *reinterpret_cast<const float4 *>(dhn + long(r) * d.dv + j0 + c);
        extraS += s0.x * dh.x + s0.y * dh.y + s0.z * dh.z + s0.w * dh.w;
        bf *a = S0b + r * pb + c, *e = dHb + r * pb + c;
        a[0] = f2b(s0.x), a[1] = f2b(s0.y), a[2] = f2b(s0.z), a[3] = f2b(s0.w);
        e[0] = f2b(dh.x), e[1] = f2b(dh.y), e[2] = f2b(dh.z), e[3] = f2b(dh.w);
      }
    }
    loadF32Rows(dVb, pb, dvnc + j0, d.dv, C, vb);
    cpAsyncWait<0>();
    __syncthreads();
    ctaGemm(C, d.dk, vb, SMat{dOb, pb, 1}, SMat{S0b, 1, pb},
            [&](int m, int c, float x) { dQc[m * d.dk + c] += x; });
    ctaGemm(C, d.dk, vb, SMat{Vnb, pb, 1}, SMat{dHb, 1, pb},
            [&](int m, int c, float x) { dKc[m * d.dk + c] += x; });
    ctaGemm(C, d.dk, vb, SMat{dVb, pb, 1}, SMat{S0b, 1, pb},
            [&](int m, int c, float x) { dWc[m * d.dk + c] -= x; });
    ctaGemm(C, C, vb, SMat{dOb, pb, 1}, SMat{Vnb, 1, pb},
            [&](int m, int c, float x) { dSf[m * kFP + c] += x; });
    ctaGemm(C, C, vb, SMat{dVb, pb, 1}, SMat{Vb, 1, pb},
            [&](int m, int c, float x) { dTf[m * kFP + c] += x * Bt[c]; });
    // Y = T^T dU.
    ctaGemm(C, vb, C, SMat{Ts, 1, kTP}, SMat{dVb, pb, 1},
            [&](int m, int c, float x) { Yf[m * kFP + c] = x; });
    __syncthreads();
    for (int i = threadIdx.x; i < L * vb; i += blockDim.x) {
      int r = i / vb, c = i % vb;
      dvOut[(tok0 + r) * d.vs + long(h) * d.dv + j0 + c] =
          f2b(Yf[r * kFP + c] * Bt[r]);
    }
    if (threadIdx.x < C) {
      int r = threadIdx.x;
      float s = 0.f;
      for (int c = 0; c < vb; ++c)
        s += Yf[r * kFP + c] * b2f(Vb[r * pb + c]);
      dB[r] += s;
    }
  }
  // Fixed-order block reduction of sum(S0 * dh_end).
  red[threadIdx.x] = extraS;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s)
      red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const float gl = G[C - 1];
  for (int i = threadIdx.x; i < C * d.dk; i += blockDim.x) {
    int r = i / d.dk;
    dQc[i] *= scale * Gam[r];
    dKc[i] *= __expf(gl - G[r]);
  }
  __syncthreads();
  // extra = Gam_last sum(S0 dh) + sum_r dK_r . k_r (dK so far).
  {
    float s = rowSum4(d.dk, [&](int r, int c) {
      return dKc[r * d.dk + c] * b2f(Ks[r * pk + c]);
    });
    if ((threadIdx.x & 3) == 0)
      dG[threadIdx.x >> 2] = s;
  }
  // dS = scale (dO Vnew^T) * D, lower incl.
  for (int i = threadIdx.x; i < C * C; i += blockDim.x) {
    int m = i / C, c = i % C;
    float x = (c <= m && m < L) ? scale * dSf[m * kFP + c] * __expf(G[m] - G[c])
                                : 0.f;
    dSb[m * kTP + c] = f2b(x);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int r = 0; r < C; ++r)
      s += dG[r];
    red[1] = __expf(gl) * red[0] + s; // extra
  }
  ctaGemm(C, d.dk, C, SMat{dSb, kTP, 1}, SMat{Ks, pk, 1},
          [&](int m, int c, float x) { dQc[m * d.dk + c] += x; });
  ctaGemm(C, d.dk, C, SMat{dSb, 1, kTP}, SMat{Qs, pk, 1},
          [&](int m, int c, float x) { dKc[m * d.dk + c] += x; });
  __syncthreads();
  {
    float s = rowSum4(d.dk, [&](int r, int c) {
      return dQc[r * d.dk + c] * b2f(Qs[r * pk + c]) -
             dKc[r * d.dk + c] * b2f(Ks[r * pk + c]);
    });
    int r = threadIdx.x >> 2;
    if ((threadIdx.x & 3) == 0)
      dG[r] = s + (r == L - 1 ? red[1] : 0.f);
  }
  for (int i = threadIdx.x; i < C * d.dk; i += blockDim.x) {
    int r = i / d.dk, c = i % d.dk;
    dWb[r * pk + c] = f2b(dWc[i]);
  }
  __syncthreads();
  // WY backward: dT += dW (beta Gam K)^T; X = T^T dW.
  ctaGemm(
      C, C, d.dk, SMat{dWb, pk, 1}, SMat{Ks, 1, pk},
      [&](int m, int c, float x) { dTf[m * kFP + c] += x * Bt[c] * Gam[c]; });
  ctaGemm(C, d.dk, C, SMat{Ts, 1, kTP}, SMat{dWb, pk, 1},
          [&](int m, int c, float x) {
            dKc[m * d.dk + c] += x * Bt[m] * Gam[m];
            dWc[m * d.dk + c] = x; // X, for the row sums below
          });
  __syncthreads();
  {
    float s = rowSum4(d.dk, [&](int r, int c) {
      return dWc[r * d.dk + c] * b2f(Ks[r * pk + c]);
    });
    int r = threadIdx.x >> 2;
    if ((threadIdx.x & 3) == 0) {
      dB[r] += s * Gam[r];
      dG[r] += s * Bt[r] * Gam[r];
    }
  }
  for (int i = threadIdx.x; i < C * C; i += blockDim.x) {
    int m = i / C, c = i % C;
    dTb[m * kTP + c] = f2b(dTf[m * kFP + c]);
  }
  __syncthreads();
  // dP = -strictlower(T^T dT T^T) * D.
  ctaGemm(C, C, C, SMat{Ts, 1, kTP}, SMat{dTb, kTP, 1},
          [&](int m, int c, float x) { M1b[m * kTP + c] = f2b(x); });
  __syncthreads();
  ctaGemm(C, C, C, SMat{M1b, kTP, 1}, SMat{Ts, 1, kTP},
          [&](int m, int c, float x) {
            float p = (c < m && m < L) ? -x * __expf(G[m] - G[c]) : 0.f;
            Yf[m * kFP + c] = p;
            dPb[m * kTP + c] = f2b(p);
            dPbb[m * kTP + c] = f2b(p * Bt[m]);
          });
  // K K^T for the dbeta / dG terms.
  ctaGemm(C, C, d.dk, SMat{Ks, pk, 1}, SMat{Ks, 1, pk},
          [&](int m, int c, float x) { dTf[m * kFP + c] = x; });
  __syncthreads();
  ctaGemm(C, d.dk, C, SMat{dPb, kTP, 1}, SMat{Ks, pk, 1},
          [&](int m, int c, float x) { dKc[m * d.dk + c] += Bt[m] * x; });
  ctaGemm(C, d.dk, C, SMat{dPbb, 1, kTP}, SMat{Ks, pk, 1},
          [&](int m, int c, float x) { dKc[m * d.dk + c] += x; });
  if (threadIdx.x < C) {
    int r = threadIdx.x;
    float sb = 0.f, se = 0.f;
    for (int j = 0; j < C; ++j) {
      sb += Yf[r * kFP + j] * dTf[r * kFP + j];
      se -= Yf[j * kFP + r] * Bt[j] * dTf[j * kFP + r];
    }
    dB[r] += sb;
    dG[r] += Bt[r] * sb + se;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float run = 0.f;
    for (int r = L - 1; r >= 0; --r) {
      run += dG[r];
      long si = (tok0 + r) * d.Hv + h;
      dgOut[si] = run;
      dbetaOut[si] = dB[r];
    }
  }
}

/// Fixed-order row sums over the N columns of a register-tile product with
/// M = 64 rows (ctaGemmAcc's tile map): f(i, e, m, c) is the term of element
/// e of tile i. Per (16-column tile, row) partials go to part [N/16][64];
/// thread r < 64 then adds its row's partials in column order. The result is
/// valid on threads < 64; part is free again on return.
template <int NTa, typename F>
__device__ __forceinline__ float rowSums64(int N, float *part, F &&f) {
#pragma unroll
  for (int i = 0; i < NTa; ++i) {
    int m0, n0;
    if (!tileOrigin(C, N, i, m0, n0))
      break;
    float p0 = 0.f, p1 = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float x = f(i, e, tileRow(m0, e), tileCol(n0, e));
      if ((e >> 1) & 1)
        p1 += x;
      else
        p0 += x;
    }
    p0 += __shfl_xor_sync(0xffffffffu, p0, 1);
    p0 += __shfl_xor_sync(0xffffffffu, p0, 2);
    p1 += __shfl_xor_sync(0xffffffffu, p1, 1);
    p1 += __shfl_xor_sync(0xffffffffu, p1, 2);
    if ((threadIdx.x & 3) == 0) {
      part[(n0 >> 4) * C + tileRow(m0, 0)] = p0;
      part[(n0 >> 4) * C + tileRow(m0, 2)] = p1;
    }
  }
  __syncthreads();
  float s = 0.f;
  if (threadIdx.x < C)
    for (int jn = 0; jn < (N >> 4); ++jn)
      s += part[jn * C + threadIdx.x];
  __syncthreads();
  return s;
}

/// Column sums of a 64 x 64 register-tile product, the same way: per
/// (16-row tile, column) partials (a thread's two rows, then the eight row
/// groups of the warp by shuffles), then thread c < 64 adds its column's
/// partials in row order.
template <int NTa, typename F>
__device__ __forceinline__ float colSums64(float *part, F &&f) {
#pragma unroll
  for (int i = 0; i < NTa; ++i) {
    int m0, n0;
    if (!tileOrigin(C, C, i, m0, n0))
      break;
    float p[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      // q: column n0 + 2t + (q & 1) + 8 (q >> 1); elements e = q*2-ish:
      // (e & 1) == (q & 1), (e >> 2) == (q >> 1), rows g and g + 8.
      const int e0 = (q & 1) + 4 * (q >> 1), e1 = e0 + 2;
      p[q] = f(i, e0, tileRow(m0, e0), tileCol(n0, e0)) +
             f(i, e1, tileRow(m0, e1), tileCol(n0, e1));
      p[q] += __shfl_xor_sync(0xffffffffu, p[q], 4);
      p[q] += __shfl_xor_sync(0xffffffffu, p[q], 8);
      p[q] += __shfl_xor_sync(0xffffffffu, p[q], 16);
    }
    if ((threadIdx.x & 31) < 4)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int e0 = (q & 1) + 4 * (q >> 1);
        part[(m0 >> 4) * C + tileCol(n0, e0)] = p[q];
      }
  }
  __syncthreads();
  float s = 0.f;
  if (threadIdx.x < C)
    for (int jm = 0; jm < 4; ++jm)
      s += part[jm * C + threadIdx.x];
  __syncthreads();
  return s;
}

__device__ __forceinline__ float warpSum(float x) {
  for (int off = 16; off > 0; off >>= 1)
    x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

/// Value columns per block of the per-chunk gradient kernel.
constexpr int kChunkVB = 64;

/// Per-chunk gradients for dk <= 16 * NT * 2 (NT = 4: dk <= 128), reading
/// the register-state passes' bf16 layouts (gdn_chunk.cuh), VB = 64. The
/// products accumulate in registers (ctaGemmAcc: one fixed tile -> thread
/// map per output shape); row and column sums go through shuffles and
/// partial tables in a fixed order. q/k gradients go straight to storage
/// when Hv == Hk, else to fp32 per value head for the group sum.
template <int NT, int DKc>
__global__ void __launch_bounds__(kThreads, 1)
    chunkBwdRegKernel(Dims d, const bf *q, const bf *k, const bf *v,
                      const float *gCum, const float *beta, const bf *tMat,
                      const bf *dO, const bf *hT, const bf *dhT, const bf *VnT,
                      const bf *dVnT, float *dQg, float *dKg, bf *dqOut,
                      bf *dkOut, bf *dvOut, float *dgOut, float *dbetaOut) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / d.r, L = chunkLen(d.T, n), t0 = n * C;
  constexpr int VB = kChunkVB, pb = VB + 8; // pb == kTP
  const int dk = DKc ? DKc : d.dk, pk = dk + 8;
  float *G = (float *)smem, *Bt = G + C, *Gam = Bt + C, *dG = Gam + C,
        *dB = dG + C, *red = dB + C; // red: [64]
  float *rowPart = red + C;          // [8][64]
  float *colPart = rowPart + 8 * C;  // [4][64]
  bf *Qs = (bf *)(colPart + 4 * C);  // [64][pk]
  bf *Ks = Qs + C * pk;
  bf *Ts = Ks + C * pk; // [64][kTP]
  bf *R3 = Ts + C * kTP;
  bf *R4 = R3 + 2 * VB * pk;
  bf *S0T = R3, *dHT = R3 + VB * pk; // [VB][pk] each: h^T, dh^T rows
  bf *dWb = R3;                      // [64][pk] after the dv loop
  // dO, V [64][pb]; Vnew^T, dVnew^T [VB][kTP] in the dv loop; then dS, dT,
  // M1, dP [64][kTP] (and beta dP where dS was).
  bf *dOb = R4, *VnTs = R4 + C * pb, *dVT = VnTs + C * pb, *Vb = dVT + C * pb;
  bf *dSb = R4, *dTb = R4 + C * kTP, *M1b = dTb + C * kTP, *dPb = M1b + C * kTP;
  bf *dPbb = dSb;

  const long tok0 = long(b) * d.T + t0, bh = long(b) * d.Hv + h;
  const long wrow = bh * d.NT * C + long(n) * C;
  const long sRow = (bh * d.NT + n) * d.dv; // row of hT/dhT/VnT/dVnT
  const float scale = d.scale;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < C) {
    int r = tid;
    long si = (tok0 + min(r, L - 1)) * d.Hv + h;
    G[r] = gCum[si];
    Bt[r] = r < L ? beta[si] : 0.f;
    Gam[r] = __expf(G[r]);
    dB[r] = 0.f;
  }
  loadRows(Qs, pk, q + tok0 * d.qs + long(hk) * dk, d.qs, L, dk, d.vq);
  loadRows(Ks, pk, k + tok0 * d.ks + long(hk) * dk, d.ks, L, dk, d.vk);
  loadRows(Ts, kTP, tMat + (tok0 * d.Hv + h) * C, long(d.Hv) * C, L, C, d.vt);
  cpAsyncCommit();
  float accQ[NT][8] = {}, accK[NT][8] = {}, accW[NT][8] = {};
  float accS[2][8] = {}, accT[2][8] = {};
  float extraS = 0.f;
  // One dv block; vbc is the block width, a compile-time constant for full
  // blocks (fixed loop trip counts and tile maps).
  auto dvBlock = [&](int j0, auto vbc) {
    const int vb = vbc;
    __syncthreads();
    loadRows(dOb, pb, dO + (tok0 * d.Hv + h) * d.dv + j0, long(d.Hv) * d.dv, L,
             vb, d.vo);
    loadRows(Vb, pb, v + tok0 * d.vs + long(h) * d.dv + j0, d.vs, L, vb, d.vv);
    loadTile(VnTs, kTP, VnT + (sRow + j0) * C, C, vb, vb, C, true);
    loadTile(dVT, kTP, dVnT + (sRow + j0) * C, C, vb, vb, C, true);
    loadTile(S0T, pk, hT + (sRow + j0) * dk, dk, vb, vb, dk, true);
    loadTile(dHT, pk, dhT + (sRow + j0) * dk, dk, vb, vb, dk, true);
    cpAsyncCommit();
    cpAsyncWait<0>();
    __syncthreads();
    forTile(vb, dk >> 1, [&](int r, int c2) {
      float2 s0 = __bfloat1622float2(
          reinterpret_cast<const __nv_bfloat162 *>(S0T + r * pk)[c2]);
      float2 dh = __bfloat1622float2(
          reinterpret_cast<const __nv_bfloat162 *>(dHT + r * pk)[c2]);
      extraS += s0.x * dh.x + s0.y * dh.y;
    });
    ctaGemmAcc(C, dk, vb, SMat{dOb, pb, 1}, SMat{S0T, pk, 1}, accQ);
    ctaGemmAcc(C, dk, vb, SMat{VnTs, 1, kTP}, SMat{dHT, pk, 1}, accK);
    ctaGemmAcc(C, dk, vb, SMat{dVT, 1, kTP}, SMat{S0T, pk, 1}, accW); // -dW
    ctaGemmAcc(C, C, vb, SMat{dOb, pb, 1}, SMat{VnTs, kTP, 1}, accS);
    ctaGemmAcc(C, C, vb, SMat{dVT, 1, kTP}, SMat{Vb, 1, pb}, accT);
    // Y = T^T dU: dv = beta Y; dbeta gets the row sums of Y * V.
    float accY[2][8] = {};
    ctaGemmAcc(C, vb, C, SMat{Ts, 1, kTP}, SMat{dVT, 1, kTP}, accY);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int m0, n0;
      if (!tileOrigin(C, vb, i, m0, n0))
        break;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int m = tileRow(m0, e), c = tileCol(n0, e);
        if (m < L)
          dvOut[(tok0 + m) * d.vs + long(h) * d.dv + j0 + c] =
              f2b(accY[i][e] * Bt[m]);
      }
    }
    const float sy = rowSums64<2>(vb, rowPart, [&](int i, int e, int m, int c) {
      return accY[i][e] * b2f(Vb[m * pb + c]);
    });
    if (tid < C)
      dB[tid] += sy;
  };
  for (int j0 = 0; j0 < d.dv; j0 += VB) {
    if (d.dv - j0 >= VB)
      dvBlock(j0, std::integral_constant<int, VB>{});
    else
      dvBlock(j0, d.dv - j0);
  }
  const float gl = G[C - 1];
  // Scale dQ, dK rows; this thread's share of sum_r dK_r . k_r.
  float ek = 0.f;
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    int m0, n0;
    if (!tileOrigin(C, dk, i, m0, n0))
      break;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      int m = tileRow(m0, e), c = tileCol(n0, e);
      accQ[i][e] *= scale * Gam[m];
      accK[i][e] *= __expf(gl - G[m]);
      ek += accK[i][e] * b2f(Ks[m * pk + c]);
    }
  }
  // extra = Gam_last sum(S0 dh) + sum_r dK_r . k_r, both fixed-order sums
  // (warp shuffles, then the warps in order).
  {
    const float sS = warpSum(extraS), sK = warpSum(ek);
    if (lane == 0) {
      red[warp] = sS;
      red[8 + warp] = sK;
    }
  }
  // dS = scale (dO Vnew^T) * D, lower incl. (R4 was read by the dv loop's
  // products until rowSums64's barriers.)
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int m0, n0;
    if (!tileOrigin(C, C, i, m0, n0))
      break;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int m = tileRow(m0, e), c = tileCol(n0, e);
      dSb[m * kTP + c] = f2b(
          (c <= m && m < L) ? scale * accS[i][e] * __expf(G[m] - G[c]) : 0.f);
    }
  }
  __syncthreads();
  float extra;
  {
    float sS = 0.f, sK = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) {
      sS += red[w];
      sK += red[8 + w];
    }
    extra = __expf(gl) * sS + sK;
  }
  ctaGemmAcc(C, dk, C, SMat{dSb, kTP, 1}, SMat{Ks, pk, 1}, accQ);
  ctaGemmAcc(C, dk, C, SMat{dSb, 1, kTP}, SMat{Qs, pk, 1}, accK);
  {
    float s = rowSums64<NT>(dk, rowPart, [&](int i, int e, int m, int c) {
      return accQ[i][e] * b2f(Qs[m * pk + c]) -
             accK[i][e] * b2f(Ks[m * pk + c]);
    });
    if (tid < C)
      dG[tid] = s + (tid == L - 1 ? extra : 0.f);
  }
  // dq is final: write it (straight to storage when Hv == Hk).
  const bool direct = d.r == 1;
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    int m0, n0;
    if (!tileOrigin(C, dk, i, m0, n0))
      break;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      int m = tileRow(m0, e), c = tileCol(n0, e);
      if (direct) {
        if (m < L)
          dqOut[(tok0 + m) * d.qs + long(hk) * dk + c] = f2b(accQ[i][e]);
      } else {
        dQg[(wrow + m) * dk + c] = accQ[i][e];
      }
      dWb[m * pk + c] = f2b(-accW[i][e]);
    }
  }
  __syncthreads();
  // WY backward: dT = (dU V^T + Gam (dW K^T)) diag(beta) (columns);
  // X = T^T dW.
  {
    float accWK[2][8] = {};
    ctaGemmAcc(C, C, dk, SMat{dWb, pk, 1}, SMat{Ks, 1, pk}, accWK);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int m0, n0;
      if (!tileOrigin(C, C, i, m0, n0))
        break;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int m = tileRow(m0, e), c = tileCol(n0, e);
        dTb[m * kTP + c] = f2b(Bt[c] * (accT[i][e] + Gam[c] * accWK[i][e]));
      }
    }
  }
  float accX[NT][8] = {};
  ctaGemmAcc(C, dk, C, SMat{Ts, 1, kTP}, SMat{dWb, pk, 1}, accX);
  {
    float s = rowSums64<NT>(dk, rowPart, [&](int i, int e, int m, int c) {
      return accX[i][e] * b2f(Ks[m * pk + c]);
    });
    if (tid < C) {
      dB[tid] += s * Gam[tid];
      dG[tid] += s * Bt[tid] * Gam[tid];
    }
  }
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    int m0, n0;
    if (!tileOrigin(C, dk, i, m0, n0))
      break;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      int m = tileRow(m0, e);
      accK[i][e] += accX[i][e] * Bt[m] * Gam[m];
      accX[i][e] = 0.f;
    }
  }
  // dP = -strictlower(T^T dT T^T) * D (dTb complete: rowSums64 barriers).
  ctaGemm(C, C, C, SMat{Ts, 1, kTP}, SMat{dTb, kTP, 1},
          [&](int m, int c, float x) { M1b[m * kTP + c] = f2b(x); });
  __syncthreads();
  {
    float accP[2][8] = {}, accKK[2][8] = {};
    ctaGemmAcc(C, C, C, SMat{M1b, kTP, 1}, SMat{Ts, 1, kTP}, accP);
    ctaGemmAcc(C, C, dk, SMat{Ks, pk, 1}, SMat{Ks, 1, pk}, accKK);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      int m0, n0;
      if (!tileOrigin(C, C, i, m0, n0))
        break;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int m = tileRow(m0, e), c = tileCol(n0, e);
        const float p =
            (c < m && m < L) ? -accP[i][e] * __expf(G[m] - G[c]) : 0.f;
        dPb[m * kTP + c] = f2b(p);
        dPbb[m * kTP + c] = f2b(p * Bt[m]);
        accP[i][e] = p * accKK[i][e]; // dbeta / dg terms of dP * (K K^T)
      }
    }
    const float sb = rowSums64<2>(
        C, rowPart, [&](int i, int e, int, int) { return accP[i][e]; });
    const float se = colSums64<2>(
        colPart, [&](int i, int e, int m, int) { return accP[i][e] * Bt[m]; });
    if (tid < C) {
      dB[tid] += sb;
      dG[tid] += Bt[tid] * sb - se;
    }
  }
  // dK += diag(beta) dP K + (diag(beta) dP)^T K (dPb, dPbb complete).
  ctaGemmAcc(C, dk, C, SMat{dPb, kTP, 1}, SMat{Ks, pk, 1}, accX);
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    int m0, n0;
    if (!tileOrigin(C, dk, i, m0, n0))
      break;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      accK[i][e] += Bt[tileRow(m0, e)] * accX[i][e];
  }
  ctaGemmAcc(C, dk, C, SMat{dPbb, 1, kTP}, SMat{Ks, pk, 1}, accK);
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    int m0, n0;
    if (!tileOrigin(C, dk, i, m0, n0))
      break;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      int m = tileRow(m0, e), c = tileCol(n0, e);
      if (direct) {
        if (m < L)
          dkOut[(tok0 + m) * d.ks + long(hk) * dk + c] = f2b(accK[i][e]);
      } else {
        dKg[(wrow + m) * dk + c] = accK[i][e];
      }
    }
  }
  // dg = reverse cumsum of dG over the chunk's rows: suffix scans of the two
  // warps (shuffles), then the first adds the second's total.
  if (tid < C) {
    float x = tid < L ? dG[tid] : 0.f;
    for (int off = 1; off < 32; off <<= 1) {
      float y = __shfl_down_sync(0xffffffffu, x, off);
      if (lane + off < 32)
        x += y;
    }
    rowPart[tid] = x;
  }
  __syncthreads();
  if (tid < L) {
    const long si = (tok0 + tid) * d.Hv + h;
    dgOut[si] = rowPart[tid] + (tid < 32 ? rowPart[32] : 0.f);
    dbetaOut[si] = dB[tid];
  }
}

size_t chunkBwdRegSmem(const Dims &d) {
  constexpr int VB = kChunkVB;
  const size_t pk = d.dk + 8;
  return (5 * C + C + 8 * C + 4 * C) * 4 +
         (2 * C * pk + C * kTP + 2 * size_t(VB) * pk + 4 * size_t(C) * kTP) * 2;
}

size_t chunkBwdSmem(const Dims &d, int VB) {
  const int pk = d.dk + 8, pb = VB + 8;
  size_t r3 = std::max(size_t(2) * d.dk * pb, size_t(C) * pk);
  size_t r4 = std::max(size_t(4) * C * pb, size_t(4) * C * kTP);
  return (5 * C + kThreads + 3 * C * kFP) * 4 +
         (2 * size_t(C) * pk + size_t(C) * kTP + r3 + r4) * 2;
}

/// dq/dk per value head (fp32) -> storage, summed over each group in order.
__global__ void groupSumKernel(Dims d, const float *dQg, const float *dKg,
                               bf *dq, bf *dk) {
  long total = long(d.B) * d.T * d.Hk * d.dk;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < total;
       i += long(gridDim.x) * blockDim.x) {
    int c = int(i % d.dk);
    long rest = i / d.dk;
    int hk = int(rest % d.Hk);
    long tok = rest / d.Hk;
    int b = int(tok / d.T), t = int(tok % d.T);
    float sq = 0.f, sk = 0.f;
    for (int j = 0; j < d.r; ++j) {
      long row = (long(b) * d.Hv + hk * d.r + j) * d.NT * C + t;
      sq += dQg[row * d.dk + c];
      sk += dKg[row * d.dk + c];
    }
    dq[tok * d.qs + long(hk) * d.dk + c] = f2b(sq);
    dk[tok * d.ks + long(hk) * d.dk + c] = f2b(sk);
  }
}

bool supported(const GdnChunkArgs &a) {
  return a.dtype == DType::BF16 && a.batch > 0 && a.seqLen > 0 &&
         a.keyHeads > 0 && a.valueHeads % a.keyHeads == 0 &&
         a.keyDim % 16 == 0 && a.valueDim % 16 == 0 && a.keyDim > 0 &&
         a.valueDim > 0 && a.keyDim <= 256 && a.valueDim <= 256;
}

constexpr size_t kMaxSmem = 227 * 1024;

/// dv block and buffering of a sequential pass. Each (b, h, block) CTA walks
/// all chunks with about the same latency per chunk whatever its width, so
/// the block is the narrowest that keeps the CTAs within one wave (most
/// parallelism), or the widest that fits when even that is over a wave
/// (fewest waves). Double-buffered when two copies fit in shared memory.
/// Results do not depend on the plan: blocks never interact and the
/// per-element arithmetic is the same.
template <typename SmemFn>
SeqPlan seqPlan(const Dims &d, int smCount, SmemFn smemOf) {
  const long sms = std::max(smCount, 1);
  int best = 0;
  for (int dvb : {16, 32, 64})
    if (d.dv % dvb == 0 && long(d.B) * d.Hv * (d.dv / dvb) <= sms &&
        smemOf(dvb, 1) <= kMaxSmem) {
      best = dvb;
      break;
    }
  if (!best)
    for (int dvb : {64, 32, 16})
      if (d.dv % dvb == 0 && smemOf(dvb, 1) <= kMaxSmem) {
        best = dvb;
        break;
      }
  if (!best)
    best = 16;
  SeqPlan p;
  p.dvb = best;
  p.nbuf = smemOf(best, 2) <= kMaxSmem ? 2 : 1;
  p.smem = smemOf(best, p.nbuf);
  return p;
}

template <typename K> Status setSmem(K kernel, size_t bytes) {
  AP_GDN_CUDA_CHECK(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  return Status::Ok;
}

/// Whether the register-state passes (gdn_state.cu) and their layouts are
/// used; wider keys take the shared-memory state kernels above.
bool regPath(const Dims &d) { return d.dk <= kRegStateMaxDk; }

Status runWU(const Dims &d, const GdnChunkArgs &a, cudaStream_t s,
             bool recompute, Ws &w) {
  size_t sm = intraSmem(d);
  if (Status st = setSmem(intraKernel, sm); st != Status::Ok)
    return st;
  intraKernel<<<dim3(d.NT, d.Hv, d.B), kThreads, sm, s>>>(
      d, (const bf *)a.q, (const bf *)a.k, (const bf *)a.v, (const float *)a.g,
      (const float *)a.beta, (float *)a.gCum, (bf *)a.tMat, recompute,
      regPath(d), intraStages(d, regPath(d)), w.W, w.U, w.P);
  AP_GDN_LAUNCH_CHECK(intraKernel);
  return Status::Ok;
}

Status runState(const Dims &d, const GdnChunkArgs &a, cudaStream_t s,
                int smCount, Ws &w, float *finalState) {
  SeqPlan plan = seqPlan(
      d, smCount, [&](int dvb, int nb) { return stateSmem(d, dvb, nb); });
  if (Status st = setSmem(stateKernel, plan.smem); st != Status::Ok)
    return st;
  stateKernel<<<dim3(d.dv / plan.dvb, d.Hv, d.B), kThreads, plan.smem, s>>>(
      d, plan, (const bf *)a.k, (const float *)a.gCum, w.W, w.U,
      (const float *)a.initialState, w.h, w.Vn, finalState);
  AP_GDN_LAUNCH_CHECK(stateKernel);
  return Status::Ok;
}

/// The call for one document of a packed call (kernels/cuda/documents.h):
/// batch 1 over the document's tokens, every per-token tensor offset to its
/// first token, the row's initial state (and its gradient) on the row's
/// first document only, its final state (and its gradient) on the last.
GdnChunkArgs documentArgs(const GdnChunkArgs &a,
                          const cudadocs::Document &doc) {
  const long Hk = a.keyHeads, Hv = a.valueHeads;
  const long qs = a.qStride ? a.qStride : Hk * a.keyDim;
  const long ks = a.kStride ? a.kStride : Hk * a.keyDim;
  const long vs = a.vStride ? a.vStride : Hv * a.valueDim;
  const long os = Hv * a.valueDim, state = Hv * a.keyDim * a.valueDim;
  const long tok = doc.row * a.seqLen + doc.start;
  auto st = [](auto *p, long off) {
    return p ? (decltype(p))((bf *)p + off) : p;
  };
  auto acc = [](auto *p, long off) {
    return p ? (decltype(p))((float *)p + off) : p;
  };
  GdnChunkArgs d = a;
  d.docStart = nullptr;
  d.batch = 1;
  d.seqLen = doc.length;
  d.qStride = qs;
  d.kStride = ks;
  d.vStride = vs;
  d.q = st(a.q, tok * qs);
  d.k = st(a.k, tok * ks);
  d.v = st(a.v, tok * vs);
  d.g = acc(a.g, tok * Hv);
  d.beta = acc(a.beta, tok * Hv);
  d.o = st(a.o, tok * os);
  d.gCum = acc(a.gCum, tok * Hv);
  d.tMat = st(a.tMat, tok * Hv * C);
  d.dO = st(a.dO, tok * os);
  d.dq = st(a.dq, tok * qs);
  d.dk = st(a.dk, tok * ks);
  d.dv = st(a.dv, tok * vs);
  d.dg = acc(a.dg, tok * Hv);
  d.dbeta = acc(a.dbeta, tok * Hv);
  const long row = doc.row * state;
  d.initialState = doc.first ? acc(a.initialState, row) : nullptr;
  d.dInitialState = doc.first ? acc(a.dInitialState, row) : nullptr;
  d.finalState = doc.last ? acc(a.finalState, row) : nullptr;
  d.dFinalState = doc.last ? acc(a.dFinalState, row) : nullptr;
  return d;
}

} // namespace

Status chunkForward(const KernelContext &ctx, const GdnChunkArgs &a);
Status chunkBackward(const KernelContext &ctx, const GdnChunkArgs &a);

/// Packed rows: each document runs as its own row, one after another on the
/// call's stream, reusing the workspace (a document's need is at most the
/// whole call's). Only the first document's backward records
/// firstLaunchDone.
static Status chunkPacked(const KernelContext &ctx, const GdnChunkArgs &a,
                          bool backward) {
  if (!supported(a))
    return Status::Unsupported;
  std::vector<cudadocs::Document> docs;
  if (Status st = cudadocs::readDocuments((cudaStream_t)ctx.stream, a.docStart,
                                          a.batch, a.seqLen, docs);
      st != Status::Ok)
    return st;
  KernelContext one = ctx;
  for (const cudadocs::Document &doc : docs) {
    const GdnChunkArgs d = documentArgs(a, doc);
    if (Status st = backward ? chunkBackward(one, d) : chunkForward(one, d);
        st != Status::Ok)
      return st;
    one.firstLaunchDone = nullptr;
  }
  return Status::Ok;
}

Status chunkForward(const KernelContext &ctx, const GdnChunkArgs &a) {
  if (a.docStart)
    return chunkPacked(ctx, a, false);
  if (!supported(a))
    return Status::Unsupported;
  if (!a.q || !a.k || !a.v || !a.g || !a.beta || !a.o || !a.gCum || !a.tMat)
    return Status::InvalidArgument;
  Dims d = dimsOf(a);
  if (!stateSplitOk(d))
    return Status::InvalidArgument;
  Ws w;
  // The size is the shared query's (kernels/workspace.cpp); a carve that
  // outgrew it is refused rather than run past the workspace.
  const size_t need = gdnChunkForwardWorkspaceBytes(Backend::Cuda, a);
  if (ctx.workspaceBytes < need ||
      carve(d, false, (char *)ctx.workspace, &w) > need)
    return Status::InvalidArgument;
  cudaStream_t s = (cudaStream_t)ctx.stream;
  if (Status st = runWU(d, a, s, false, w); st != Status::Ok)
    return st;
  if (regPath(d))
    return runStateForwardReg(d, s, ctx.smCount, (const bf *)a.q,
                              (const bf *)a.k, (const float *)a.gCum, w.W, w.U,
                              w.P, (const float *)a.initialState, (bf *)a.o,
                              (float *)a.finalState, nullptr, nullptr);
  if (Status st = runState(d, a, s, ctx.smCount, w, (float *)a.finalState);
      st != Status::Ok)
    return st;
  size_t sm = outputSmem(d);
  if (Status st = setSmem(outputKernel, sm); st != Status::Ok)
    return st;
  outputKernel<<<dim3(d.NT, d.Hv, d.B), kThreads, sm, s>>>(
      d, (const bf *)a.q, (const bf *)a.k, (const float *)a.gCum, w.h, w.Vn,
      (bf *)a.o);
  AP_GDN_LAUNCH_CHECK(outputKernel);
  return Status::Ok;
}

Status chunkBackward(const KernelContext &ctx, const GdnChunkArgs &a) {
  if (a.docStart)
    return chunkPacked(ctx, a, true);
  if (!supported(a))
    return Status::Unsupported;
  if (!a.q || !a.k || !a.v || !a.beta || !a.gCum || !a.tMat || !a.dO || !a.dq ||
      !a.dk || !a.dv || !a.dg || !a.dbeta)
    return Status::InvalidArgument;
  Dims d = dimsOf(a);
  if (!stateSplitOk(d))
    return Status::InvalidArgument;
  Ws w;
  const size_t need = gdnChunkBackwardWorkspaceBytes(Backend::Cuda, a);
  if (ctx.workspaceBytes < need ||
      carve(d, true, (char *)ctx.workspace, &w) > need)
    return Status::InvalidArgument;
  cudaStream_t s = (cudaStream_t)ctx.stream;
  if (Status st = runWU(d, a, s, true, w); st != Status::Ok)
    return st;
  // The W/U pass runs a CTA per chunk and head on every SM; the state passes
  // after it run at most one wave of small CTAs that are latency-bound (a
  // chunk at a time): the point where work on another stream can start
  // without taking SMs from the wide pass.
  if (ctx.firstLaunchDone)
    AP_GDN_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ctx.firstLaunchDone, s));
  const bool direct = d.r == 1;
  if (regPath(d)) {
    // Register-state passes; h, dh, Vnew, dVnew in bf16 (transposed, see
    // gdn_chunk.cuh) in the fp32-sized workspace regions.
    bf *hT = (bf *)w.h, *dhT = (bf *)w.dh, *dVnT = (bf *)w.dVn;
    if (Status st = runStateForwardReg(
            d, s, ctx.smCount, (const bf *)a.q, (const bf *)a.k,
            (const float *)a.gCum, w.W, w.U, w.P, (const float *)a.initialState,
            nullptr, nullptr, hT, w.Vn);
        st != Status::Ok)
      return st;
    if (Status st = runStateBackwardReg(
            d, s, ctx.smCount, (const bf *)a.q, (const bf *)a.k,
            (const float *)a.gCum, w.W, w.P, (const bf *)a.dO,
            (const float *)a.dFinalState, dhT, dVnT, (float *)a.dInitialState);
        st != Status::Ok)
      return st;
    size_t sm = chunkBwdRegSmem(d);
    if (Status st = withDk(
            d.dk,
            [&](auto dkc) {
              constexpr int DKc = decltype(dkc)::value;
              if (Status st2 = setSmem(chunkBwdRegKernel<4, DKc>, sm);
                  st2 != Status::Ok)
                return st2;
              chunkBwdRegKernel<4, DKc>
                  <<<dim3(d.NT, d.Hv, d.B), kThreads, sm, s>>>(
                      d, (const bf *)a.q, (const bf *)a.k, (const bf *)a.v,
                      (const float *)a.gCum, (const float *)a.beta,
                      (const bf *)a.tMat, (const bf *)a.dO, hT, dhT, w.Vn, dVnT,
                      w.dQ, w.dK, (bf *)a.dq, (bf *)a.dk, (bf *)a.dv,
                      (float *)a.dg, (float *)a.dbeta);
              AP_GDN_LAUNCH_CHECK(chunkBwdRegKernel);
              return Status::Ok;
            });
        st != Status::Ok)
      return st;
  } else {
    if (Status st = runState(d, a, s, ctx.smCount, w, nullptr);
        st != Status::Ok)
      return st;
    SeqPlan plan = seqPlan(d, ctx.smCount, [&](int dvb, int nb) {
      return stateBwdSmem(d, dvb, nb);
    });
    if (Status st = setSmem(stateBwdKernel, plan.smem); st != Status::Ok)
      return st;
    stateBwdKernel<<<dim3(d.dv / plan.dvb, d.Hv, d.B), kThreads, plan.smem,
                     s>>>(d, plan, (const bf *)a.q, (const bf *)a.k,
                          (const float *)a.gCum, w.W, (const bf *)a.dO,
                          (const float *)a.dFinalState, w.dh, w.dVn,
                          (float *)a.dInitialState);
    AP_GDN_LAUNCH_CHECK(stateBwdKernel);
    const int VB = 32;
    size_t sm = chunkBwdSmem(d, VB);
    if (Status st = setSmem(chunkBwdKernel, sm); st != Status::Ok)
      return st;
    chunkBwdKernel<<<dim3(d.NT, d.Hv, d.B), kThreads, sm, s>>>(
        d, VB, (const bf *)a.q, (const bf *)a.k, (const bf *)a.v,
        (const float *)a.gCum, (const float *)a.beta, (const bf *)a.tMat,
        (const bf *)a.dO, w.h, w.dh, w.Vn, w.dVn, w.dQ, w.dK, w.dW, (bf *)a.dv,
        (float *)a.dg, (float *)a.dbeta);
    AP_GDN_LAUNCH_CHECK(chunkBwdKernel);
  }
  if (!direct || !regPath(d)) {
    groupSumKernel<<<1024, 256, 0, s>>>(d, w.dQ, w.dK, (bf *)a.dq, (bf *)a.dk);
    AP_GDN_LAUNCH_CHECK(groupSumKernel);
  }
  return Status::Ok;
}

} // namespace ap::kernels::gdncuda

namespace ap::kernels::gdncuda {
void opsAnchor();
/// Also referenced by tests: true once the cuda GDN objects are linked.
bool linked() {
  opsAnchor();
  return true;
}
} // namespace ap::kernels::gdncuda

/// Referenced from kernels/gdn.h by every ACTPLACE_HAVE_CUDA translation unit
/// so that this object (and, through linked(), gdn_ops.cu's) is linked.
extern "C" {
int actplaceGdnCudaAnchor = int(ap::kernels::gdncuda::linked());
}
