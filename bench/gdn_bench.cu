//===- gdn_bench.cu - chunked gated delta rule timing -----------*- C++ -*-===//
//
// Times gdnChunkForward and gdnChunkBackward at the Qwen3.5-0.8B GDN shape
// (T=4096, Hk=Hv=16, dk=dv=128; B=1, 2 and 4: the step's 4 x 1, 2 x 2 and
// 1 x 4) with CUDA events (median of 30 after 5 warm-ups) and prints the
// matmul FLOPs and the bytes-moved floor of each. "splits": then the same
// per work split of the sequential state passes (GdnChunkArgs::stateSplit x
// stateSlicesPerCta), each split's outputs compared bitwise with the shape's
// own choice. Build: see bench/gdn_bench.sh.
//
//===----------------------------------------------------------------------===//
#include "bench/bench_timing.h"
#include "bench/gdn_operands.h"
#include "kernels/kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

using namespace ap::kernels;

namespace {

void *devZeros(size_t n) {
  void *p;
  CK(cudaMalloc(&p, n));
  CK(cudaMemset(p, 0, n));
  return p;
}

/// Every output of one forward + backward, as bytes.
std::vector<std::vector<char>> outputs(const GdnChunkArgs &a, size_t rows,
                                       int dk, int dv) {
  std::vector<std::pair<const void *, size_t>> bufs = {
      {a.o, rows * dv * 2},  {a.dq, rows * dk * 2}, {a.dk, rows * dk * 2},
      {a.dv, rows * dv * 2}, {a.dg, rows * 4},      {a.dbeta, rows * 4}};
  std::vector<std::vector<char>> r;
  for (auto [p, n] : bufs) {
    r.emplace_back(n);
    CK(cudaMemcpy(r.back().data(), p, n, cudaMemcpyDeviceToHost));
  }
  return r;
}

template <typename F> double medianMs(F &&f, cudaStream_t s) {
  ap::bench::EventTimer timer(s);
  for (int i = 0; i < 5; ++i)
    f();
  std::vector<float> ms;
  for (int i = 0; i < 30; ++i)
    ms.push_back(timer.ms(f));
  return ap::bench::median(ms);
}

/// Medians of the forward, the backward (after one forward: it reads the
/// saved g cumsum and T) and the two back to back, in ms.
struct Times {
  double fwd, bwd, both;
};
template <typename F, typename B>
Times fwdBwdTimes(F &&fwd, B &&bwd, cudaStream_t s) {
  Times t;
  t.fwd = medianMs(fwd, s);
  fwd();
  t.bwd = medianMs(bwd, s);
  t.both = medianMs(
      [&] {
        fwd();
        bwd();
      },
      s);
  return t;
}

} // namespace

int main(int argc, char **argv) {
  // "once": one fwd + bwd per batch size, no timing (for a profiler).
  const bool once = argc > 1 && std::string(argv[1]) == "once";
  const bool splits = argc > 1 && std::string(argv[1]) == "splits";
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  std::printf("%-4s %-5s %9s %9s %9s %10s %10s %10s %10s\n", "B", "T", "fwd_ms",
              "bwd_ms", "total_ms", "fwd_GFLOP", "bwd_GFLOP", "fwd_MB",
              "bwd_MB");
  for (int B : {1, 2, 4}) {
    const int T = 4096, H = 16, dk = 128, dv = 128;
    const size_t N = size_t(B) * T;
    GdnChunkArgs a = ap::bench::gdnChunkOperands(
        B, T, H, dk, dv, unsigned(B),
        [](const void *h, size_t n) {
          void *p;
          CK(cudaMalloc(&p, n));
          CK(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice));
          return p;
        },
        devZeros);
    size_t wsb = std::max(gdnChunkForwardWorkspaceBytes(a),
                          gdnChunkBackwardWorkspaceBytes(a));
    KernelContext ctx;
    ctx.backend = Backend::Cuda;
    ctx.stream = s;
    ctx.workspace = devZeros(wsb);
    ctx.workspaceBytes = wsb;
    ctx.smCount = sms;
    auto fwd = [&] {
      if (gdnChunkForward(ctx, a) != Status::Ok)
        std::exit(2);
    };
    auto bwd = [&] {
      if (gdnChunkBackward(ctx, a) != Status::Ok)
        std::exit(3);
    };
    if (once) {
      fwd();
      bwd();
      CK(cudaStreamSynchronize(s));
      continue;
    }
    const Times t = fwdBwdTimes(fwd, bwd, s);
    const double tf = t.fwd, tb = t.bwd, both = t.both;
    // Matmul FLOPs per (chunk, head) as the kernels do them (2 per MAC).
    const double c = 64, K = dk, V = dv, cc = c * c;
    double fwdMac = cc * K /*KK^T*/ + cc * K + cc * V /*W, U*/ +
                    2 * c * K * V /*state*/ + cc * K + c * K * V +
                    cc * V /*out*/;
    double bwdMac = cc * K + cc * V /*W, U*/ + 2 * c * K * V /*state*/ +
                    cc * K + cc * V + 3 * c * K * V /*reverse state*/ +
                    3 * c * K * V + 3 * cc * V /*dQ,dK,dW,dS,dT,Y*/ +
                    2 * cc * K /*dS K, dS^T Q*/ + 2 * cc * K /*dT, X*/ +
                    2 * cc * c /*T^T dT T^T*/ + cc * K /*KK^T*/ + 2 * cc * K;
    double units = double(B) * H * (T / 64);
    double fwdG = 2 * fwdMac * units / 1e9, bwdG = 2 * bwdMac * units / 1e9;
    // Bytes floor: each input read once, each output written once.
    double tok = double(N) * H;
    double fwdMB =
        (tok * (dk * 2 * 2 + dv * 2 + 4 + 4) + tok * (dv * 2 + 4 + 64 * 2)) /
        1e6;
    double bwdMB = (tok * (dk * 2 * 2 + dv * 2 + 4 + 4 + 64 * 2 + dv * 2) +
                    tok * (dk * 2 * 2 + dv * 2 + 4 + 4)) /
                   1e6;
    std::printf("%-4d %-5d %9.3f %9.3f %9.3f %10.1f %10.1f %10.1f %10.1f\n", B,
                T, tf, tb, both, fwdG, bwdG, fwdMB, bwdMB);
    // 4.3 TB/s = 4300 MB/ms; 790 TFLOP/s = 790 GFLOP/ms (KINDS.md readings).
    std::printf("     floors at 4.3 TB/s: fwd %.3f ms, bwd %.3f ms; at 790 "
                "TFLOP/s: fwd %.3f "
                "ms, bwd %.3f ms\n",
                fwdMB / 4300, bwdMB / 4300, fwdG / 790, bwdG / 790);
    if (!splits)
      continue;
    // The shape's own choice, then every split: times and bits.
    const size_t rows = N * H;
    fwd();
    bwd();
    CK(cudaStreamSynchronize(s));
    const auto ref = outputs(a, rows, dk, dv);
    std::printf("     split slices/CTA   fwd_ms   bwd_ms total_ms  bits\n");
    const int combos[][2] = {{1, 1}, {1, 2}, {1, 4}, {1, 8}, {2, 1},
                             {2, 2}, {2, 4}, {4, 1}, {4, 2}};
    for (auto [ks, nw] : combos) {
      a.stateSplit = ks;
      a.stateSlicesPerCta = nw;
      for (void *p : {a.o, a.dq, a.dk, a.dv})
        CK(cudaMemset(p, 0xff, (p == a.o || p == a.dv ? dv : dk) * rows * 2));
      fwd();
      bwd();
      CK(cudaStreamSynchronize(s));
      const bool same = outputs(a, rows, dk, dv) == ref;
      const Times t = fwdBwdTimes(fwd, bwd, s);
      std::printf("     %5d %10d %8.3f %8.3f %8.3f  %s\n", ks, nw, t.fwd, t.bwd,
                  t.both, same ? "equal" : "DIFFER");
    }
    a.stateSplit = a.stateSlicesPerCta = 0;
  }
  return 0;
}
