//===- dense_bench.cpp - dense kernels on the H200 --------------*- C++ -*-===//
//
// Times every dense kernel at the Qwen3.5-0.8B shapes (T=4096 tokens, D=1024,
// I=3584, V=248320) and prints one JSON line per kernel: median time over
// the timed repetitions, bytes and FLOPs counted from the shapes, and the
// roofline floor max(flops / peakFlops, bytes / peakBw) with the ceilings
// measured on this card kind (KINDS.md: 790 TFLOP/s bf16, 4.3 TB/s copy).
// bench/dense_bench_torch.py times the PyTorch peers in the same run.
// Build: bench/dense_bench.sh.
//
//===----------------------------------------------------------------------===//
#include "bench/bench_timing.h"
#include "kernels/cuda/dense/dense_cuda.h"
#include "kernels/kernels.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using namespace ap::kernels;

namespace {

constexpr double kPeakFlops = 790e12, kPeakBw = 4.3e12;
constexpr int64_t T = 4096, D = 1024, I = 3584, V = 248320;

cudaStream_t gStream;
KernelContext gCtx;

void *devAlloc(size_t bytes, int fill = 1) {
  void *p = nullptr;
  CK(cudaMalloc(&p, bytes));
  // Non-zero, finite bf16 and fp32 values: 0x3C3C = bf16 0.0115, fp32 0.0115.
  CK(cudaMemset(p, fill ? 0x3C : 0, bytes));
  return p;
}

/// Median milliseconds of `reps` timed calls after `warm` untimed ones.
double timeMs(const std::function<void()> &fn, int warm = 3, int reps = 15) {
  for (int i = 0; i < warm; ++i)
    fn();
  std::vector<cudaEvent_t> ev(reps + 1);
  for (auto &e : ev)
    CK(cudaEventCreate(&e));
  CK(cudaEventRecord(ev[0], gStream));
  for (int i = 0; i < reps; ++i) {
    fn();
    CK(cudaEventRecord(ev[i + 1], gStream));
  }
  CK(cudaStreamSynchronize(gStream));
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i)
    CK(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]));
  for (auto &e : ev)
    CK(cudaEventDestroy(e));
  return ap::bench::median(ms);
}

void report(const std::string &name, double ms, double flops, double bytes,
            const std::string &extra = "") {
  double floorMs = 1e3 * std::max(flops / kPeakFlops, bytes / kPeakBw);
  std::printf("{\"impl\":\"actplace\",\"kernel\":\"%s\",\"ms\":%.4f,"
              "\"floor_ms\":%.4f,\"of_floor\":%.3f,\"tflops\":%.1f,"
              "\"gbps\":%.1f%s}\n",
              name.c_str(), ms, floorMs, floorMs / ms,
              flops / (ms * 1e-3) / 1e12, bytes / (ms * 1e-3) / 1e9,
              extra.c_str());
  std::fflush(stdout);
}

void benchLinear(const char *name, int64_t in, int64_t out) {
  auto *x = devAlloc(T * in * 2), *w = devAlloc(out * in * 2),
       *y = devAlloc(T * out * 2), *dy = devAlloc(T * out * 2),
       *dx = devAlloc(T * in * 2), *dw = devAlloc(out * in * 4);
  double f = 2.0 * T * in * out;
  LinearForwardArgs fa{DType::BF16, x, w, y, T, in, out};
  report(std::string(name) + ".fwd",
         timeMs([&] { KS(linearForward(gCtx, fa)); }), f,
         2.0 * (T * in + in * out + T * out));
  LinearBackwardArgs dxa{DType::BF16, x, w, dy, dx, nullptr, T, in, out};
  report(std::string(name) + ".dx",
         timeMs([&] { KS(linearBackward(gCtx, dxa)); }), f,
         2.0 * (T * out + in * out + T * in));
  LinearBackwardArgs dwa{DType::BF16, x, w, dy, nullptr, dw, T, in, out};
  report(std::string(name) + ".dw",
         timeMs([&] { KS(linearBackward(gCtx, dwa)); }), f,
         2.0 * (T * out + T * in) + 8.0 * in * out);
  for (void *p : {x, w, y, dy, dx, dw})
    CK(cudaFree(p));
}

} // namespace

int main(int argc, char **argv) {
  // --quick: the LM head at chunk 1024 only; --ce: only the LM head (chunk
  // 1024, its GEMMs alone beside it), for interleaving two builds in a call.
  bool quick = false, ceOnly = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--quick")
      quick = true;
    else if (arg == "--ce")
      quick = ceOnly = true;
    else {
      std::fprintf(stderr,
                   "dense_bench: unknown argument '%s' (expected --quick or "
                   "--ce)\n",
                   arg.c_str());
      return 2;
    }
  }
  cublasLtHandle_t lt;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS)
    return 1;
  CK(cudaStreamCreate(&gStream));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"device\":\"%s\",\"sms\":%d,\"T\":%lld}\n", prop.name, sms,
              (long long)T);
  gCtx.backend = Backend::Cuda;
  gCtx.stream = gStream;
  gCtx.cublasLt = lt;
  gCtx.smCount = sms;
  // One workspace big enough for the largest chunked CE configuration.
  LmHeadCrossEntropyArgs ceProbe;
  ceProbe.tokens = T;
  ceProbe.dim = D;
  ceProbe.vocab = V;
  ceProbe.chunkTokens = 2048;
  size_t wsBytes = lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, ceProbe);
  gCtx.workspace = devAlloc(wsBytes, 0);
  gCtx.workspaceBytes = wsBytes;

  // GEMMs: MLP gate/up (and fused), down, GDN in_proj_qkv, out_proj.
  if (!ceOnly) {
    benchLinear("gemm.mlp_up_1024x3584", D, I);
    benchLinear("gemm.mlp_gateup_1024x7168", D, 2 * I);
    benchLinear("gemm.mlp_down_3584x1024", I, D);
    benchLinear("gemm.gdn_qkv_1024x6144", D, 6144);
    benchLinear("gemm.gdn_out_2048x1024", 2048, D);

    {
      // RMSNorm: model norm [T, D]; q_norm [T*8, 256] on the gated q_proj view.
      // x, dy, dx hold the gated q_proj view [T*8, 512]; y the q_norm output.
      auto *x = devAlloc(T * 8192), *w = devAlloc(2048),
           *y = devAlloc(T * 4096), *rs = devAlloc(T * 8 * 4),
           *dy = devAlloc(T * 8192), *dx = devAlloc(T * 8192),
           *dw = devAlloc(4096);
      RmsNormForwardArgs f{DType::BF16, x, w, y, rs, T, D};
      report("rmsnorm.fwd_4096x1024",
             timeMs([&] { KS(rmsNormForward(gCtx, f)); }), 0,
             2.0 * T * D * 2 + 4.0 * T);
      RmsNormBackwardArgs b{DType::BF16, x, w, rs, dy, dx, dw, T, D};
      report("rmsnorm.bwd_4096x1024",
             timeMs([&] { KS(rmsNormBackward(gCtx, b)); }), 0,
             2.0 * T * D * 3 + 4.0 * T);
      RmsNormForwardArgs q{DType::BF16, x, w, y, rs, T * 8, 256, 512, 256};
      report("rmsnorm.qnorm_fwd_32768x256_stride512",
             timeMs([&] { KS(rmsNormForward(gCtx, q)); }), 0,
             2.0 * T * 8 * 256 * 2 + 4.0 * T * 8);
      RmsNormBackwardArgs qb{DType::BF16, x,     w,   rs,  dy,  dx,
                             dw,          T * 8, 256, 512, 512, 512};
      report("rmsnorm.qnorm_bwd_32768x256_stride512",
             timeMs([&] { KS(rmsNormBackward(gCtx, qb)); }), 0,
             2.0 * T * 8 * 256 * 3 + 4.0 * T * 8);

      RopeArgs r{DType::BF16, x, y, 1, T, 8, 256, 0, 64, 1e7};
      report("rope.fwd_q_4096x8x256_rd64",
             timeMs([&] { KS(ropeForward(gCtx, r)); }), 0,
             2.0 * T * 8 * 256 * 2);
      RopeArgs ri{DType::BF16, x, x, 1, T, 8, 256, 0, 64, 1e7};
      report("rope.fwd_q_inplace", timeMs([&] { KS(ropeForward(gCtx, ri)); }),
             0, 2.0 * T * 8 * 64 * 2);
      for (void *p : {x, w, y, rs, dy, dx, dw})
        CK(cudaFree(p));
    }
    {
      // Big enough for [T, I] and for the gated q_proj view [T*8, 512].
      const int64_t bytes = std::max<int64_t>(T * I * 2, T * 8 * 512 * 2);
      auto *g = devAlloc(bytes), *u = devAlloc(bytes), *y = devAlloc(bytes),
           *dy = devAlloc(bytes), *dg = devAlloc(bytes), *du = devAlloc(bytes);
      SwiGluForwardArgs f{DType::BF16, g, u, y, T, I};
      report("swiglu.fwd_4096x3584",
             timeMs([&] { KS(swiGluForward(gCtx, f)); }), 0, 2.0 * T * I * 3);
      SwiGluBackwardArgs b{DType::BF16, g, u, dy, dg, du, T, I};
      report("swiglu.bwd_4096x3584",
             timeMs([&] { KS(swiGluBackward(gCtx, b)); }), 0, 2.0 * T * I * 5);
      SigmoidGateForwardArgs gf{DType::BF16, g, u, y, T * 8, 256, 0, 512, 0};
      report("gate.fwd_32768x256",
             timeMs([&] { KS(sigmoidGateForward(gCtx, gf)); }), 0,
             2.0 * T * 8 * 256 * 3);
      SigmoidGateBackwardArgs gb{DType::BF16, g, u,   dy, dg, du, T * 8,
                                 256,         0, 512, 0,  0,  512};
      report("gate.bwd_32768x256",
             timeMs([&] { KS(sigmoidGateBackward(gCtx, gb)); }), 0,
             2.0 * T * 8 * 256 * 5);
      ResidualAddArgs ra{DType::BF16, g, u, y, T * D};
      report("residual.fwd_4096x1024",
             timeMs([&] { KS(residualAddForward(gCtx, ra)); }), 0,
             2.0 * T * D * 3);
      for (void *p : {g, u, y, dy, dg, du})
        CK(cudaFree(p));
    }
  } // !ceOnly
  {
    auto *w = devAlloc(V * D * 2), *y = devAlloc(T * D * 2),
         *dy = devAlloc(T * D * 2), *dw = devAlloc(V * D * 4);
    std::vector<int32_t> ids(T);
    for (int64_t n = 0; n < T; ++n)
      ids[n] = int32_t((n * 2654435761ull) % V);
    int32_t *dIds;
    CK(cudaMalloc(&dIds, T * 4));
    CK(cudaMemcpy(dIds, ids.data(), T * 4, cudaMemcpyHostToDevice));
    if (!ceOnly) {
      EmbeddingForwardArgs f{DType::BF16, dIds, w, y, T, V, D};
      report("embedding.fwd_4096x1024",
             timeMs([&] { KS(embeddingForward(gCtx, f)); }), 0,
             2.0 * T * D * 2);
      EmbeddingBackwardArgs b{DType::BF16, dIds, dy, dw, T, V, D};
      report("embedding.bwd_4096x1024_V248320",
             timeMs([&] { KS(embeddingBackward(gCtx, b)); }), 0,
             2.0 * T * D + 8.0 * T * D);
    }

    // Chunked LM head + CE, forward+backward (the backward entry computes
    // the loss too): 3 GEMMs of 2*T*D*V each.
    auto *h = devAlloc(T * D * 2), *dh = devAlloc(T * D * 2);
    float *loss;
    int32_t *count;
    CK(cudaMalloc(&loss, 4));
    CK(cudaMalloc(&count, 4));
    for (int64_t chunk : {512, 1024, 2048}) {
      if (quick && chunk != 1024)
        continue;
      LmHeadCrossEntropyArgs a;
      a.dtype = DType::BF16;
      a.hidden = h;
      a.weight = w;
      a.labels = dIds;
      a.tokens = T;
      a.dim = D;
      a.vocab = V;
      a.chunkTokens = chunk;
      a.lossSum = loss;
      a.validCount = count;
      a.gradScale = 1.0 / T;
      a.dHidden = dh;
      a.dWeight = dw;
      size_t wsb = lmHeadCrossEntropyWorkspaceBytes(Backend::Cuda, a);
      double flops = 3 * 2.0 * T * D * V;
      double bytes = 2.0 * V * D * 3 + 8.0 * V * D + 12.0 * T * V;
      report("ce.fwd_bwd_chunk" + std::to_string(chunk),
             timeMs([&] { KS(lmHeadCrossEntropyBackward(gCtx, a)); }, 2, 7),
             flops, bytes, ",\"workspace_mib\":" + std::to_string(wsb >> 20));
      report("ce.fwd_chunk" + std::to_string(chunk),
             timeMs([&] { KS(lmHeadCrossEntropyForward(gCtx, a)); }, 2, 7),
             flops / 3, 2.0 * V * D + 4.0 * T * V,
             ",\"workspace_mib\":" + std::to_string(wsb >> 20));
    }
    {
      // The LM head's three GEMMs alone at chunk 1024, as lmHeadCe issues
      // them (bf16 logits, dh, dW += into the fp32 main grad): what the
      // cross-entropy passes add is the difference to ce.fwd_bwd_chunk1024.
      using namespace ap::kernels::cuda;
      const int64_t chunk = 1024;
      auto up = [](size_t b) { return (b + 255) / 256 * 256; };
      char *ws = static_cast<char *>(gCtx.workspace);
      // The logits' buffer holds the dlogits the two gradient GEMMs read.
      void *logits = ws, *dl = ws;
      void *gemmWs = ws + up(size_t(chunk) * V * 2);
      CK(cudaMemset(dl, 0, size_t(chunk) * V * 2));
      GemmShape lg;
      lg.transA = true;
      lg.m = V, lg.n = chunk, lg.k = D;
      lg.lda = D, lg.ldb = D, lg.ldd = V;
      GemmShape gh;
      gh.m = D, gh.n = chunk, gh.k = V;
      gh.lda = D, gh.ldb = V, gh.ldd = D;
      GemmShape gw;
      gw.transB = true;
      gw.m = D, gw.n = V, gw.k = chunk;
      gw.lda = D, gw.ldb = V, gw.ldd = D;
      gw.dType = GemmType::F32;
      gw.accumulate = true;
      auto *hb = static_cast<char *>(h), *dhb = static_cast<char *>(dh);
      report("ce.gemms_chunk1024",
             timeMs(
                 [&] {
                   for (int64_t n0 = 0; n0 < T; n0 += chunk) {
                     KS(gemm(gCtx, lg, w, hb + n0 * D * 2, logits, gemmWs));
                     KS(gemm(gCtx, gh, w, dl, dhb + n0 * D * 2, gemmWs));
                     KS(gemm(gCtx, gw, hb + n0 * D * 2, dl, dw, gemmWs));
                   }
                 },
                 2, 7),
             3 * 2.0 * T * D * V, 2.0 * V * D * 3 + 8.0 * V * D + 6.0 * T * V);
    }
    for (void *p : {(void *)w, y, dy, dw, h, dh, (void *)dIds, (void *)loss,
                    (void *)count})
      CK(cudaFree(p));
  }
  if (!ceOnly) {
    // Optimizer over 0.75B parameters (Qwen3.5-0.8B): one flat range, and
    // the step's list of its 320 parameters (18 GDN and 6 attention layers,
    // tied embedding) as views of the same buffers in the model's order.
    // Most of them are vectors of a few thousand elements, so with one
    // launch per tensor the launches, not the bytes, set the time.
    std::vector<int64_t> sizes = {int64_t(248320) * 1024};
    for (int l = 0; l < 24; ++l) {
      sizes.push_back(1024); // input_layernorm
      if (l % 4 == 3) {      // full attention: q (with gate), k, v, o, norms
        for (int64_t s :
             {int64_t(4096) * 1024, int64_t(512) * 1024, int64_t(512) * 1024,
              int64_t(1024) * 2048, int64_t(256), int64_t(256)})
          sizes.push_back(s);
      } else { // GDN: qkv, z, a, b, conv, A_log, dt_bias, norm, out
        for (int64_t s :
             {int64_t(6144) * 1024, int64_t(2048) * 1024, int64_t(16) * 1024,
              int64_t(16) * 1024, int64_t(6144) * 4, int64_t(16), int64_t(16),
              int64_t(128), int64_t(1024) * 2048})
          sizes.push_back(s);
      }
      sizes.push_back(1024); // post_attention_layernorm
      for (int k = 0; k < 3; ++k)
        sizes.push_back(int64_t(3584) * 1024); // gate, up, down
    }
    sizes.push_back(1024); // final norm
    int64_t listTotal = 0;
    for (int64_t s : sizes)
      listTotal += s;
    const int64_t n = 752'000'000, cap = std::max(n, listTotal);
    auto *p = static_cast<float *>(devAlloc(cap * 4)),
         *g = static_cast<float *>(devAlloc(cap * 4)),
         *m = static_cast<float *>(devAlloc(cap * 4)),
         *v = static_cast<float *>(devAlloc(cap * 4));
    auto *copy = static_cast<char *>(devAlloc(cap * 2));
    float *norm, *clip;
    CK(cudaMalloc(&norm, 4));
    CK(cudaMalloc(&clip, 4));
    GradTensor t{g, n};
    GradNormArgs gn{&t, 1, 1.0, norm, clip};
    size_t need = gradNormWorkspaceBytes(Backend::Cuda, gn);
    if (need > gCtx.workspaceBytes)
      return 1;
    report("gradnorm_752M", timeMs([&] { KS(gradNorm(gCtx, gn)); }, 2, 9), 0,
           4.0 * n);
    std::vector<GradTensor> list;
    std::vector<AdamWArgs> adamList;
    for (int64_t off = 0, i = 0; i < int64_t(sizes.size()); off += sizes[i++]) {
      list.push_back({g + off, sizes[i]});
      AdamWArgs a;
      a.master = p + off;
      a.expAvg = m + off;
      a.expAvgSq = v + off;
      a.grad = g + off;
      a.clipCoef = clip;
      a.computeCopy = copy + 2 * off;
      a.n = sizes[i];
      adamList.push_back(a);
    }
    GradNormArgs gl{list.data(), int64_t(list.size()), 1.0, norm, clip};
    if (gradNormWorkspaceBytes(Backend::Cuda, gl) > gCtx.workspaceBytes)
      return 1;
    report("gradnorm_qwen_320_tensors",
           timeMs([&] { KS(gradNorm(gCtx, gl)); }, 2, 9), 0, 4.0 * listTotal);
    AdamWArgs a = adamList[0];
    a.master = p;
    a.expAvg = m;
    a.expAvgSq = v;
    a.grad = g;
    a.computeCopy = copy;
    a.n = n;
    report("adamw_752M_bf16copy", timeMs([&] { KS(adamWStep(gCtx, a)); }, 2, 9),
           0, 30.0 * n);
    // The step's optimizer both ways, in one binary: one update and one
    // memset of its main grad per tensor (what the runtime did), and the
    // batched updates that zero the grads as they read them.
    report("adamw_qwen_320_one_by_one_memset",
           timeMs(
               [&] {
                 for (const AdamWArgs &x : adamList) {
                   KS(adamWStep(gCtx, x));
                   CK(cudaMemsetAsync(const_cast<void *>(x.grad), 0, x.n * 4,
                                      gStream));
                 }
               },
               2, 9),
           0, 34.0 * listTotal);
    AdamWBatchArgs batch{adamList.data(), int64_t(adamList.size()), true};
    report("adamw_qwen_320_batched_zeroing",
           timeMs([&] { KS(adamWSteps(gCtx, batch)); }, 2, 9), 0,
           34.0 * listTotal);
    for (void *q : {(void *)p, (void *)g, (void *)m, (void *)v, (void *)copy,
                    (void *)norm, (void *)clip})
      CK(cudaFree(q));
  }
  return 0;
}
