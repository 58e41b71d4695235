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
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"

#include <cmath>
#include <map>
#include <optional>
#include <vector>

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
///
/// Scopes are handled as dense ids: the placement search runs this pass on
/// thousands of candidates, and comparing scopes by their leaf strings in
/// ordered sets and maps was most of its cost. The ids are numbered in Scope
/// order (operator<), so walking them in increasing order visits the scopes
/// as an ordered std::map<Scope, ...> would, and ties resolve the same way.
class ScopeIds {
public:
  /// Interns every owner of every value; then ids are final.
  ScopeIds(ArrayRef<SavedActivation> values, const PlacementConfig &cfg)
      : cfg(cfg) {
    SmallVector<SmallVector<unsigned, 4>> provisional;
    for (const SavedActivation &s : values) {
      SmallVector<unsigned, 4> &owners = provisional.emplace_back();
      for (const Scope &n : s.neededBy) {
        unsigned leaf = leafId(n.leaf);
        if (!recomputeLeaf[leaf])
          owners.push_back(intern(n));
      }
      if (owners.empty())
        owners.push_back(intern(s.scope));
    }
    // Renumber in Scope order.
    SmallVector<unsigned> order(scopes.size());
    for (unsigned i = 0; i < order.size(); ++i)
      order[i] = i;
    llvm::sort(order,
               [&](unsigned a, unsigned b) { return scopes[a] < scopes[b]; });
    SmallVector<unsigned> rank(order.size());
    std::vector<Scope> sorted;
    sorted.reserve(order.size());
    for (auto [r, i] : llvm::enumerate(order)) {
      rank[i] = r;
      sorted.push_back(std::move(scopes[i]));
    }
    scopes = std::move(sorted);
    for (auto &entry : ids)
      entry.second = rank[entry.second];
    ownersAt.reserve(provisional.size());
    for (SmallVector<unsigned, 4> &owners : provisional) {
      for (unsigned &id : owners)
        id = rank[id];
      ownersAt.push_back(std::move(owners));
    }
  }

  size_t size() const { return scopes.size(); }
  const Scope &scope(unsigned id) const { return scopes[id]; }
  /// The owners of values[i], as ids.
  ArrayRef<unsigned> owners(size_t i) const { return ownersAt[i]; }
  /// The id of `s` if it owns some value.
  std::optional<unsigned> find(const Scope &s) const {
    auto leaf = leaves.find(s.leaf);
    if (leaf == leaves.end())
      return std::nullopt;
    auto it = ids.find({s.layer, leaf->second});
    if (it == ids.end())
      return std::nullopt;
    return it->second;
  }

private:
  unsigned leafId(StringRef leaf) {
    auto [it, inserted] = leaves.try_emplace(leaf, leaves.size());
    if (inserted)
      recomputeLeaf.push_back(cfg.recomputeLeaves.count(leaf.str()) != 0);
    return it->second;
  }
  unsigned intern(const Scope &s) {
    auto [it, inserted] =
        ids.try_emplace({s.layer, leafId(s.leaf)}, scopes.size());
    if (inserted)
      scopes.push_back(s);
    return it->second;
  }

  const PlacementConfig &cfg;
  llvm::StringMap<unsigned> leaves;
  SmallVector<bool> recomputeLeaf;
  llvm::DenseMap<std::pair<int64_t, unsigned>, unsigned> ids;
  std::vector<Scope> scopes;
  std::vector<SmallVector<unsigned, 4>> ownersAt;
};

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

  // Candidate scopes in forward order. Scopes that own no value are never
  // asked about; a candidate not seen in the forward part sorts as 0.
  ArrayRef<SavedActivation> values = saved.values();
  ScopeIds scopes(values, cfg);
  const size_t numScopes = scopes.size();
  std::vector<int64_t> firstForwardAt(numScopes, -1);
  for (int64_t i = 0; i < bwdStart; ++i)
    if (ops[i]->hasAttr("scope"))
      if (std::optional<unsigned> id = scopes.find(Scope::of(ops[i])))
        if (firstForwardAt[*id] < 0)
          firstForwardAt[*id] = i;
  auto firstForward = [&](unsigned id) {
    return std::max<int64_t>(firstForwardAt[id], 0);
  };
  std::vector<char> candidates(numScopes, 0);
  for (size_t i = 0; i < values.size(); ++i)
    for (unsigned n : scopes.owners(i))
      if (cfg.offloadLeaves.count(scopes.scope(n).leaf))
        candidates[n] = 1;
  SmallVector<unsigned> inOrder;
  for (unsigned id = 0; id < numScopes; ++id)
    if (candidates[id])
      inOrder.push_back(id);
  llvm::sort(inOrder, [&](unsigned a, unsigned b) {
    return firstForward(a) < firstForward(b);
  });

  // scope -> why it stays; in id (= Scope) order for the remarks.
  std::map<unsigned, std::string> dropped;
  std::vector<char> chosen = candidates;
  auto allChosen = [&](size_t i) {
    return llvm::all_of(scopes.owners(i),
                        [&](unsigned n) { return chosen[n] != 0; });
  };
  // Per scope the offloadable values it owns: the loops below ask per scope
  // and per retry (the placement search runs this pass on thousands of
  // candidates).
  std::vector<SmallVector<size_t>> ownedBy(numScopes);
  for (auto [i, s] : llvm::enumerate(values))
    if (isOffloadable(s))
      for (unsigned n : scopes.owners(i)) {
        SmallVector<size_t> &owned = ownedBy[n];
        if (owned.empty() || owned.back() != i)
          owned.push_back(i);
      }
  auto bytesOf = [&](unsigned scope) {
    int64_t bytes = 0;
    for (size_t i : ownedBy[scope])
      if (allChosen(i))
        bytes += values[i].bytes;
    return bytes;
  };

  // 1. min-offload-bytes (and scopes left with nothing of their own).
  for (bool changed = true; changed;) {
    changed = false;
    for (unsigned scope : inOrder) {
      if (!chosen[scope])
        continue;
      int64_t bytes = bytesOf(scope);
      if (bytes > 0 && bytes >= cfg.minOffloadBytes)
        continue;
      chosen[scope] = 0;
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
  SmallVector<unsigned> eligible;
  for (unsigned scope : inOrder)
    if (chosen[scope])
      eligible.push_back(scope);
  size_t keepCount =
      static_cast<size_t>(std::ceil(cfg.fraction * eligible.size() - 1e-9));
  for (size_t i = keepCount; i < eligible.size(); ++i) {
    chosen[eligible[i]] = 0;
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
    auto lateScope = [&]() -> std::optional<std::pair<unsigned, double>> {
      SmallVector<const SavedActivation *> vals;
      SmallVector<size_t> valIndex;
      for (auto [i, s] : llvm::enumerate(values))
        if (isOffloadable(s) && allChosen(i)) {
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
      auto everyOpAnchors = [](int64_t) { return true; };
      SmallVector<ReloadPlan> plans =
          planReloads(end, bwdStart, everyOpAnchors, requests);
      // The latest (in forward order) needer of a late value goes; report
      // how late its latest value would be.
      std::vector<double> lateness(numScopes, 0);
      std::vector<char> isLate(numScopes, 0);
      for (auto [i, plan] : llvm::zip(valIndex, plans))
        if (plan.late)
          for (unsigned n : scopes.owners(i)) {
            lateness[n] = std::max(lateness[n], plan.end - plan.deadline);
            isLate[n] = 1;
          }
      std::optional<std::pair<unsigned, double>> worst;
      for (unsigned scope = 0; scope < numScopes; ++scope)
        if (isLate[scope] &&
            (!worst || firstForward(scope) > firstForward(worst->first)))
          worst = std::make_pair(scope, lateness[scope]);
      return worst;
    };
    while (auto late = lateScope()) {
      chosen[late->first] = 0;
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
  for (auto [i, s] : llvm::enumerate(values)) {
    if (!isOffloadable(s))
      continue;
    unsigned resultIndex = cast<OpResult>(s.value).getResultNumber();
    ArrayRef<unsigned> owners = scopes.owners(i);
    bool selected =
        llvm::any_of(owners, [&](unsigned n) { return candidates[n] != 0; });
    if (!allChosen(i)) {
      if (!selected || !recording)
        continue;
      // Name the first owner that keeps it, and why.
      for (unsigned n : owners) {
        if (chosen[n])
          continue;
        std::string why = dropped.count(n)
                              ? dropped[n]
                              : "its module is not in offload-modules";
        recordPlacement(s.producer, resultIndex,
                        ("keep: needed by " + scopes.scope(n).str() +
                         ", which stays: " + why));
        break;
      }
      continue;
    }
    const Scope &copyScope =
        llvm::any_of(owners,
                     [&](unsigned n) { return scopes.scope(n) == s.scope; })
            ? s.scope
            : scopes.scope(owners[0]);
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
  for (const auto &[id, why] : dropped) {
    if (!recording)
      break;
    const Scope &scope = scopes.scope(id);
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
