//===- FuseRecompute.cpp - train-fuse-recompute ---------------------------===//
//
// A recomputed SwiGLU or RMSNorm is read in backward only by the weight
// gradients of the linears after it (dW += dy^T y), while its own backward
// reads the same inputs right after. Splitting those linear backwards lets
// the op's backward write y itself:
//
//   %act = train.swiglu %g, %u {train.recomputed}
//   %da  = train.linear_grad %act, %w, %dy {weight_grad = @w}
//   %dg, %du = train.swiglu_grad %g, %u, %da
// becomes
//   %da  = train.linear_input_grad %w, %dy
//   %dg, %du, %act = train.swiglu_grad %g, %u, %da
//   train.linear_grad %act, %w, %dy {weight_grad = @w}
//
// and a recomputed RMSNorm (the projections' input) becomes one
// train.rms_norm_grad_rebuild, which reads the forward's saved rstd (a float
// per row, kept again) and writes y, followed by the projections' dW.
// dx never read y, and dW is the same GEMM on the same bits (the backward
// kernels write the forward's expression, kernels/dense.h), so results do
// not change. y costs one store in a kernel that runs anyway instead of a
// launch that reads its inputs a second time.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/PlacementConfig.h"

#include "mlir/IR/Remarks.h"

namespace ap {
#define GEN_PASS_DEF_TRAINFUSERECOMPUTE
#include "passes/Passes.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {

/// The recomputed SwiGLU that `grad` can rebuild, and the linear backward
/// between them; null when the pattern does not hold exactly.
struct Candidate {
  SwiGLUOp act;
  LinearGradOp linear;
};

Candidate match(SwiGLUGradOp grad) {
  if (grad.getOutput())
    return {};
  auto linear = grad.getResultGrad().getDefiningOp<LinearGradOp>();
  if (!linear || !linear.getInputGrad() || !linear.getInputGrad().hasOneUse())
    return {};
  auto act = linear.getInput().getDefiningOp<SwiGLUOp>();
  // Only a clone (train.recomputed) whose one reader is this linear: a kept
  // activation is already there, and another reader would need it earlier.
  if (!act || !act->hasAttr(kRecomputedAttrName) ||
      !act.getResult().hasOneUse() || act.getGate() != grad.getGate() ||
      act.getUp() != grad.getUp())
    return {};
  return {act, linear};
}

/// The forward op `clone` was copied from: same name, operands and
/// attributes (but the placement ones), not itself a clone.
template <typename OpT> OpT forwardOf(OpT clone) {
  for (OpT op : clone->getBlock()->template getOps<OpT>()) {
    if (op == clone || op->hasAttr(kRecomputedAttrName) ||
        !llvm::equal(op->getOperands(), clone->getOperands()))
      continue;
    bool same = llvm::all_of(clone->getAttrs(), [&](NamedAttribute a) {
      return a.getName() == kRecomputedAttrName ||
             a.getName() == kPlacementAttrName ||
             op->getAttr(a.getName()) == a.getValue();
    });
    if (same)
      return op;
  }
  return {};
}

/// A recomputed RMSNorm whose output only the weight gradients of linears
/// read (attn_norm, mlp_norm: the projections after them), and whose rstd
/// only its backward reads. The backward gets the forward's saved rstd (a
/// float per row) and writes y; the linears' dW follow it.
struct NormCandidate {
  RMSNormOp clone, forward;
  SmallVector<LinearGradOp> linears;
};

NormCandidate matchNorm(RMSNormGradOp grad) {
  auto clone = grad.getRstd().getDefiningOp<RMSNormOp>();
  if (!clone || !clone->hasAttr(kRecomputedAttrName) || !grad.getInputGrad() ||
      !clone.getRstd().hasOneUse() || clone.getInput() != grad.getInput() ||
      clone.getWeight() != grad.getWeight())
    return {};
  NormCandidate c{clone, forwardOf(clone), {}};
  if (!c.forward || !c.forward.getRstd())
    return {};
  for (Operation *user : clone.getResult().getUsers()) {
    auto linear = dyn_cast<LinearGradOp>(user);
    // A frozen projection's backward would keep reading y without a dW.
    if (!linear || linear.getInput() != clone.getResult() ||
        !linear.getWeightGradAttr() || !linear->isBeforeInBlock(grad))
      return {};
    c.linears.push_back(linear);
  }
  if (c.linears.empty())
    return {};
  return c;
}

/// Splits `linear` into dx at its place (when it has one) and returns the
/// builder state unchanged; the dW half is built by the caller.
void splitInputGrad(OpBuilder &b, LinearGradOp linear) {
  if (!linear.getInputGrad())
    return;
  b.setInsertionPoint(linear);
  Value dx = LinearInputGradOp::create(
      b, linear.getLoc(), linear.getInputGrad().getType(), linear.getWeight(),
      linear.getResultGrad(), linear.getScope());
  linear.getInputGrad().replaceAllUsesWith(dx);
}

void remarkFused(Operation *clone, StringRef what) {
  std::string scope = Scope::of(clone).str();
  remark::passed(clone->getLoc(), remark::RemarkOpts::name("fuse-recompute")
                                      .category("actplace-placement")
                                      .subCategory(scope))
      << ("recomputed " + clone->getName().getStringRef() + " of " + scope +
          " inside its " + what +
          "; the weight gradients of the linears that read it follow it")
             .str();
}

struct TrainFuseRecomputePass
    : ap::impl::TrainFuseRecomputeBase<TrainFuseRecomputePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!fuseRecompute)
      return markAllAnalysesPreserved();
    SmallVector<SwiGLUGradOp> grads;
    module.walk([&](SwiGLUGradOp g) { grads.push_back(g); });
    OpBuilder b(&getContext());
    int64_t fused = 0;
    for (SwiGLUGradOp grad : grads) {
      Candidate c = match(grad);
      if (!c.act)
        continue;
      LinearGradOp linear = c.linear;
      splitInputGrad(b, linear);
      Value dx = grad.getResultGrad();
      b.setInsertionPoint(grad);
      // Without a weight gradient (frozen) nothing reads the activation.
      bool needsAct = static_cast<bool>(linear.getWeightGradAttr());
      auto rebuilt = SwiGLUGradOp::create(
          b, grad.getLoc(), grad.getGateGrad().getType(),
          grad.getUpGrad().getType(), needsAct ? c.act.getType() : Type(),
          grad.getGate(), grad.getUp(), dx, grad.getScope());
      if (needsAct)
        LinearGradOp::create(b, linear.getLoc(), /*input_grad=*/Type(),
                             rebuilt.getOutput(), linear.getWeight(),
                             linear.getResultGrad(), linear.getWeightGradAttr(),
                             linear.getScope());
      grad.getGateGrad().replaceAllUsesWith(rebuilt.getGateGrad());
      grad.getUpGrad().replaceAllUsesWith(rebuilt.getUpGrad());
      grad.erase();
      linear.erase();
      remarkFused(c.act, "train.swiglu_grad");
      c.act.erase();
      ++fused;
    }
    SmallVector<RMSNormGradOp> normGrads;
    module.walk([&](RMSNormGradOp g) { normGrads.push_back(g); });
    for (RMSNormGradOp grad : normGrads) {
      NormCandidate c = matchNorm(grad);
      if (!c.clone)
        continue;
      for (LinearGradOp linear : c.linears)
        splitInputGrad(b, linear);
      b.setInsertionPoint(grad);
      auto rebuilt = RMSNormGradRebuildOp::create(
          b, grad.getLoc(), grad.getInputGrad().getType(),
          c.clone.getResult().getType(), grad.getInput(), grad.getWeight(),
          c.forward.getRstd(), grad.getResultGrad(), grad.getZeroCenteredAttr(),
          grad.getWeightGradAttr(), grad.getScope());
      for (LinearGradOp linear : c.linears)
        LinearGradOp::create(b, linear.getLoc(), /*input_grad=*/Type(),
                             rebuilt.getOutput(), linear.getWeight(),
                             linear.getResultGrad(), linear.getWeightGradAttr(),
                             linear.getScope());
      grad.getInputGrad().replaceAllUsesWith(rebuilt.getInputGrad());
      // The forward's rstd is read in backward again: kept (a float a row).
      recordPlacement(c.forward, 1, "keep: read by the fused recompute");
      remarkFused(c.clone, "train.rms_norm_grad_rebuild");
      grad.erase();
      for (LinearGradOp linear : c.linears)
        linear.erase();
      c.clone.erase();
      ++fused;
    }
    if (!fused)
      markAllAnalysesPreserved();
  }
};
} // namespace
