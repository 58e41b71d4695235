//===- PlacementReport.cpp - train-placement-report -----------------------===//
//
// Explains the placement of every saved activation: the decision the
// placement passes recorded on its producer (`train.placement`), why, where
// its reload is issued and waited, and the predicted copy and exposed times
// (StreamSimulation). Totals compare the predicted memory timeline and step
// time of the placed step with the same step with placement undone.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/CostModel.h"
#include "passes/analysis/GraphSummary.h"
#include "passes/analysis/MemoryTimeline.h"
#include "passes/analysis/PlacementConfig.h"
#include "passes/analysis/StreamSimulation.h"

#include "mlir/IR/IRMapping.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/ToolOutputFile.h"

#include <set>

namespace ap {
#define GEN_PASS_DEF_TRAINPLACEMENTREPORT
#include "passes/Passes.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {

/// Undoes placement in a copy of the step: waits read the offloaded value
/// again, recomputed clones are replaced by the forward op they copy.
void unplace(Block &body) {
  SmallVector<Operation *> dead;
  llvm::DenseMap<Operation *, Operation *> originalOf;
  auto sameAttrs = [](Operation *a, Operation *b) {
    for (NamedAttribute attr : a->getAttrs()) {
      if (attr.getName() == kRecomputedAttrName ||
          attr.getName() == kPlacementAttrName)
        continue;
      if (b->getAttr(attr.getName()) != attr.getValue())
        return false;
    }
    return true;
  };
  auto matches = [&](Operation *clone, Operation *fwd) {
    if (fwd->getName() != clone->getName() || fwd == clone ||
        fwd->hasAttr(kRecomputedAttrName) || !sameAttrs(clone, fwd) ||
        fwd->getNumOperands() != clone->getNumOperands())
      return false;
    for (auto [c, f] : llvm::zip(clone->getOperands(), fwd->getOperands())) {
      if (c == f)
        continue;
      Operation *cp = c.getDefiningOp();
      if (!cp || originalOf.lookup(cp) != f.getDefiningOp() ||
          cast<OpResult>(c).getResultNumber() !=
              cast<OpResult>(f).getResultNumber())
        return false;
    }
    return true;
  };
  for (Operation &op : body) {
    if (auto wait = dyn_cast<WaitOp>(op)) {
      auto reload = wait.getInput().getDefiningOp<ReloadOp>();
      auto offload = reload.getHost().getDefiningOp<OffloadOp>();
      wait.getResult().replaceAllUsesWith(offload.getInput());
      continue;
    }
    if (!op.hasAttr(kRecomputedAttrName))
      continue;
    for (Operation &fwd : body)
      if (matches(&op, &fwd)) {
        originalOf[&op] = &fwd;
        break;
      }
  }
  for (auto [clone, fwd] : originalOf)
    for (auto [c, f] : llvm::zip(clone->getResults(), fwd->getResults()))
      c.replaceAllUsesWith(f);
  for (Operation &op : llvm::reverse(body))
    if (isa<WaitOp, ReloadOp, OffloadOp>(op) || originalOf.count(&op))
      dead.push_back(&op);
  for (Operation *op : dead)
    op->erase();
}

struct Row {
  std::string value, scope, decision, reason, prefetch, wait;
  int64_t bytes = 0;
  double copyUs = 0, exposedUs = 0;
};

struct Totals {
  int64_t keptBytes = 0, offloadBytes = 0, recomputeBytes = 0;
  int64_t peakBefore = 0, peakAfter = 0, actPeakBefore = 0, actPeakAfter = 0;
  double stepBefore = 0, stepAfter = 0, exposed = 0, hidden = 0;
  int64_t microBatches = 1;
};

std::string describe(Operation *op, int64_t index) {
  return op ? llvm::formatv("#{0} {1} ({2})", index,
                            op->getName().getStringRef(), Scope::of(op).str())
                  .str()
            : std::string("-");
}

struct TrainPlacementReportPass
    : ap::impl::TrainPlacementReportBase<TrainPlacementReportPass> {
  using Base::Base;
  void runOnOperation() override;
};

void TrainPlacementReportPass::runOnOperation() {
  ModuleOp module = getOperation();
  PlacementConfig cfg = AP_PLACEMENT_CONFIG();
  if (failed(cfg.validate([&] { return module.emitError(); })))
    return signalPassFailure();
  if (reportFormat != "text" && reportFormat != "json") {
    module.emitError() << "report-format must be text or json, got '"
                       << reportFormat << "'";
    return signalPassFailure();
  }
  Block *body = SavedActivations::findBodyOrEmitError(module);
  if (!body)
    return signalPassFailure();
  FailureOr<CostModel> costModel = cfg.costModel(module);
  if (failed(costModel))
    return signalPassFailure();
  const CostModel &costs = *costModel;

  // The same step without placement, for the "before" columns.
  OwningOpRef<ModuleOp> baseline = module.clone();
  unplace(*SavedActivations::findBody(*baseline));
  SavedActivations before(*SavedActivations::findBody(*baseline));
  StreamSimulation simBefore =
      StreamSimulation::simulate(*SavedActivations::findBody(*baseline), costs);
  StreamSimulation simAfter = StreamSimulation::simulate(*body, costs);
  MemoryTimeline memBefore = MemoryTimeline::compute(*baseline, costs);
  MemoryTimeline memAfter = MemoryTimeline::compute(module, costs);

  Totals totals;
  if (auto mb = module->getAttrOfType<IntegerAttr>(kMicroBatchesAttrName))
    totals.microBatches = mb.getInt();
  totals.peakBefore = memBefore.peakBytes();
  totals.peakAfter = memAfter.peakBytes();
  totals.actPeakBefore = memBefore.activationPeakBytes();
  totals.actPeakAfter = memAfter.activationPeakBytes();
  totals.stepBefore = simBefore.computeSeconds * totals.microBatches;
  totals.stepAfter = simAfter.computeSeconds * totals.microBatches;

  // Rows: every saved activation of the unplaced step, in forward order;
  // the placed step's producer (same position) carries the decision.
  SmallVector<Operation *> placedOps;
  for (Operation &op : *body)
    placedOps.push_back(&op);
  llvm::DenseMap<Operation *, int64_t> placedIndex;
  for (auto [i, op] : llvm::enumerate(placedOps))
    placedIndex[op] = i;
  // Forward ops keep their relative order; map the n-th forward op of the
  // baseline to the n-th non-placement forward op of the placed body.
  SmallVector<Operation *> placedForward;
  for (Operation *op : placedOps)
    if (!SavedActivations::isBackwardOp(op) && !isa<OffloadOp>(op))
      placedForward.push_back(op);

  SmallVector<Row> rows;
  for (const SavedActivation &s : before.values()) {
    Row row;
    row.bytes = s.bytes;
    row.scope = s.scope.str();
    for (const Scope &n : s.neededBy)
      row.reason += (row.reason.empty() ? "" : ",") + n.str();
    row.reason = "needed by " + row.reason;
    Operation *placed =
        s.producer && s.defIndex < static_cast<int64_t>(placedForward.size())
            ? placedForward[s.defIndex]
            : nullptr;
    unsigned resultIndex =
        s.producer ? cast<OpResult>(s.value).getResultNumber() : 0;
    row.value = s.producer ? llvm::formatv("#{0} {1}#{2}", s.defIndex,
                                           s.producer->getName().getStringRef(),
                                           resultIndex)
                                 .str()
                           : "block argument";
    std::string decision = "keep";
    if (placed)
      if (auto attr = placed->getAttrOfType<ArrayAttr>(kPlacementAttrName))
        if (resultIndex < attr.size())
          if (auto str = cast<StringAttr>(attr[resultIndex]).getValue();
              !str.empty())
            decision = str.str();
    if (StringRef(decision).starts_with("keep: ")) {
      row.reason = decision.substr(6);
      decision = "keep";
    } else if (decision == "keep") {
      row.reason = "not selected (" + row.reason + ")";
    }
    row.decision = decision;
    if (decision == "offload" && placed) {
      Value v = placed->getResult(resultIndex);
      for (Operation *user : v.getUsers()) {
        auto offload = dyn_cast<OffloadOp>(user);
        if (!offload)
          continue;
        for (Operation *r : offload.getHost().getUsers()) {
          auto reload = cast<ReloadOp>(r);
          // Anchors are the compute ops around the copy's own ops: skip the
          // other reloads and waits placed at the same point.
          int64_t ri = placedIndex.lookup(reload) - 1;
          while (ri >= 0 && isa<ReloadOp, WaitOp>(placedOps[ri]))
            --ri;
          row.prefetch = describe(ri >= 0 ? placedOps[ri] : nullptr, ri);
          Operation *wait = *reload.getResult().getUsers().begin();
          int64_t wi = placedIndex.lookup(wait) + 1;
          while (wi < static_cast<int64_t>(placedOps.size()) &&
                 isa<ReloadOp, WaitOp>(placedOps[wi]))
            ++wi;
          row.wait = describe(wi < static_cast<int64_t>(placedOps.size())
                                  ? placedOps[wi]
                                  : nullptr,
                              wi);
          if (const SimulatedCopy *c = simAfter.copyOf(reload))
            row.copyUs = (c->end - c->start) * 1e6;
          if (const SimulatedCopy *c = simAfter.copyOf(offload))
            row.copyUs += (c->end - c->start) * 1e6;
          int idx = simAfter.indexOf(wait);
          if (idx >= 0)
            row.exposedUs = simAfter.ops[idx].stall * 1e6;
        }
      }
      totals.offloadBytes += s.bytes;
      totals.exposed += row.exposedUs * 1e-6;
      totals.hidden += std::max(0.0, row.copyUs - row.exposedUs) * 1e-6;
    } else if (decision == "recompute") {
      totals.recomputeBytes += s.bytes;
    } else {
      totals.keptBytes += s.bytes;
    }
    rows.push_back(row);
  }

  // Values that are saved only because recomputed ops read them in
  // backward (the inputs of a recompute) have no row yet.
  std::set<std::pair<int64_t, unsigned>> listed;
  for (const SavedActivation &s : before.values())
    if (s.producer)
      listed.insert({s.defIndex, cast<OpResult>(s.value).getResultNumber()});
  SavedActivations after(*body);
  for (const SavedActivation &s : after.values()) {
    if (!s.producer)
      continue;
    auto ordinal =
        llvm::find(placedForward, s.producer) - placedForward.begin();
    unsigned resultIndex = cast<OpResult>(s.value).getResultNumber();
    if (ordinal == static_cast<int64_t>(placedForward.size()) ||
        listed.count({ordinal, resultIndex}))
      continue;
    Row row;
    row.value = llvm::formatv("#{0} {1}#{2}", ordinal,
                              s.producer->getName().getStringRef(), resultIndex)
                    .str();
    row.scope = s.scope.str();
    row.bytes = s.bytes;
    row.decision = "keep";
    row.reason = "input of recomputed ops";
    totals.keptBytes += s.bytes;
    rows.push_back(row);
  }
  for (Operation *op : placedForward)
    for (Value v : op->getResults())
      for (Operation *user : v.getUsers())
        if (auto offload = dyn_cast<OffloadOp>(user)) {
          auto ordinal = llvm::find(placedForward, op) - placedForward.begin();
          unsigned resultIndex = cast<OpResult>(v).getResultNumber();
          if (listed.count({ordinal, resultIndex}))
            continue;
          Row row;
          row.value = llvm::formatv("#{0} {1}#{2}", ordinal,
                                    op->getName().getStringRef(), resultIndex)
                          .str();
          row.scope = Scope::of(op).str();
          row.bytes = tensorBytes(v.getType());
          row.decision = "offload";
          row.reason = "input of recomputed ops";
          if (auto reload =
                  dyn_cast<ReloadOp>(*offload.getHost().getUsers().begin())) {
            int64_t ri = placedIndex.lookup(reload) - 1;
            while (ri >= 0 && isa<ReloadOp, WaitOp>(placedOps[ri]))
              --ri;
            row.prefetch = describe(ri >= 0 ? placedOps[ri] : nullptr, ri);
            if (const SimulatedCopy *c = simAfter.copyOf(reload))
              row.copyUs = (c->end - c->start) * 1e6;
          }
          totals.offloadBytes += row.bytes;
          rows.push_back(row);
        }

  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> file =
      mlir::openOutputFile(reportFile, &error);
  if (!file) {
    module.emitError() << error;
    return signalPassFailure();
  }
  llvm::raw_ostream &os = file->os();
  auto mib = [](int64_t b) { return b / (1024.0 * 1024.0); };
  if (reportFormat == "json") {
    llvm::json::Array jrows;
    for (const Row &r : rows)
      jrows.push_back(llvm::json::Object{{"value", r.value},
                                         {"scope", r.scope},
                                         {"bytes", r.bytes},
                                         {"decision", r.decision},
                                         {"reason", r.reason},
                                         {"prefetch_anchor", r.prefetch},
                                         {"wait_anchor", r.wait},
                                         {"copy_us", r.copyUs},
                                         {"exposed_us", r.exposedUs}});
    llvm::json::Object root{
        {"values", std::move(jrows)},
        {"totals",
         llvm::json::Object{
             {"kept_bytes", totals.keptBytes},
             {"offloaded_bytes", totals.offloadBytes},
             {"recomputed_bytes", totals.recomputeBytes},
             {"d2h_bytes_per_step", totals.offloadBytes * totals.microBatches},
             {"h2d_bytes_per_step", totals.offloadBytes * totals.microBatches},
             {"peak_bytes_before", totals.peakBefore},
             {"peak_bytes_after", totals.peakAfter},
             {"activation_peak_bytes_before", totals.actPeakBefore},
             {"activation_peak_bytes_after", totals.actPeakAfter},
             {"step_seconds_before", totals.stepBefore},
             {"step_seconds_after", totals.stepAfter},
             {"exposed_transfer_seconds_per_microbatch", totals.exposed},
             {"hidden_transfer_seconds_per_microbatch", totals.hidden}}}};
    os << llvm::formatv("{0:2}", llvm::json::Value(std::move(root))) << "\n";
  } else {
    os << "placement report: " << rows.size() << " saved activations per "
       << "microbatch, " << totals.microBatches << " microbatches\n";
    for (const Row &r : rows) {
      os << llvm::formatv("{0} | {1} | {2} bytes | {3} | {4}", r.value, r.scope,
                          r.bytes, r.decision, r.reason);
      if (r.decision == "offload")
        os << llvm::formatv(" | prefetch after {0} | wait before {1} | copy "
                            "{2:F1} us, exposed {3:F1} us",
                            r.prefetch, r.wait, r.copyUs, r.exposedUs);
      os << "\n";
    }
    os << llvm::formatv("totals per microbatch: kept {0} bytes, offloaded {1} "
                        "bytes, recomputed {2} bytes\n",
                        totals.keptBytes, totals.offloadBytes,
                        totals.recomputeBytes);
    os << llvm::formatv("transfers per step: d2h {0} bytes, h2d {0} bytes\n",
                        totals.offloadBytes * totals.microBatches);
    os << llvm::formatv("predicted device peak: {0} -> {1} bytes ({2:F1} -> "
                        "{3:F1} MiB)\n",
                        totals.peakBefore, totals.peakAfter,
                        mib(totals.peakBefore), mib(totals.peakAfter));
    os << llvm::formatv("predicted activation peak: {0} -> {1} bytes ({2:F1} "
                        "-> {3:F1} MiB)\n",
                        totals.actPeakBefore, totals.actPeakAfter,
                        mib(totals.actPeakBefore), mib(totals.actPeakAfter));
    int64_t saved = totals.actPeakBefore - totals.actPeakAfter;
    os << llvm::formatv(
        "predicted activation peak reduction: {0} bytes "
        "({1:F2}% of the activation peak)\n",
        saved,
        totals.actPeakBefore ? 100.0 * saved / totals.actPeakBefore : 0.0);
    os << llvm::formatv("predicted transfer time per microbatch: hidden {0:F1} "
                        "us, exposed {1:F1} us\n",
                        totals.hidden * 1e6, totals.exposed * 1e6);
    double cost =
        totals.stepBefore > 0
            ? 100.0 * (totals.stepAfter - totals.stepBefore) / totals.stepBefore
            : 0.0;
    os << llvm::formatv("predicted step compute time: {0:F3} -> {1:F3} ms "
                        "({2:F2}%)\n",
                        totals.stepBefore * 1e3, totals.stepAfter * 1e3, cost);
  }
  file->keep();
  markAllAnalysesPreserved();
}
} // namespace
