//===- elem_bench.cu - row and elementwise kernels, old vs new -*- C++ -*-===//
//
// Times the bandwidth-bound kernels of the Qwen3.5-0.8B step at their model
// shapes (T = 4096 tokens per microbatch): the kernels as they were at b9a54af
// (bench/elem_bench_old.cuh) against the library entries, in one process on
// one card. Each sample is one CUDA-event pair around 20 back-to-back calls
// that cycle through enough copies of the operands (>= 160 MB) that no call
// finds its inputs in the 50 MB L2; old and new samples alternate; prints the
// median per call over 21 samples and the bytes each call must move.
// Build: bench/elem_bench.sh.
//
//===----------------------------------------------------------------------===//
#include "bench/elem_bench_old.cuh"
#include "kernels/kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using namespace ap::kernels;

#define CK(call)                                                               \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));  \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)
#define KS(call)                                                               \
  do {                                                                         \
    Status s_ = (call);                                                        \
    if (s_ != Status::Ok) {                                                    \
      std::fprintf(stderr, "%s returned %d\n", #call, int(s_));                \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

namespace {

using bf = __nv_bfloat16;
constexpr int64_t T = 4096;
constexpr int kCalls = 20, kSamples = 21;
cudaStream_t gStream;
KernelContext gCtx;
std::vector<void *> gAllocs;

/// Non-zero finite bf16 / fp32 fill (0x3C3C: bf16 0.0115).
void *devAlloc(size_t bytes) {
  void *p = nullptr;
  CK(cudaMalloc(&p, bytes));
  CK(cudaMemset(p, 0x3C, bytes));
  gAllocs.push_back(p);
  return p;
}
void freeAll() {
  for (void *p : gAllocs)
    CK(cudaFree(p));
  gAllocs.clear();
}

/// Copies of the operands so that consecutive calls touch new memory.
int setsFor(double bytesPerCall) {
  return std::clamp(int(160e6 / bytesPerCall) + 1, 1, kCalls);
}

/// Median ms per call of fn(set) for old and new, samples interleaved.
std::pair<double, double> timeBoth(int sets,
                                   const std::function<void(int)> &oldFn,
                                   const std::function<void(int)> &newFn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> to, tn;
  for (int s = 0; s < kSamples + 2; ++s)
    for (int which = 0; which < 2; ++which) {
      const auto &fn = which ? newFn : oldFn;
      CK(cudaEventRecord(a, gStream));
      for (int i = 0; i < kCalls; ++i)
        fn(i % sets);
      CK(cudaEventRecord(b, gStream));
      CK(cudaEventSynchronize(b));
      CK(cudaGetLastError());
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      if (s >= 2) // two warm-up samples
        (which ? tn : to).push_back(ms / kCalls);
    }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(to.begin(), to.end());
  std::sort(tn.begin(), tn.end());
  return {to[to.size() / 2], tn[tn.size() / 2]};
}

void report(const std::string &name, const std::string &shape, double bytes,
            std::pair<double, double> t) {
  std::printf("{\"kernel\":\"%s\",\"shape\":\"%s\",\"mb\":%.2f,"
              "\"old_us\":%.2f,\"new_us\":%.2f,\"old_gbps\":%.0f,"
              "\"new_gbps\":%.0f,\"speedup\":%.2f}\n",
              name.c_str(), shape.c_str(), bytes / 1e6, t.first * 1e3,
              t.second * 1e3, bytes / (t.first * 1e-3) / 1e9,
              bytes / (t.second * 1e-3) / 1e9, t.first / t.second);
  std::fflush(stdout);
}

/// `sets` copies of a buffer of `bytes`.
std::vector<void *> bufs(int sets, size_t bytes) {
  std::vector<void *> v;
  for (int i = 0; i < sets; ++i)
    v.push_back(devAlloc(bytes));
  return v;
}
template <class T> T *at(const std::vector<void *> &v, int i) {
  return static_cast<T *>(v[i]);
}

void benchRmsNorm(int64_t rows, int64_t dim) {
  const std::string shape = std::to_string(rows) + "x" + std::to_string(dim);
  const size_t n = size_t(rows * dim);
  // Forward: x in, y out, rstd out.
  double fb = 4.0 * n + 4.0 * rows;
  // Backward: x, dy in, dx out, rstd in, dw partials out and back in.
  double bb = 6.0 * n + 4.0 * rows;
  int sets = setsFor(bb);
  auto x = bufs(sets, n * 2), y = bufs(sets, n * 2), dy = bufs(sets, n * 2),
       dx = bufs(sets, n * 2), rs = bufs(sets, rows * 4);
  void *w = devAlloc(dim * 2), *dw = devAlloc(dim * 4);
  const int64_t oldParts =
      (rows + old::kRmsNormRowsPerPartial - 1) / old::kRmsNormRowsPerPartial;
  RmsNormBackwardArgs probe{DType::BF16};
  probe.rows = rows;
  probe.dim = dim;
  size_t ws = std::max(rmsNormBackwardWorkspaceBytes(Backend::Cuda, probe),
                       size_t(oldParts * dim * 4));
  void *wsp = devAlloc(ws);
  gCtx.workspace = wsp;
  gCtx.workspaceBytes = ws;
  report("rms_norm", shape, fb,
         timeBoth(
             sets,
             [&](int i) {
               old::rmsNormFwdKernel<<<unsigned((rows + old::kNormWarps - 1) /
                                                old::kNormWarps),
                                       old::kNormWarps * 32, 0, gStream>>>(
                   at<bf>(x, i), (bf *)w, at<bf>(y, i), at<float>(rs, i), rows,
                   dim, dim, dim, 1e-6f, true);
             },
             [&](int i) {
               RmsNormForwardArgs f{DType::BF16, x[i], w,  y[i],
                                    rs[i],       rows, dim};
               KS(rmsNormForward(gCtx, f));
             }));
  report("rms_norm_grad", shape, bb,
         timeBoth(
             sets,
             [&](int i) {
               old::rmsNormBwdKernel<<<unsigned(oldParts), old::kNormBwdThreads,
                                       0, gStream>>>(
                   at<bf>(x, i), (bf *)w, at<float>(rs, i), at<bf>(dy, i),
                   at<bf>(dx, i), (float *)wsp, rows, dim, dim, dim, dim, true);
               old::columnSumKernel<<<unsigned((dim + 31) / 32), dim3(32, 32),
                                      0, gStream>>>((float *)wsp, (float *)dw,
                                                    oldParts, dim);
             },
             [&](int i) {
               RmsNormBackwardArgs b{DType::BF16, x[i], w,    rs[i], dy[i],
                                     dx[i],       dw,   rows, dim};
               KS(rmsNormBackward(gCtx, b));
             }));
  freeAll();
}

void benchL2() {
  const long N = T;
  const int H = 16, d = 128;
  const long rows = N * H;
  const size_t n = size_t(rows) * d;
  double fb = 4.0 * n + 4.0 * rows, bb = 6.0 * n + 4.0 * rows;
  int sets = setsFor(fb);
  auto x = bufs(sets, n * 2), y = bufs(sets, n * 2), dy = bufs(sets, n * 2),
       dx = bufs(sets, n * 2), rs = bufs(sets, rows * 4);
  const std::string shape = "4096x16x128";
  GdnL2NormArgs a;
  a.dtype = DType::BF16;
  a.tokens = N;
  a.heads = H;
  a.dim = d;
  report(
      "l2_norm", shape, fb,
      timeBoth(
          sets,
          [&](int i) {
            old::l2FwdKernel<<<old::gridFor(rows * 32, 256), 256, 0, gStream>>>(
                rows, H, d, H * d, H * d, 1e-6f, at<bf>(x, i), at<bf>(y, i),
                at<float>(rs, i));
          },
          [&](int i) {
            GdnL2NormArgs f = a;
            f.x = x[i];
            f.y = y[i];
            f.rstd = rs[i];
            KS(gdnL2NormForward(gCtx, f));
          }));
  report(
      "l2_norm_grad", shape, bb,
      timeBoth(
          sets,
          [&](int i) {
            old::l2BwdKernel<<<old::gridFor(rows * 32, 256), 256, 0, gStream>>>(
                rows, H, d, H * d, H * d, at<bf>(y, i), at<float>(rs, i),
                at<bf>(dy, i), at<bf>(dx, i));
          },
          [&](int i) {
            GdnL2NormArgs b = a;
            b.y = y[i];
            b.rstd = rs[i];
            b.dy = dy[i];
            b.dx = dx[i];
            KS(gdnL2NormBackward(gCtx, b));
          }));
  freeAll();
}

void benchGatedNorm() {
  const long N = T;
  const int H = 16, d = 128;
  const long rows = N * H;
  const size_t n = size_t(rows) * d;
  double fb = 6.0 * n + 4.0 * rows, bb = 10.0 * n + 4.0 * rows;
  int sets = setsFor(fb);
  auto x = bufs(sets, n * 2), z = bufs(sets, n * 2), y = bufs(sets, n * 2),
       dy = bufs(sets, n * 2), dx = bufs(sets, n * 2), dz = bufs(sets, n * 2),
       rs = bufs(sets, rows * 4);
  void *w = devAlloc(d * 2), *dw = devAlloc(d * 4);
  GdnGatedNormArgs a;
  a.dtype = DType::BF16;
  a.tokens = N;
  a.heads = H;
  a.dim = d;
  a.w = w;
  a.dw = dw;
  const long oldParts =
      (rows + old::kNormRowsPerBlock - 1) / old::kNormRowsPerBlock;
  size_t ws =
      std::max(gdnGatedNormBackwardWorkspaceBytes(a), size_t(oldParts * d * 4));
  void *wsp = devAlloc(ws);
  gCtx.workspace = wsp;
  gCtx.workspaceBytes = ws;
  const std::string shape = "4096x16x128";
  report("gated_rms_norm", shape, fb,
         timeBoth(
             sets,
             [&](int i) {
               old::gatedNormFwdKernel<<<old::gridFor(rows * 32, 256), 256, 0,
                                         gStream>>>(
                   rows, d, 1e-6f, at<bf>(x, i), at<bf>(z, i), (bf *)w,
                   at<bf>(y, i), at<float>(rs, i));
             },
             [&](int i) {
               GdnGatedNormArgs f = a;
               f.x = x[i];
               f.z = z[i];
               f.y = y[i];
               f.rstd = rs[i];
               KS(gdnGatedNormForward(gCtx, f));
             }));
  report(
      "gated_rms_norm_grad", shape, bb,
      timeBoth(
          sets,
          [&](int i) {
            old::gatedNormBwdKernel<<<unsigned(oldParts), 256,
                                      8 * d * sizeof(float), gStream>>>(
                rows, d, at<bf>(x, i), at<bf>(z, i), (bf *)w, at<float>(rs, i),
                at<bf>(dy, i), at<bf>(dx, i), at<bf>(dz, i), (float *)wsp);
            old::sumPartialsKernel<<<old::gridFor(d, 256), 256, 0, gStream>>>(
                oldParts, d, (float *)wsp, (float *)dw);
          },
          [&](int i) {
            GdnGatedNormArgs b = a;
            b.x = x[i];
            b.z = z[i];
            b.rstd = rs[i];
            b.dy = dy[i];
            b.dx = dx[i];
            b.dz = dz[i];
            KS(gdnGatedNormBackward(gCtx, b));
          }));
  freeAll();
}

void benchSwiGluAdd() {
  const int64_t rows = T, cols = 3584;
  const size_t n = size_t(rows * cols);
  double fb = 6.0 * n, bb = 10.0 * n;
  int sets = setsFor(fb);
  auto g = bufs(sets, n * 2), u = bufs(sets, n * 2), y = bufs(sets, n * 2),
       dy = bufs(sets, n * 2), dg = bufs(sets, n * 2), du = bufs(sets, n * 2);
  const std::string shape = "4096x3584";
  report("swiglu", shape, fb,
         timeBoth(
             sets,
             [&](int i) {
               old::EwLaunch l = old::ewLaunch(rows, cols, 2);
               old::swiGluFwdKernel<2><<<l.grid, l.block, 0, gStream>>>(
                   at<bf>(g, i), at<bf>(u, i), at<bf>(y, i), rows, cols, cols,
                   cols, cols);
             },
             [&](int i) {
               KS(swiGluForward(gCtx,
                                {DType::BF16, g[i], u[i], y[i], rows, cols}));
             }));
  report("swiglu_grad", shape, bb,
         timeBoth(
             sets,
             [&](int i) {
               old::EwLaunch l = old::ewLaunch(rows, cols, 2);
               old::swiGluBwdKernel<2><<<l.grid, l.block, 0, gStream>>>(
                   at<bf>(g, i), at<bf>(u, i), at<bf>(dy, i), at<bf>(dg, i),
                   at<bf>(du, i), rows, cols, cols, cols, cols, cols, cols);
             },
             [&](int i) {
               KS(swiGluBackward(gCtx, {DType::BF16, g[i], u[i], dy[i], dg[i],
                                        du[i], rows, cols}));
             }));
  freeAll();
  // Residual add over [T, D].
  const int64_t na = T * 1024;
  sets = setsFor(6.0 * na);
  auto a = bufs(sets, na * 2), b = bufs(sets, na * 2), o = bufs(sets, na * 2);
  report(
      "add", "4096x1024", 6.0 * na,
      timeBoth(
          sets,
          [&](int i) {
            unsigned grid =
                unsigned(std::min<int64_t>((na / 2 + 255) / 256, 4096));
            old::addKernel<2><<<grid, 256, 0, gStream>>>(
                at<bf>(a, i), at<bf>(b, i), at<bf>(o, i), na);
          },
          [&](int i) {
            KS(residualAddForward(gCtx, {DType::BF16, a[i], b[i], o[i], na}));
          }));
  freeAll();
}

/// copyRows at slice / concat shapes: outer rows of rowBytes out of (or
/// into) rows of pitch bytes, 16-byte words.
void benchCopy(const char *what, int64_t outer, int64_t rowBytes,
               int64_t srcPitch, int64_t dstPitch) {
  double bytes = 2.0 * outer * rowBytes;
  int sets = setsFor(bytes);
  auto s = bufs(sets, outer * srcPitch), d = bufs(sets, outer * dstPitch);
  const std::string shape = std::to_string(outer) + "x" +
                            std::to_string(rowBytes) + "B of " +
                            std::to_string(std::max(srcPitch, dstPitch)) + "B";
  report(what, shape, bytes,
         timeBoth(
             sets,
             [&](int i) {
               const int64_t words = rowBytes / 16;
               int threads = int(std::min<int64_t>(
                   256, std::max<int64_t>(32, (words + 31) / 32 * 32)));
               old::copyRowsKernel<uint4>
                   <<<unsigned(std::min<int64_t>(outer, 1 << 16)), threads, 0,
                      gStream>>>(at<uint4>(s, i), at<uint4>(d, i), outer, 1,
                                 words, srcPitch / 16, dstPitch / 16);
             },
             [&](int i) {
               CopyRowsArgs c;
               c.src = s[i];
               c.dst = d[i];
               c.outer = outer;
               c.rowBytes = rowBytes;
               c.srcPitch = srcPitch;
               c.dstPitch = dstPitch;
               KS(copyRows(gCtx, c));
             }));
  freeAll();
}

/// RoPE over [T, heads, 256], rotary 64 (Qwen q: 8 heads, k: 2).
void benchRope(int64_t heads) {
  const int64_t n = T * heads * 256;
  double bytes = 4.0 * n;
  int sets = setsFor(bytes);
  auto x = bufs(sets, n * 2), y = bufs(sets, n * 2);
  const std::string shape = "4096x" + std::to_string(heads) + "x256";
  for (bool backward : {false, true})
    report(backward ? "rope_grad" : "rope", shape, bytes,
           timeBoth(
               sets,
               [&](int i) {
                 old::ropeKernel<<<unsigned(T), 256, 0, gStream>>>(
                     at<bf>(x, i), at<bf>(y, i), T, heads, 256, 0, 64, 1e7,
                     backward);
               },
               [&](int i) {
                 RopeArgs a{DType::BF16, x[i], y[i], 1,  T,
                            heads,       256,  0,    64, 1e7};
                 KS(backward ? ropeBackward(gCtx, a) : ropeForward(gCtx, a));
               }));
  freeAll();
}

} // namespace

int main() {
  CK(cudaStreamCreate(&gStream));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"device\":\"%s\",\"sms\":%d}\n", prop.name,
              prop.multiProcessorCount);
  gCtx.backend = Backend::Cuda;
  gCtx.stream = gStream;
  gCtx.smCount = prop.multiProcessorCount;
  benchGatedNorm();
  benchRmsNorm(T, 1024);    // input / post-attention / final norms
  benchRmsNorm(T * 8, 256); // q_norm
  benchRmsNorm(T * 2, 256); // k_norm
  benchL2();
  benchSwiGluAdd();
  benchRope(8);
  benchRope(2);
  // q (2048 of the 6144 conv channels), a 16-wide gate slice, a concat.
  benchCopy("slice", T, 4096, 12288, 4096);
  benchCopy("slice", T, 32, 64, 32);
  benchCopy("concat", T, 4096, 4096, 8192);
  return 0;
}
