//===- conv_sweep.cu - GDN short-conv kernel shapes -------------*- C++ -*-===//
//
// Times variants of the GDN causal depthwise conv + SiLU kernels at the
// Qwen3.5-0.8B shape (4096 tokens x 6144 channels, kernel 4) against the
// library's windowed path, to choose the work split of the library kernels
// (kernels/cuda/gdn/gdn_conv_kernels.cuh):
// V channels a thread (V bf16 in one access), R tokens a thread (forward;
// backward: R tokens per dw partial block), loads issued A tokens ahead.
// The per-channel arithmetic is the library's, so every variant gives the
// bits of y and dx of the per-element kernels (the library's fallback path,
// which shares none of the windowed code), and the sweep checks each, and the
// library's windowed path, against them bitwise (dw depends on R). Its
// results (bench/notes/gdn.md) chose 4 tokens ahead for the forward and
// __restrict__ pointers for both. Median of 21 samples of 20 calls over
// rotating operand copies (no L2 reuse), as bench/elem_bench.cu. First, the
// library's dx pass by tokens loaded ahead (dense dy, and dy in the step's
// three groups) and the sweep's kernel with the shape at run time; last, the
// library's backward again. `conv_sweep --tiled` times only the library's
// staged kernels (GdnConvKernels::Staged: x and, backward, dpre in shared
// memory; y, dx and the dw partials checked bitwise against the windowed
// path's) and the windowed ones, two rounds in turn. Build and run:
// bench/conv_sweep.sh [build folder].
//
//===----------------------------------------------------------------------===//
#include "bench/bench_timing.h"
#include "kernels/cuda/gdn/gdn_common.cuh"
#include "kernels/cuda/gdn/gdn_layout.h"
#include "kernels/kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace ap::kernels;
using namespace ap::kernels::gdncuda; // bf, b2f, f2b, sigmoidf_

namespace {

// The library's conv helpers (push), as gdn_ops.cu includes them: the
// variants below use the library's per-channel arithmetic.
#include "kernels/cuda/gdn/gdn_conv_kernels.cuh"

constexpr long N = 4096;
constexpr int C = 6144, K = 4;
constexpr int kCalls = 20, kSamples = 21, kSets = 4;

template <int V> struct alignas(2 * V) BfV {
  bf v[V]; // V consecutive bf16: one aligned access
};

template <int V> __device__ __forceinline__ BfV<V> ld(const bf *p) {
  return *reinterpret_cast<const BfV<V> *>(p);
}

/// Weights of channels c0 .. c0 + V - 1, and the window before token tok0
/// (win[v][j], j >= 1: x at tok0 - K + j, zero before the sequence start);
/// cc channels a token.
template <int V>
__device__ __forceinline__ void
initColumns(const bf *x, const bf *w, int c0, long tok0, long cc,
            float (&wc)[V][K], float (&win)[V][K]) {
#pragma unroll
  for (int v = 0; v < V; ++v) {
#pragma unroll
    for (int j = 0; j < K; ++j)
      wc[v][j] = b2f(w[(c0 + v) * K + j]);
    win[v][0] = 0.f;
  }
#pragma unroll
  for (int j = 1; j < K; ++j) {
    long back = K - j;
    BfV<V> h = {};
    if (tok0 - back >= 0)
      h = ld<V>(x + (tok0 - back) * cc + c0);
#pragma unroll
    for (int v = 0; v < V; ++v)
      win[v][j] = tok0 - back >= 0 ? b2f(h.v[v]) : 0.f;
  }
}

template <int V, int R, int A>
__global__ void fwd(const bf *__restrict__ x, const bf *__restrict__ w,
                    bf *__restrict__ y) {
  int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c0 >= C)
    return;
  long tok0 = long(blockIdx.y) * R;
  long tokEnd = min(N, tok0 + R);
  float wc[V][K], win[V][K];
  initColumns<V>(x, w, c0, tok0, C, wc, win);
  for (long base = tok0; base < tokEnd; base += A) {
    BfV<V> in[A];
#pragma unroll
    for (int u = 0; u < A; ++u)
      if (base + u < tokEnd)
        in[u] = ld<V>(x + (base + u) * C + c0);
#pragma unroll
    for (int u = 0; u < A; ++u) {
      long tok = base + u;
      if (tok >= tokEnd)
        break;
      BfV<V> out;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        push(win[v], b2f(in[u].v[v]));
        float pre = 0.f;
#pragma unroll
        for (int j = 0; j < K; ++j)
          pre += wc[v][j] * win[v][j];
        out.v[v] = f2b(pre * sigmoidf_(pre));
      }
      *reinterpret_cast<BfV<V> *>(y + tok * C + c0) = out;
    }
  }
}

/// CN / CC: the token and channel counts as compile-time constants (the
/// sweep's variants), or 0 to take them from nArg / ccArg at run time (what
/// the library does; the decomposition in main).
template <int V, int R, int A, long CN = N, int CC = C>
__global__ void bwd(long nArg, int ccArg, const bf *__restrict__ x,
                    const bf *__restrict__ w, const bf *__restrict__ dy,
                    bf *__restrict__ dx, float *__restrict__ partial) {
  const long n = CN > 0 ? CN : nArg;
  const long cc = CC > 0 ? CC : ccArg;
  int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c0 >= cc)
    return;
  long tok0 = long(blockIdx.y) * R;
  long tokEnd = min(n, tok0 + R);
  float wc[V][K], xwin[V][K], dwin[V][K] = {}, acc[V][K] = {};
  initColumns<V>(x, w, c0, tok0, cc, wc, xwin);
  int tpos[K] = {};
  const long last = tokEnd + K - 1;
  for (long base = tok0; base < last; base += A) {
    BfV<V> xin[A], gin[A];
#pragma unroll
    for (int u = 0; u < A; ++u)
      if (base + u < last && base + u < n) {
        xin[u] = ld<V>(x + (base + u) * cc + c0);
        gin[u] = ld<V>(dy + (base + u) * cc + c0);
      }
#pragma unroll
    for (int u = 0; u < A; ++u) {
      long tok = base + u;
      if (tok >= last)
        break;
      float dp[V];
#pragma unroll
      for (int v = 0; v < V; ++v) {
        dp[v] = 0.f;
        if (tok < n) {
          push(xwin[v], b2f(xin[u].v[v]));
          float pre = 0.f;
#pragma unroll
          for (int j = 0; j < K; ++j)
            pre += wc[v][j] * xwin[v][j];
          float s = sigmoidf_(pre);
          dp[v] = b2f(gin[u].v[v]) * s * (1.f + pre * (1.f - s));
          if (tok < tokEnd) {
#pragma unroll
            for (int j = 0; j < K; ++j)
              acc[v][j] += dp[v] * xwin[v][j];
          }
        }
      }
#pragma unroll
      for (int j = 0; j + 1 < K; ++j)
        tpos[j] = tpos[j + 1];
      tpos[K - 1] = int(tok);
#pragma unroll
      for (int v = 0; v < V; ++v)
        push(dwin[v], dp[v]);
      long emit = tok - (K - 1);
      if (emit >= tok0 && emit < tokEnd) {
        int te = tpos[0];
        BfV<V> o;
#pragma unroll
        for (int v = 0; v < V; ++v) {
          float sdx = 0.f;
#pragma unroll
          for (int j = 0; j < K; ++j)
            if (te + K - 1 - j < n)
              sdx += wc[v][j] * dwin[v][K - 1 - j];
          o.v[v] = f2b(sdx);
        }
        *reinterpret_cast<BfV<V> *>(dx + emit * cc + c0) = o;
      }
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int j = 0; j < K; ++j)
      partial[(long(blockIdx.y) * cc + c0 + v) * K + j] = acc[v][j];
}

cudaStream_t gStream;
std::vector<void *> x, y, dy, dx;
void *w, *partial, *ws;
std::vector<unsigned char> refY, refDx, refPartial;

std::vector<unsigned char> fetch(void *p, size_t n) {
  std::vector<unsigned char> h(n);
  CK(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost));
  return h;
}

double timeCalls(const std::function<void(int)> &fn) {
  return ap::bench::medianMsPerCall(gStream, kSamples, kCalls, kSets, fn);
}

void report(const char *kind, int V, int R, int A, int threads, double ms,
            double mb, bool same) {
  std::printf("{\"kernel\":\"%s\",\"V\":%d,\"R\":%d,\"A\":%d,\"threads\":%d,"
              "\"us\":%.2f,\"gbps\":%.0f,\"bitwise_as_library\":%s}\n",
              kind, V, R, A, threads, ms * 1e3, mb / (ms * 1e-3) / 1e3,
              same ? "true" : "false");
  std::fflush(stdout);
}

template <int V, int R, int A, int TH> void runFwd() {
  dim3 grid((C / V + TH - 1) / TH, unsigned((N + R - 1) / R));
  double ms = timeCalls([&](int i) {
    fwd<V, R, A>
        <<<grid, TH, 0, gStream>>>((const bf *)x[i], (const bf *)w, (bf *)y[i]);
  });
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(gStream));
  report("short_conv", V, R, A, TH, ms, 4.0 * N * C / 1e6,
         fetch(y[0], size_t(N) * C * 2) == refY);
}

template <int V, int R, int A, int TH> void runBwd() {
  dim3 grid((C / V + TH - 1) / TH, unsigned((N + R - 1) / R));
  double ms = timeCalls([&](int i) {
    bwd<V, R, A><<<grid, TH, 0, gStream>>>(N, C, (const bf *)x[i],
                                           (const bf *)w, (const bf *)dy[i],
                                           (bf *)dx[i], (float *)partial);
  });
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(gStream));
  report("short_conv_grad", V, R, A, TH, ms, 6.0 * N * C / 1e6,
         fetch(dx[0], size_t(N) * C * 2) == refDx);
}

/// bwd<1, 128, 1> with N and / or C at run time (CN, CC = 0): with the
/// library's dx pass, separates what constant shapes buy from what the
/// library's sequence and group handling costs.
template <long CN, int CC> void runRuntimeShape(const char *name) {
  dim3 grid((C + 127) / 128, unsigned((N + 127) / 128));
  double ms = timeCalls([&](int i) {
    bwd<1, 128, 1, CN, CC><<<grid, 128, 0, gStream>>>(
        N, C, (const bf *)x[i], (const bf *)w, (const bf *)dy[i], (bf *)dx[i],
        (float *)partial);
  });
  bwd<1, 128, 1, CN, CC><<<grid, 128, 0, gStream>>>(
      N, C, (const bf *)x[0], (const bf *)w, (const bf *)dy[0], (bf *)dx[0],
      (float *)partial);
  CK(cudaStreamSynchronize(gStream));
  report(name, 1, 128, 1, 128, ms, 6.0 * N * C / 1e6,
         fetch(dx[0], size_t(N) * C * 2) == refDx);
}

void *devRandom(size_t n, unsigned seed) {
  std::vector<uint16_t> h(n);
  unsigned s = seed;
  for (auto &v : h) {
    s = s * 1664525u + 1013904223u;
    float f = (float(s >> 8) / float(1 << 24) - 0.5f) * 4.f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    v = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  void *p;
  CK(cudaMalloc(&p, n * 2));
  CK(cudaMemcpy(p, h.data(), n * 2, cudaMemcpyHostToDevice));
  return p;
}

} // namespace

int main(int argc, char **argv) {
  // --tiled: the library's staged and windowed kernels only (seconds).
  const bool tiledOnly = argc > 1 && std::strcmp(argv[1], "--tiled") == 0;
  CK(cudaStreamCreate(&gStream));
  for (int i = 0; i < kSets; ++i) {
    x.push_back(devRandom(size_t(N) * C, 1 + i));
    dy.push_back(devRandom(size_t(N) * C, 100 + i));
    void *p;
    CK(cudaMalloc(&p, size_t(N) * C * 2));
    y.push_back(p);
    CK(cudaMalloc(&p, size_t(N) * C * 2));
    dx.push_back(p);
  }
  w = devRandom(size_t(C) * K, 7);
  CK(cudaMalloc(&partial, size_t(N) * C * K * 4));
  // The library's windowed path (the default): the bits every variant must
  // give.
  GdnConvArgs a;
  a.batch = 1;
  a.seqLen = N;
  a.channels = C;
  a.kernelSize = K;
  a.x = x[0];
  a.w = w;
  a.y = y[0];
  a.dy = dy[0];
  a.dx = dx[0];
  CK(cudaMalloc(&a.dw, size_t(C) * K * 4));
  size_t wsb = gdnConvBackwardWorkspaceBytes(a);
  CK(cudaMalloc(&ws, wsb));
  KernelContext ctx;
  ctx.backend = Backend::Cuda;
  ctx.stream = gStream;
  ctx.workspace = ws;
  ctx.workspaceBytes = wsb;
  // The bits every variant must give: the per-element kernels (the
  // library's fallback path), which share none of the windowed code.
  {
    ConvGroups<bf *> yd{};
    yd.n = 1;
    yd.start[1] = C;
    yd.ptr[0] = (bf *)y[0];
    ConvGroups<const bf *> dyd{};
    dyd.n = 1;
    dyd.start[1] = C;
    dyd.ptr[0] = (const bf *)dy[0];
    unsigned blocks = unsigned((N * C + 255) / 256);
    convFwdKernel<<<blocks, 256, 0, gStream>>>(
        N, int(N), C, K, (const bf *)x[0], (const bf *)w, yd, nullptr);
    convDxKernel<<<blocks, 256, 0, gStream>>>(N, int(N), C, K, (const bf *)x[0],
                                              (const bf *)w, dyd, (bf *)dx[0],
                                              nullptr);
    CK(cudaGetLastError());
  }
  CK(cudaStreamSynchronize(gStream));
  refY = fetch(y[0], size_t(N) * C * 2);
  refDx = fetch(dx[0], size_t(N) * C * 2);
  // The library's windowed path (the default) must give them too.
  KS(gdnConvForward(ctx, a));
  KS(gdnConvBackward(ctx, a));
  CK(cudaStreamSynchronize(gStream));
  refPartial = fetch(ws, size_t((N + kConvRows - 1) / kConvRows) * C * K * 4);
  std::printf("{\"library_windowed_bitwise_as_per_element\":[%s,%s]}\n",
              fetch(y[0], size_t(N) * C * 2) == refY ? "true" : "false",
              fetch(dx[0], size_t(N) * C * 2) == refDx ? "true" : "false");
  double lib[2];
  lib[0] = timeCalls([&](int i) {
    a.x = x[i];
    a.y = y[i];
    KS(gdnConvForward(ctx, a));
  });
  lib[1] = timeCalls([&](int i) {
    a.x = x[i];
    a.dy = dy[i];
    a.dx = dx[i];
    KS(gdnConvBackward(ctx, a));
  });
  std::printf("{\"library_windowed_us\":[%.2f,%.2f]}\n", lib[0] * 1e3,
              lib[1] * 1e3);
  if (tiledOnly) {
    for (int round = 0; round < 2; ++round) {
      // The library's staged forward and backward (GdnConvKernels::Staged),
      // their bits against the windowed path's.
      a.kernels = GdnConvKernels::Staged;
      double fwdStaged = timeCalls([&](int i) {
        a.x = x[i];
        a.y = y[i];
        KS(gdnConvForward(ctx, a));
      });
      a.x = x[0];
      a.y = y[0];
      KS(gdnConvForward(ctx, a));
      CK(cudaStreamSynchronize(gStream));
      std::printf(
          "{\"library_staged_fwd_us\":%.2f,\"bitwise_as_library\":%s}\n",
          fwdStaged * 1e3,
          fetch(y[0], size_t(N) * C * 2) == refY ? "true" : "false");
      double libStaged = timeCalls([&](int i) {
        a.x = x[i];
        a.dy = dy[i];
        a.dx = dx[i];
        KS(gdnConvBackward(ctx, a));
      });
      a.x = x[0];
      a.dy = dy[0];
      a.dx = dx[0];
      KS(gdnConvBackward(ctx, a));
      CK(cudaStreamSynchronize(gStream));
      const bool stagedSame = fetch(dx[0], size_t(N) * C * 2) == refDx &&
                              fetch(ws, refPartial.size()) == refPartial;
      a.kernels = GdnConvKernels::Fastest;
      std::printf(
          "{\"library_staged_bwd_us\":%.2f,\"bitwise_as_library\":%s}\n",
          libStaged * 1e3, stagedSame ? "true" : "false");
      double libAgain = timeCalls([&](int i) {
        a.x = x[i];
        a.dy = dy[i];
        a.dx = dx[i];
        KS(gdnConvBackward(ctx, a));
      });
      double fwdAgain = timeCalls([&](int i) {
        a.x = x[i];
        a.y = y[i];
        KS(gdnConvForward(ctx, a));
      });
      std::printf("{\"library_windowed_bwd_us_again\":%.2f,"
                  "\"library_windowed_fwd_us_again\":%.2f}\n",
                  libAgain * 1e3, fwdAgain * 1e3);
      // The staged kernel with registers for 2 blocks an SM (its dx pass
      // and partials; the dw sum is the library's).
      {
        constexpr int bytes = int(ConvStagedTile<K>::smemBytes);
        CK(cudaFuncSetAttribute(convStagedBwdKernel<K, 2>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                bytes));
        ConvGroups<const bf *> dense{};
        dense.n = 1;
        dense.start[1] = C;
        dim3 grid(C / kConvStagedChannels,
                  unsigned((N + kConvRows - 1) / kConvRows));
        auto run2 = [&](int i) {
          dense.ptr[0] = (const bf *)dy[i];
          convStagedBwdKernel<K, 2>
              <<<grid, kConvStagedThreads, bytes, gStream>>>(
                  N, int(N), C, (const bf *)x[i], (const bf *)w, dense,
                  (bf *)dx[i], (float *)partial);
        };
        double ms2 = timeCalls(run2);
        CK(cudaGetLastError());
        run2(0);
        CK(cudaStreamSynchronize(gStream));
        const bool same2 = fetch(dx[0], size_t(N) * C * 2) == refDx &&
                           fetch(partial, refPartial.size()) == refPartial;
        std::printf(
            "{\"staged_dx_pass_2_blocks_us\":%.2f,\"bitwise_as_library\":%s}\n",
            ms2 * 1e3, same2 ? "true" : "false");
      }
    }
    return 0;
  }
  // The library's dx pass alone, by how many tokens it loads ahead (dense
  // dy; the library's own count also with dy in the step's three groups),
  // and the sweep's kernel with the shape at run time, the control the
  // library's dx pass is measured against (times in bench/notes/gdn.md).
  {
    dim3 grid((C + 127) / 128, unsigned((N + 127) / 128));
    ConvGroups<const bf *> dense{};
    dense.n = 1;
    dense.start[0] = 0;
    dense.start[1] = C;
    auto dxPass = [&](auto ahead, const char *name) {
      constexpr int A = decltype(ahead)::value;
      double ms = timeCalls([&](int i) {
        dense.ptr[0] = (const bf *)dy[i];
        convWindowBwdKernel<K, A><<<grid, 128, 0, gStream>>>(
            N, int(N), C, (const bf *)x[i], (const bf *)w, dense, (bf *)dx[i],
            (float *)partial);
      });
      dense.ptr[0] = (const bf *)dy[0];
      convWindowBwdKernel<K, A><<<grid, 128, 0, gStream>>>(
          N, int(N), C, (const bf *)x[0], (const bf *)w, dense, (bf *)dx[0],
          (float *)partial);
      CK(cudaStreamSynchronize(gStream));
      report(name, 1, 128, A, 128, ms, 6.0 * N * C / 1e6,
             fetch(dx[0], size_t(N) * C * 2) == refDx);
    };
    dxPass(std::integral_constant<int, 1>{}, "lib_dx_pass_dense");
    dxPass(std::integral_constant<int, 2>{}, "lib_dx_pass_dense");
    dxPass(std::integral_constant<int, 4>{}, "lib_dx_pass_dense");
    dxPass(std::integral_constant<int, 8>{}, "lib_dx_pass_dense");
    // Three groups of C / 3 channels (q, k, v): their own buffers.
    std::vector<void *> dyq(kSets);
    for (int i = 0; i < kSets; ++i) {
      CK(cudaMalloc(&dyq[i], size_t(N) * C * 2));
      // Group g of token t holds channels [g C/3, (g+1) C/3) of dy's row t.
      CK(cudaMemcpy2D(dyq[i], size_t(C / 3) * 2, dy[i], size_t(C) * 2,
                      size_t(C / 3) * 2, N, cudaMemcpyDeviceToDevice));
      for (int g = 1; g < 3; ++g)
        CK(cudaMemcpy2D((char *)dyq[i] + size_t(N) * (C / 3) * 2 * g,
                        size_t(C / 3) * 2,
                        (char *)dy[i] + size_t(C / 3) * 2 * g, size_t(C) * 2,
                        size_t(C / 3) * 2, N, cudaMemcpyDeviceToDevice));
    }
    ConvGroups<const bf *> split{};
    split.n = 3;
    for (int g = 0; g <= 3; ++g)
      split.start[g] = g * (C / 3);
    auto setSplit = [&](int i) {
      for (int g = 0; g < 3; ++g)
        split.ptr[g] = (const bf *)dyq[i] + size_t(N) * (C / 3) * g;
    };
    double dxSplit = timeCalls([&](int i) {
      setSplit(i);
      convWindowBwdKernel<K><<<grid, 128, 0, gStream>>>(
          N, int(N), C, (const bf *)x[i], (const bf *)w, split, (bf *)dx[i],
          (float *)partial);
    });
    setSplit(0);
    convWindowBwdKernel<K><<<grid, 128, 0, gStream>>>(
        N, int(N), C, (const bf *)x[0], (const bf *)w, split, (bf *)dx[0],
        (float *)partial);
    CK(cudaStreamSynchronize(gStream));
    report("lib_dx_pass_split3", 1, 128, kConvBwdAhead, 128, dxSplit,
           6.0 * N * C / 1e6, fetch(dx[0], size_t(N) * C * 2) == refDx);
    runRuntimeShape<0, 0>("sweep_bwd_runtime_shape");
    for (void *p : dyq)
      CK(cudaFree(p));
  }
  runFwd<1, 32, 1, 128>();
  runFwd<1, 32, 4, 128>();
  runFwd<2, 32, 4, 128>();
  runFwd<2, 16, 4, 128>();
  runFwd<2, 8, 4, 128>();
  runFwd<4, 16, 4, 128>();
  runFwd<4, 8, 4, 128>();
  runFwd<4, 32, 4, 64>();
  runFwd<8, 32, 4, 64>();
  runFwd<8, 8, 4, 64>();
  runFwd<8, 16, 8, 64>();
  runFwd<2, 64, 8, 128>();
  runBwd<1, 128, 1, 128>();
  runBwd<1, 128, 4, 128>();
  runBwd<2, 128, 4, 128>();
  runBwd<4, 128, 4, 128>();
  runBwd<8, 128, 4, 64>();
  runBwd<1, 32, 4, 128>();
  runBwd<2, 32, 4, 128>();
  runBwd<2, 64, 4, 128>();
  runBwd<4, 32, 4, 128>();
  runBwd<2, 16, 4, 128>();
  runBwd<4, 16, 4, 64>();
  runBwd<8, 32, 4, 64>();
  // The library's backward again, last in the process: shows whether run
  // order moves the timings (bench/notes/gdn.md, "Run order tested").
  double libLate = timeCalls([&](int i) {
    a.x = x[i];
    a.dy = dy[i];
    a.dx = dx[i];
    KS(gdnConvBackward(ctx, a));
  });
  std::printf("{\"library_windowed_bwd_us_late\":%.2f}\n", libLate * 1e3);
  return 0;
}
