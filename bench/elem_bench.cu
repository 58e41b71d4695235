//===- elem_bench.cu - row and elementwise kernels --------------*- C++ -*-===//
//
// Times the bandwidth-bound kernels of the Qwen3.5-0.8B step (the library
// entries) at their model shapes (T = 4096 tokens per microbatch) on one
// card. Each sample is one CUDA-event pair around 20 back-to-back calls that
// cycle through enough copies of the operands (>= 160 MB) that no call finds
// its inputs in the 50 MB L2; prints the median per call over 21 samples and
// the bytes each call must move. The old-vs-new comparison in
// bench/notes/dense.md ran an earlier version of this file against a copy
// of the kernels it replaced; that copy is gone.
// Build: bench/elem_bench.sh.
//
//===----------------------------------------------------------------------===//
#include "bench/bench_timing.h"
#include "kernels/kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using namespace ap::kernels;

namespace {

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

/// A workspace of `bytes` for the calls that follow (freed by freeAll).
void useWorkspace(size_t bytes) {
  gCtx.workspace = devAlloc(bytes);
  gCtx.workspaceBytes = bytes;
}

/// Copies of the operands so that consecutive calls touch new memory.
int setsFor(double bytesPerCall) {
  return std::clamp(int(160e6 / bytesPerCall) + 1, 1, kCalls);
}

/// Median ms per call of fn(set) over kSamples samples of kCalls calls,
/// after two warm-up samples.
double timeCalls(int sets, const std::function<void(int)> &fn) {
  return ap::bench::medianMsPerCall(gStream, kSamples, kCalls, sets, fn);
}

void report(const std::string &name, const std::string &shape, double bytes,
            double ms) {
  std::printf("{\"kernel\":\"%s\",\"shape\":\"%s\",\"mb\":%.2f,"
              "\"us\":%.2f,\"gbps\":%.0f}\n",
              name.c_str(), shape.c_str(), bytes / 1e6, ms * 1e3,
              bytes / (ms * 1e-3) / 1e9);
  std::fflush(stdout);
}

/// `sets` copies of a buffer of `bytes`.
std::vector<void *> bufs(int sets, size_t bytes) {
  std::vector<void *> v;
  for (int i = 0; i < sets; ++i)
    v.push_back(devAlloc(bytes));
  return v;
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
  RmsNormBackwardArgs probe{DType::BF16};
  probe.rows = rows;
  probe.dim = dim;
  useWorkspace(rmsNormBackwardWorkspaceBytes(Backend::Cuda, probe));
  report("rms_norm", shape, fb, timeCalls(sets, [&](int i) {
           RmsNormForwardArgs f{DType::BF16, x[i], w, y[i], rs[i], rows, dim};
           KS(rmsNormForward(gCtx, f));
         }));
  report("rms_norm_grad", shape, bb, timeCalls(sets, [&](int i) {
           RmsNormBackwardArgs b{DType::BF16, x[i], w,    rs[i], dy[i],
                                 dx[i],       dw,   rows, dim};
           KS(rmsNormBackward(gCtx, b));
         }));
  freeAll();
}

/// The GDN norms' view: [T, 16 heads, 128].
constexpr int kGdnHeads = 16, kGdnDim = 128;
constexpr long kGdnRows = T * kGdnHeads;
constexpr size_t kGdnElems = size_t(kGdnRows) * kGdnDim;
const std::string kGdnShape = "4096x16x128";

/// GDN norm arguments of that view, pointers unset.
template <class Args> Args gdnNormArgs() {
  Args a;
  a.dtype = DType::BF16;
  a.tokens = T;
  a.heads = kGdnHeads;
  a.dim = kGdnDim;
  return a;
}

void benchL2() {
  const long rows = kGdnRows;
  const size_t n = kGdnElems;
  double fb = 4.0 * n + 4.0 * rows, bb = 6.0 * n + 4.0 * rows;
  int sets = setsFor(fb);
  auto x = bufs(sets, n * 2), y = bufs(sets, n * 2), dy = bufs(sets, n * 2),
       dx = bufs(sets, n * 2), rs = bufs(sets, rows * 4);
  const auto a = gdnNormArgs<GdnL2NormArgs>();
  report("l2_norm", kGdnShape, fb, timeCalls(sets, [&](int i) {
           GdnL2NormArgs f = a;
           f.x = x[i];
           f.y = y[i];
           f.rstd = rs[i];
           KS(gdnL2NormForward(gCtx, f));
         }));
  report("l2_norm_grad", kGdnShape, bb, timeCalls(sets, [&](int i) {
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
  const long rows = kGdnRows;
  const size_t n = kGdnElems;
  double fb = 6.0 * n + 4.0 * rows, bb = 10.0 * n + 4.0 * rows;
  int sets = setsFor(fb);
  auto x = bufs(sets, n * 2), z = bufs(sets, n * 2), y = bufs(sets, n * 2),
       dy = bufs(sets, n * 2), dx = bufs(sets, n * 2), dz = bufs(sets, n * 2),
       rs = bufs(sets, rows * 4);
  auto a = gdnNormArgs<GdnGatedNormArgs>();
  a.w = devAlloc(kGdnDim * 2);
  a.dw = devAlloc(kGdnDim * 4);
  useWorkspace(gdnGatedNormBackwardWorkspaceBytes(a));
  report("gated_rms_norm", kGdnShape, fb, timeCalls(sets, [&](int i) {
           GdnGatedNormArgs f = a;
           f.x = x[i];
           f.z = z[i];
           f.y = y[i];
           f.rstd = rs[i];
           KS(gdnGatedNormForward(gCtx, f));
         }));
  report("gated_rms_norm_grad", kGdnShape, bb, timeCalls(sets, [&](int i) {
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
  report("swiglu", shape, fb, timeCalls(sets, [&](int i) {
           KS(swiGluForward(gCtx, {DType::BF16, g[i], u[i], y[i], rows, cols}));
         }));
  report("swiglu_grad", shape, bb, timeCalls(sets, [&](int i) {
           KS(swiGluBackward(gCtx, {DType::BF16, g[i], u[i], dy[i], dg[i],
                                    du[i], rows, cols}));
         }));
  freeAll();
  // Residual add over [T, D].
  const int64_t na = T * 1024;
  sets = setsFor(6.0 * na);
  auto a = bufs(sets, na * 2), b = bufs(sets, na * 2), o = bufs(sets, na * 2);
  report("add", "4096x1024", 6.0 * na, timeCalls(sets, [&](int i) {
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
  report(what, shape, bytes, timeCalls(sets, [&](int i) {
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
           timeCalls(sets, [&](int i) {
             RopeArgs a{DType::BF16, x[i], y[i], 1, T, heads, 256, 0, 64, 1e7};
             KS(backward ? ropeBackward(gCtx, a) : ropeForward(gCtx, a));
           }));
  freeAll();
}

/// The GDN short conv + SiLU at [T, 6144] channels, kernel 4, on both paths
/// (GdnConvArgs::kernels): the per-element kernels and the windowed ones
/// (the default). Forward: x in,
/// y out; backward: x, dy in, dx out (the dw partials are small).
void benchConv() {
  const int64_t C = 6144;
  const int K = 4;
  const size_t n = size_t(T * C);
  double fb = 4.0 * n, bb = 6.0 * n;
  int sets = setsFor(bb);
  auto x = bufs(sets, n * 2), y = bufs(sets, n * 2), dy = bufs(sets, n * 2),
       dx = bufs(sets, n * 2);
  void *w = devAlloc(C * K * 2), *dw = devAlloc(C * K * 4);
  GdnConvKernels kernels = GdnConvKernels::Fastest;
  auto args = [&](int i) {
    GdnConvArgs a;
    a.kernels = kernels;
    a.dtype = DType::BF16;
    a.batch = 1;
    a.seqLen = T;
    a.channels = C;
    a.kernelSize = K;
    a.x = x[i];
    a.w = w;
    a.y = y[i];
    a.dy = dy[i];
    a.dx = dx[i];
    a.dw = dw;
    return a;
  };
  useWorkspace(gdnConvBackwardWorkspaceBytes(args(0)));
  const std::string shape = std::to_string(T) + "x" + std::to_string(C);
  for (GdnConvKernels k :
       {GdnConvKernels::PerElement, GdnConvKernels::Fastest}) {
    kernels = k;
    std::string path =
        k == GdnConvKernels::Fastest ? "[windowed]" : "[per-element]";
    report("short_conv" + path, shape, fb,
           timeCalls(sets, [&](int i) { KS(gdnConvForward(gCtx, args(i))); }));
    report("short_conv_grad" + path, shape, bb,
           timeCalls(sets, [&](int i) { KS(gdnConvBackward(gCtx, args(i))); }));
  }
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
  benchConv();
  return 0;
}
