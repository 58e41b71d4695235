//===- dense.h - actplace dense kernels ABI ----------------------*- C++
//-*-===//
//
// Included from kernels/kernels.h; do not include directly.
//
// Dense op family (issue 6): GEMM for every linear, RMSNorm (zero-centred and
// plain), partial rotary embedding, SwiGLU, sigmoid output gate, residual
// add, token embedding, tied LM head + chunked cross-entropy, AdamW and the
// global gradient norm. Formulas: docs/model-math.md sections 2 and 3.
//
// Conventions shared by every entry below:
//  - `dtype` is the storage type of activations and compute weights: BF16 on
//    the training path, F32 for the tiny f32 host model, F64 in tests. The
//    CUDA backend supports BF16 only and answers Unsupported otherwise.
//  - The accumulation type ("acc") is F32 for BF16/F32 storage and F64 for
//    F64 storage. Statistics (rstd, LSE), losses and main-grad buffers use
//    it. Weight gradients ACCUMULATE (+=) into acc main-grad buffers; input
//    gradients OVERWRITE their outputs, unless an entry says otherwise.
//  - Pointers live in the memory of ctx.backend. Row strides are in elements;
//    a stride of 0 means "contiguous" (the row length).
//  - Every kernel is deterministic: fixed reduction orders, no float atomics,
//    no choice made from pointer values; the same inputs give the same bits.
//  - Entries dispatch on ctx.backend; with backend Cuda in a build without
//    the CUDA kernels they return Unsupported.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_DENSE_H
#define ACTPLACE_KERNELS_DENSE_H

namespace ap::kernels {

//===----------------------------------------------------------------------===//
// GEMM (every linear layer). Weights as in HF: W is [out, in], y = x W^T.
// CUDA: cuBLASLt, BF16 inputs, FP32 accumulation and scale, BF16 output
// (FP32 for the weight gradient); the algorithm and workspace are chosen once
// per (op, m, n, k) with 256-byte alignment assumed for every operand and then
// cached, so where buffers live never changes which algorithm runs.
//===----------------------------------------------------------------------===//

struct LinearForwardArgs {
  DType dtype = DType::BF16;
  const void *x = nullptr; ///< [rows, in]
  const void *w = nullptr; ///< [out, in]
  void *y = nullptr;       ///< [rows, out], overwritten
  int64_t rows = 0, in = 0, out = 0;
};

struct LinearBackwardArgs {
  DType dtype = DType::BF16;
  const void *x = nullptr;  ///< [rows, in] forward input (needed for dw)
  const void *w = nullptr;  ///< [out, in] (needed for dx)
  const void *dy = nullptr; ///< [rows, out]
  void *dx = nullptr;       ///< [rows, in], overwritten; null: skip
  void *dw = nullptr; ///< [out, in] acc main grad, dw += dy^T x; null: skip
  int64_t rows = 0, in = 0, out = 0;
};

/// Scratch the cuBLASLt algorithms may use; a fixed constant (32 MiB on the
/// CUDA backend, 0 on host) so that the algorithm never depends on the
/// workspace handed in. Calls with a smaller ctx.workspaceBytes fail.
size_t linearWorkspaceBytes(Backend backend);
Status linearForward(const KernelContext &ctx, const LinearForwardArgs &args);
Status linearBackward(const KernelContext &ctx, const LinearBackwardArgs &args);

//===----------------------------------------------------------------------===//
// RMSNorm over the last dim: y = x * rstd * (1 + w) (zeroCentered, Qwen3.5
// model norms and q_norm/k_norm) or y = x * rstd * w (plain, MLA / GDN),
// rstd = 1 / sqrt(mean(x^2) + eps), computed in acc. q_norm/k_norm use
// rows = tokens * heads, dim = head_dim, and strides to read the q half of
// the gated q_proj output in place.
//===----------------------------------------------------------------------===//

struct RmsNormForwardArgs {
  DType dtype = DType::BF16;
  const void *x = nullptr; ///< [rows, dim] with row stride xStride
  const void *w = nullptr; ///< [dim], storage dtype
  void *y = nullptr;       ///< [rows, dim] with row stride yStride
  void *rstd = nullptr;    ///< [rows] acc, saved for backward (may be null)
  int64_t rows = 0, dim = 0;
  int64_t xStride = 0, yStride = 0;
  double eps = 1e-6;
  bool zeroCentered = true;
};

struct RmsNormBackwardArgs {
  DType dtype = DType::BF16;
  const void *x = nullptr;    ///< [rows, dim], row stride xStride
  const void *w = nullptr;    ///< [dim]
  const void *rstd = nullptr; ///< [rows] acc from the forward
  const void *dy = nullptr;   ///< [rows, dim], row stride dyStride
  void *dx = nullptr;         ///< [rows, dim], row stride dxStride, overwritten
  void *dw =
      nullptr; ///< [dim] acc main grad, += sum_rows dy*x*rstd; null: skip
  int64_t rows = 0, dim = 0;
  int64_t xStride = 0, dyStride = 0, dxStride = 0;
  bool zeroCentered = true;
  /// With y, also the forward's output from x and the saved rstd,
  /// bit-identical to rmsNormForward's (train-fuse-recompute); null: skip.
  void *y = nullptr;
  int64_t yStride = 0;
};

/// Scratch for the fixed-order dw reduction (per-block partial sums).
size_t rmsNormBackwardWorkspaceBytes(Backend backend,
                                     const RmsNormBackwardArgs &args);
Status rmsNormForward(const KernelContext &ctx, const RmsNormForwardArgs &args);
Status rmsNormBackward(const KernelContext &ctx,
                       const RmsNormBackwardArgs &args);

//===----------------------------------------------------------------------===//
// Partial rotary embedding, rotate-half, positions 0..seq-1 in every batch
// row. Within each head of headDim elements, dims [offset, offset+rotaryDim)
// are rotated; with h = rotaryDim/2, i < h, inv_freq_i = theta^(-2i/rotaryDim),
// a = pos * inv_freq_i (angle in double, cos/sin rounded to acc):
//   y[i]   = x[i] cos a - x[i+h] sin a,   y[i+h] = x[i+h] cos a + x[i] sin a.
// The other dims of the head are copied. y may equal x (in place).
// Qwen3.5: headDim 256, offset 0, rotaryDim 64, theta 1e7. MLA: q heads of
// 192 with offset 128, rotaryDim 64; k_pe as heads = 1, headDim 64.
// Backward: the same map with -a (the transpose of a rotation).
// With docStart (packed documents) the position of token t is
// t - docStart[b*seq + t]: positions restart at every document.
//===----------------------------------------------------------------------===//

struct RopeArgs {
  DType dtype = DType::BF16;
  const void *x =
      nullptr;       ///< forward: x; backward: dy. [batch, seq, heads, headDim]
  void *y = nullptr; ///< forward: y; backward: dx. Same layout.
  int64_t batch = 0, seq = 0, heads = 0, headDim = 0;
  int64_t offset = 0, rotaryDim = 0;
  double theta = 1e7;
  /// [batch, seq] packed documents (kernels/kernels.h); null: one per row.
  const int32_t *docStart = nullptr;
};

Status ropeForward(const KernelContext &ctx, const RopeArgs &args);
Status ropeBackward(const KernelContext &ctx, const RopeArgs &args);

//===----------------------------------------------------------------------===//
// Document starts of packed sequences (kernels/kernels.h). Both backends.
//===----------------------------------------------------------------------===//

/// Packed sequences: each token's document start from the token ids. A
/// document begins at t = 0 and right after every `separator` token (the
/// separator ends its document).
struct DocumentStartsArgs {
  const int32_t *tokens = nullptr; ///< [B, T]
  int32_t *docStart = nullptr;     ///< [B, T], written
  int64_t batch = 0, seq = 0;
  int32_t separator = 0;
};
Status documentStarts(const KernelContext &ctx, const DocumentStartsArgs &args);

//===----------------------------------------------------------------------===//
// Elementwise ops over [rows, cols] views with row strides (0 = cols), so that
// halves of fused projections can be read and written in place.
//===----------------------------------------------------------------------===//

/// SwiGLU: y = silu(gate) * up, silu(g) = g * sigmoid(g).
struct SwiGluForwardArgs {
  DType dtype = DType::BF16;
  const void *gate = nullptr, *up = nullptr;
  void *y = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t gateStride = 0, upStride = 0, yStride = 0;
};
/// dgate = dy * up * s * (1 + g (1 - s)), dup = dy * silu(g), s = sigmoid(g).
/// With `y`, also the forward's output, bit-identical to swiGluForward's: a
/// recomputed activation written by the backward that reads gate and up
/// anyway (train-fuse-recompute).
struct SwiGluBackwardArgs {
  DType dtype = DType::BF16;
  const void *gate = nullptr, *up = nullptr, *dy = nullptr;
  void *dgate = nullptr, *dup = nullptr; ///< overwritten
  int64_t rows = 0, cols = 0;
  int64_t gateStride = 0, upStride = 0, dyStride = 0, dgateStride = 0,
          dupStride = 0;
  void *y = nullptr; ///< overwritten when set; null: skip
  int64_t yStride = 0;
};
Status swiGluForward(const KernelContext &ctx, const SwiGluForwardArgs &args);
Status swiGluBackward(const KernelContext &ctx, const SwiGluBackwardArgs &args);

/// Sigmoid output gate (Qwen3.5 attention): y = o * sigmoid(gate). For the
/// gated q_proj output [N, H, 2*hd] the gate view is rows = N*H, cols = hd,
/// gate pointer at element hd, gateStride = 2*hd.
struct SigmoidGateForwardArgs {
  DType dtype = DType::BF16;
  const void *o = nullptr, *gate = nullptr;
  void *y = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t oStride = 0, gateStride = 0, yStride = 0;
};
/// do = dy * s, dgate = dy * o * s * (1 - s).
struct SigmoidGateBackwardArgs {
  DType dtype = DType::BF16;
  const void *o = nullptr, *gate = nullptr, *dy = nullptr;
  void *dout = nullptr, *dgate = nullptr; ///< overwritten; either may be null
  int64_t rows = 0, cols = 0;
  int64_t oStride = 0, gateStride = 0, dyStride = 0, doStride = 0,
          dgateStride = 0;
};
Status sigmoidGateForward(const KernelContext &ctx,
                          const SigmoidGateForwardArgs &args);
Status sigmoidGateBackward(const KernelContext &ctx,
                           const SigmoidGateBackwardArgs &args);

/// Residual add y = a + b over n contiguous elements (y may alias a or b),
/// rounded once from acc. The backward routes dy to both inputs:
/// residualAddBackward copies dy into da and db (either may be null).
struct ResidualAddArgs {
  DType dtype = DType::BF16;
  const void *a = nullptr, *b = nullptr;
  void *y = nullptr;
  int64_t n = 0;
};
struct ResidualAddBackwardArgs {
  DType dtype = DType::BF16;
  const void *dy = nullptr;
  void *da = nullptr, *db = nullptr;
  int64_t n = 0;
};
Status residualAddForward(const KernelContext &ctx,
                          const ResidualAddArgs &args);
Status residualAddBackward(const KernelContext &ctx,
                           const ResidualAddBackwardArgs &args);

//===----------------------------------------------------------------------===//
// The vocabulary split over tensor-parallel ranks (Megatron's vocab-parallel
// embedding and LM head): rank r of `ranks` holds rows [offset, offset +
// vocab) of the whole [vocab x ranks, dim] table, offset = r x vocab. The
// embedding looks up the ids of its rows and writes zero rows for the others
// (the ranks' outputs are then summed); the cross-entropy exchanges each
// token's partial softmax statistics through `allGather`. The runtime fills
// it for launches of a program compiled with --tensor-parallel; ranks 1
// (the default) is the whole vocabulary on this rank, and nothing else is
// read.
//===----------------------------------------------------------------------===//

struct VocabGroup {
  int32_t ranks = 1;  ///< ranks sharing the vocabulary (1: not split)
  int64_t offset = 0; ///< this rank's first row: rank x vocab
  /// Gathers `n` floats from every rank of the group into recv[ranks x n]
  /// in rank order, ordered on ctx's stream (device memory on cuda, host
  /// memory on host); the same bits on every rank. Throws on failure (the
  /// runtime's collective errors). Null when ranks is 1.
  void (*allGather)(void *self, const KernelContext &ctx, const float *send,
                    float *recv, int64_t n) = nullptr;
  void *self = nullptr;
};

//===----------------------------------------------------------------------===//
// Token embedding. Forward gathers rows of W [vocab, dim]; ids outside
// [0, vocab) give zero rows (the host backend also returns InvalidArgument;
// the CUDA backend cannot report without a sync). Backward: each vocab row
// has one owner that adds dy rows of its tokens in increasing token order,
//   dw[id] += dy[n] for n = 0..tokens-1,
// the same order on both backends (no atomics; results are bitwise equal).
// With a split vocabulary (group.ranks > 1) W holds rows [group.offset,
// group.offset + vocab): id maps to row id - group.offset, ids of other
// ranks' rows give zero rows forward and nothing backward, and only ids
// outside [0, vocab x group.ranks) are invalid.
//===----------------------------------------------------------------------===//

struct EmbeddingForwardArgs {
  DType dtype = DType::BF16;
  const int32_t *ids = nullptr; ///< [tokens]
  const void *w = nullptr;      ///< [vocab, dim]
  void *y = nullptr;            ///< [tokens, dim]
  int64_t tokens = 0, vocab = 0, dim = 0;
  /// The generated step sets it when the table is this tensor-parallel
  /// rank's block; the runtime then fills `group`.
  int32_t vocabParallel = 0;
  VocabGroup group;
};
struct EmbeddingBackwardArgs {
  DType dtype = DType::BF16;
  const int32_t *ids = nullptr; ///< [tokens]
  const void *dy = nullptr;     ///< [tokens, dim]
  void *dw = nullptr;           ///< [vocab, dim] acc main grad, +=
  int64_t tokens = 0, vocab = 0, dim = 0;
  int32_t vocabParallel = 0; ///< as EmbeddingForwardArgs
  VocabGroup group;
};
Status embeddingForward(const KernelContext &ctx,
                        const EmbeddingForwardArgs &args);
Status embeddingBackward(const KernelContext &ctx,
                         const EmbeddingBackwardArgs &args);

//===----------------------------------------------------------------------===//
// Tied LM head + cross-entropy, in chunks of chunkTokens tokens so that the
// [tokens, vocab] logits never exist whole: per chunk, logits = h W^T (acc),
// lse per token, loss_n = lse_n - logit_n[label_n] for label != ignoreIndex.
//   lossSum    = sum_n loss_n over valid tokens (acc scalar, overwritten)
//   validCount = number of labels != ignoreIndex (int32 scalar)
//   lse        = [tokens] acc (optional output; ignored tokens get their lse)
// Backward (recomputes the logits chunk by chunk; also writes the outputs
// above): dlogits = gradScale * (softmax - onehot(label)) for valid tokens, 0
// for ignored ones, stored in the storage dtype, then
//   dHidden = dlogits W        [tokens, dim], overwritten
//   dWeight += dlogits^T h     [vocab, dim] acc main grad of the tied weight.
// gradScale is the caller's loss scaling (1 / total valid tokens for a mean).
// Labels outside [0, vocab) other than ignoreIndex are treated as ignored.
// With a split vocabulary (group.ranks > 1, the weight is this rank's rows
// [group.offset, group.offset + vocab)): per token each rank computes the
// running (max, sum of exp) over its logits and the label's logit if the
// label is its row (else 0); the ranks all-gather these triples and every
// rank merges them in rank order (the same online merge as within a row), so
// lse, loss, lossSum and validCount are the whole vocabulary's and equal on
// every rank. Labels are valid in [0, vocab x group.ranks). dlogits cover the
// rank's rows; dHidden is this rank's partial sum (the graph sums it over
// the ranks), dWeight its rows' gradient.
//===----------------------------------------------------------------------===//

struct LmHeadCrossEntropyArgs {
  DType dtype = DType::BF16;
  const void *hidden = nullptr;    ///< [tokens, dim] (after the final norm)
  const void *weight = nullptr;    ///< [vocab, dim] tied embedding
  const int32_t *labels = nullptr; ///< [tokens]
  int64_t tokens = 0, dim = 0, vocab = 0;
  int64_t chunkTokens = 1024; ///< tokens per chunk; fixes the workspace
  int32_t ignoreIndex = -100;
  void *lossSum = nullptr;       ///< acc scalar, overwritten
  int32_t *validCount = nullptr; ///< scalar, overwritten (may be null)
  void *lse = nullptr;           ///< [tokens] acc (may be null)
  // Backward only.
  double gradScale = 1.0;
  void *dHidden = nullptr;   ///< [tokens, dim], overwritten (may be null)
  void *dWeight = nullptr;   ///< [vocab, dim] acc main grad, += (may be null)
  int32_t vocabParallel = 0; ///< as EmbeddingForwardArgs
  VocabGroup group;
};
/// Proportional to min(chunkTokens, tokens) * vocab, independent of tokens
/// beyond one chunk (plus the GEMM workspace on CUDA); with a split
/// vocabulary also the gathered statistics, 3 floats per chunk token and
/// rank (group.ranks is read; the rest of the group need not be filled).
size_t lmHeadCrossEntropyWorkspaceBytes(Backend backend,
                                        const LmHeadCrossEntropyArgs &args);
/// The chunk buffers alone (bf16 logits, overwritten by the bf16 dlogits;
/// per-token state):
/// lmHeadCrossEntropyWorkspaceBytes less linearWorkspaceBytes, for a memory
/// plan that reserves the GEMM workspace once for every GEMM.
size_t
lmHeadCrossEntropyChunkWorkspaceBytes(Backend backend,
                                      const LmHeadCrossEntropyArgs &args);
Status lmHeadCrossEntropyForward(const KernelContext &ctx,
                                 const LmHeadCrossEntropyArgs &args);
Status lmHeadCrossEntropyBackward(const KernelContext &ctx,
                                  const LmHeadCrossEntropyArgs &args);

//===----------------------------------------------------------------------===//
// Optimizer. Master weights and moments are FP32 whatever the compute
// dtype; main grads are FP32 or BF16 (ZeRO-3's bf16 main grads).
//===----------------------------------------------------------------------===//

/// One tensor (or flat range) in a gradient list: n elements of `dtype`
/// (F32 or BF16).
struct GradTensor {
  const void *data = nullptr;
  int64_t n = 0;
  DType dtype = DType::F32;
};

/// Global grad norm over a list of tensors, in list order with a fixed
/// blocking (partial sums per fixed-size block of 65536 elements in double,
/// then combined in a fixed order; a BF16 tensor's elements are widened
/// exactly, so its blocking is the same), and the clip coefficient
///   clipCoef = min(1, maxNorm / (norm + 1e-6))  (1 when maxNorm <= 0).
/// Outputs are device (or host) float scalars, so no sync is needed.
/// A pipeline stage continues the sum of squares of the stages before it:
/// `initialSquares` (a double scalar in the same memory, null: 0) starts
/// the sum and `squares` receives its final value. Both backends sum the
/// blocks' partials in one running sum, so continuing it gives the bits of
/// one pass over all tensors on the same backend (the CUDA partials are
/// reduced in another order than the reference's, so the backends agree to
/// rounding, not bitwise).
struct GradNormArgs {
  const GradTensor *tensors = nullptr; ///< host array of numTensors
  int64_t numTensors = 0;
  double maxNorm = 1.0;
  float *norm = nullptr;                  ///< scalar, overwritten
  float *clipCoef = nullptr;              ///< scalar, overwritten (may be null)
  const double *initialSquares = nullptr; ///< scalar read first (may be null)
  double *squares = nullptr;              ///< scalar, overwritten (may be null)
};
/// The blocking above: the elements of one partial sum, and the partials
/// of a tensor of n elements (a generated grad norm, kernelgen's
/// GradNormSquares, uses the same).
constexpr int64_t kGradNormBlockElements = 65536;
inline int64_t gradNormParts(int64_t n) {
  return n <= 0 ? 0 : (n + kGradNormBlockElements - 1) / kGradNormBlockElements;
}
/// The partials, one double each (at least one), on both backends (the host
/// reference needs none, a generated host kernel does).
size_t gradNormWorkspaceBytes(Backend backend, const GradNormArgs &args);
Status gradNorm(const KernelContext &ctx, const GradNormArgs &args);

/// AdamW (decoupled weight decay, PyTorch's formulation) over n elements,
/// step >= 1 is the 1-based step for bias correction; g = grad * clipCoef
/// (a BF16 grad widened to float first, exactly):
///   p  = p * (1 - lr * weightDecay)
///   m  = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
///   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
/// then the compute copy (storage dtype computeDType) = round(p).
struct AdamWArgs {
  float *master = nullptr;          ///< [n] fp32 master weights
  float *expAvg = nullptr;          ///< [n] first moment
  float *expAvgSq = nullptr;        ///< [n] second moment
  const void *grad = nullptr;       ///< [n] main grad of gradDType
  DType gradDType = DType::F32;     ///< F32 or BF16
  const float *clipCoef = nullptr;  ///< scalar from gradNorm; null: 1
  void *computeCopy = nullptr;      ///< [n] refreshed copy; null: skip
  DType computeDType = DType::BF16; ///< BF16 or F32
  int64_t n = 0;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.01;
  int64_t step = 1;
};
Status adamWStep(const KernelContext &ctx, const AdamWArgs &args);
/// AdamW over many tensors in a few launches: each tensor's update is
/// adamWStep's, bit for bit, and with `zeroGrads` its n main-grad elements
/// are set to zero once read (in the grad's element size), so the main
/// grads start the next step at zero without a pass of their own. Tensors
/// must not overlap. Not used by the runtime: on the H100 its CUDA kernel
/// took 15.2 ms for Qwen3.5-0.8B's 320 tensors against 10.6 ms for one
/// adamWStep and one memset each (bench/notes/dense.md).
struct AdamWBatchArgs {
  const AdamWArgs *tensors = nullptr; ///< host array of numTensors
  int64_t numTensors = 0;
  bool zeroGrads = false;
};
Status adamWSteps(const KernelContext &ctx, const AdamWBatchArgs &args);
/// The f32 scalars of one AdamW step: the bias corrections in double, then
/// rounded to float at fixed points. Every implementation takes them from
/// here (the reference, the CUDA kernel, a generated AdamW the runtime
/// launches), so the update's bits do not depend on which one runs.
struct AdamWScalars {
  float stepSize, bc2Sqrt, decay, beta1, beta2, eps;
};
AdamWScalars adamWScalars(const AdamWArgs &args);

//===----------------------------------------------------------------------===//
// Data movement: the train dialect's view ops (slice, concat, expand) and the
// dtype conversions between storage and acc staging, as kernels on the
// backend's stream, so a step never round-trips through host memory.
//===----------------------------------------------------------------------===//

/// Byte rows: for o < outer and r < repeats,
///   dst[o * dstPitch + r * rowBytes, +rowBytes) = src[o * srcPitch,
///   +rowBytes).
/// slice is one call with src advanced to the slice start; concat one call per
/// input with dst advanced to its place; expand one call with repeats = n.
/// Requires srcPitch >= rowBytes and dstPitch >= repeats * rowBytes.
struct CopyRowsArgs {
  const void *src = nullptr;
  void *dst = nullptr;
  int64_t outer = 0, rowBytes = 0, srcPitch = 0, dstPitch = 0;
  int64_t repeats = 1;
};
Status copyRows(const KernelContext &ctx, const CopyRowsArgs &args);

/// The backward of expand: y[o, i] = sum over r < repeats of x[o, r, i], summed
/// in acc with r increasing and rounded once to the storage dtype.
struct SumRepeatsArgs {
  DType dtype = DType::BF16;
  const void *x = nullptr; ///< [outer, repeats, inner]
  void *y = nullptr;       ///< [outer, inner], overwritten
  int64_t outer = 0, repeats = 0, inner = 0;
};
Status sumRepeats(const KernelContext &ctx, const SumRepeatsArgs &args);

/// y[i] = x[i] converted from `from` to `to` (BF16, F32, F64; narrowing rounds
/// to nearest even). CUDA: BF16 <-> F32 and same-type copies.
struct ConvertArgs {
  DType from = DType::F32, to = DType::BF16;
  const void *x = nullptr;
  void *y = nullptr;
  int64_t n = 0;
};
Status convertDType(const KernelContext &ctx, const ConvertArgs &args);

//===----------------------------------------------------------------------===//
// Internal: the CUDA implementations live in the actplace_kernels_cuda
// archive and are reached from the entries above through weak references.
// Any translation unit built with ACTPLACE_HAVE_CUDA (the runtime, tests,
// generated code) pulls that archive member in through this anchor.
//===----------------------------------------------------------------------===//
namespace detail {
extern "C" int actplaceDenseCudaAnchor;
} // namespace detail
#if defined(ACTPLACE_HAVE_CUDA)
[[maybe_unused, gnu::used]] static const int *const actplaceDenseCudaAnchorRef =
    &detail::actplaceDenseCudaAnchor;
#endif
namespace detail {
extern "C" int actplaceMovementCudaAnchor;
} // namespace detail
#if defined(ACTPLACE_HAVE_CUDA)
[[maybe_unused,
  gnu::used]] static const int *const actplaceMovementCudaAnchorRef =
    &detail::actplaceMovementCudaAnchor;
#endif

} // namespace ap::kernels

#endif // ACTPLACE_KERNELS_DENSE_H
