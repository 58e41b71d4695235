//===- PrintMemoryTimeline.cpp - train-print-memory-timeline --------------===//
//
// Prints MemoryTimeline (and the StreamSimulation and CostModel it uses) as
// stable text for FileCheck: byte counts are exact integers, times are
// microseconds with three decimals. Values are named by their producer's
// point, `<op name> #<point>#<result>`.
//
//===----------------------------------------------------------------------===//

#include "passes/Passes.h"
#include "passes/analysis/CostModel.h"
#include "passes/analysis/MemoryTimeline.h"

#include "dialect/train/TrainOps.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <tuple>

namespace ap {
#define GEN_PASS_DEF_TRAINPRINTMEMORYTIMELINE
#include "passes/train/TrainPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::train;

namespace {

std::string withMiB(int64_t bytes) {
  return llvm::formatv("{0} bytes ({1:F2} MiB)", bytes,
                       static_cast<double>(bytes) / (1024.0 * 1024.0))
      .str();
}

std::string us(double seconds) {
  return llvm::formatv("{0:F3}", seconds * 1e6).str();
}

/// Orders scope keys as a reader expects: inputs, decoder layers by number,
/// then model-level leaves.
std::tuple<int, int64_t, std::string> scopeOrder(const std::string &key) {
  if (key == "inputs")
    return {0, 0, key};
  if (key.size() > 1 && key[0] == 'L') {
    size_t dot = key.find('.');
    int64_t layer = 0;
    if (dot != std::string::npos &&
        !StringRef(key).slice(1, dot).getAsInteger(10, layer))
      return {1, layer, key.substr(dot + 1)};
  }
  return {2, 0, key};
}

void printByScope(llvm::raw_ostream &os,
                  const std::map<std::string, int64_t> &byScope) {
  std::vector<std::pair<std::string, int64_t>> sorted(byScope.begin(),
                                                      byScope.end());
  llvm::sort(sorted, [](const auto &a, const auto &b) {
    return scopeOrder(a.first) < scopeOrder(b.first);
  });
  for (const auto &[scope, bytes] : sorted)
    os << "  " << scope << " " << bytes << "\n";
}

struct TrainPrintMemoryTimelinePass
    : ap::impl::TrainPrintMemoryTimelineBase<TrainPrintMemoryTimelinePass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto step = module.lookupSymbol<func::FuncOp>("train_step");
    if (!step) {
      module.emitError()
          << "train-print-memory-timeline: the module has no @train_step "
             "function; run -train-autodiff first to build the training step";
      return signalPassFailure();
    }
    bool hasLoop = false;
    if (!step.getBody().empty())
      hasLoop = !step.getBody().front().getOps<MicrobatchLoopOp>().empty();
    if (!hasLoop) {
      step.emitError()
          << "train-print-memory-timeline: @train_step has no "
             "train.microbatch_loop; run -train-autodiff first to build the "
             "training step";
      return signalPassFailure();
    }

    FailureOr<CostModel> cost = CostModel::fromProfile(
        profile, module, "train-print-memory-timeline: ");
    if (failed(cost))
      return signalPassFailure();
    MemoryTimeline tl = MemoryTimeline::compute(module, *cost);
    print(llvm::outs(), tl, *cost);
    markAllAnalysesPreserved();
  }

  void print(llvm::raw_ostream &os, const MemoryTimeline &tl,
             const CostModel &cost) {
    ArrayRef<MemoryPoint> pts = tl.points();
    const StreamSimulation &sim = tl.bodySimulation();
    unsigned bodyBegin = tl.bodyBegin(),
             bodyEnd = bodyBegin + sim.ops.size(); // exclusive
    const DeviceProfile &p = cost.profile();

    auto at = [&](Operation *op) {
      return llvm::formatv("{0} #{1}", op->getName().getStringRef(),
                           tl.indexOf(op))
          .str();
    };
    int64_t maxWs = 0;
    for (const MemoryPoint &pt : pts)
      maxWs = std::max(maxWs, pt.workspace);
    const MemoryPoint &peak = pts[tl.indexOf(tl.peakOp())];

    os << "memory timeline of @train_step: " << pts.size() << " ops, body #"
       << bodyBegin << "..#" << bodyEnd - 1 << ", " << tl.microBatches()
       << " microbatches\n";
    os << llvm::formatv("profile: peakFlops={0:E3} memBandwidth={1:E3} "
                        "launchLatency={2:E3} d2hBandwidth={3:E3} "
                        "h2dBandwidth={4:E3} duplexBandwidth={5:E3} "
                        "computeScale={6:E3} copySlowdownPerByte={7:E3} "
                        "copyHoldSlack={8:E3}\n",
                        p.peakFlops, p.memBandwidth, p.launchLatency,
                        p.d2hBandwidth, p.h2dBandwidth, p.duplexBandwidth,
                        p.computeScale, p.copySlowdownPerByte, p.copyHoldSlack);
    // The per-op copy slowdowns, one "op=rate" per line (sorted by op).
    for (const auto &[dir, table] :
         {std::pair<const char *, const OpTable *>{"h2d", &p.h2dSlowdown},
          {"d2h", &p.d2hSlowdown}})
      for (const auto &[name, rate] : *table)
        os << llvm::formatv("profile: {0} slowdown beside {1} = {2:E3} s/B\n",
                            dir, name, rate);
    os << "params: " << withMiB(peak.params) << "\n";
    os << "grads: " << withMiB(peak.grads) << "\n";
    os << "optimizer: " << withMiB(peak.optimizer) << "\n";
    os << "activations max: " << withMiB(tl.activationPeakBytes()) << "\n";
    os << "workspace max: " << withMiB(maxWs) << "\n";
    os << "pinned host max: " << withMiB(tl.pinnedHostPeakBytes()) << "\n";
    os << "peak: " << withMiB(tl.peakBytes()) << " at " << at(tl.peakOp())
       << "\n";
    os << llvm::formatv("peak breakdown: params={0} grads={1} optimizer={2} "
                        "activations={3} workspace={4}\n",
                        peak.params, peak.grads, peak.optimizer,
                        peak.activations, peak.workspace);
    // What the planned arena cannot go below: it holds the largest
    // workspace for the whole step, beside the packed activations.
    os << "peak with the workspace region: "
       << withMiB(tl.workspaceRegionPeakBytes()) << "\n";
    os << "activation peak: " << withMiB(tl.activationPeakBytes()) << " at "
       << at(tl.activationPeakOp()) << "\n";
    os << "activations at peak by scope:\n";
    printByScope(os, tl.activationsByScope(tl.peakOp()));
    if (tl.activationPeakOp() != tl.peakOp()) {
      os << "activations at activation peak by scope:\n";
      printByScope(os, tl.activationsByScope(tl.activationPeakOp()));
    }

    // Predicted time: the body once per microbatch, then the ops after it.
    double after = 0;
    for (unsigned i = 0; i < pts.size(); ++i)
      if (i < bodyBegin || i >= bodyEnd)
        after += cost.cost(pts[i].op).seconds;
    int64_t d2hBytes = 0, h2dBytes = 0, d2hCount = 0, h2dCount = 0;
    for (const SimulatedCopy &c : sim.copies) {
      bool d2h = c.direction == CopyDirection::DeviceToHost;
      (d2h ? d2hBytes : h2dBytes) += c.bytes;
      ++(d2h ? d2hCount : h2dCount);
    }
    os << "body time: " << us(sim.computeSeconds) << " us (busy "
       << us(sim.busySeconds) << " us, exposed " << us(sim.exposedSeconds)
       << " us)\n";
    if (sim.sideSeconds > 0)
      os << "side stream: " << us(sim.sideSeconds)
         << " us of recompute, compute waited " << us(sim.sideWaitSeconds)
         << " us for it\n";
    os << "copies: d2h " << d2hCount << " x " << d2hBytes << " bytes in "
       << us(sim.copySeconds(CopyDirection::DeviceToHost)) << " us, h2d "
       << h2dCount << " x " << h2dBytes << " bytes in "
       << us(sim.copySeconds(CopyDirection::HostToDevice))
       << " us, last copy ends at " << us(sim.copyEndSeconds) << " us\n";
    for (const auto &[scope, seconds] : sim.exposedByScope)
      os << "exposed " << scope << " " << us(seconds) << " us\n";
    os << "step time: " << us(tl.microBatches() * sim.computeSeconds + after)
       << " us (" << tl.microBatches() << " x body + " << us(after)
       << " us after the loop)\n";

    // Activations off the device at the peak: what placement took away
    // there.
    SmallVector<OffDeviceValue> off = tl.offDeviceAt(tl.indexOf(tl.peakOp()));
    int64_t offBytes = 0;
    for (const OffDeviceValue &v : off)
      offBytes += v.bytes;
    os << "off the device at peak: " << offBytes << " bytes in " << off.size()
       << " values\n";
    for (const OffDeviceValue &v : off) {
      std::string value =
          isa<BlockArgument>(v.value)
              ? llvm::formatv("block argument {0}",
                              cast<BlockArgument>(v.value).getArgNumber())
                    .str()
              : llvm::formatv("{0}#{1}", at(v.value.getDefiningOp()),
                              cast<OpResult>(v.value).getResultNumber())
                    .str();
      os << llvm::formatv("  {0} {1} {2} {3} left after #{4} back at #{5}\n",
                          value, v.scope, v.bytes,
                          v.returnsBy == ActivationBuffer::Origin::Recompute
                              ? "recomputed"
                              : "offloaded",
                          v.leftAfter, v.backAt);
    }

    if (!perOp)
      return;
    for (unsigned i = 0; i < pts.size(); ++i) {
      const MemoryPoint &pt = pts[i];
      std::string scope = scopeKey(pt.op);
      OpCost c = cost.cost(pt.op);
      // In the loop body the simulated duration: with h2dSlowdown /
      // d2hSlowdown an op runs longer beside copies than its cost alone.
      const bool inBody = i >= bodyBegin && i < bodyEnd;
      double seconds =
          inBody ? sim.ops[i - bodyBegin].end - sim.ops[i - bodyBegin].start
                 : c.seconds;
      os << llvm::formatv("#{0} {1} {2} total={3} act={4} ws={5} host={6} "
                          "flops={7:F0} bytes={8:F0} dur={9}",
                          i, pt.op->getName().getStringRef(),
                          scope.empty() ? "-" : scope, pt.total(),
                          pt.activations, pt.workspace, pt.pinnedHost, c.flops,
                          c.bytes, us(seconds));
      if (inBody) {
        const SimulatedOp &s = sim.ops[i - bodyBegin];
        os << " start=" << us(s.start);
        if (s.stall > 0)
          os << " stall=" << us(s.stall);
      }
      os << "\n";
    }
    for (const SimulatedCopy &c : sim.copies)
      os << llvm::formatv(
          "copy {0} {1} #{2} bytes={3} issue={4} start={5} end={6}\n",
          c.direction == CopyDirection::DeviceToHost ? "d2h" : "h2d",
          c.scope.empty() ? "-" : c.scope, tl.indexOf(c.op), c.bytes,
          us(c.issue), us(c.start), us(c.end));
  }
};
} // namespace
