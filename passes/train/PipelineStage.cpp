//===- PipelineStage.cpp - train-pipeline-stage ---------------------------===//
//
// Applies PipelineStages: keeps one stage of the step, with sends and
// receives where its values cross to a neighbour.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/PipelineStages.h"
#include "passes/analysis/SavedActivations.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

namespace ap {
#define GEN_PASS_DEF_TRAINPIPELINESTAGE
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {
struct TrainPipelineStagePass
    : ap::impl::TrainPipelineStageBase<TrainPipelineStagePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // A module that already is this stage (the placement search plans a
    // stage it cut out before) is left as it is.
    if (auto kept =
            module->getAttrOfType<IntegerAttr>(kPipelineStageAttrName)) {
      auto of = module->getAttrOfType<IntegerAttr>(kPipelineStagesAttrName);
      if (kept.getInt() == stage && of && of.getInt() == stages)
        return markAllAnalysesPreserved();
      module.emitError() << "train-pipeline-stage: the module already is "
                         << "stage " << kept.getInt() << " of "
                         << (of ? of.getInt() : 0) << "; asked for stage "
                         << int64_t(stage) << " of " << int64_t(stages);
      return signalPassFailure();
    }
    MicrobatchLoopOp loop;
    module.walk([&](MicrobatchLoopOp l) { loop = l; });
    if (!loop) {
      module.emitError("train-pipeline-stage: no train.microbatch_loop (run "
                       "train-autodiff first)");
      return signalPassFailure();
    }
    if (stage < 0 || stage >= stages) {
      module.emitError() << "train-pipeline-stage: stage " << int64_t(stage)
                         << " of " << int64_t(stages)
                         << " (expected 0 to stages - 1)";
      return signalPassFailure();
    }
    SmallVector<int64_t> perStage(layers.begin(), layers.end());
    if (balance == StageBalance::Cost) {
      if (!perStage.empty()) {
        module.emitError() << "--pipeline-balance=cost chooses the layers per "
                              "stage; --pipeline-stages gives them: pass one "
                              "of the two";
        return signalPassFailure();
      }
      FailureOr<CostModel> cost = CostModel::fromProfile(profile, module);
      if (failed(cost))
        return signalPassFailure();
      FailureOr<SmallVector<int64_t>> split =
          PipelineStages::balanceByCost(loop, stages, *cost);
      if (failed(split))
        return signalPassFailure();
      perStage = *split;
    }
    FailureOr<PipelineStages> plan =
        PipelineStages::assign(loop, stages, perStage);
    if (failed(plan))
      return signalPassFailure();
    numLayers = plan->firstLayer[stage + 1] - plan->firstLayer[stage];
    int64_t micro = loop.getTokens().getType().getDimSize(0);
    if (micro < stages) {
      loop.emitError() << "--micro-batches=" << micro
                       << " is smaller than --pipeline-parallel="
                       << int64_t(stages)
                       << ": every stage needs a microbatch in flight (use at "
                          "least as many microbatches as stages)";
      return signalPassFailure();
    }
    const int self = int(stage);
    const int last = int(stages) - 1;
    Block &body = loop.getBody().front();
    OpBuilder b(module.getContext());

    // Which stages hold each parameter (read it, or accumulate its grad):
    // one held by another stage too is tied across stages.
    llvm::StringMap<llvm::SmallSetVector<int, 2>> holders;
    for (Operation &op : body) {
      if (auto ref = dyn_cast<ParamRefOp>(op)) {
        for (Operation *user : ref->getUsers())
          holders[ref.getParam()].insert(
              plan->stageOf.lookup(body.findAncestorOpInBlock(*user)));
        continue;
      }
      for (NamedAttribute a : op.getAttrs())
        if (auto sym = dyn_cast<FlatSymbolRefAttr>(a.getValue()))
          if (a.getName().getValue().ends_with("_grad"))
            holders[sym.getValue()].insert(plan->stageOf.lookup(&op));
    }
    SmallVector<Attribute> tied;
    for (ParamOp p : module.getOps<ParamOp>()) {
      auto it = holders.find(p.getSymName());
      if (it != holders.end() && it->second.size() > 1 &&
          it->second.contains(self))
        tied.push_back(b.getStringAttr(p.getSymName()));
    }

    // The stage's first backward op: where the gradients of its outputs
    // are received (nothing of its backward can start before them).
    Operation *backwardStart = nullptr;
    for (Operation &op : body)
      if (plan->stageOf.lookup(&op) == self && !isa<ParamRefOp>(op) &&
          SavedActivations::isBackwardOp(&op)) {
        backwardStart = &op;
        break;
      }

    // Sends go right after their producer, in channel order (crossings are
    // numbered in body order). Receives from one neighbour all go where the
    // first of them is needed (forward inputs: their first use; gradients:
    // the start of the stage's backward), in channel order, so each side
    // of a boundary issues its messages in the same order.
    struct Recv {
      const PipelineStages::Crossing *crossing;
      SmallVector<OpOperand *> uses;
    };
    SmallVector<Recv> recvs[2]; // by peer: prev, next
    Operation *recvAt[2] = {nullptr, nullptr};
    for (const PipelineStages::Crossing &c : plan->crossings) {
      const bool forward = c.to > c.from;
      if (c.from == self) {
        b.setInsertionPointAfterValue(c.value);
        PipelineSendOp::create(
            b, c.value.getLoc(), c.value,
            forward ? PipelinePeer::Next : PipelinePeer::Prev, c.channel);
        ++numSends;
        continue;
      }
      if (c.to != self)
        continue;
      Recv r{&c, {}};
      Operation *first = nullptr;
      for (OpOperand &use : c.value.getUses()) {
        Operation *top = body.findAncestorOpInBlock(*use.getOwner());
        if (plan->stageOf.lookup(top) != self)
          continue;
        r.uses.push_back(&use);
        if (!first || top->isBeforeInBlock(first))
          first = top;
      }
      if (!forward && backwardStart && backwardStart->isBeforeInBlock(first))
        first = backwardStart;
      int peer = forward ? 0 : 1;
      if (!recvAt[peer] || first->isBeforeInBlock(recvAt[peer]))
        recvAt[peer] = first;
      recvs[peer].push_back(std::move(r));
    }
    for (int peer = 0; peer < 2; ++peer)
      for (Recv &r : recvs[peer]) {
        Value v = r.crossing->value;
        b.setInsertionPoint(recvAt[peer]);
        auto recv = PipelineRecvOp::create(
            b, v.getLoc(), cast<RankedTensorType>(v.getType()),
            peer == 0 ? PipelinePeer::Prev : PipelinePeer::Next,
            r.crossing->channel);
        for (OpOperand *use : r.uses)
          use->set(recv.getResult());
        ++numRecvs;
      }

    // Document starts (packed sequences) made on another stage are made
    // again here from this stage's tokens, before their first use: the
    // analysis counts them as no crossing (PipelineStages.h).
    for (Operation &op : llvm::make_early_inc_range(body)) {
      auto starts = dyn_cast<DocStartsOp>(op);
      if (!starts || plan->stageOf.lookup(&op) == self)
        continue;
      SmallVector<OpOperand *> uses;
      Operation *first = nullptr;
      for (OpOperand &use : starts.getResult().getUses()) {
        Operation *top = body.findAncestorOpInBlock(*use.getOwner());
        if (plan->stageOf.lookup(top) != self)
          continue;
        uses.push_back(&use);
        if (!first || top->isBeforeInBlock(first))
          first = top;
      }
      if (uses.empty())
        continue;
      b.setInsertionPoint(first);
      Operation *copy = b.clone(op);
      plan->stageOf[copy] = self;
      for (OpOperand *use : uses)
        use->set(copy->getResult(0));
    }

    // Drop the other stages' ops (users first), then unused parameter reads.
    SmallVector<Operation *> drop;
    for (Operation &op : body)
      if (!isa<ParamRefOp, PipelineSendOp, PipelineRecvOp>(op) &&
          plan->stageOf.lookup(&op) != self)
        drop.push_back(&op);
    YieldOp yield = cast<YieldOp>(body.getTerminator());
    if (self != last) {
      // No loss on this stage: the loop's results are summed over stages
      // by the step.
      b.setInsertionPoint(yield);
      YieldOp::create(b, yield.getLoc(), ValueRange{});
    }
    for (Operation *op : llvm::reverse(drop)) {
      op->dropAllUses();
      op->erase();
      ++numErased;
    }
    for (Operation &op : llvm::make_early_inc_range(body))
      if (isa<ParamRefOp>(op) && op.use_empty())
        op.erase();

    // Parameters the stage reads or accumulates gradients into.
    llvm::StringSet<> used;
    body.walk([&](Operation *op) {
      if (auto ref = dyn_cast<ParamRefOp>(op))
        used.insert(ref.getParam());
      for (NamedAttribute a : op->getAttrs())
        if (auto sym = dyn_cast<FlatSymbolRefAttr>(a.getValue()))
          if (a.getName().getValue().ends_with("_grad"))
            used.insert(sym.getValue());
    });
    module.walk([&](AdamWOp adam) {
      if (!used.contains(adam.getParam()))
        adam.erase();
    });
    for (ParamOp p : llvm::make_early_inc_range(module.getOps<ParamOp>()))
      if (!used.contains(p.getSymName()))
        p.erase();

    module->setAttr(kPipelineStagesAttrName, b.getI64IntegerAttr(stages));
    module->setAttr(kPipelineStageAttrName, b.getI64IntegerAttr(stage));
    if (!tied.empty())
      module->setAttr(kPipelineTiedAttrName, b.getArrayAttr(tied));
    module->setAttr(kPipelineLayersAttrName,
                    b.getDenseI64ArrayAttr(
                        {plan->firstLayer[self], plan->firstLayer[self + 1]}));
  }
};
} // namespace
