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
// and a recomputed RMSNorm or gated RMSNorm (the projections' input, maybe
// through a reshape) is written by train.rms_norm_grad_rebuild or by
// train.gated_rms_norm_grad's output, from the forward's saved rstd (a float
// per row, kept again), followed by the projections' dW.
// dx never read y, and dW is the same GEMM on the same bits (the backward
// kernels write the forward's expression, kernels/dense.h), so results do
// not change. y costs one store in a kernel that runs anyway instead of a
// launch that reads its inputs a second time.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/PlacementConfig.h"

#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Remarks.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/TypeSwitch.h"

namespace ap {
#define GEN_PASS_DEF_TRAINFUSERECOMPUTE
#include "passes/train/TrainPasses.h.inc"
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
  // The forward op reads the clone's operands, so it is among the users of
  // the first; the earliest match in the block wins (as a scan of the block
  // from the top would find) without scanning the block per clone: the
  // placement search runs this pass on thousands of clones.
  if (clone->getNumOperands() == 0)
    return {};
  OpT found;
  for (Operation *user : clone->getOperand(0).getUsers()) {
    auto op = dyn_cast<OpT>(user);
    if (!op || op == clone || op->getBlock() != clone->getBlock() ||
        op->hasAttr(kRecomputedAttrName) ||
        !llvm::equal(op->getOperands(), clone->getOperands()))
      continue;
    bool same = llvm::all_of(clone->getAttrs(), [&](NamedAttribute a) {
      return a.getName() == kRecomputedAttrName ||
             a.getName() == kPlacementAttrName ||
             op->getAttr(a.getName()) == a.getValue();
    });
    if (same && (!found || op->isBeforeInBlock(found)))
      found = op;
  }
  return found;
}

/// A reader of a recomputed norm's output: the weight gradient of a linear,
/// directly or through a recomputed reshape (the gated norm's [.., H, d] to
/// the out projection's [.., H d]).
struct Reader {
  ReshapeOp view;
  LinearGradOp linear;
};

/// The readers of `y`, all before `grad`; false when anything else reads it
/// (or a frozen projection, whose backward would keep reading y without a
/// dW to move).
bool linearReaders(Value y, Operation *grad, SmallVector<Reader> &out) {
  auto weightGradOf = [&](Operation *user, Value x) {
    auto linear = dyn_cast<LinearGradOp>(user);
    if (!linear || linear.getInput() != x || !linear.getWeightGradAttr() ||
        !linear->isBeforeInBlock(grad))
      return LinearGradOp();
    return linear;
  };
  for (Operation *user : y.getUsers()) {
    auto view = dyn_cast<ReshapeOp>(user);
    if (view && view->hasAttr(kRecomputedAttrName)) {
      for (Operation *u : view.getResult().getUsers()) {
        LinearGradOp linear = weightGradOf(u, view.getResult());
        if (!linear)
          return false;
        out.push_back({view, linear});
      }
      continue;
    }
    LinearGradOp linear = weightGradOf(user, y);
    if (!linear)
      return false;
    out.push_back({ReshapeOp(), linear});
  }
  return !out.empty();
}

/// The readers' weight gradients from the rebuilt output, at the builder's
/// point (right after the backward that writes it), views rebuilt as well.
void buildWeightGrads(OpBuilder &b, Value rebuilt, ArrayRef<Reader> readers) {
  llvm::DenseMap<Operation *, Value> views;
  for (Reader r : readers) {
    Value x = rebuilt;
    if (r.view) {
      Value &v = views[r.view];
      if (!v) {
        IRMapping map;
        map.map(r.view.getInput(), rebuilt);
        Operation *view = b.clone(*r.view, map);
        view->removeAttr(kRecomputedAttrName);
        v = view->getResult(0);
      }
      x = v;
    }
    LinearGradOp::create(b, r.linear.getLoc(), /*input_grad=*/Type(), x,
                         r.linear.getWeight(), r.linear.getResultGrad(),
                         r.linear.getWeightGradAttr(), r.linear.getScope());
  }
}

/// Erases the readers' linear backwards, then their views.
void eraseReaders(ArrayRef<Reader> readers) {
  llvm::SetVector<Operation *> views;
  for (Reader r : readers) {
    r.linear.erase();
    if (r.view)
      views.insert(r.view);
  }
  for (Operation *view : views)
    view->erase();
}

/// A recomputed RMSNorm (attn_norm, mlp_norm) or gated RMSNorm
/// (gdn_norm_out) that only weight gradients read and whose rstd only its
/// backward reads. The backward gets the forward's saved rstd (a float per
/// row) and writes y; the weight gradients follow it.
template <typename NormOp, typename GradOp> struct NormCandidate {
  NormOp clone, forward;
  SmallVector<Reader> readers;
};

template <typename NormOp, typename GradOp>
NormCandidate<NormOp, GradOp> matchNorm(GradOp grad) {
  auto clone = grad.getRstd().template getDefiningOp<NormOp>();
  if (!clone || !clone->hasAttr(kRecomputedAttrName) ||
      !clone.getRstd().hasOneUse() ||
      !llvm::equal(clone->getOperands(),
                   grad->getOperands().take_front(clone->getNumOperands())))
    return {};
  NormCandidate<NormOp, GradOp> c{clone, forwardOf(clone), {}};
  if (!c.forward || !c.forward.getRstd() ||
      !linearReaders(clone.getResult(), grad, c.readers))
    return {};
  return c;
}

/// Replaces the dx half of `linear` by a train.linear_input_grad in its
/// place (when it has one); the caller builds the dW half and erases it.
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
  if (!UnrecordedPlacements::recording())
    return;
  std::string scope = Scope::of(clone).str();
  remark::passed(clone->getLoc(), remark::RemarkOpts::name("fuse-recompute")
                                      .category("actplace-placement")
                                      .subCategory(scope))
      << ("recomputed " + clone->getName().getStringRef() + " of " + scope +
          " inside its " + what +
          "; the weight gradients of the linears that read it follow it")
             .str();
}

/// The common end of a norm fusion: the forward's rstd is read in backward
/// again (kept: a float a row), the remark, and the replaced ops erased.
void finish(Operation *grad, Operation *clone, Operation *forward,
            ArrayRef<Reader> readers, StringRef what) {
  recordPlacement(forward, 1, "keep: read by the fused recompute");
  remarkFused(clone, what);
  grad->erase();
  eraseReaders(readers);
  clone->erase();
}

/// The SwiGLU case: `grad`'s dy comes from the linear backward reading the
/// clone. Returns whether it fused.
bool fuseSwiGLU(OpBuilder &b, SwiGLUGradOp grad) {
  Candidate c = match(grad);
  if (!c.act)
    return false;
  LinearGradOp linear = c.linear;
  splitInputGrad(b, linear);
  b.setInsertionPoint(grad);
  // Without a weight gradient (frozen) nothing reads the activation.
  bool needsAct = static_cast<bool>(linear.getWeightGradAttr());
  auto rebuilt = SwiGLUGradOp::create(
      b, grad.getLoc(), grad.getGateGrad().getType(),
      grad.getUpGrad().getType(), needsAct ? c.act.getType() : Type(),
      grad.getGate(), grad.getUp(), grad.getResultGrad(), grad.getScope());
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
  return true;
}

/// The RMSNorm case: its backward has an optional dx, so the rebuilding
/// form is an op of its own. Returns whether it fused.
bool fuseRMSNorm(OpBuilder &b, RMSNormGradOp grad) {
  if (!grad.getInputGrad())
    return false;
  auto c = matchNorm<RMSNormOp>(grad);
  if (!c.clone)
    return false;
  for (Reader r : c.readers)
    splitInputGrad(b, r.linear);
  b.setInsertionPoint(grad);
  auto rebuilt = RMSNormGradRebuildOp::create(
      b, grad.getLoc(), grad.getInputGrad().getType(),
      c.clone.getResult().getType(), grad.getInput(), grad.getWeight(),
      c.forward.getRstd(), grad.getResultGrad(), grad.getZeroCenteredAttr(),
      grad.getWeightGradAttr(), grad.getScope());
  buildWeightGrads(b, rebuilt.getOutput(), c.readers);
  grad.getInputGrad().replaceAllUsesWith(rebuilt.getInputGrad());
  finish(grad, c.clone, c.forward, c.readers, "train.rms_norm_grad_rebuild");
  return true;
}

/// The gated RMSNorm case: its backward takes the output as an optional
/// third result. Returns whether it fused.
bool fuseGatedNorm(OpBuilder &b, GatedRMSNormGradOp grad) {
  if (grad.getOutput())
    return false;
  auto c = matchNorm<GatedRMSNormOp>(grad);
  if (!c.clone)
    return false;
  for (Reader r : c.readers)
    splitInputGrad(b, r.linear);
  b.setInsertionPoint(grad);
  auto rebuilt = GatedRMSNormGradOp::create(
      b, grad.getLoc(), grad.getInputGrad().getType(),
      grad.getGateGrad().getType(), c.clone.getResult().getType(),
      grad.getInput(), grad.getGate(), grad.getWeight(), c.forward.getRstd(),
      grad.getResultGrad(), grad.getWeightGradAttr(), grad.getScope());
  buildWeightGrads(b, rebuilt.getOutput(), c.readers);
  grad.getInputGrad().replaceAllUsesWith(rebuilt.getInputGrad());
  grad.getGateGrad().replaceAllUsesWith(rebuilt.getGateGrad());
  finish(grad, c.clone, c.forward, c.readers, "train.gated_rms_norm_grad");
  return true;
}

struct TrainFuseRecomputePass
    : ap::impl::TrainFuseRecomputeBase<TrainFuseRecomputePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (!fuseRecompute)
      return markAllAnalysesPreserved();
    // Collected first: each fusion erases the op it visits.
    SmallVector<Operation *> grads;
    module.walk([&](Operation *op) {
      if (isa<SwiGLUGradOp, RMSNormGradOp, GatedRMSNormGradOp>(op))
        grads.push_back(op);
    });
    OpBuilder b(&getContext());
    bool fused = false;
    for (Operation *op : grads)
      fused |=
          llvm::TypeSwitch<Operation *, bool>(op)
              .Case([&](SwiGLUGradOp g) { return fuseSwiGLU(b, g); })
              .Case([&](RMSNormGradOp g) { return fuseRMSNorm(b, g); })
              .Case([&](GatedRMSNormGradOp g) { return fuseGatedNorm(b, g); })
              .Default([](Operation *) { return false; });
    if (!fused)
      markAllAnalysesPreserved();
  }
};
} // namespace
