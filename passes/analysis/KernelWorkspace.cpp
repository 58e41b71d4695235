//===- KernelWorkspace.cpp - kernel scratch of train ops --------*- C++ -*-===//
//
// Args structs built from the op's shapes, sizes from the kernel library's
// queries (kernels/workspace.cpp). Only the shape fields a query reads are
// set; the pointers stay null (the queries never read them).
//
//===----------------------------------------------------------------------===//

#include "passes/analysis/KernelWorkspace.h"

#include "dialect/train/TrainOps.h"
#include "kernelgen/KernelAbi.h"
#include "kernels/dense.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/TypeSwitch.h"

#include <algorithm>
#include <limits>
#include <optional>

using namespace mlir;
using namespace ap::train;
namespace k = ap::kernels;

namespace {

int64_t dim(Value v, unsigned i) {
  return cast<ShapedType>(v.getType()).getDimSize(i);
}

/// `v` as an int32 args field, or nothing when it does not fit.
std::optional<int32_t> i32(int64_t v) {
  if (v < std::numeric_limits<int32_t>::min() ||
      v > std::numeric_limits<int32_t>::max())
    return std::nullopt;
  return static_cast<int32_t>(v);
}

int64_t capped(size_t bytes) {
  return static_cast<int64_t>(
      std::min<size_t>(bytes, size_t(kMaxKernelWorkspaceBytes)));
}

/// The chunked gated delta rule's args: q [B, T, Hk, dk], v [B, T, Hv, dv].
std::optional<k::GdnChunkArgs> gdnArgs(Value q, Value v) {
  std::optional<int32_t> hk = i32(dim(q, 2)), dk = i32(dim(q, 3));
  std::optional<int32_t> hv = i32(dim(v, 2)), dv = i32(dim(v, 3));
  if (!hk || !dk || !hv || !dv)
    return std::nullopt;
  k::GdnChunkArgs a;
  a.batch = dim(v, 0);
  a.seqLen = dim(v, 1);
  a.keyHeads = *hk;
  a.valueHeads = *hv;
  a.keyDim = *dk;
  a.valueDim = *dv;
  return a;
}

/// The LM head's args: labels [B, T], weight [V, D].
template <class Op> k::LmHeadCrossEntropyArgs lmHeadArgs(Op l) {
  k::LmHeadCrossEntropyArgs a;
  a.tokens = cast<ShapedType>(l.getLabels().getType()).getNumElements();
  a.vocab = dim(l.getWeight(), 0);
  a.dim = dim(l.getWeight(), 1);
  a.chunkTokens = l.getChunkTokens();
  // A vocab-parallel head also holds the ranks' gathered statistics.
  if (l.getVocabParallel())
    if (auto module = l->template getParentOfType<ModuleOp>())
      if (auto tp = module->template getAttrOfType<IntegerAttr>(
              kTensorParallelAttrName))
        a.group.ranks = int32_t(std::min<int64_t>(tp.getInt(), INT32_MAX));
  return a;
}

} // namespace

int64_t ap::train::kernelWorkspaceBytes(Operation *op, k::Backend backend) {
  // std::nullopt: the shape does not fit the args struct.
  std::optional<size_t> bytes =
      llvm::TypeSwitch<Operation *, std::optional<size_t>>(op)
          .Case([&](GatedDeltaRuleOp g) -> std::optional<size_t> {
            if (auto a = gdnArgs(g.getQ(), g.getV()))
              return k::gdnChunkForwardWorkspaceBytes(backend, *a);
            return std::nullopt;
          })
          .Case([&](GatedDeltaRuleGradOp g) -> std::optional<size_t> {
            if (auto a = gdnArgs(g.getQ(), g.getV()))
              return k::gdnChunkBackwardWorkspaceBytes(backend, *a);
            return std::nullopt;
          })
          .Case([&](AttentionGradOp g) -> std::optional<size_t> {
            // q [B, T, Hq, Dqk], k [B, T, Hkv, Dqk], v [B, T, Hkv, Dv].
            std::optional<int32_t> dims[] = {
                i32(dim(g.getQ(), 0)), i32(dim(g.getQ(), 1)),
                i32(dim(g.getQ(), 2)), i32(dim(g.getK(), 2)),
                i32(dim(g.getQ(), 3)), i32(dim(g.getV(), 3))};
            if (llvm::any_of(dims, [](auto d) { return !d; }))
              return std::nullopt;
            // One query for both backends (kernels/attention.h).
            k::AttentionBackwardArgs a;
            // The CUDA kernels' storage; the size does not depend on it.
            a.dtype = k::DType::BF16;
            a.shape = {*dims[0],
                       *dims[1],
                       *dims[2],
                       *dims[3],
                       *dims[4],
                       *dims[5],
                       g.getScale().convertToDouble()};
            return k::attentionBackwardWorkspaceBytes(a);
          })
          .Case([&](ShortConvGradOp g) -> std::optional<size_t> {
            // The weight gradient's per-run partials (kernels/gdn.h).
            k::GdnConvArgs a;
            a.batch = dim(g.getInput(), 0);
            a.seqLen = dim(g.getInput(), 1);
            a.channels = dim(g.getInput(), 2);
            std::optional<int32_t> ks = i32(dim(g.getWeight(), 1));
            if (!ks)
              return std::nullopt;
            a.kernelSize = *ks;
            return k::gdnConvBackwardWorkspaceBytes(backend, a);
          })
          .Case([&](GatedRMSNormGradOp g) -> std::optional<size_t> {
            // The weight gradient's per-block partials; x [.., H, d].
            auto x = cast<ShapedType>(g.getInput().getType());
            std::optional<int32_t> h = i32(x.getDimSize(x.getRank() - 2)),
                                   d = i32(x.getDimSize(x.getRank() - 1));
            if (!h || !d || *h <= 0 || *d <= 0)
              return std::nullopt;
            k::GdnGatedNormArgs a;
            a.heads = *h;
            a.dim = *d;
            a.tokens = x.getNumElements() / (int64_t(*h) * *d);
            if (!g.getWeightGrad())
              return k::gdnGatedNormBackwardWorkspaceBytes(backend, a);
            // With dw: also kernelgen's partials when generated.
            return std::max<size_t>(
                k::gdnGatedNormBackwardWorkspaceBytes(backend, a),
                size_t(ap::kernelgen::rmsNormDwWorkspaceBytes(
                    a.tokens * a.heads, a.dim)));
          })
          .Case([&](GDNGatesGradOp g) -> std::optional<size_t> {
            // The library runs the gates backward in the runner's own
            // scratch; kernelgen's partial column sums of dA_log and
            // dt_bias's gradient take the stream's workspace when the step
            // runs generated kernels.
            auto a = cast<ShapedType>(g.getA().getType());
            int64_t heads = a.getDimSize(a.getRank() - 1);
            if (heads <= 0)
              return std::nullopt;
            return size_t(ap::kernelgen::gdnGatesWorkspaceBytes(
                a.getNumElements() / heads, heads));
          })
          .Case<RMSNormGradOp, RMSNormGradRebuildOp>(
              [&](auto g) -> std::optional<size_t> {
                // The weight gradient's partial column sums: the library
                // kernel's, or kernelgen's when the step runs generated
                // kernels (the larger of the two; the plan is the same
                // either way).
                if (!g.getWeightGrad())
                  return 0;
                k::RmsNormBackwardArgs a;
                a.dim =
                    cast<ShapedType>(g.getWeight().getType()).getNumElements();
                if (a.dim <= 0)
                  return std::nullopt;
                a.rows =
                    cast<ShapedType>(g.getInput().getType()).getNumElements() /
                    a.dim;
                return std::max<size_t>(
                    k::rmsNormBackwardWorkspaceBytes(backend, a),
                    size_t(
                        ap::kernelgen::rmsNormDwWorkspaceBytes(a.rows, a.dim)));
              })
          .Case<LMHeadCrossEntropyOp, LMHeadCrossEntropyGradOp,
                LMHeadCrossEntropyWithGradOp>(
              [&](auto l) -> std::optional<size_t> {
                return k::lmHeadCrossEntropyChunkWorkspaceBytes(backend,
                                                                lmHeadArgs(l));
              })
          .Default([](Operation *) -> std::optional<size_t> { return 0; });
  return bytes ? capped(*bytes) : kMaxKernelWorkspaceBytes;
}
