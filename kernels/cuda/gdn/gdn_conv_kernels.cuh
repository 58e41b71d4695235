//===- gdn_conv_kernels.cuh - GDN short-conv kernel bodies --*- C++ -*-===//
//
// The causal depthwise short conv + SiLU kernels of the cuda backend: the
// windowed ones (the default) and the per-element ones
// (GdnConvKernels::PerElement, and inputs too long for the windowed grid).
// Included inside gdn_ops.cu's anonymous namespace, and, for a CPU check of
// their index logic, by test/unit/kernels/gdn_conv_emulation_test.cpp, which
// defines `bf`, `b2f`, `f2b`, `sigmoidf_`, the launch builtins (blockIdx,
// threadIdx, blockDim, gridDim) and `min` for the host first. So the bodies use
// nothing else (and std::integral_constant, from <type_traits>, for the
// dispatch, and kConvRows, from gdn_layout.h, which both include first: the
// workspace query sizes the dw partials with it).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_CUDA_GDN_GDN_CONV_KERNELS_CUH
#define ACTPLACE_KERNELS_CUDA_GDN_GDN_CONV_KERNELS_CUH

/// The conv output's layout (GdnConvArgs): n groups of channels, group s
/// holding channels [start[s], start[s + 1]) in its own dense buffer of
/// start[s + 1] - start[s] channels a token; the dense layout is one group.
template <typename P> struct ConvGroups {
  P ptr[kGdnConvMaxSplits];
  int start[kGdnConvMaxSplits + 1];
  int n;
};

/// Channel c's column of a ConvGroups layout: token tok's element is at
/// p[tok * stride].
template <typename P> struct ConvColumn {
  P p;
  long stride;
};
// Every index into the groups is a constant after unrolling: a dynamic index
// would copy the kernel parameter to the thread's stack (56 bytes of local
// memory in the windowed backward, ptxas -v).
template <typename P>
__device__ __forceinline__ ConvColumn<P> columnOf(const ConvGroups<P> &g,
                                                  int c) {
  P p = g.ptr[0];
  int start = g.start[0], end = g.start[1];
#pragma unroll
  for (int s = 1; s < kGdnConvMaxSplits; ++s)
    if (s < g.n && c >= g.start[s]) {
      p = g.ptr[s];
      start = g.start[s];
      end = g.start[s + 1];
    }
  return {p + (c - start), long(end - start)};
}

/// Where token `tok`'s window may start: its row's first token, or its
/// document's first one when the row packs several (kernels/kernels.h,
/// docStart; null: one document per row).
__device__ __forceinline__ int convFirst(const int *ds, long tok) {
  return ds ? ds[tok] : 0;
}

__global__ void convFwdKernel(long N, int T, int Cc, int K, const bf *x,
                              const bf *w, ConvGroups<bf *> y, const int *ds) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N * Cc;
       i += long(gridDim.x) * blockDim.x) {
    int c = int(i % Cc);
    long tok = i / Cc;
    int t = int(tok % T);
    const int first = convFirst(ds, tok);
    float pre = 0.f;
    for (int j = 0; j < K; ++j) {
      int ts = t - (K - 1) + j;
      if (ts >= first)
        pre += b2f(w[c * K + j]) * b2f(x[(tok - t + ts) * Cc + c]);
    }
    ConvColumn<bf *> col = columnOf(y, c);
    col.p[tok * col.stride] = f2b(pre * sigmoidf_(pre));
  }
}

__device__ float convDpre(long tok, int t, int c, int Cc, int K, const bf *x,
                          const bf *w, const ConvGroups<const bf *> &dy,
                          const int *ds) {
  const int first = convFirst(ds, tok);
  float pre = 0.f;
  for (int j = 0; j < K; ++j) {
    int ts = t - (K - 1) + j;
    if (ts >= first)
      pre += b2f(w[c * K + j]) * b2f(x[(tok - t + ts) * Cc + c]);
  }
  float s = sigmoidf_(pre);
  ConvColumn<const bf *> col = columnOf(dy, c);
  return b2f(col.p[tok * col.stride]) * s * (1.f + pre * (1.f - s));
}

__global__ void convDxKernel(long N, int T, int Cc, int K, const bf *x,
                             const bf *w, ConvGroups<const bf *> dy, bf *dx,
                             const int *ds) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < N * Cc;
       i += long(gridDim.x) * blockDim.x) {
    int c = int(i % Cc);
    long tok = i / Cc;
    int t = int(tok % T);
    float s = 0.f;
    for (int j = 0; j < K; ++j) {
      int td = t + K - 1 - j;
      // Output td reads x[t] only when t is in td's document.
      if (td < T && convFirst(ds, tok - t + td) <= t)
        s += b2f(w[c * K + j]) *
             convDpre(tok - t + td, td, c, Cc, K, x, w, dy, ds);
    }
    dx[i] = f2b(s);
  }
}

/// partial[blk][c][j] = sum over tokens of block blk of dpre[t,c] x[t-K+1+j,c].
__global__ void convDwPartialKernel(long N, int T, int Cc, int K, const bf *x,
                                    const bf *w, ConvGroups<const bf *> dy,
                                    float *partial, const int *ds) {
  int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= Cc)
    return;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  long tEnd = min(N, long(blockIdx.x + 1) * kConvRows);
  for (long tok = long(blockIdx.x) * kConvRows; tok < tEnd; ++tok) {
    int t = int(tok % T);
    float dp = convDpre(tok, t, c, Cc, K, x, w, dy, ds);
    const int first = convFirst(ds, tok);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int ts = t - K + 1 + j;
      if (j < K && ts >= first)
        acc[j] += dp * b2f(x[(tok - t + ts) * Cc + c]);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    if (j < K)
      partial[(long(blockIdx.x) * Cc + c) * K + j] = acc[j];
}

constexpr int kConvFwdRows = 32; // tokens per thread of the conv forward

// The windowed conv kernels (the default; =0 opts out) give each
// thread one channel and a run of consecutive tokens, and slide a window of the
// last K inputs (and, backward, of the next K pre-activation gradients) through
// registers: every x and dy element is loaded once (plus K - 1 halo tokens per
// run), and a warp's loads cover 32 consecutive channels of one token. Terms
// outside the sequence enter as zeros, which leaves every fp32 sum bitwise as
// if they were skipped (the sums start at +0), so the results equal the
// per-element formulas of the reference bit for bit.

/// Shifts `v` into the end of `win` (win[K-1] is the newest).
template <int K>
__device__ __forceinline__ void push(float (&win)[K], float v) {
#pragma unroll
  for (int j = 0; j + 1 < K; ++j)
    win[j] = win[j + 1];
  win[K - 1] = v;
}

/// Tokens whose x loads the windowed forward issues before it uses any of
/// them in the last, partial run of a column (whole runs load all theirs
/// first): with one load in flight a thread waits on memory once per token.
constexpr int kConvAhead = 4;

template <int K>
__global__ void
convWindowFwdKernel(long N, int T, int Cc, const bf *__restrict__ x,
                    const bf *__restrict__ w, ConvGroups<bf *> y) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= Cc)
    return;
  const ConvColumn<bf *> ycol = columnOf(y, c);
  long tok0 = long(blockIdx.y) * kConvFwdRows;
  if (tok0 >= N)
    return;
  long tokEnd = min(N, tok0 + kConvFwdRows);
  float wc[K];
#pragma unroll
  for (int j = 0; j < K; ++j)
    wc[j] = b2f(w[c * K + j]);
  int t = int(tok0 % T);
  // After each push, win[j] = x at t - (K - 1) + j.
  // Before the first push, win[j] (j >= 1) holds x at t - K + j; win[0] is
  // shifted out by that push.
  float win[K];
  win[0] = 0.f;
#pragma unroll
  for (int j = 1; j < K; ++j) {
    int back = K - j;
    win[j] = t - back >= 0 ? b2f(x[(tok0 - back) * Cc + c]) : 0.f;
  }
  auto step = [&](long tok, float xv) {
    if (t == T) { // a new sequence: nothing before it
      t = 0;
#pragma unroll
      for (int j = 0; j < K; ++j)
        win[j] = 0.f;
    }
    push(win, xv);
    float pre = 0.f;
#pragma unroll
    for (int j = 0; j < K; ++j)
      pre += wc[j] * win[j];
    ycol.p[tok * ycol.stride] = f2b(pre * sigmoidf_(pre));
    ++t;
  };
  if (tokEnd - tok0 == kConvFwdRows) {
    // A whole run (all but the last): the trip count is known, so every
    // load of the run is issued before the first is used (elem_bench on
    // the H200: 47.8 us at the Qwen shape, 56.2 us with 4 ahead only).
    const bf *xp = x + tok0 * Cc + c;
    float in[kConvFwdRows];
#pragma unroll
    for (int u = 0; u < kConvFwdRows; ++u)
      in[u] = b2f(xp[long(u) * Cc]);
#pragma unroll
    for (int u = 0; u < kConvFwdRows; ++u)
      step(tok0 + u, in[u]);
    return;
  }
  for (long base = tok0; base < tokEnd; base += kConvAhead) {
    float in[kConvAhead];
#pragma unroll
    for (int u = 0; u < kConvAhead; ++u)
      in[u] = base + u < tokEnd ? b2f(x[(base + u) * Cc + c]) : 0.f;
#pragma unroll
    for (int u = 0; u < kConvAhead; ++u) {
      if (base + u >= tokEnd)
        break;
      step(base + u, in[u]);
    }
  }
}

/// Tokens whose x and dy loads the windowed backward issues before it uses
/// the first of them. With one token at a time every token would wait a full
/// memory round trip: the whole grid is one wave of
/// threads that each walk 131 tokens, so that chain was the kernel's time
/// (144 us at the Qwen shape; bench/notes/gdn.md, "The conv backward's loads").
constexpr int kConvBwdAhead = 4;

/// dx for the tokens of one dw partial, and that partial:
///   dpre[t] = dy[t] silu'(pre[t]),
///   dx[t] = sum_j w[j] dpre[t + K-1-j] (same sequence only),
///   partial[blk][c][j] = sum over the block's tokens of dpre[t] x[t-K+1+j].
/// A: tokens loaded ahead (kConvBwdAhead in the library; the emulation test
/// and bench/conv_sweep.cu take others). The arithmetic, and so every bit,
/// does not depend on A.
template <int K, int A = kConvBwdAhead>
__global__ void
convWindowBwdKernel(long N, int T, int Cc, const bf *__restrict__ x,
                    const bf *__restrict__ w, ConvGroups<const bf *> dy,
                    bf *__restrict__ dx, float *__restrict__ partial) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= Cc)
    return;
  const ConvColumn<const bf *> dycol = columnOf(dy, c);
  long tok0 = long(blockIdx.y) * kConvRows;
  long tokEnd = min(N, tok0 + kConvRows);
  float wc[K];
#pragma unroll
  for (int j = 0; j < K; ++j)
    wc[j] = b2f(w[c * K + j]);
  int t = int(tok0 % T);
  float xwin[K]; // as win in convWindowFwdKernel
  xwin[0] = 0.f;
#pragma unroll
  for (int j = 1; j < K; ++j) {
    int back = K - j;
    xwin[j] = t - back >= 0 ? b2f(x[(tok0 - back) * Cc + c]) : 0.f;
  }
  // dwin[d] = dpre of the token d places after the oldest pending one;
  // tpos[d] its position in its sequence.
  float dwin[K], acc[K];
  int tpos[K];
#pragma unroll
  for (int j = 0; j < K; ++j) {
    dwin[j] = 0.f;
    tpos[j] = 0;
    acc[j] = 0.f;
  }
  // Tokens tok0 .. tokEnd + K - 2: the last K - 1 only complete the dx of
  // the block's own tokens; those at or past N load nothing.
  const long last = tokEnd + K - 1, loadEnd = min(last, N);
  auto step = [&](long tok, float xv, float gv) {
    if (t == T) {
      t = 0;
#pragma unroll
      for (int j = 0; j < K; ++j)
        xwin[j] = 0.f;
    }
    float dp = 0.f;
    if (tok < N) {
      push(xwin, xv);
      float pre = 0.f;
#pragma unroll
      for (int j = 0; j < K; ++j)
        pre += wc[j] * xwin[j];
      float s = sigmoidf_(pre);
      dp = gv * s * (1.f + pre * (1.f - s));
      if (tok < tokEnd) {
#pragma unroll
        for (int j = 0; j < K; ++j)
          acc[j] += dp * xwin[j];
      }
    }
    // Shift in this token's dpre (its position t), then emit the dx of the
    // token K - 1 places back once all its later terms are known.
#pragma unroll
    for (int j = 0; j + 1 < K; ++j)
      tpos[j] = tpos[j + 1];
    tpos[K - 1] = t;
    push(dwin, dp);
    long emit = tok - (K - 1);
    if (emit >= tok0 && emit < tokEnd) {
      int te = tpos[0];
      float sdx = 0.f;
#pragma unroll
      for (int j = 0; j < K; ++j)
        if (te + K - 1 - j < T)
          sdx += wc[j] * dwin[K - 1 - j];
      dx[emit * Cc + c] = f2b(sdx);
    }
    ++t;
  };
  for (long base = tok0; base < last; base += A) {
    float xin[A], gin[A];
#pragma unroll
    for (int u = 0; u < A; ++u) {
      bool in = base + u < loadEnd;
      xin[u] = in ? b2f(x[(base + u) * Cc + c]) : 0.f;
      gin[u] = in ? b2f(dycol.p[(base + u) * dycol.stride]) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < A; ++u) {
      if (base + u >= last)
        break;
      step(base + u, xin[u], gin[u]);
    }
  }
#pragma unroll
  for (int j = 0; j < K; ++j)
    partial[(long(blockIdx.y) * Cc + c) * K + j] = acc[j];
}

/// Calls f(std::integral_constant<int, K>{}) for K in 1..8.
template <typename F> void withKernelSize(int k, F &&f) {
  switch (k) {
  case 1:
    f(std::integral_constant<int, 1>{});
    break;
  case 2:
    f(std::integral_constant<int, 2>{});
    break;
  case 3:
    f(std::integral_constant<int, 3>{});
    break;
  case 4:
    f(std::integral_constant<int, 4>{});
    break;
  case 5:
    f(std::integral_constant<int, 5>{});
    break;
  case 6:
    f(std::integral_constant<int, 6>{});
    break;
  case 7:
    f(std::integral_constant<int, 7>{});
    break;
  default:
    f(std::integral_constant<int, 8>{});
    break;
  }
}

/// The staged conv backward (GdnConvKernels::Staged): a block per run of
/// kConvRows tokens (one dw partial, as the windowed backward) and
/// kConvStagedChannels channels, in three phases separated by barriers, its
/// global accesses 16 bytes (8 channels) each:
///   0. x of the run, the K - 1 tokens before it and the K - 1 after (zero
///      outside [0, N)), and the tile's weights as floats, into shared
///      memory;
///   1. dpre of the run's tokens and the K - 1 after (zero at or past N), 8
///      channels a thread and item, dy read once from global memory, into
///      shared memory as floats;
///   2. dx of the run's tokens, 8 channels an item; then the dw partial, a
///      thread per (channel, tap) at a time summing the run's tokens in order.
/// Every value's operations are convWindowBwdKernel's, in the same order and
/// with the window's zero terms, so dx and the partials are its bits. The
/// phases are functions of (phase, thread) so that the host emulation test
/// can run every thread of a phase before the next phase.
constexpr int kConvStagedChannels = 64;
constexpr int kConvStagedThreads = 256;

/// 8 consecutive bf16 channels: one 16-byte access.
struct alignas(16) ConvBf8 {
  bf v[8];
};

template <int K> struct ConvStagedTile {
  static constexpr int TC = kConvStagedChannels, TR = kConvRows,
                       TH = kConvStagedThreads;
  static constexpr int XR = TR + 2 * (K - 1); // x rows from tok0 - (K - 1)
  static constexpr int DR = TR + K - 1;       // dpre rows from tok0
  // x row pitch in bf16: consecutive rows 16 bytes apart in the banks, so
  // the taps of one channel (rows e .. e + K - 1) do not clash.
  static constexpr int XP = TC + 8;
  static constexpr int V8 = TC / 8;
  static constexpr long xBytes = long(XR) * XP * 2;
  static constexpr long dpBytes = long(DR) * TC * 4;
  // The tile's weights as floats after x and dpre (read from shared memory,
  // so that 8 x K of them are not held in registers across the phases).
  static constexpr long smemBytes = xBytes + dpBytes + long(TC) * K * 4;
  static_assert(TH % V8 == 0, "a thread's items keep their 8 channels");
};

/// Phase 0's x rows of both staged kernels: `rows` rows of the tile's
/// channels from token tok0 - (K - 1), zero outside [0, N), 16 bytes a
/// thread and item.
template <int K>
__device__ __forceinline__ void convStageX(int tid, int rows, long tok0, long N,
                                           int Cc, int c0,
                                           const bf *__restrict__ x, bf *xs) {
  using S = ConvStagedTile<K>;
  for (int it = tid; it < rows * S::V8; it += S::TH) {
    const int r = it / S::V8, v = it % S::V8;
    const long tok = tok0 - (K - 1) + r;
    ConvBf8 h = {};
    if (tok >= 0 && tok < N)
      h = *reinterpret_cast<const ConvBf8 *>(x + tok * Cc + c0 + v * 8);
    *reinterpret_cast<ConvBf8 *>(xs + r * S::XP + v * 8) = h;
  }
}

/// Phase `phase` of thread `tid` of block (bx, by) of the staged backward;
/// `dyc` is dy at channel c0 = bx * kConvStagedChannels of its group (the
/// tile lies in one), a token's row dyStride elements after the previous.
template <int K>
__device__ __forceinline__ void
convStagedBwdPhase(int phase, int tid, int bx, int by, long N, int T, int Cc,
                   const bf *__restrict__ x, const bf *__restrict__ w,
                   const bf *__restrict__ dyc, long dyStride,
                   bf *__restrict__ dx, float *__restrict__ partial,
                   unsigned char *smem) {
  using S = ConvStagedTile<K>;
  bf *xs = reinterpret_cast<bf *>(smem);
  float *dps = reinterpret_cast<float *>(smem + S::xBytes);
  float *wsm = reinterpret_cast<float *>(smem + S::xBytes + S::dpBytes);
  const int c0 = bx * S::TC;
  const long tok0 = long(by) * S::TR;
  const long tokEnd = min(N, tok0 + S::TR);
  if (phase == 0) {
    convStageX<K>(tid, S::XR, tok0, N, Cc, c0, x, xs);
    for (int i = tid; i < S::TC * K; i += S::TH)
      wsm[i] = b2f(w[long(c0) * K + i]);
    return;
  }
  // A thread's items keep the 8 channels v * 8 .. v * 8 + 7.
  const int v = tid % S::V8;
  // Channel v * 8 + q's tap j.
  const float *wq = wsm + v * 8 * K;
  if (phase == 1) {
    // Row d is token tok0 + d; its window's tap j is x row d + j, zero
    // before the token's sequence starts.
    for (int d = tid / S::V8; d < S::DR; d += S::TH / S::V8) {
      const long tok = tok0 + d;
      float dp[8];
      if (tok < N) {
        const int t = int(tok % T);
        const ConvBf8 g =
            *reinterpret_cast<const ConvBf8 *>(dyc + tok * dyStride + v * 8);
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          float pre = 0.f;
#pragma unroll
          for (int j = 0; j < K; ++j) {
            const float xv = t - (K - 1) + j >= 0
                                 ? b2f(xs[(d + j) * S::XP + v * 8 + q])
                                 : 0.f;
            pre += wq[q * K + j] * xv;
          }
          const float sg = sigmoidf_(pre);
          dp[q] = b2f(g.v[q]) * sg * (1.f + pre * (1.f - sg));
        }
      } else {
#pragma unroll
        for (int q = 0; q < 8; ++q)
          dp[q] = 0.f;
      }
#pragma unroll
      for (int q = 0; q < 8; ++q)
        dps[d * S::TC + v * 8 + q] = dp[q];
    }
    return;
  }
  // Phase 2. dx of token tok0 + e: dpre of tokens e .. e + K - 1 of its
  // sequence.
  for (int e = tid / S::V8; e < S::TR; e += S::TH / S::V8) {
    const long tok = tok0 + e;
    if (tok >= tokEnd)
      break;
    const int te = int(tok % T);
    ConvBf8 o;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      float sdx = 0.f;
#pragma unroll
      for (int j = 0; j < K; ++j)
        if (te + K - 1 - j < T)
          sdx += wq[q * K + j] * dps[(e + K - 1 - j) * S::TC + v * 8 + q];
      o.v[q] = f2b(sdx);
    }
    *reinterpret_cast<ConvBf8 *>(dx + tok * Cc + c0 + v * 8) = o;
  }
  // The dw partial of (channel c, tap j): the run's tokens in order.
  for (int pj = tid; pj < S::TC * K; pj += S::TH) {
    const int c = pj / K, j = pj % K;
    float acc = 0.f;
    for (long tok = tok0; tok < tokEnd; ++tok) {
      const int e = int(tok - tok0), t = int(tok % T);
      const float xv =
          t - (K - 1) + j >= 0 ? b2f(xs[(e + j) * S::XP + c]) : 0.f;
      acc += dps[e * S::TC + c] * xv;
    }
    partial[(long(by) * Cc + c0 + c) * K + j] = acc;
  }
}

/// The staged forward (GdnConvKernels::Staged), the same tiles: x of the run
/// and the K - 1 tokens before it into shared memory (phase 0), then y of
/// the run's tokens, 8 channels an item and one 16-byte store (phase 1), with
/// convWindowFwdKernel's operations, so its bits. `yc` is y at channel c0 of
/// its group, a token's row yStride elements after the previous.
template <int K>
__device__ __forceinline__ void
convStagedFwdPhase(int phase, int tid, int bx, int by, long N, int T, int Cc,
                   const bf *__restrict__ x, const bf *__restrict__ w,
                   bf *__restrict__ yc, long yStride, unsigned char *smem) {
  using S = ConvStagedTile<K>;
  constexpr int XRF = S::TR + K - 1; // x rows from tok0 - (K - 1)
  bf *xs = reinterpret_cast<bf *>(smem);
  const int c0 = bx * S::TC;
  const long tok0 = long(by) * S::TR;
  const long tokEnd = min(N, tok0 + S::TR);
  if (phase == 0) {
    convStageX<K>(tid, XRF, tok0, N, Cc, c0, x, xs);
    return;
  }
  const int v = tid % S::V8;
  float wr[8][K];
#pragma unroll
  for (int q = 0; q < 8; ++q)
#pragma unroll
    for (int j = 0; j < K; ++j)
      wr[q][j] = b2f(w[(c0 + v * 8 + q) * K + j]);
  // Token tok0 + e: its window's tap j is x row e + j, zero before its
  // sequence starts.
  for (int e = tid / S::V8; e < S::TR; e += S::TH / S::V8) {
    const long tok = tok0 + e;
    if (tok >= tokEnd)
      break;
    const int t = int(tok % T);
    ConvBf8 o;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      float pre = 0.f;
#pragma unroll
      for (int j = 0; j < K; ++j) {
        const float xv =
            t - (K - 1) + j >= 0 ? b2f(xs[(e + j) * S::XP + v * 8 + q]) : 0.f;
        pre += wr[q][j] * xv;
      }
      o.v[q] = f2b(pre * sigmoidf_(pre));
    }
    *reinterpret_cast<ConvBf8 *>(yc + tok * yStride + v * 8) = o;
  }
}

#ifndef AP_GDN_CONV_HOST_EMULATION
/// MinBlocks: blocks an SM the registers must allow (__launch_bounds__): the
/// library asks for 4 (at most 64 registers, no spills for K = 1-8, ptxas;
/// 4 blocks' shared memory fits an SM), conv_sweep also times 2.
template <int K, int MinBlocks = 4>
__global__ void __launch_bounds__(kConvStagedThreads, MinBlocks)
    convStagedBwdKernel(long N, int T, int Cc, const bf *__restrict__ x,
                        const bf *__restrict__ w, ConvGroups<const bf *> dy,
                        bf *__restrict__ dx, float *__restrict__ partial) {
  extern __shared__ __align__(16) unsigned char convStagedSmem[];
  const ConvColumn<const bf *> dyc =
      columnOf(dy, int(blockIdx.x) * kConvStagedChannels);
  convStagedBwdPhase<K>(0, threadIdx.x, blockIdx.x, blockIdx.y, N, T, Cc, x, w,
                        dyc.p, dyc.stride, dx, partial, convStagedSmem);
  __syncthreads();
  convStagedBwdPhase<K>(1, threadIdx.x, blockIdx.x, blockIdx.y, N, T, Cc, x, w,
                        dyc.p, dyc.stride, dx, partial, convStagedSmem);
  __syncthreads();
  convStagedBwdPhase<K>(2, threadIdx.x, blockIdx.x, blockIdx.y, N, T, Cc, x, w,
                        dyc.p, dyc.stride, dx, partial, convStagedSmem);
}
template <int K>
__global__ void __launch_bounds__(kConvStagedThreads)
    convStagedFwdKernel(long N, int T, int Cc, const bf *__restrict__ x,
                        const bf *__restrict__ w, ConvGroups<bf *> y) {
  __shared__ __align__(16) unsigned char
      convStagedFwdSmem[(kConvRows + K - 1) * (kConvStagedChannels + 8) * 2];
  const ConvColumn<bf *> yc =
      columnOf(y, int(blockIdx.x) * kConvStagedChannels);
  convStagedFwdPhase<K>(0, threadIdx.x, blockIdx.x, blockIdx.y, N, T, Cc, x, w,
                        yc.p, yc.stride, convStagedFwdSmem);
  __syncthreads();
  convStagedFwdPhase<K>(1, threadIdx.x, blockIdx.x, blockIdx.y, N, T, Cc, x, w,
                        yc.p, yc.stride, convStagedFwdSmem);
}
#endif

#endif // ACTPLACE_KERNELS_CUDA_GDN_GDN_CONV_KERNELS_CUH
