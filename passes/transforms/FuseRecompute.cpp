//===- FuseRecompute.cpp - train-fuse-recompute ---------------------------===//
//
// A recomputed SwiGLU is read by one op in backward: the weight gradient of
// the linear after it (dW += dy^T act). Its clone reads gate and up, then
// the SwiGLU backward reads them again right after. Splitting the linear
// backward lets the SwiGLU backward write the activation itself:
//
//   %act = train.swiglu %g, %u {train.recomputed}
//   %da  = train.linear_grad %act, %w, %dy {weight_grad = @w}
//   %dg, %du = train.swiglu_grad %g, %u, %da
// becomes
//   %da  = train.linear_input_grad %w, %dy
//   %dg, %du, %act = train.swiglu_grad %g, %u, %da
//   train.linear_grad %act, %w, %dy {weight_grad = @w}
//
// dx never read x, and dW is the same GEMM on the same bits (the backward
// kernel writes the forward's expression, kernels/dense.h), so results do
// not change. The activation costs one write in a kernel that runs anyway
// instead of a launch that reads two tensors of its size.
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
      b.setInsertionPoint(linear);
      Value dx = LinearInputGradOp::create(
          b, linear.getLoc(), linear.getInputGrad().getType(),
          linear.getWeight(), linear.getResultGrad(), linear.getScope());
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
      Location actLoc = c.act.getLoc();
      std::string scope = Scope::of(c.act).str();
      c.act.erase();
      remark::passed(actLoc, remark::RemarkOpts::name("fuse-recompute")
                                 .category("actplace-placement")
                                 .subCategory(scope))
          << ("recomputed train.swiglu of " + scope +
              " inside its train.swiglu_grad; the weight gradient of the "
              "next linear follows it");
      ++fused;
    }
    if (!fused)
      markAllAnalysesPreserved();
  }
};
} // namespace
