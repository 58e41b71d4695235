//===- PrefetchAnchors.cpp - train-prefetch-anchors -----------------------===//
//
// Moves each train.reload right after its prefetch anchor. Cost-model mode
// picks the latest anchor whose simulated H2D still ends before compute
// reaches the wait (least memory held while the copy stays hidden); with
// prefetch-depth=N the reference design's rule is used instead.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/CostModel.h"
#include "passes/analysis/GraphSummary.h"
#include "passes/analysis/PlacementConfig.h"
#include "passes/analysis/PrefetchPlanner.h"

#include "llvm/ADT/DenseMap.h"

#include <map>

namespace ap {
#define GEN_PASS_DEF_TRAINPREFETCHANCHORS
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {
struct TrainPrefetchAnchorsPass
    : ap::impl::TrainPrefetchAnchorsBase<TrainPrefetchAnchorsPass> {
  using Base::Base;
  void runOnOperation() override;
};

void TrainPrefetchAnchorsPass::runOnOperation() {
  ModuleOp module = getOperation();
  PlacementConfig cfg = AP_PLACEMENT_CONFIG();
  if (failed(cfg.validate([&] { return module.emitError(); })))
    return signalPassFailure();
  Block *body = SavedActivations::findBodyOrEmitError(module);
  if (!body)
    return signalPassFailure();
  FailureOr<CostModel> costModel = cfg.costModel(module);
  if (failed(costModel))
    return signalPassFailure();
  const CostModel &costs = *costModel;
  // Without reloads there is nothing to move: no timeline to cost (the
  // placement search runs this pass on thousands of clones, many of them
  // with nothing offloaded).
  if (llvm::none_of(*body, [](Operation &op) { return isa<ReloadOp>(op); }))
    return markAllAnalysesPreserved();

  // Compute timeline of the body without stalls.
  SmallVector<Operation *> ops;
  llvm::DenseMap<Operation *, int64_t> index;
  SmallVector<double> end;
  size_t numOps = body->getOperations().size();
  ops.reserve(numOps);
  index.reserve(numOps);
  end.reserve(numOps);
  double now = 0;
  int64_t bwdStart = -1;
  for (Operation &op : *body) {
    index[&op] = ops.size();
    ops.push_back(&op);
    end.push_back(now += costs.cost(&op).seconds);
    bool isAnchorCandidate =
        SavedActivations::isBackwardOp(&op) && !isa<ReloadOp, WaitOp>(op);
    if (bwdStart < 0 && isAnchorCandidate)
      bwdStart = ops.size() - 1;
  }
  if (bwdStart < 0)
    return markAllAnalysesPreserved();
  auto isAnchor = [&](int64_t i) {
    return i >= bwdStart && !isa<ReloadOp, WaitOp>(ops[i]);
  };

  // D2H queue in forward order gives when each offload's bytes are on host.
  llvm::DenseMap<Operation *, double> d2hEnd;
  std::map<std::string, int64_t> scopeFirstOffload;
  SmallVector<std::string> offloadedScopes;
  double d2hFree = 0;
  for (auto [i, op] : llvm::enumerate(ops)) {
    auto offload = dyn_cast<OffloadOp>(op);
    if (!offload)
      continue;
    int64_t bytes = tensorBytes(offload.getInput().getType());
    double start = std::max(end[i], d2hFree);
    d2hFree =
        start + costs.copySeconds(bytes, CopyDirection::DeviceToHost, false);
    d2hEnd[op] = d2hFree;
    std::string key = Scope::of(op).str();
    if (scopeFirstOffload.emplace(key, i).second)
      offloadedScopes.push_back(key);
  }

  struct Reload {
    ReloadOp op;
    int64_t waitIndex;
    int64_t bytes;
    double ready; // its D2H end
  };
  SmallVector<Reload> reloads;
  for (Operation *op : ops)
    if (auto reload = dyn_cast<ReloadOp>(op)) {
      Operation *wait = *reload.getResult().getUsers().begin();
      reloads.push_back({reload, index[wait],
                         tensorBytes(reload.getResult().getType()),
                         d2hEnd.lookup(reload.getHost().getDefiningOp())});
    }
  llvm::sort(reloads, [](const Reload &a, const Reload &b) {
    return a.waitIndex < b.waitIndex;
  });

  SmallVector<std::pair<ReloadOp, Operation *>> moves;
  if (cfg.prefetchDepth > 0) {
    for (const Reload &r : reloads) {
      // The reference rule: issue when the backward of the N-th later
      // offloaded scope has produced its input gradient (its last op).
      std::string scope = Scope::of(r.op).str();
      auto pos = llvm::find(offloadedScopes, scope) - offloadedScopes.begin();
      int64_t target = pos + cfg.prefetchDepth;
      int64_t anchor = -1;
      if (target < static_cast<int64_t>(offloadedScopes.size())) {
        const std::string &later = offloadedScopes[target];
        for (int64_t i = r.waitIndex - 1; i >= bwdStart && anchor < 0; --i)
          if (isAnchor(i) && Scope::of(ops[i]).str() == later)
            anchor = i;
      }
      if (anchor < 0 && bwdStart < r.waitIndex)
        anchor = bwdStart;
      // No backward op before the wait (the first backward op reads the
      // value): the reload stays where the offload pass put it.
      if (anchor >= 0)
        moves.push_back({r.op, ops[anchor]});
    }
  } else {
    SmallVector<ReloadRequest> requests;
    for (const Reload &r : reloads)
      requests.push_back(
          {r.waitIndex, r.ready,
           costs.copySeconds(r.bytes, CopyDirection::HostToDevice, false)});
    SmallVector<ReloadPlan> plans =
        planReloads(end, bwdStart, isAnchor, requests);
    for (auto [r, plan] : llvm::zip(reloads, plans))
      if (plan.anchor >= 0)
        moves.push_back({r.op, ops[plan.anchor]});
  }
  for (auto [reload, anchor] : moves)
    reload->moveAfter(anchor);
}
} // namespace
