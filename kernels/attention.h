//===- attention.h - actplace attention kernels ABI -------------*- C++ -*-===//
//
// Included from kernels/kernels.h; do not include directly.
//
// Causal softmax attention, flash style, for the two attention flavours of the
// models (docs/model-math.md sections 2 and 3):
//   - Qwen3.5 full attention: GQA, 8 q heads / 2 kv heads, head dim 256,
//     scale 1/16. The sigmoid output gate is a separate op (dense kernels).
//   - MLA: q/k head dim 192 (128 nope + 64 rope), v head dim 128, Hq == Hkv.
//
// Layouts (row-major, each batch row its own sequence, positions 0..T-1, or
// with docStart each document of a packed row, kernels/kernels.h):
//   q  [B, T, Hq,  Dqk]    k  [B, T, Hkv, Dqk]    v [B, T, Hkv, Dv]
//   o  [B, T, Hq,  Dv ]    lse [B, Hq, T]  (natural log of the softmax
//                                           denominator of the scaled scores)
// Query head h reads kv head h / (Hq / Hkv) (consecutive q heads share a kv
// head, as in HF repeat_kv).
//
// Math: S = scale Q K^T with the causal mask (key j visible to query i iff
// docStart(i) <= j <= i, docStart(i) = 0 without packed documents),
// P = softmax_row(S) in fp32, O = P V, lse_i = log sum_j exp(S_ij).
// Backward (FlashAttention-2): P is recomputed from lse; D_i = dO_i . O_i;
// dP = dO V^T; dS = P * (dP - D); dQ = scale dS K; dK = scale dS^T Q;
// dV = P^T dO. dK and dV of a kv head sum over the q heads of its group, in
// increasing q-head order.
//
// Storage dtypes: BF16 (training path, host and CUDA), F32 and F64 (host
// reference only). lse is F32 for BF16/F32 storage and F64 for F64 storage.
// Accumulation is fp32 (f64 for F64).
//
// Gradients of q, k, v OVERWRITE dq, dk, dv (they are input gradients).
// Every entry is deterministic: fixed reduction orders, no atomics, and the
// algorithm depends on shapes only.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_ATTENTION_H
#define ACTPLACE_KERNELS_ATTENTION_H

namespace ap::kernels {

/// Shapes shared by forward and backward.
struct AttentionShape {
  int32_t batch = 0;
  int32_t seqLen = 0;
  int32_t numQHeads = 0;
  int32_t numKvHeads = 0;
  int32_t headDimQk = 0;
  int32_t headDimV = 0;
  /// Multiplies Q K^T before the softmax (1/16 for Qwen3.5, 192^-0.5 for MLA).
  double softmaxScale = 0.0;
};

/// Forward: o and lse are written.
/// Which CUDA kernels attention runs. Fastest: the sm_90a wgmma kernels
/// where the loaded binary has them and the device is compute capability 9
/// (measured faster at every shape they cover, bench/notes/attention.md),
/// else the portable mma.sync ones. Portable: the mma.sync kernels always,
/// so that tests and benchmarks on an H100/H200 reach them. The host
/// backend has one implementation and ignores it.
enum class AttentionKernels : int32_t { Fastest = 0, Portable = 1 };

struct AttentionForwardArgs {
  DType dtype = DType::BF16; ///< storage of q, k, v, o
  AttentionShape shape;
  const void *q = nullptr;
  const void *k = nullptr;
  const void *v = nullptr;
  void *o = nullptr;
  void *lse = nullptr;
  AttentionKernels kernels = AttentionKernels::Fastest;
  /// [B, T] packed documents (kernels/kernels.h); null: one per row.
  const int32_t *docStart = nullptr;
};

/// Backward: dq, dk, dv are overwritten. o and lse are the forward's outputs.
struct AttentionBackwardArgs {
  DType dtype = DType::BF16; ///< storage of q, k, v, o, dO, dq, dk, dv
  AttentionShape shape;
  const void *q = nullptr;
  const void *k = nullptr;
  const void *v = nullptr;
  const void *o = nullptr;
  const void *lse = nullptr;
  const void *dO = nullptr;
  void *dq = nullptr;
  void *dk = nullptr;
  void *dv = nullptr;
  AttentionKernels kernels = AttentionKernels::Fastest;
  /// [B, T] packed documents (kernels/kernels.h); null: one per row.
  const int32_t *docStart = nullptr;
};

/// How the CUDA backward gets dQ without float atomics (both deterministic):
///  - RecomputeDq: a dQ pass recomputes S and dP per (q tile, kv tile); the
///    workspace stays O(B T Hq) but the backward does 7 GEMM-sized products
///    instead of 5.
///  - StoredDs: the dK/dV pass also stores the bf16 dS tiles and the dQ pass
///    is one product per tile pair; needs T^2/2 bf16 per (batch, head),
///    processed in chunks of (batch, head) pairs of at most 256 MiB.
/// The algorithm is a function of the shape only (detail::
/// attentionBackwardDefaultAlgo); both give bit-identical dK and dV and the
/// same dQ up to fp32 summation order.
enum class AttentionBackwardAlgo : int32_t { RecomputeDq = 0, StoredDs = 1 };

namespace detail {
AttentionBackwardAlgo attentionBackwardDefaultAlgo(const AttentionShape &s);
size_t attentionBackwardWorkspaceBytesFor(const AttentionShape &s,
                                          AttentionBackwardAlgo algo);
/// (batch, head) pairs per StoredDs launch.
int64_t attentionStoredDsChunk(const AttentionShape &s);
} // namespace detail

/// Scratch needed by attentionForward (none).
size_t attentionForwardWorkspaceBytes(const AttentionForwardArgs &args);
/// Scratch needed by attentionBackward on the CUDA backend: D = rowsum(dO*O)
/// in fp32, plus fp32 per-q-head dK/dV partials when Hq > Hkv (summed over the
/// group in fixed order by a second pass), plus the dS tiles when the shape's
/// algorithm is StoredDs. The host backend needs none, but the query does not
/// depend on the backend so plans are backend-agnostic.
size_t attentionBackwardWorkspaceBytes(const AttentionBackwardArgs &args);

/// Validates shapes and dtype (positive sizes, Hq a multiple of Hkv, finite
/// positive scale, BF16/F32/F64). Shared by both backends; the entries also
/// reject null pointers.
Status attentionValidate(const AttentionShape &shape, DType dtype);

namespace reference {
/// CPU reference, any of BF16/F32/F64 storage. Parallel over row chunks with
/// std::thread; each output element is computed by one thread in a fixed
/// order, so results are independent of the thread count.
Status attentionForward(const AttentionForwardArgs &args);
Status attentionBackward(const AttentionBackwardArgs &args);
} // namespace reference

#ifdef ACTPLACE_HAVE_CUDA
namespace cuda {
/// CUDA kernels (BF16 storage only; Unsupported for head dims other than
/// (Dqk, Dv) in {(256,256), (192,128), (128,128), (64,64)}). Launched on
/// ctx.stream; backward needs ctx.workspace of attentionBackwardWorkspaceBytes.
Status attentionForward(const KernelContext &ctx,
                        const AttentionForwardArgs &args);
Status attentionBackward(const KernelContext &ctx,
                         const AttentionBackwardArgs &args);
/// The backward with an explicit algorithm, for tests and benchmarks; needs
/// detail::attentionBackwardWorkspaceBytesFor(shape, algo) of workspace.
Status attentionBackwardWithAlgo(const KernelContext &ctx,
                                 const AttentionBackwardArgs &args,
                                 AttentionBackwardAlgo algo);
} // namespace cuda
#endif

// The entries are header-inline so that the CUDA path is linked exactly where
// the including target was built with ACTPLACE_HAVE_CUDA (and so links
// actplace_kernels_cuda): a weak or registered hook would silently drop the
// CUDA object out of static-library links. `static` keeps each translation
// unit's copy separate, so units built with and without CUDA do not violate
// the one-definition rule.

/// Forward entry: dispatches on ctx.backend.
static inline Status attentionForward(const KernelContext &ctx,
                                      const AttentionForwardArgs &args) {
  if (ctx.backend == Backend::Host)
    return reference::attentionForward(args);
#ifdef ACTPLACE_HAVE_CUDA
  return cuda::attentionForward(ctx, args);
#else
  return Status::Unsupported;
#endif
}

/// Backward entry: dispatches on ctx.backend.
static inline Status attentionBackward(const KernelContext &ctx,
                                       const AttentionBackwardArgs &args) {
  if (ctx.backend == Backend::Host)
    return reference::attentionBackward(args);
#ifdef ACTPLACE_HAVE_CUDA
  return cuda::attentionBackward(ctx, args);
#else
  return Status::Unsupported;
#endif
}

} // namespace ap::kernels

#endif // ACTPLACE_KERNELS_ATTENTION_H
