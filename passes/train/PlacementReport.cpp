//===- PlacementReport.cpp - train-placement-report -----------------------===//
//
// Explains the placement of every saved activation: the decision the
// placement passes recorded on its producer (`train.placement`), why, where
// its reload is issued and waited, and the predicted copy and exposed times
// (StreamSimulation). Totals compare the predicted memory timeline and step
// time of the placed step with the same step with placement undone
// (PlacementMemoryDelta). Per recomputed scope, the predicted time of its
// recompute kernels in the backward and the bytes they spare, so a scope's
// cost per byte can be read off. At the placed step's peak op, and at the
// unplaced step's, the report lists the activations off the device there; the
// difference of the two timelines at that op is their bytes plus any other
// term PlacementMemoryDelta names. On several data-parallel ranks
// (data-parallel-size), the step on those ranks (DataParallelCost): the
// main-grad buckets on the comm stream and the communication the last
// backward does not hide (replicate), or each window's gathers and
// reduce-scatters, the compute waits for gathers and this rank's share of
// the persistent state (zero3); every byte count is per rank.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/CostModel.h"
#include "passes/analysis/DataParallelCost.h"
#include "passes/analysis/GraphSummary.h"
#include "passes/analysis/MemoryTimeline.h"
#include "passes/analysis/PlacementConfig.h"
#include "passes/analysis/StreamSimulation.h"

#include "mlir/Support/FileUtilities.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/ToolOutputFile.h"

#include <limits>
#include <map>
#include <set>

namespace ap {
#define GEN_PASS_DEF_TRAINPLACEMENTREPORT
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {

struct Row {
  std::string value, scope, decision, reason, prefetch, wait;
  int64_t bytes = 0;
  double copyUs = 0, exposedUs = 0;
};

struct Totals {
  int64_t keptBytes = 0, offloadBytes = 0, recomputeBytes = 0;
  int64_t peakBefore = 0, peakAfter = 0, actPeakBefore = 0, actPeakAfter = 0;
  /// Microbatches a pipeline stage holds in flight (1 without stages).
  int64_t inflight = 1;
  double stepBefore = 0, stepAfter = 0, exposed = 0, hidden = 0;
  double recomputeSeconds = 0; ///< recompute kernels, per microbatch
  int64_t microBatches = 1;
  /// The step on the data-parallel ranks, unplaced and placed (one rank:
  /// no collectives, the compute step).
  DataParallelStep dpBefore, dpAfter;
  /// Persistent state per rank (the placed timeline's, without zero3's
  /// gathered windows), the same with every parameter whole, and the most
  /// zero3 gathered-weight and grad-buffer bytes live at once.
  int64_t persistent = 0, persistentReplicated = 0;
  int64_t gatheredPeak = 0, gradWindowPeak = 0;

  /// Offloaded bytes per step (each direction). A microbatch count the
  /// verifier accepts times the bytes of one microbatch can exceed int64;
  /// the product saturates instead of wrapping.
  int64_t transferBytesPerStep() const {
    int64_t product = 0;
    if (llvm::MulOverflow(offloadBytes, microBatches, product))
      return std::numeric_limits<int64_t>::max();
    return product;
  }
};

/// The recompute kernels of one scope in the placed backward.
struct RecomputeCost {
  int64_t ops = 0;
  double seconds = 0; ///< predicted, per microbatch
  int64_t bytes = 0;  ///< saved bytes of the scope's rows marked recompute
};

std::string describe(Operation *op, int64_t index) {
  return op ? llvm::formatv("#{0} {1} ({2})", index,
                            op->getName().getStringRef(), Scope::of(op).str())
                  .str()
            : std::string("-");
}

/// Names ops and values of the placed and the unplaced step as the rows do:
/// ops by their index in their own loop body, values by the index of their
/// producer in the unplaced body (the rows' forward ordinal).
struct PeakPointNames {
  const PlacementMemoryDelta &delta;
  llvm::DenseMap<Operation *, int64_t> placedIndex, unplacedIndex;

  PeakPointNames(const PlacementMemoryDelta &delta, Block &placedBody,
                 Block &unplacedBody)
      : delta(delta) {
    for (auto [i, op] : llvm::enumerate(placedBody))
      placedIndex[&op] = i;
    for (auto [i, op] : llvm::enumerate(unplacedBody))
      unplacedIndex[&op] = i;
  }
  static std::string op(Operation *op,
                        const llvm::DenseMap<Operation *, int64_t> &index) {
    auto it = index.find(op);
    if (it != index.end())
      return describe(op, it->second);
    return llvm::formatv("{0} (outside the microbatch loop)",
                         op->getName().getStringRef())
        .str();
  }
  std::string placedPoint(unsigned point) const {
    return op(delta.placedTimeline().points()[point].op, placedIndex);
  }
  std::string unplacedPoint(unsigned point) const {
    return op(delta.unplacedTimeline().points()[point].op, unplacedIndex);
  }
  std::string value(Value v) const {
    if (!v)
      return "-";
    if (auto arg = dyn_cast<BlockArgument>(v))
      return llvm::formatv("block argument {0}", arg.getArgNumber()).str();
    Operation *def = v.getDefiningOp();
    Operation *unplaced = delta.unplacedOpOf(def);
    int64_t i = unplaced ? unplacedIndex.lookup(unplaced) : -1;
    return llvm::formatv("#{0} {1}#{2}", i, def->getName().getStringRef(),
                         cast<OpResult>(v).getResultNumber())
        .str();
  }
};

/// The report's section for one point of the placed step.
struct PeakPoint {
  std::string label;
  MemoryDeltaAtPoint at;
};

void printPeakPoint(llvm::raw_ostream &os, const PeakPoint &pp,
                    const PeakPointNames &names) {
  const MemoryDeltaAtPoint &at = pp.at;
  std::string unplacedOp =
      at.unplacedPoint >= 0
          ? "at " + names.unplacedPoint(at.unplacedPoint)
          : (at.unplacedBefore >= 0
                 ? "after " + names.unplacedPoint(at.unplacedBefore)
                 : std::string("-"));
  os << llvm::formatv(
      "predicted device bytes at the {0} peak {1}: before {2} ({3}) -> after "
      "{4} bytes, difference {5} = off the device {6} bytes ({7} values) + "
      "other terms {8} bytes + unaccounted {9} bytes\n",
      pp.label, names.placedPoint(at.placedPoint), at.unplacedBytes, unplacedOp,
      at.placedBytes, at.difference(), at.offDeviceBytes, at.offDevice.size(),
      at.otherTermsBytes, at.unaccounted());
  for (const OffDeviceValue &v : at.offDevice)
    os << llvm::formatv(
        "  off the device: {0} | {1} | {2} bytes | {3} | left after {4} | "
        "back at {5}\n",
        names.value(v.value), v.scope, v.bytes,
        v.returnsBy == ActivationBuffer::Origin::Recompute ? "recomputed"
                                                           : "offloaded",
        names.placedPoint(v.leftAfter), names.placedPoint(v.backAt));
  for (const MemoryDeltaTerm &t : at.otherTerms)
    os << llvm::formatv("  other term: {0} | {1} | {2} | {3} bytes\n", t.term,
                        names.value(t.value), t.scope.empty() ? "-" : t.scope,
                        t.bytes);
}

llvm::json::Object peakPointJson(const PeakPoint &pp,
                                 const PeakPointNames &names) {
  const MemoryDeltaAtPoint &at = pp.at;
  llvm::json::Array off, other;
  for (const OffDeviceValue &v : at.offDevice)
    off.push_back(llvm::json::Object{
        {"value", names.value(v.value)},
        {"scope", v.scope},
        {"bytes", v.bytes},
        {"kind", v.returnsBy == ActivationBuffer::Origin::Recompute
                     ? "recomputed"
                     : "offloaded"},
        {"left_after", names.placedPoint(v.leftAfter)},
        {"back_at", names.placedPoint(v.backAt)}});
  for (const MemoryDeltaTerm &t : at.otherTerms)
    other.push_back(llvm::json::Object{{"term", t.term},
                                       {"value", names.value(t.value)},
                                       {"scope", t.scope},
                                       {"bytes", t.bytes}});
  return llvm::json::Object{
      {"op", names.placedPoint(at.placedPoint)},
      {"op_before",
       at.unplacedPoint >= 0
           ? llvm::json::Value(names.unplacedPoint(at.unplacedPoint))
           : llvm::json::Value(nullptr)},
      {"gap_after_op_before",
       at.unplacedPoint < 0 && at.unplacedBefore >= 0
           ? llvm::json::Value(names.unplacedPoint(at.unplacedBefore))
           : llvm::json::Value(nullptr)},
      {"bytes_before", at.unplacedBytes},
      {"bytes_after", at.placedBytes},
      {"difference_bytes", at.difference()},
      {"off_device_bytes", at.offDeviceBytes},
      {"off_device", std::move(off)},
      {"other_terms_bytes", at.otherTermsBytes},
      {"other_terms", std::move(other)},
      {"unaccounted_bytes", at.unaccounted()}};
}

const char *collectiveName(PredictedCollective::Kind k) {
  switch (k) {
  case PredictedCollective::Kind::GradBucket:
    return "grad bucket";
  case PredictedCollective::Kind::LossSum:
    return "loss sum";
  case PredictedCollective::Kind::TokenCount:
    return "token count";
  case PredictedCollective::Kind::UnwrittenGrad:
    return "unwritten grad";
  case PredictedCollective::Kind::GatherWindow:
    return "all-gather window";
  case PredictedCollective::Kind::ReduceScatterWindow:
    return "reduce-scatter window";
  }
  return "";
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
  Block *body = SavedActivations::findBodyOrEmitError(module);
  if (!body)
    return signalPassFailure();
  FailureOr<CostModel> costModel = cfg.costModel(module);
  if (failed(costModel))
    return signalPassFailure();
  const CostModel &costs = *costModel;
  // Tensor parallelism: the collectives over "tp" one microbatch runs (on
  // the compute stream, priced by the cost model like any op).
  struct TensorParallelSummary {
    int64_t ranks = 1;
    bool sequenceParallel = false;
    int64_t allReduces = 0, allGathers = 0, reduceScatters = 0, bytes = 0;
    double seconds = 0;
  } tps;
  tps.ranks = tensorParallelSize(module);
  tps.sequenceParallel = module->hasAttr(kSequenceParallelAttrName);
  module.walk([&](Operation *op) {
    if (!isa<TensorParallelReduceOp, SequenceParallelGatherOp,
             SequenceParallelScatterOp>(op))
      return;
    (isa<TensorParallelReduceOp>(op)     ? tps.allReduces
     : isa<SequenceParallelGatherOp>(op) ? tps.allGathers
                                         : tps.reduceScatters) += 1;
    // The whole [B, T, ...] buffer each moves.
    Value whole = isa<SequenceParallelGatherOp>(op) ? op->getResult(0)
                                                    : op->getOperand(0);
    tps.bytes += tensorBytes(cast<RankedTensorType>(whole.getType()));
    tps.seconds += costs.cost(op).seconds;
  });

  // The same step without placement, for the "before" columns.
  DataParallelOptions dpOptions = cfg.dataParallelOptions();
  PlacementMemoryDelta delta =
      PlacementMemoryDelta::compute(module, costs, dpOptions);
  ModuleOp baseline = delta.unplacedModule();
  Block *baselineBody = SavedActivations::findBody(baseline);
  SavedActivations before(*baselineBody);
  StreamSimulation simBefore = StreamSimulation::simulate(*baselineBody, costs);
  StreamSimulation simAfter = StreamSimulation::simulate(*body, costs);
  const MemoryTimeline &memBefore = delta.unplacedTimeline();
  const MemoryTimeline &memAfter = delta.placedTimeline();

  Totals totals;
  if (auto mb = module->getAttrOfType<IntegerAttr>(kMicroBatchesAttrName))
    totals.microBatches = mb.getInt();
  // A pipeline stage's peak includes the other microbatches 1F1B keeps in
  // flight there (as the placement search predicts it).
  totals.peakBefore = stagePeakBytes(module, memBefore);
  totals.peakAfter = stagePeakBytes(module, memAfter);
  totals.inflight = pipelineInflight(module, memAfter.microBatches());
  totals.actPeakBefore = memBefore.activationPeakBytes();
  totals.actPeakAfter = memAfter.activationPeakBytes();
  totals.stepBefore = simBefore.computeSeconds * totals.microBatches;
  totals.stepAfter = simAfter.computeSeconds * totals.microBatches;
  totals.dpBefore = DataParallelStep::predict(*baselineBody, simBefore, costs,
                                              totals.microBatches, dpOptions);
  totals.dpAfter = DataParallelStep::predict(*body, simAfter, costs,
                                             totals.microBatches, dpOptions);
  for (const MemoryPoint &p : memAfter.points()) {
    totals.persistent =
        p.params - p.gatheredParams + p.grads - p.gradWindows + p.optimizer;
    totals.gatheredPeak = std::max(totals.gatheredPeak, p.gatheredParams);
    totals.gradWindowPeak = std::max(totals.gradWindowPeak, p.gradWindows);
  }
  {
    ZeroLayout whole = ZeroLayout::of(module, nullptr, 1, 0);
    totals.persistentReplicated =
        whole.paramBytes + whole.gradBytes + whole.optimizerBytes;
  }

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

  // What each recomputed scope costs: its cloned ops' predicted kernel
  // times in the placed step (simulated, so with the profile's op scales).
  // In forward order of the scopes' saved values.
  llvm::MapVector<std::string, RecomputeCost, std::map<std::string, unsigned>>
      recomputeCosts;
  for (const Row &r : rows)
    if (r.decision == "recompute")
      recomputeCosts[r.scope].bytes += r.bytes;
  for (const SimulatedOp &so : simAfter.ops) {
    if (!so.op)
      continue;
    double seconds = so.end - so.start;
    // A backward that also rebuilds a forward value (train-fuse-recompute)
    // is charged the share of its time its extra output writes: it is
    // memory-bound, and the rest is the backward it runs anyway.
    if (Value rebuilt = rebuiltOutputOf(so.op)) {
      int64_t all = 0;
      for (Value v :
           llvm::concat<Value>(so.op->getOperands(), so.op->getResults()))
        all += tensorBytes(v.getType());
      seconds *= double(tensorBytes(rebuilt.getType())) /
                 double(std::max<int64_t>(all, 1));
    } else if (!so.op->hasAttr(kRecomputedAttrName)) {
      continue;
    }
    RecomputeCost &c = recomputeCosts[Scope::of(so.op).str()];
    c.ops += 1;
    c.seconds += seconds;
    totals.recomputeSeconds += seconds;
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

  // The peak points: where the placed step peaks and, mapped to the placed
  // step, where the unplaced one does.
  PeakPointNames names(delta, *body, *baselineBody);
  SmallVector<PeakPoint> peakPoints;
  if (Operation *peak = memAfter.peakOp())
    peakPoints.push_back(
        {"placed", delta.at(static_cast<unsigned>(memAfter.indexOf(peak)))});
  if (Operation *peak = memBefore.peakOp())
    if (int p = delta.placedPointOf(memBefore.indexOf(peak)); p >= 0)
      peakPoints.push_back({"unplaced", delta.at(static_cast<unsigned>(p))});

  std::string error;
  std::unique_ptr<llvm::ToolOutputFile> file =
      mlir::openOutputFile(reportFile, &error);
  if (!file) {
    module.emitError() << error;
    return signalPassFailure();
  }
  llvm::raw_ostream &os = file->os();
  auto mib = [](int64_t b) { return b / (1024.0 * 1024.0); };
  if (reportFormat == ReportFormat::Json) {
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
    llvm::json::Array jrecompute;
    for (const auto &[scope, c] : recomputeCosts)
      jrecompute.push_back(
          llvm::json::Object{{"scope", scope},
                             {"ops", c.ops},
                             {"seconds_per_microbatch", c.seconds},
                             {"bytes", c.bytes}});
    const DataParallelStep &dp = totals.dpAfter;
    bool zero3 = dp.mode == DataParallelMode::Zero3;
    llvm::json::Array jcomm;
    for (const PredictedCollective &c : dp.collectives) {
      llvm::json::Object jc{
          {"kind", collectiveName(c.kind)},
          {"grads", c.grads},
          {"grad_names", llvm::json::Array(c.gradNames)},
          {"bytes", c.bytes},
          {"after", c.after ? describe(c.after, placedIndex.lookup(c.after))
                            : std::string("the microbatch loop")},
          {"issue_seconds", c.issue},
          {"start_seconds", c.start},
          {"end_seconds", c.end}};
      if (zero3) {
        jc["group"] = c.group;
        jc["params"] = c.params;
        jc["param_names"] = llvm::json::Array(c.paramNames);
        jc["before"] = c.before
                           ? describe(c.before, placedIndex.lookup(c.before))
                           : std::string();
        jc["wait_seconds"] = c.wait;
      }
      jcomm.push_back(std::move(jc));
    }
    llvm::json::Object jdp{
        {"size", dp.ranks},
        {"mode", zero3 ? "zero3" : "replicate"},
        {"grad_bucket_bytes", dp.bucketBytes},
        {"peaks_per_rank", true},
        {"buckets", dp.numBuckets()},
        {"gather_max_inflight", dp.gatherMaxInflight},
        {"gather_windows", dp.gatherWindows},
        {"gathers_per_microbatch", dp.gathersPerMicrobatch},
        {"reduce_scatter_windows", dp.reduceScatterWindows},
        {"reduce_scatters_per_microbatch", dp.reduceScattersPerMicrobatch},
        {"gather_wait_seconds_before", totals.dpBefore.gatherWaitSeconds},
        {"gather_wait_seconds_after", dp.gatherWaitSeconds},
        {"persistent_bytes", totals.persistent},
        {"persistent_bytes_replicated", totals.persistentReplicated},
        {"gathered_weight_peak_bytes", totals.gatheredPeak},
        {"grad_buffer_peak_bytes", totals.gradWindowPeak},
        {"microbatch_seconds", dp.microbatchSeconds},
        {"compute_step_seconds", dp.computeStepSeconds},
        {"step_seconds_before", totals.dpBefore.stepSeconds},
        {"step_seconds_after", dp.stepSeconds},
        {"exposed_comm_seconds_before", totals.dpBefore.exposedCommSeconds},
        {"exposed_comm_seconds_after", dp.exposedCommSeconds},
        {"comm_seconds", dp.commSeconds},
        // What one collective of 1 MiB costs on these ranks under the
        // profile, so a profile's collective constants can be read off.
        {"seconds_per_mib",
         llvm::json::Object{
             {"all_reduce", costs.collectiveSeconds(Collective::AllReduce,
                                                    1 << 20, dp.ranks)},
             {"all_gather", costs.collectiveSeconds(Collective::AllGather,
                                                    1 << 20, dp.ranks)},
             {"reduce_scatter",
              costs.collectiveSeconds(Collective::ReduceScatter, 1 << 20,
                                      dp.ranks)}}},
        {"last_microbatch_collectives", std::move(jcomm)}};
    llvm::json::Object jpeaks;
    for (const PeakPoint &pp : peakPoints)
      jpeaks[pp.label + "_peak"] = peakPointJson(pp, names);
    llvm::json::Object root{
        {"values", std::move(jrows)},
        {"recompute_scopes", std::move(jrecompute)},
        {"peak_points", std::move(jpeaks)},
        {"data_parallel", std::move(jdp)},
        {"tensor_parallel",
         llvm::json::Object{
             {"ranks", tps.ranks},
             {"sequence_parallel", tps.sequenceParallel},
             {"all_reduces_per_microbatch", tps.allReduces},
             {"all_gathers_per_microbatch", tps.allGathers},
             {"reduce_scatters_per_microbatch", tps.reduceScatters},
             {"bytes_per_microbatch", tps.bytes},
             {"seconds_per_microbatch", tps.seconds}}},
        {"totals",
         llvm::json::Object{
             {"kept_bytes", totals.keptBytes},
             {"offloaded_bytes", totals.offloadBytes},
             {"recomputed_bytes", totals.recomputeBytes},
             {"recompute_seconds_per_microbatch", totals.recomputeSeconds},
             {"d2h_bytes_per_step", totals.transferBytesPerStep()},
             {"h2d_bytes_per_step", totals.transferBytesPerStep()},
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
    for (const auto &[scope, c] : recomputeCosts)
      os << llvm::formatv("recompute {0}: {1} ops, {2:F1} us per microbatch, "
                          "{3} bytes spared\n",
                          scope, c.ops, c.seconds * 1e6, c.bytes);
    os << llvm::formatv("totals per microbatch: kept {0} bytes, offloaded {1} "
                        "bytes, recomputed {2} bytes in {3:F1} us of recompute "
                        "kernels\n",
                        totals.keptBytes, totals.offloadBytes,
                        totals.recomputeBytes, totals.recomputeSeconds * 1e6);
    os << llvm::formatv("transfers per step: d2h {0} bytes, h2d {0} bytes\n",
                        totals.transferBytesPerStep());
    const DataParallelStep &dp = totals.dpAfter;
    // One rank keeps the lines as they were; several say the peaks are per
    // rank (every rank holds the whole replicated plan, or its zero3 share).
    std::string perRank =
        dp.ranks > 1 ? llvm::formatv(" per rank of {0}", dp.ranks).str() : "";
    if (totals.inflight > 1)
      perRank += llvm::formatv(", with the {0} microbatches this pipeline "
                               "stage holds in flight",
                               totals.inflight)
                     .str();
    os << llvm::formatv("predicted device peak: {0} -> {1} bytes ({2:F1} -> "
                        "{3:F1} MiB){4}\n",
                        totals.peakBefore, totals.peakAfter,
                        mib(totals.peakBefore), mib(totals.peakAfter), perRank);
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
    if (tps.ranks > 1)
      os << llvm::formatv(
          "tensor parallel: {0} ranks{1}; per microbatch {2} all-reduces, {3} "
          "all-gathers and {4} reduce-scatters over tp on the compute stream "
          "({5} bytes, {6:F1} us in the step time above); bytes here are "
          "per rank{7}\n",
          tps.ranks, tps.sequenceParallel ? ", sequence parallel" : "",
          tps.allReduces, tps.allGathers, tps.reduceScatters, tps.bytes,
          tps.seconds * 1e6,
          tps.sequenceParallel
              ? " (the per-token values between regions hold 1/" +
                    std::to_string(tps.ranks) + " of the tokens)"
              : std::string());
    bool zero3 = dp.mode == DataParallelMode::Zero3;
    if (dp.ranks > 1 || zero3) {
      if (zero3) {
        os << llvm::formatv(
            "data parallel: {0} zero3 ranks, per microbatch {1} all-gathers "
            "in {2} windows (gather-max-inflight {3}) and {4} "
            "reduce-scatters in {5} windows on the comm stream; device bytes "
            "are per rank\n",
            dp.ranks, dp.gathersPerMicrobatch, dp.gatherWindows,
            dp.gatherMaxInflight, dp.reduceScattersPerMicrobatch,
            dp.reduceScatterWindows);
        os << llvm::formatv(
            "zero3 persistent state per rank: {0} bytes ({1} with every "
            "parameter whole); gathered weights up to {2} bytes, grad "
            "buffers up to {3} bytes\n",
            totals.persistent, totals.persistentReplicated, totals.gatheredPeak,
            totals.gradWindowPeak);
      } else {
        os << llvm::formatv(
            "data parallel: {0} replicated ranks, main grads summed in {1} "
            "buckets of at least {2} bytes on the comm stream in the last "
            "microbatch; device bytes are per rank\n",
            dp.ranks, dp.numBuckets(), dp.bucketBytes);
      }
      for (const PredictedCollective &c : dp.collectives) {
        if (c.kind == PredictedCollective::Kind::GatherWindow) {
          os << llvm::formatv(
              "  comm {0} {1}: {2} params, {3} bytes, issued before {4} at "
              "{5:F1} us, runs {6:F1} -> {7:F1} us, compute waits {8:F1} "
              "us\n",
              collectiveName(c.kind), c.group, c.params, c.bytes,
              describe(c.before, placedIndex.lookup(c.before)), c.issue * 1e6,
              c.start * 1e6, c.end * 1e6, c.wait * 1e6);
          continue;
        }
        std::string what = collectiveName(c.kind);
        if (c.kind == PredictedCollective::Kind::ReduceScatterWindow)
          what += " " + c.group;
        os << llvm::formatv(
            "  comm {0}: {1} grads, {2} bytes, issued after {3} at {4:F1} "
            "us, runs {5:F1} -> {6:F1} us\n",
            what, c.grads, c.bytes,
            c.after ? describe(c.after, placedIndex.lookup(c.after))
                    : std::string("the microbatch loop"),
            c.issue * 1e6, c.start * 1e6, c.end * 1e6);
      }
      os << llvm::formatv(
          "predicted step time on {0} ranks: {1:F3} -> {2:F3} ms, exposed "
          "communication {3:F1} -> {4:F1} us ({5:F1} us on the comm "
          "stream",
          dp.ranks, totals.dpBefore.stepSeconds * 1e3, dp.stepSeconds * 1e3,
          totals.dpBefore.exposedCommSeconds * 1e6, dp.exposedCommSeconds * 1e6,
          dp.commSeconds * 1e6);
      if (zero3)
        os << llvm::formatv(", compute waits {0:F1} -> {1:F1} us for gathers",
                            totals.dpBefore.gatherWaitSeconds * 1e6,
                            dp.gatherWaitSeconds * 1e6);
      os << ")\n";
    }
    for (const PeakPoint &pp : peakPoints)
      printPeakPoint(os, pp, names);
  }
  file->keep();
  markAllAnalysesPreserved();
}
} // namespace
