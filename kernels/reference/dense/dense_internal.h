//===- dense_internal.h - dense kernels: shared internals --------*- C++
//-*-===//
//
// Declarations shared by the dense entries (reference library) and the CUDA
// implementations: the templated reference kernels and the CUDA hooks. Not
// part of the kernel ABI; include kernels/kernels.h for that.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_REFERENCE_DENSE_DENSE_INTERNAL_H
#define ACTPLACE_KERNELS_REFERENCE_DENSE_DENSE_INTERNAL_H

#include "kernels/cuda/row_layout.h"
#include "kernels/kernels.h"

namespace ap::kernels {
namespace ref {

/// Accumulation type of a storage type: float for bf16/float, double for
/// double (kernels/dense.h).
template <class T> struct AccOf {
  using type = float; // f32 accumulation for bf16 and f32 storage
};
template <> struct AccOf<double> {
  using type = double; // f64 storage accumulates in f64
};
template <class T> using Acc = typename AccOf<T>::type;

template <class T> inline Acc<T> load(T v) {
  return static_cast<Acc<T>>(static_cast<float>(v));
}
template <> inline double load<double>(double v) { return v; }
template <class T> inline T store(Acc<T> v) { return T(v); }

/// C[i][j] = sum_k A[i][k] * B[j][k] over acc arrays; `out(i, j, value)`
/// receives each element once. Fixed summation order: 8 interleaved partial
/// sums over k (so the loop vectorises), combined pairwise, then the tail.
template <class A, class Out>
void gemmNT(const A *a, const A *b, int64_t m, int64_t n, int64_t k,
            Out &&out) {
  constexpr int64_t kBlockN = 64;
  for (int64_t j0 = 0; j0 < n; j0 += kBlockN) {
    int64_t j1 = j0 + kBlockN < n ? j0 + kBlockN : n;
    for (int64_t i = 0; i < m; ++i) {
      const A *ai = a + i * k;
      for (int64_t j = j0; j < j1; ++j) {
        const A *bj = b + j * k;
        A p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t kk = 0;
        for (; kk + 8 <= k; kk += 8)
          for (int l = 0; l < 8; ++l)
            p[l] += ai[kk + l] * bj[kk + l];
        A s = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
        for (; kk < k; ++kk)
          s += ai[kk] * bj[kk];
        out(i, j, s);
      }
    }
  }
}

template <class T>
Status linearForward(const T *x, const T *w, T *y, int64_t rows, int64_t in,
                     int64_t out);
template <class T>
Status linearBackward(const T *x, const T *w, const T *dy, T *dx, Acc<T> *dw,
                      int64_t rows, int64_t in, int64_t out);

template <class T> Status rmsNormForward(const RmsNormForwardArgs &a);
template <class T> Status rmsNormBackward(const RmsNormBackwardArgs &a);
template <class T> Status rope(const RopeArgs &a, bool backward);
Status documentStarts(const DocumentStartsArgs &a);
template <class T> Status swiGluForward(const SwiGluForwardArgs &a);
template <class T> Status swiGluBackward(const SwiGluBackwardArgs &a);
template <class T> Status sigmoidGateForward(const SigmoidGateForwardArgs &a);
template <class T> Status sigmoidGateBackward(const SigmoidGateBackwardArgs &a);
template <class T> Status residualAddForward(const ResidualAddArgs &a);
template <class T> Status residualAddBackward(const ResidualAddBackwardArgs &a);
template <class T> Status embeddingForward(const EmbeddingForwardArgs &a);
template <class T> Status embeddingBackward(const EmbeddingBackwardArgs &a);
/// ctx is handed to a.group.allGather when the vocabulary is split.
template <class T>
Status lmHeadCrossEntropy(const KernelContext &ctx,
                          const LmHeadCrossEntropyArgs &a, bool backward);
Status gradNorm(const GradNormArgs &a);
Status adamWStep(const AdamWArgs &a);
Status copyRows(const CopyRowsArgs &a);
template <class T> Status sumRepeats(const SumRepeatsArgs &a);
Status convertDType(const ConvertArgs &a);

/// Fixed blocking of the grad-norm reduction (both backends).
constexpr int64_t kGradNormBlock = kGradNormBlockElements;
/// Rows per partial sum in the CUDA RMSNorm dw reduction of rows wider than
/// rowwise::kMaxDim (narrower rows: rowwise::partials).
constexpr int64_t kRmsNormRowsPerPartial = 32;
/// Partial dw rows the CUDA RMSNorm backward writes to its workspace.
inline int64_t rmsNormBackwardPartials(int64_t rows, int64_t dim) {
  if (dim <= rowwise::kMaxDim)
    return rowwise::partials(rows, dim);
  return (rows + kRmsNormRowsPerPartial - 1) / kRmsNormRowsPerPartial;
}
/// grid.y of the CUDA cross-entropy gradient kernel for a chunk of `rows`
/// tokens: one block row per token up to CUDA's grid.y limit (65535), then
/// the rows stride (a chunk_tokens above 65535 is legal).
inline int64_t ceGradGridRows(int64_t rows) {
  return rows < 1 ? 1 : (rows > 65535 ? 65535 : rows);
}
/// The per-token softmax statistics a rank of a split vocabulary sends
/// (kernels/dense.h, VocabGroup), in floats: the running max m, the sum of
/// exp(logit - m) over the rank's logits and the label's logit (0 when the
/// label is another rank's row). A chunk of cn tokens sends
/// [cn][kCeStats] (token-major) and receives [ranks][cn][kCeStats].
constexpr int64_t kCeStats = 3;
/// The row of the whole table that local row 0 of `group` holds: 0 unless the
/// vocabulary is split.
inline int64_t vocabOffset(const VocabGroup &group) {
  return group.ranks > 1 ? group.offset : 0;
}
/// Labels and ids are valid in [0, vocabBound): the whole table's rows.
inline int64_t vocabBound(const VocabGroup &group, int64_t vocab) {
  return group.ranks > 1 ? vocab * group.ranks : vocab;
}

/// The cuBLASLt workspace: fixed so the algorithm never depends on it.
constexpr size_t kCudaGemmWorkspaceBytes = size_t(32) << 20;

} // namespace ref

#ifndef AP_DENSE_CUDA_HOOK
#define AP_DENSE_CUDA_HOOK
#endif

/// CUDA implementations (actplace_kernels_cuda). The reference library
/// declares them weak, so a build without CUDA links and answers
/// Unsupported.
namespace cuda {
#define AP_DENSE_HOOK(name, Args)                                              \
  AP_DENSE_CUDA_HOOK Status name(const KernelContext &ctx, const Args &args);
AP_DENSE_HOOK(linearForward, LinearForwardArgs)
AP_DENSE_HOOK(linearBackward, LinearBackwardArgs)
AP_DENSE_HOOK(rmsNormForward, RmsNormForwardArgs)
AP_DENSE_HOOK(rmsNormBackward, RmsNormBackwardArgs)
AP_DENSE_HOOK(ropeForward, RopeArgs)
AP_DENSE_HOOK(ropeBackward, RopeArgs)
AP_DENSE_HOOK(documentStarts, DocumentStartsArgs)
AP_DENSE_HOOK(swiGluForward, SwiGluForwardArgs)
AP_DENSE_HOOK(swiGluBackward, SwiGluBackwardArgs)
AP_DENSE_HOOK(sigmoidGateForward, SigmoidGateForwardArgs)
AP_DENSE_HOOK(sigmoidGateBackward, SigmoidGateBackwardArgs)
AP_DENSE_HOOK(residualAddForward, ResidualAddArgs)
AP_DENSE_HOOK(residualAddBackward, ResidualAddBackwardArgs)
AP_DENSE_HOOK(embeddingForward, EmbeddingForwardArgs)
AP_DENSE_HOOK(embeddingBackward, EmbeddingBackwardArgs)
AP_DENSE_HOOK(lmHeadCrossEntropyForward, LmHeadCrossEntropyArgs)
AP_DENSE_HOOK(lmHeadCrossEntropyBackward, LmHeadCrossEntropyArgs)
AP_DENSE_HOOK(gradNorm, GradNormArgs)
AP_DENSE_HOOK(adamWStep, AdamWArgs)
AP_DENSE_HOOK(adamWSteps, AdamWBatchArgs)
AP_DENSE_HOOK(copyRows, CopyRowsArgs)
AP_DENSE_HOOK(sumRepeats, SumRepeatsArgs)
AP_DENSE_HOOK(convertDType, ConvertArgs)
#undef AP_DENSE_HOOK
} // namespace cuda

} // namespace ap::kernels

#endif // ACTPLACE_KERNELS_REFERENCE_DENSE_DENSE_INTERNAL_H
