//===- attention_bench_capi.cpp - C entry points for the Python bench ----===//
//
// A flat C surface over the attention ABI so that bench/attention_bench.py
// can call the CUDA kernels through ctypes on PyTorch's current stream, and
// time them in the same process as torch's SDPA backends.
//
//===----------------------------------------------------------------------===//
#include "kernels/kernels.h"

using namespace ap::kernels;

// This library links only the attention kernels (kernels/cuda/attention and
// kernels/reference/attention); kernels/dense.h and kernels/gdn.h make every
// CUDA translation unit reference their archives' link anchors, satisfied
// here by weak definitions (the real ones win where those archives link).
extern "C" {
__attribute__((weak)) int actplaceDenseCudaAnchor = 0;
__attribute__((weak)) int actplaceGdnCudaAnchor = 0;
__attribute__((weak)) int actplaceMovementCudaAnchor = 0;
}

namespace {
AttentionShape shapeOf(int B, int T, int Hq, int Hkv, int Dqk, int Dv,
                       double scale) {
  AttentionShape s;
  s.batch = B;
  s.seqLen = T;
  s.numQHeads = Hq;
  s.numKvHeads = Hkv;
  s.headDimQk = Dqk;
  s.headDimV = Dv;
  s.softmaxScale = scale;
  return s;
}

/// The kernels every call below asks for (apAttentionUsePortable).
AttentionKernels gKernels = AttentionKernels::Fastest;
} // namespace

extern "C" {

/// Nonzero: later calls run the portable mma.sync kernels
/// (AttentionKernels::Portable); 0: the fastest available.
void apAttentionUsePortable(int portable) {
  gKernels = portable ? AttentionKernels::Portable : AttentionKernels::Fastest;
}

/// Returns the Status value of the forward (0 = Ok).
int apAttentionForward(void *stream, const void *q, const void *k,
                       const void *v, void *o, void *lse, int B, int T, int Hq,
                       int Hkv, int Dqk, int Dv, double scale) {
  KernelContext ctx;
  ctx.backend = Backend::Cuda;
  ctx.stream = stream;
  AttentionForwardArgs a;
  a.shape = shapeOf(B, T, Hq, Hkv, Dqk, Dv, scale);
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.lse = lse;
  a.kernels = gKernels;
  return static_cast<int>(attentionForward(ctx, a));
}

/// algo < 0: the shape's default (what attentionBackward runs); else an
/// AttentionBackwardAlgo value.
size_t apAttentionBackwardWorkspaceBytes(int B, int T, int Hq, int Hkv, int Dqk,
                                         int Dv, int algo) {
  AttentionBackwardArgs a;
  a.shape = shapeOf(B, T, Hq, Hkv, Dqk, Dv, 1.0);
  if (algo < 0)
    return attentionBackwardWorkspaceBytes(a);
  return detail::attentionBackwardWorkspaceBytesFor(
      a.shape, static_cast<AttentionBackwardAlgo>(algo));
}

int apAttentionBackwardDefaultAlgo(int B, int T, int Hq, int Hkv, int Dqk,
                                   int Dv) {
  return static_cast<int>(detail::attentionBackwardDefaultAlgo(
      shapeOf(B, T, Hq, Hkv, Dqk, Dv, 1.0)));
}

int apAttentionBackward(void *stream, void *workspace, size_t workspaceBytes,
                        const void *q, const void *k, const void *v,
                        const void *o, const void *lse, const void *dO,
                        void *dq, void *dk, void *dv, int B, int T, int Hq,
                        int Hkv, int Dqk, int Dv, double scale, int algo) {
  KernelContext ctx;
  ctx.backend = Backend::Cuda;
  ctx.stream = stream;
  ctx.workspace = workspace;
  ctx.workspaceBytes = workspaceBytes;
  AttentionBackwardArgs a;
  a.shape = shapeOf(B, T, Hq, Hkv, Dqk, Dv, scale);
  a.q = q;
  a.k = k;
  a.v = v;
  a.o = o;
  a.lse = lse;
  a.dO = dO;
  a.dq = dq;
  a.dk = dk;
  a.dv = dv;
  a.kernels = gKernels;
  if (algo < 0)
    return static_cast<int>(attentionBackward(ctx, a));
  return static_cast<int>(cuda::attentionBackwardWithAlgo(
      ctx, a, static_cast<AttentionBackwardAlgo>(algo)));
}

} // extern "C"
