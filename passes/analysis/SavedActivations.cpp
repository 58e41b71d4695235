//===- SavedActivations.cpp - values crossing forward -> backward ---------===//

#include "passes/analysis/SavedActivations.h"
#include "passes/analysis/GraphSummary.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace ap::train;

Scope Scope::of(Operation *op) {
  if (!op)
    return {-1, "inputs"};
  if (auto attr = op->getAttrOfType<ScopeAttr>("scope"))
    return {attr.getLayer(), attr.getModule().str()};
  return {-1, op->getName().getStringRef().str()};
}

std::string Scope::str() const {
  if (layer < 0)
    return "model." + leaf;
  return "L" + std::to_string(layer) + "." + leaf;
}

bool SavedActivations::isBackwardOp(Operation *op) {
  // A discardable attribute: looked up without asking the op's inherent
  // ones by name (this runs for every op of every placed clone).
  if (op->getDiscardableAttr(kRecomputedAttrName) || isa<ReloadOp, WaitOp>(op))
    return true;
  // A pipeline stage's backward starts with the gradient of its output.
  if (auto recv = dyn_cast<PipelineRecvOp>(op))
    return recv.getPeer() == PipelinePeer::Next;
  return isa<EmbeddingGradOp, LinearGradOp, LinearInputGradOp, RMSNormGradOp,
             RMSNormGradRebuildOp, GatedRMSNormGradOp, L2NormGradOp,
             ShortConvGradOp, GDNGatesGradOp, GatedDeltaRuleGradOp, RoPEGradOp,
             AttentionGradOp, OutputGateGradOp, SwiGLUGradOp, SliceGradOp,
             ExpandGradOp, LMHeadCrossEntropyGradOp,
             LMHeadCrossEntropyWithGradOp>(op);
}

Block *SavedActivations::findBody(ModuleOp module) {
  Block *found = nullptr;
  // Pre-order: the loop is found before its body is walked.
  module->walk<WalkOrder::PreOrder>([&](MicrobatchLoopOp loop) {
    found = &loop.getBody().front();
    return WalkResult::interrupt();
  });
  return found;
}

Block *SavedActivations::findBodyOrEmitError(ModuleOp module) {
  Block *found = findBody(module);
  if (!found)
    module.emitError() << "no train.microbatch_loop: run train-autodiff "
                          "first (placement works on the training step it "
                          "builds)";
  return found;
}

SavedActivations::SavedActivations(ModuleOp module) {
  body = findBodyOrEmitError(module);
  if (body)
    analyse();
}

SavedActivations::SavedActivations(Block &b) : body(&b) { analyse(); }

SavedActivations SavedActivations::orderOnly(ModuleOp module) {
  SavedActivations s;
  s.body = findBodyOrEmitError(module);
  if (s.body)
    s.analyse(/*listValues=*/false);
  return s;
}

void SavedActivations::analyse(bool listValues) {
  size_t numOps = body->getOperations().size();
  order.reserve(numOps);
  index.reserve(numOps);
  for (Operation &op : *body) {
    index[&op] = order.size();
    order.push_back(&op);
  }
  // Backward starts at the first backward op; everything that depends on
  // a backward value is backward too, so the boundary is the first one.
  bwdStart = order.size();
  for (auto [i, op] : llvm::enumerate(order))
    if (isBackwardOp(op)) {
      bwdStart = i;
      break;
    }
  if (!listValues)
    return;

  auto consider = [&](Value v, Operation *producer, int64_t defIndex) {
    auto type = dyn_cast<RankedTensorType>(v.getType());
    if (!type || (producer && isa<ParamRefOp>(producer)))
      return;
    SavedActivation s;
    s.value = v;
    s.producer = producer;
    s.defIndex = defIndex;
    for (Operation *user : v.getUsers()) {
      // Uses inside nested regions count at their top-level op.
      Operation *top = body->findAncestorOpInBlock(*user);
      int64_t at = index.lookup(top);
      if (at < bwdStart || isa<YieldOp>(top))
        continue;
      s.firstUse = s.firstUse < 0 ? at : std::min(s.firstUse, at);
      s.lastUse = std::max(s.lastUse, at);
      // Reloads and waits read on behalf of the op that consumes them.
      Scope needer = Scope::of(top);
      if (isa<OffloadOp>(top))
        continue;
      if (!llvm::is_contained(s.neededBy, needer))
        s.neededBy.push_back(needer);
    }
    if (s.firstUse < 0 || s.neededBy.empty())
      return;
    // Only for the values kept: most forward results are not.
    s.scope = Scope::of(producer);
    s.bytes = tensorBytes(type);
    llvm::sort(s.neededBy);
    saved.push_back(std::move(s));
  };
  for (BlockArgument arg : body->getArguments())
    consider(arg, nullptr, -1);
  for (int64_t i = 0; i < bwdStart; ++i)
    for (Value r : order[i]->getResults())
      consider(r, order[i], i);
}

int64_t SavedActivations::totalBytes() const {
  int64_t total = 0;
  for (const SavedActivation &s : saved)
    total += s.bytes;
  return total;
}
