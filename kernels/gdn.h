//===- gdn.h - Gated DeltaNet kernel ABI ------------------------*- C++ -*-===//
//
// Included from kernels/kernels.h; do not include directly.
//
// The GDN family (docs/model-math.md section 1): causal depthwise short
// conv + SiLU, the gates, the per-head L2 norm, the chunked gated delta rule
// (chunk 64) and the gated RMSNorm with a silu(z) gate. Every op has a forward
// and a backward entry dispatching on KernelContext::backend.
//
// Dtypes. `dtype` is the storage type of activations (BF16 on the training
// path, F32 for the host f32 model, F64 in tests). The "accumulation type" Acc
// is F64 when dtype is F64 and F32 otherwise; gates (g, beta), g cumsum,
// statistics (rstd), recurrent states, parameters of the gate (A_log,
// dt_bias) and all weight gradients are Acc. Layer weights (conv weight,
// norm weight) are in the storage type.
//
// Layout. Row-major [B, T, ...]; each batch row is its own sequence (conv
// state and recurrent state reset per row), or, with docStart, each document
// of a packed row (kernels/kernels.h, "Packed sequences"). Per-head tensors
// [B, T, H, d] may have a token stride (elements between consecutive tokens)
// larger than H*d, so that q, k, v can be read straight out of the conv
// output [B, T, conv_dim] without a copy; a stride of 0 means dense (H*d).
//
// Gradients: input gradients overwrite; weight gradients accumulate (+=) into
// Acc buffers. All reductions use a fixed order: two runs give identical bits.
//
// Backends: the host reference takes BF16, F32 and F64 storage and any head
// size; the cuda kernels take BF16 storage only (Unsupported otherwise).
// Workspace queries give the scratch the cuda kernels need (the reference
// needs none). The forms taking a Backend answer for that backend in any
// build (kernels/workspace.cpp, which the compiler links to plan for the
// cuda backend); the forms without one answer for the kernels this binary
// has: the cuda figure in a build with them, 0 in one without.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_GDN_H
#define ACTPLACE_KERNELS_GDN_H

namespace ap::kernels {

/// Chunk length of the chunked gated delta rule.
constexpr int kGdnChunk = 64;

//===----------------------------------------------------------------------===//
// Causal depthwise short conv + SiLU
//===----------------------------------------------------------------------===//

/// y[b,t,c] = silu(sum_j w[c,j] x[b, t-(kc-1)+j, c]), zeros before t = 0
/// (with docStart: before the first token of t's document).
/// Saved for backward: x and w (pre is recomputed).
///
/// Split output. With splits = S > 0 the output channels come in S
/// consecutive groups of splitChannels[s] (summing to C), group s in its
/// own dense [B, T, splitChannels[s]] buffer: ys[s] for y and dys[s] for dy
/// (y and dy unused). The GDN layer's q, k and v are such groups, so the
/// conv writes them where the recurrence reads them, with no slice copies,
/// and the backward reads their gradients with no concat. Same values as
/// the dense layout, bit for bit.
constexpr int kGdnConvMaxSplits = 4;
/// Which CUDA kernels the short conv runs. Fastest: the windowed kernels
/// (runs of tokens share their loads; bitwise equal to the per-element ones
/// and faster at the model shapes, bench/notes/training.md) where the grid
/// allows, else the per-element ones. PerElement: the per-element kernels
/// always, for tests and benchmarks that compare the two. Staged: x (and,
/// backward, dpre) staged in shared memory per run of 128 tokens and 64
/// channels, every global access 16 bytes, where the layout allows it (no
/// packed documents; channels, and every split group's width, multiples of
/// 64; 16-byte aligned x, y or dx, and groups), else as Fastest: the
/// windowed kernels' bits either way. The host backend has one
/// implementation and ignores it.
enum class GdnConvKernels : int32_t { Fastest = 0, PerElement = 1, Staged = 2 };

struct GdnConvArgs {
  DType dtype = DType::BF16;
  int64_t batch = 0, seqLen = 0, channels = 0;
  int32_t kernelSize = 4;  ///< 1..8
  const void *x = nullptr; ///< [B, T, C] storage
  const void *w = nullptr; ///< [C, kc] storage
  void *y = nullptr;       ///< [B, T, C] storage (forward output)
  // Backward only:
  const void *dy = nullptr; ///< [B, T, C] storage
  void *dx = nullptr;       ///< [B, T, C] storage, overwritten
  void *dw = nullptr;       ///< [C, kc] Acc, accumulated (+=)
  // Split output (see above); 0 = the dense y / dy.
  int32_t splits = 0;
  int64_t splitChannels[kGdnConvMaxSplits] = {};
  void *ys[kGdnConvMaxSplits] = {};
  const void *dys[kGdnConvMaxSplits] = {};
  GdnConvKernels kernels = GdnConvKernels::Fastest;
  /// [B, T] packed documents (kernels/kernels.h); null: one per row.
  const int32_t *docStart = nullptr;
};
/// Whether `a`'s split layout is usable: 0 <= splits <= kGdnConvMaxSplits,
/// positive groups that sum to the channels.
inline bool gdnConvSplitsValid(const GdnConvArgs &a) {
  if (a.splits < 0 || a.splits > kGdnConvMaxSplits)
    return false;
  if (a.splits == 0)
    return true;
  int64_t sum = 0;
  for (int s = 0; s < a.splits; ++s) {
    if (a.splitChannels[s] <= 0)
      return false;
    sum += a.splitChannels[s];
  }
  return sum == a.channels;
}
Status gdnConvForward(const KernelContext &ctx, const GdnConvArgs &args);
Status gdnConvBackward(const KernelContext &ctx, const GdnConvArgs &args);
size_t gdnConvBackwardWorkspaceBytes(const GdnConvArgs &args);
size_t gdnConvBackwardWorkspaceBytes(Backend backend, const GdnConvArgs &args);

//===----------------------------------------------------------------------===//
// Gates
//===----------------------------------------------------------------------===//

/// beta = sigmoid(b); g = -exp(A_log[h]) * softplus(a + dt_bias[h]) (softplus
/// threshold 20). beta is a storage-dtype tensor, as in the train dialect
/// (train.gdn_gates); the backward reads it, not b: sigmoid'(b) is
/// beta (1 - beta), the derivative autograd takes from a sigmoid's output.
/// Saved for backward: a, beta (and the parameters).
struct GdnGatesArgs {
  DType dtype = DType::BF16;
  int64_t tokens = 0;           ///< N = B*T
  int32_t heads = 0;            ///< Hv
  const void *a = nullptr;      ///< [N, Hv] storage
  const void *b = nullptr;      ///< [N, Hv] storage (forward input)
  const void *aLog = nullptr;   ///< [Hv] Acc
  const void *dtBias = nullptr; ///< [Hv] Acc
  void *g = nullptr;            ///< [N, Hv] Acc (forward output)
  void *beta = nullptr;         ///< [N, Hv] storage (forward output,
                                ///< backward input)
  // Backward only:
  const void *dg = nullptr;    ///< [N, Hv] Acc
  const void *dbeta = nullptr; ///< [N, Hv] storage
  void *da = nullptr;          ///< [N, Hv] storage, overwritten
  void *db = nullptr;          ///< [N, Hv] storage, overwritten
  void *dALog = nullptr;       ///< [Hv] Acc, accumulated
  void *dDtBias = nullptr;     ///< [Hv] Acc, accumulated
};
Status gdnGatesForward(const KernelContext &ctx, const GdnGatesArgs &args);
Status gdnGatesBackward(const KernelContext &ctx, const GdnGatesArgs &args);
size_t gdnGatesBackwardWorkspaceBytes(const GdnGatesArgs &args);
size_t gdnGatesBackwardWorkspaceBytes(Backend backend,
                                      const GdnGatesArgs &args);

//===----------------------------------------------------------------------===//
// Per-head L2 norm
//===----------------------------------------------------------------------===//

/// y = x * rstd, rstd = 1/sqrt(sum x^2 + eps) per (token, head).
/// Saved for backward: y and rstd.
struct GdnL2NormArgs {
  DType dtype = DType::BF16;
  int64_t tokens = 0;
  int32_t heads = 0, dim = 0;
  int64_t xStride = 0, yStride = 0; ///< token strides (0: heads*dim)
  float eps = 1e-6f;
  const void *x = nullptr; ///< [N, H, d] storage (token stride xStride)
  void *y = nullptr;       ///< [N, H, d] storage (token stride yStride)
  void *rstd = nullptr;    ///< [N, H] Acc (forward output)
  // Backward (reads y, rstd): dx = rstd (dy - (dy . y) y).
  const void *dy = nullptr; ///< [N, H, d] storage (token stride yStride)
  void *dx = nullptr;       ///< [N, H, d] storage (token stride xStride)
};
Status gdnL2NormForward(const KernelContext &ctx, const GdnL2NormArgs &args);
Status gdnL2NormBackward(const KernelContext &ctx, const GdnL2NormArgs &args);

//===----------------------------------------------------------------------===//
// Chunked gated delta rule
//===----------------------------------------------------------------------===//

/// Recurrence of docs/model-math.md 1.3 over value heads h = 0..Hv-1, which
/// read q/k head h / (Hv/Hk). q and k are the L2-normalised q^, k^. The forward
/// saves gCum (chunk-local inclusive cumsum of g) and tMat (T = (I+A)^-1 per
/// chunk, row r of chunk n stored at token n*64+r); backward reads q, k, v,
/// gCum, beta, tMat, initialState and recomputes W, U, the chunk states and
/// Vnew. Both cuda entries need dk, dv multiples of 16 and <= 256 (Unsupported
/// otherwise); the host reference takes any size.
///
/// Packed documents (docStart): the state resets at each document start and
/// every document is computed as its own row: its chunk n covers its tokens
/// n*64 .. n*64+63, gCum is local to those chunks and row r of its chunk n is
/// stored at token docStart + n*64 + r. initialState is the state before a
/// row's first document, finalState the one after its last (and so for
/// dInitialState, dFinalState).
struct GdnChunkArgs {
  DType dtype = DType::BF16;
  int64_t batch = 0, seqLen = 0;
  int32_t keyHeads = 0, valueHeads = 0, keyDim = 0, valueDim = 0;
  float scale = 0.f;                             ///< usually keyDim^-0.5
  int64_t qStride = 0, kStride = 0, vStride = 0; ///< token strides (0: dense)
  const void *q = nullptr;                       ///< [B, T, Hk, dk] storage
  const void *k = nullptr;                       ///< [B, T, Hk, dk] storage
  const void *v = nullptr;                       ///< [B, T, Hv, dv] storage
  const void *g = nullptr;    ///< [B, T, Hv] Acc, log decay (forward input)
  const void *beta = nullptr; ///< [B, T, Hv] Acc
  /// [B, Hv, dk, dv] Acc; null means zeros.
  const void *initialState = nullptr;
  // Forward outputs:
  void *o = nullptr;          ///< [B, T, Hv, dv] storage, dense
  void *finalState = nullptr; ///< [B, Hv, dk, dv] Acc; optional (null)
  void *gCum = nullptr;       ///< [B, T, Hv] Acc, saved
  void *tMat = nullptr;       ///< [B, T, Hv, 64] storage, saved
  // Backward inputs (plus q, k, v, beta, initialState, gCum, tMat above):
  const void *dO = nullptr;          ///< [B, T, Hv, dv] storage, dense
  const void *dFinalState = nullptr; ///< [B, Hv, dk, dv] Acc; optional
  // Backward outputs (overwritten):
  void *dq = nullptr;    ///< [B, T, Hk, dk] storage (token stride qStride)
  void *dk = nullptr;    ///< [B, T, Hk, dk] storage (token stride kStride)
  void *dv = nullptr;    ///< [B, T, Hv, dv] storage (token stride vStride)
  void *dg = nullptr;    ///< [B, T, Hv] Acc: gradient of the raw g
  void *dbeta = nullptr; ///< [B, T, Hv] Acc
  void *dInitialState = nullptr; ///< [B, Hv, dk, dv] Acc; optional
  /// [B, T] packed documents (kernels/kernels.h); null: one per row.
  const int32_t *docStart = nullptr;
  /// Work split of the cuda sequential state passes (dk 64 or 128): warps
  /// sharing one 16-column state slice (1, 2 or 4; each owns a quarter or a
  /// half of the chunk's positions and of the key columns) and slices per
  /// CTA. 0: chosen by shape. Every split gives the same bits (each product
  /// tile keeps its own accumulation order), so these are for tests and
  /// benchmarks; code generation leaves them 0. Other values: InvalidArgument.
  int32_t stateSplit = 0, stateSlicesPerCta = 0;
};
Status gdnChunkForward(const KernelContext &ctx, const GdnChunkArgs &args);
Status gdnChunkBackward(const KernelContext &ctx, const GdnChunkArgs &args);
size_t gdnChunkForwardWorkspaceBytes(const GdnChunkArgs &args);
size_t gdnChunkBackwardWorkspaceBytes(const GdnChunkArgs &args);
size_t gdnChunkForwardWorkspaceBytes(Backend backend, const GdnChunkArgs &args);
size_t gdnChunkBackwardWorkspaceBytes(Backend backend,
                                      const GdnChunkArgs &args);

/// The naive per-token recurrence (the oracle; host only, any dtype): writes
/// o and, when non-null, finalState. Ignores gCum/tMat.
Status gdnRecurrentForwardReference(const GdnChunkArgs &args);

//===----------------------------------------------------------------------===//
// Gated RMSNorm
//===----------------------------------------------------------------------===//

/// y = w * (x * rstd) * silu(z), rstd = 1/sqrt(mean x^2 + eps) per (token,
/// head) over d. Saved for backward: x, z, w, rstd.
struct GdnGatedNormArgs {
  DType dtype = DType::BF16;
  int64_t tokens = 0;
  int32_t heads = 0, dim = 0;
  float eps = 1e-6f;
  const void *x = nullptr; ///< [N, H, d] storage
  const void *z = nullptr; ///< [N, H, d] storage
  const void *w = nullptr; ///< [d] storage
  /// [N, H, d] storage: the forward's output; set in a backward call, the
  /// backward writes it too, bit-identical to the forward's, from the saved
  /// rstd (train-fuse-recompute).
  void *y = nullptr;
  void *rstd = nullptr; ///< [N, H] Acc (forward output, saved)
  // Backward:
  const void *dy = nullptr; ///< [N, H, d] storage
  void *dx = nullptr;       ///< [N, H, d] storage, overwritten
  void *dz = nullptr;       ///< [N, H, d] storage, overwritten
  void *dw = nullptr;       ///< [d] Acc, accumulated
};
Status gdnGatedNormForward(const KernelContext &ctx,
                           const GdnGatedNormArgs &args);
Status gdnGatedNormBackward(const KernelContext &ctx,
                            const GdnGatedNormArgs &args);
size_t gdnGatedNormBackwardWorkspaceBytes(const GdnGatedNormArgs &args);
size_t gdnGatedNormBackwardWorkspaceBytes(Backend backend,
                                          const GdnGatedNormArgs &args);

//===----------------------------------------------------------------------===//
// Linking the cuda implementation
//===----------------------------------------------------------------------===//
// The entries above live in actplace_kernels_reference and reach the cuda
// kernels through weak references (a CPU-only build links and answers
// Unsupported). Weak references do not pull archive members, so every
// translation unit built with ACTPLACE_HAVE_CUDA references this anchor,
// defined next to the cuda entries.
namespace detail {
extern "C" int actplaceGdnCudaAnchor;
} // namespace detail
#if defined(ACTPLACE_HAVE_CUDA)
[[maybe_unused, gnu::used]] static const int *const actplaceGdnCudaAnchorRef =
    &detail::actplaceGdnCudaAnchor;
#endif

} // namespace ap::kernels

#endif // ACTPLACE_KERNELS_GDN_H
