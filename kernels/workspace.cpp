//===- workspace.cpp - workspace queries of every kernel family -*- C++ -*-===//
//
// The one definition of how much scratch each kernel asks for, for both
// backends: the kernel entries (host and CUDA) check ctx.workspaceBytes
// against these functions, and the compiler's memory plan calls the same
// functions with args built from the op's shapes (passes/analysis/
// KernelWorkspace.cpp). Built without CUDA (library actplace_kernel_sizes,
// also compiled into actplace_kernels_reference), so the CUDA-free compiler
// can plan for the CUDA backend. The blocking constants the CUDA kernels use
// for their partial sums live in plain C++ headers (kernels/cuda/
// row_layout.h, gdn/gdn_layout.h, reference/dense/dense_internal.h) that the
// kernels include too.
//
// Sizes saturate at SIZE_MAX instead of wrapping: the compiler asks for
// shapes the dialect accepts, and some of those (an attention backward over
// T = 2^40 tokens) need more scratch than 64 bits count.
//
//===----------------------------------------------------------------------===//
#include "kernels/cuda/gdn/gdn_layout.h"
#include "kernels/kernels.h"
#include "kernels/reference/dense/dense_internal.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ap::kernels {
namespace {

constexpr size_t kSaturated = std::numeric_limits<size_t>::max();

size_t mul(size_t a, size_t b) {
  size_t r;
  return __builtin_mul_overflow(a, b, &r) ? kSaturated : r;
}
template <class... Rest> size_t mul(size_t a, size_t b, Rest... rest) {
  return mul(mul(a, b), size_t(rest)...);
}
size_t add(size_t a, size_t b) {
  size_t r;
  return __builtin_add_overflow(a, b, &r) ? kSaturated : r;
}
size_t align256(size_t n) {
  return n > kSaturated - 255 ? kSaturated : (n + 255) / 256 * 256;
}
/// A count as size_t; negative counts (invalid args) count as none.
size_t count(int64_t n) { return n > 0 ? size_t(n) : 0; }

} // namespace

//===----------------------------------------------------------------------===//
// Dense (kernels/dense.h)
//===----------------------------------------------------------------------===//

size_t linearWorkspaceBytes(Backend backend) {
  return backend == Backend::Cuda ? ref::kCudaGemmWorkspaceBytes : 0;
}

size_t rmsNormBackwardWorkspaceBytes(Backend backend,
                                     const RmsNormBackwardArgs &a) {
  if (backend != Backend::Cuda || a.rows <= 0 || a.dim <= 0)
    return 0;
  return mul(count(ref::rmsNormBackwardPartials(a.rows, a.dim)), count(a.dim),
             sizeof(float));
}

size_t lmHeadCrossEntropyChunkWorkspaceBytes(Backend backend,
                                             const LmHeadCrossEntropyArgs &a) {
  if (backend != Backend::Cuda || a.tokens <= 0 || a.vocab <= 0)
    return 0;
  int64_t c = std::min(a.chunkTokens, a.tokens);
  if (c <= 0)
    return 0;
  // bf16 logits (overwritten by their gradient), per-token loss, valid flag
  // and lse.
  size_t bytes = add(align256(mul(count(c), count(a.vocab), 2)),
                     align256(mul(count(c), 12)));
  // A split vocabulary: the fp32 statistics sent and the ranks' gathered.
  if (a.group.ranks > 1) {
    size_t stats = mul(count(c), size_t(ref::kCeStats), sizeof(float));
    bytes = add(add(bytes, align256(stats)),
                align256(mul(count(a.group.ranks), stats)));
  }
  return bytes;
}

size_t lmHeadCrossEntropyWorkspaceBytes(Backend backend,
                                        const LmHeadCrossEntropyArgs &a) {
  size_t chunk = lmHeadCrossEntropyChunkWorkspaceBytes(backend, a);
  return chunk ? add(chunk, linearWorkspaceBytes(backend)) : 0;
}

size_t gradNormWorkspaceBytes(Backend, const GradNormArgs &a) {
  size_t parts = 0;
  for (int64_t t = 0; t < a.numTensors; ++t)
    parts = add(parts, count(gradNormParts(a.tensors[t].n)));
  return mul(std::max<size_t>(parts, 1), sizeof(double));
}

//===----------------------------------------------------------------------===//
// GDN (kernels/gdn.h)
//===----------------------------------------------------------------------===//

size_t gdnConvBackwardWorkspaceBytes(Backend backend, const GdnConvArgs &a) {
  if (backend != Backend::Cuda)
    return 0;
  // One fp32 [channels][kernelSize] dw partial per run of kConvRows tokens.
  int64_t runs =
      (a.batch * a.seqLen + gdncuda::kConvRows - 1) / gdncuda::kConvRows;
  return mul(count(runs), count(a.channels), count(a.kernelSize), 4);
}

size_t gdnGatesBackwardWorkspaceBytes(Backend, const GdnGatesArgs &) {
  return 0;
}

namespace {
/// The CUDA chunk kernels' regions, each 256-byte aligned, in the order
/// kernels/cuda/gdn/gdn_chunk.cu (carve) lays them out: W, U, Vnew (bf16,
/// one row per padded token and value head), the bf16 64x64 P tile per
/// chunk, the fp32 chunk states h; backward adds dh, fp32 dVnew, dQ, dK, dW.
size_t gdnChunkWorkspace(const GdnChunkArgs &a, bool backward) {
  const size_t C = kGdnChunk;
  const size_t nt = (count(a.seqLen) + C - 1) / C;
  const size_t dk = count(a.keyDim), dv = count(a.valueDim);
  const size_t rows = mul(count(a.batch), count(a.valueHeads), nt, C);
  const size_t states = mul(count(a.batch), count(a.valueHeads), nt, dk, dv);
  size_t bytes = 0;
  auto take = [&](size_t region) { bytes = add(bytes, align256(region)); };
  take(mul(rows, dk, 2)); // W
  take(mul(rows, dv, 2)); // U
  take(mul(rows, dv, 2)); // Vnew
  take(mul(rows, C, 2));  // P
  take(mul(states, 4));   // h
  if (backward) {
    take(mul(states, 4));       // dh
    take(mul(rows, dv, 4));     // dVnew
    for (int i = 0; i < 3; ++i) // dQ, dK, dW
      take(mul(rows, dk, 4));
  }
  return bytes;
}
} // namespace

size_t gdnChunkForwardWorkspaceBytes(Backend backend, const GdnChunkArgs &a) {
  return backend == Backend::Cuda ? gdnChunkWorkspace(a, false) : 0;
}
size_t gdnChunkBackwardWorkspaceBytes(Backend backend, const GdnChunkArgs &a) {
  return backend == Backend::Cuda ? gdnChunkWorkspace(a, true) : 0;
}

size_t gdnGatedNormBackwardWorkspaceBytes(Backend backend,
                                          const GdnGatedNormArgs &a) {
  if (backend != Backend::Cuda)
    return 0;
  int64_t rows = a.tokens * a.heads;
  return mul(count(gdncuda::gatedNormPartials(rows, a.dim)), count(a.dim), 4);
}

//===----------------------------------------------------------------------===//
// Attention (kernels/attention.h)
//===----------------------------------------------------------------------===//

Status attentionValidate(const AttentionShape &s, DType dtype) {
  if (dtype != DType::BF16 && dtype != DType::F32 && dtype != DType::F64)
    return Status::InvalidArgument;
  if (s.batch <= 0 || s.seqLen <= 0 || s.numQHeads <= 0 || s.numKvHeads <= 0 ||
      s.headDimQk <= 0 || s.headDimV <= 0)
    return Status::InvalidArgument;
  if (s.numQHeads % s.numKvHeads != 0)
    return Status::InvalidArgument;
  if (!(s.softmaxScale > 0.0) || !std::isfinite(s.softmaxScale))
    return Status::InvalidArgument;
  return Status::Ok;
}

size_t attentionForwardWorkspaceBytes(const AttentionForwardArgs &) {
  return 0;
}

namespace detail {

namespace {
/// bf16 dS tiles of one (batch, head) pair: the causal half of the 64x64
/// tiles over T.
size_t storedDsPairBytes(const AttentionShape &s) {
  const size_t tiles = (count(s.seqLen) + 63) / 64;
  return mul(mul(tiles, tiles + 1) / 2, 64, 64, 2);
}
/// Most dS scratch a StoredDs backward takes (one launch's pairs).
constexpr size_t kStoredDsCap = size_t(256) << 20;
} // namespace

// Measured on the H200 (bench/notes/attention.md): StoredDs's backward is
// 1.4x faster than RecomputeDq at every model shape at T = 4096 (Qwen3.5
// GQA, MLA with 16 and 128 heads), for at most 256 MiB of extra scratch.
// One pair's dS grows as T^2 (1 GiB at T = 32768, 16 GiB at T = 131072):
// where a single pair outgrows the cap (T > 16320), the backward recomputes
// dQ instead, so that its scratch stays linear in T.
AttentionBackwardAlgo attentionBackwardDefaultAlgo(const AttentionShape &s) {
  return storedDsPairBytes(s) <= kStoredDsCap
             ? AttentionBackwardAlgo::StoredDs
             : AttentionBackwardAlgo::RecomputeDq;
}

int64_t attentionStoredDsChunk(const AttentionShape &s) {
  const size_t perPair = storedDsPairBytes(s);
  const size_t cap = kStoredDsCap;
  const int64_t pairs = int64_t(s.batch) * s.numQHeads;
  if (pairs <= 0 || perPair == 0)
    return 0; // an invalid shape (attentionValidate): no launch
  const int64_t maxChunk = std::max<int64_t>(1, int64_t(cap / perPair));
  // As few launches as the cap allows, with the pairs spread evenly over
  // them (16 pairs of which 15 fit: two launches of 8, not 15 + 1).
  const int64_t launches = (pairs + maxChunk - 1) / maxChunk;
  return (pairs + launches - 1) / launches;
}

size_t attentionBackwardWorkspaceBytesFor(const AttentionShape &s,
                                          AttentionBackwardAlgo algo) {
  if (attentionValidate(s, DType::BF16) != Status::Ok)
    return 0;
  const size_t rows = mul(count(s.batch), count(s.seqLen));
  size_t bytes = align256(mul(rows, count(s.numQHeads), sizeof(float))); // D
  if (s.numQHeads != s.numKvHeads)
    bytes = add(bytes, add(align256(mul(rows, count(s.numQHeads),
                                        count(s.headDimQk), sizeof(float))),
                           align256(mul(rows, count(s.numQHeads),
                                        count(s.headDimV), sizeof(float)))));
  if (algo == AttentionBackwardAlgo::StoredDs)
    bytes = add(bytes, align256(mul(count(attentionStoredDsChunk(s)),
                                    storedDsPairBytes(s))));
  return bytes;
}

} // namespace detail

size_t attentionBackwardWorkspaceBytes(const AttentionBackwardArgs &a) {
  if (attentionValidate(a.shape, a.dtype) != Status::Ok)
    return 0;
  return detail::attentionBackwardWorkspaceBytesFor(
      a.shape, detail::attentionBackwardDefaultAlgo(a.shape));
}

} // namespace ap::kernels
