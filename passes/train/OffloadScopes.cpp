//===- OffloadScopes.cpp - train-offload-scopes ---------------------------===//
//
// Applies docs/architecture.md section 4's offload rules. Decisions are
// recorded on the producing op (`train.placement`, one string per result) for
// the report and emitted as remarks.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/CostModel.h"
#include "passes/analysis/PlacementConfig.h"
#include "passes/analysis/PrefetchPlanner.h"

#include "mlir/IR/Remarks.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <map>

namespace ap {
#define GEN_PASS_DEF_TRAINOFFLOADSCOPES
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {

struct TrainOffloadScopesPass
    : ap::impl::TrainOffloadScopesBase<TrainOffloadScopesPass> {
  using Base::Base;
  void runOnOperation() override;
};

bool isOffloadable(const SavedActivation &s) {
  auto type = cast<RankedTensorType>(s.value.getType());
  return s.producer && isa<FloatType>(type.getElementType());
}

/// The scopes that decide where a saved value lives: the scopes whose
/// backward reads it, except recomputed ones (their clones read it before
/// their own backward, so it may leave and come back before them). When only
/// recomputed scopes read it, it exists to feed recomputation and follows
/// the scope that produced it. A value leaves the device when all its
/// owners are offloaded.
SmallVector<Scope> ownersOf(const SavedActivation &s,
                            const PlacementConfig &cfg) {
  SmallVector<Scope> owners;
  for (const Scope &n : s.neededBy)
    if (!cfg.recomputeLeaves.count(n.leaf))
      owners.push_back(n);
  if (owners.empty())
    owners.push_back(s.scope);
  return owners;
}

bool allIn(ArrayRef<Scope> owners, const std::set<Scope> &chosen) {
  return llvm::all_of(owners, [&](const Scope &n) { return chosen.count(n); });
}

void TrainOffloadScopesPass::runOnOperation() {
  ModuleOp module = getOperation();
  PlacementConfig cfg = AP_PLACEMENT_CONFIG();
  if (failed(cfg.validate([&] { return module.emitError(); })))
    return signalPassFailure();
  if (!cfg.offloading())
    return markAllAnalysesPreserved();
  SavedActivations saved(module);
  if (!saved.valid())
    return signalPassFailure();

  FailureOr<CostModel> costModel = cfg.costModel(module);
  if (failed(costModel))
    return signalPassFailure();
  const CostModel &costs = *costModel;
  // Compute-stream timeline without stalls: end time of every body op.
  ArrayRef<Operation *> ops = saved.ops();
  SmallVector<double> end(ops.size());
  double now = 0;
  for (auto [i, op] : llvm::enumerate(ops))
    end[i] = now += costs.cost(op).seconds;
  auto startOf = [&](int64_t i) { return i == 0 ? 0.0 : end[i - 1]; };
  int64_t bwdStart = saved.backwardStart();

  // Candidate scopes in forward order.
  std::map<Scope, int64_t> firstForward;
  for (int64_t i = 0; i < bwdStart; ++i)
    if (ops[i]->hasAttr("scope")) {
      Scope s = Scope::of(ops[i]);
      firstForward.try_emplace(s, i);
    }
  std::set<Scope> candidates;
  for (const SavedActivation &s : saved.values())
    for (const Scope &n : ownersOf(s, cfg))
      if (cfg.offloadLeaves.count(n.leaf))
        candidates.insert(n);
  SmallVector<Scope> inOrder(candidates.begin(), candidates.end());
  llvm::sort(inOrder, [&](const Scope &a, const Scope &b) {
    return firstForward[a] < firstForward[b];
  });

  std::map<Scope, std::string> dropped; // scope -> why it stays
  std::set<Scope> chosen(candidates.begin(), candidates.end());
  // Each saved value's owners, once, and per scope the offloadable values
  // it owns: the loops below ask per scope and per retry (the placement
  // search runs this pass on thousands of candidates).
  ArrayRef<SavedActivation> values = saved.values();
  std::vector<SmallVector<Scope>> ownersAt;
  std::map<Scope, SmallVector<size_t>> ownedBy;
  for (auto [i, s] : llvm::enumerate(values)) {
    ownersAt.push_back(ownersOf(s, cfg));
    if (isOffloadable(s))
      for (const Scope &n : ownersAt.back()) {
        SmallVector<size_t> &owned = ownedBy[n];
        if (owned.empty() || owned.back() != i)
          owned.push_back(i);
      }
  }
  auto bytesOf = [&](const Scope &scope) {
    int64_t bytes = 0;
    auto it = ownedBy.find(scope);
    if (it != ownedBy.end())
      for (size_t i : it->second)
        if (allIn(ownersAt[i], chosen))
          bytes += values[i].bytes;
    return bytes;
  };

  // 1. min-offload-bytes (and scopes left with nothing of their own).
  for (bool changed = true; changed;) {
    changed = false;
    for (const Scope &scope : inOrder) {
      if (!chosen.count(scope))
        continue;
      int64_t bytes = bytesOf(scope);
      if (bytes > 0 && bytes >= cfg.minOffloadBytes)
        continue;
      chosen.erase(scope);
      dropped[scope] =
          bytes == 0 ? "every saved value it reads is also read by a scope "
                       "that stays on the device"
                     : llvm::formatv("{0} offloadable bytes < "
                                     "min-offload-bytes={1}",
                                     bytes, cfg.minOffloadBytes)
                           .str();
      changed = true;
    }
  }
  // 2. fraction: the first ceil(f * n) eligible scopes in forward order.
  SmallVector<Scope> eligible;
  for (const Scope &scope : inOrder)
    if (chosen.count(scope))
      eligible.push_back(scope);
  size_t keepCount =
      static_cast<size_t>(std::ceil(cfg.fraction * eligible.size() - 1e-9));
  for (size_t i = keepCount; i < eligible.size(); ++i) {
    chosen.erase(eligible[i]);
    dropped[eligible[i]] =
        llvm::formatv("beyond fraction={0}: only the first "
                      "{1} of {2} eligible scopes offload",
                      cfg.fraction, keepCount, eligible.size())
            .str();
  }
  // 3. Hide rule: simulate the copy queues for the chosen set (D2H in
  // forward order after each producer; each reload at the latest backward
  // op that still delivers it in time, FIFO on the h2d queue, never before
  // its own D2H). While some reload arrives late, keep the latest scope in
  // forward order that has a late value on the device and try again.
  if (cfg.hideRuleOn()) {
    auto lateScope = [&]() -> std::optional<std::pair<Scope, double>> {
      SmallVector<const SavedActivation *> vals;
      SmallVector<size_t> valIndex;
      for (auto [i, s] : llvm::enumerate(values))
        if (isOffloadable(s) && allIn(ownersAt[i], chosen)) {
          vals.push_back(&s);
          valIndex.push_back(i);
        }
      llvm::DenseMap<const SavedActivation *, double> d2hEnd;
      double d2hFree = 0;
      for (const SavedActivation *s : vals) {
        double start = std::max(end[s->defIndex], d2hFree);
        d2hFree = start + costs.copySeconds(s->bytes,
                                            CopyDirection::DeviceToHost, false);
        d2hEnd[s] = d2hFree;
      }
      SmallVector<ReloadRequest> requests;
      for (const SavedActivation *s : vals)
        requests.push_back(
            {s->firstUse, d2hEnd[s],
             costs.copySeconds(s->bytes, CopyDirection::HostToDevice, false)});
      SmallVector<ReloadPlan> plans = planReloads(
          end, bwdStart, [](int64_t) { return true; }, requests);
      // The latest (in forward order) needer of a late value goes; report
      // how late its latest value would be.
      std::map<Scope, double> lateness;
      for (auto [i, plan] : llvm::zip(valIndex, plans))
        if (plan.late)
          for (const Scope &n : ownersAt[i])
            lateness[n] = std::max(lateness[n], plan.end - plan.deadline);
      std::optional<std::pair<Scope, double>> worst;
      for (const auto &[scope, late] : lateness)
        if (!worst || firstForward[scope] > firstForward[worst->first])
          worst = std::make_pair(scope, late);
      return worst;
    };
    while (auto late = lateScope()) {
      chosen.erase(late->first);
      dropped[late->first] =
          llvm::formatv("hide rule: the h2d queue would deliver its reload "
                        "{0:F1} us late (hide-rule=off offloads anyway)",
                        late->second * 1e6)
              .str();
    }
  }

  // Apply: offload after the producer, reload + wait before the first use.
  // The decisions and remarks only when recorded (UnrecordedPlacements).
  const bool recording = UnrecordedPlacements::recording();
  OpBuilder b(&getContext());
  llvm::DenseMap<Operation *, Operation *> lastCopyAfter;
  for (const SavedActivation &s : saved.values()) {
    if (!isOffloadable(s))
      continue;
    unsigned resultIndex = cast<OpResult>(s.value).getResultNumber();
    SmallVector<Scope> owners = ownersOf(s, cfg);
    bool selected = llvm::any_of(
        owners, [&](const Scope &n) { return candidates.count(n); });
    if (!allIn(owners, chosen)) {
      if (!selected || !recording)
        continue;
      // Name the first owner that keeps it, and why.
      for (const Scope &n : owners) {
        if (chosen.count(n))
          continue;
        std::string why = dropped.count(n)
                              ? dropped[n]
                              : "its module is not in offload-modules";
        recordPlacement(
            s.producer, resultIndex,
            ("keep: needed by " + n.str() + ", which stays: " + why));
        break;
      }
      continue;
    }
    Scope copyScope = llvm::is_contained(owners, s.scope) ? s.scope : owners[0];
    auto scopeAttr =
        ScopeAttr::get(&getContext(), copyScope.layer, copyScope.leaf);
    // D2Hs of one producer are issued in result order, right after it.
    Operation *&after = lastCopyAfter[s.producer];
    b.setInsertionPointAfter(after ? after : s.producer);
    auto tensorType = cast<RankedTensorType>(s.value.getType());
    auto offload = OffloadOp::create(
        b, s.producer->getLoc(), HostTensorType::get(&getContext(), tensorType),
        s.value, scopeAttr);
    after = offload;
    Value host = offload.getHost();
    Operation *firstUser = ops[s.firstUse];
    b.setInsertionPoint(firstUser);
    Value reloaded =
        ReloadOp::create(b, firstUser->getLoc(), tensorType, host, scopeAttr);
    Value ready =
        WaitOp::create(b, firstUser->getLoc(), tensorType, reloaded, scopeAttr);
    Value original = s.value;
    original.replaceUsesWithIf(ready, [&](OpOperand &use) {
      Operation *top = saved.getBody()->findAncestorOpInBlock(*use.getOwner());
      return top && !isa<OffloadOp>(top) && saved.indexOf(top) >= bwdStart &&
             use.getOwner() != ready.getDefiningOp();
    });
    if (!recording)
      continue;
    recordPlacement(s.producer, resultIndex, "offload");
    remark::passed(s.producer->getLoc(), remark::RemarkOpts::name("offload")
                                             .category("actplace-placement")
                                             .subCategory(copyScope.str()))
        << ("offloaded " + std::to_string(s.bytes) + " bytes of " +
            s.producer->getName().getStringRef() + " (" + copyScope.str() + ")")
               .str();
  }
  for (const auto &[scope, why] : dropped) {
    if (!recording)
      break;
    remark::missed(module.getLoc(), remark::RemarkOpts::name("offload")
                                        .category("actplace-placement")
                                        .subCategory(scope.str()))
        << (scope.str() + " stays on the device: " + why);
  }
  if (cfg.maxInflight > 0)
    saved.getBody()->getParentOp()->setAttr(
        kMaxInflightAttrName, b.getI64IntegerAttr(cfg.maxInflight));
}

} // namespace
