//===- Recompute.cpp - train-recompute ------------------------------------===//
//
// Drops the saved activations of the selected scopes by cloning their forward
// ops into backward. Clones are built from the values the original ops read:
// those stay saved (kept, or offloaded later) unless their producer is
// recomputed too, in which case its clone is used. The same kernels on the
// same inputs give the same bits, so results do not change.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/PlacementConfig.h"

#include "mlir/IR/IRMapping.h"
#include "mlir/IR/Remarks.h"
#include "llvm/ADT/DenseMap.h"

namespace ap {
#define GEN_PASS_DEF_TRAINRECOMPUTE
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {
struct TrainRecomputePass : ap::impl::TrainRecomputeBase<TrainRecomputePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    PlacementConfig cfg = AP_PLACEMENT_CONFIG();
    if (failed(cfg.validate([&] { return module.emitError(); })))
      return signalPassFailure();
    if (cfg.recomputeLeaves.empty())
      return markAllAnalysesPreserved();
    SavedActivations saved = SavedActivations::orderOnly(module);
    if (!saved.valid())
      return signalPassFailure();

    int64_t bwdStart = saved.backwardStart();
    // Forward compute ops only: a value that already went through
    // train.offload / reload / wait (a step placed before) stays as placed;
    // cloning the copy ops would put a reload before its offload.
    auto isForward = [&](Operation *op) {
      return op && op->getBlock() == saved.getBody() &&
             saved.indexOf(op) < bwdStart &&
             !isa<ParamRefOp, OffloadOp, ReloadOp, WaitOp>(op);
    };
    // Asked for every operand of every backward op: answered once per
    // producer (the pass erases nothing, so no op takes another's place).
    llvm::DenseMap<Operation *, bool> selectedOps;
    auto selected = [&](Operation *op) {
      auto [it, inserted] = selectedOps.try_emplace(op, false);
      if (inserted)
        it->second = isForward(op) && cfg.isRecomputed(op);
      return it->second;
    };
    llvm::DenseMap<Operation *, Operation *> clones;
    OpBuilder b(&getContext());

    // Clones `op` (and recomputed producers of its operands) before `before`.
    std::function<Operation *(Operation *, Operation *)> recompute =
        [&](Operation *op, Operation *before) -> Operation * {
      if (Operation *c = clones.lookup(op))
        return c;
      IRMapping mapping;
      for (Value operand : op->getOperands()) {
        Operation *producer = operand.getDefiningOp();
        if (selected(producer))
          mapping.map(
              operand,
              recompute(producer, before)
                  ->getResult(cast<OpResult>(operand).getResultNumber()));
      }
      b.setInsertionPoint(before);
      Operation *clone = b.clone(*op, mapping);
      clone->setAttr(kRecomputedAttrName, b.getUnitAttr());
      clones[op] = clone;
      return clone;
    };

    SmallVector<Operation *> backward(saved.ops().begin() + bwdStart,
                                      saved.ops().end());
    for (Operation *user : backward)
      for (OpOperand &use : user->getOpOperands()) {
        Operation *producer = use.get().getDefiningOp();
        if (!selected(producer))
          continue;
        Operation *clone = recompute(producer, user);
        unsigned resultIndex = cast<OpResult>(use.get()).getResultNumber();
        recordPlacement(producer, resultIndex, "recompute");
        use.set(clone->getResult(resultIndex));
      }

    if (!UnrecordedPlacements::recording())
      return;
    for (auto [orig, clone] : clones) {
      Scope scope = Scope::of(orig);

      remark::passed(orig->getLoc(), remark::RemarkOpts::name("recompute")
                                         .category("actplace-placement")
                                         .subCategory(scope.str()))
          << ("recomputed " + orig->getName().getStringRef() + " of " +
              scope.str() + " before its first backward use")
                 .str();
    }
  }
};
} // namespace
