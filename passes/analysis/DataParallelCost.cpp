//===- DataParallelCost.cpp - the step on N data-parallel ranks -----------===//

#include "passes/analysis/DataParallelCost.h"

#include "dialect/train/TrainOps.h"
#include "passes/analysis/GradReduceBuckets.h"
#include "passes/analysis/GraphSummary.h"
#include "passes/analysis/ZeroShardPlan.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

#include <algorithm>
#include <tuple>

using namespace mlir;
using namespace ap::train;

namespace {
/// The parameters a backward op accumulates into: its `*_grad` symbol
/// attributes (TrainBackwardOps.td; the lowering reads the same ones).
void forEachGradSymbol(Operation *op, function_ref<void(StringRef)> fn) {
  for (NamedAttribute a : op->getAttrs())
    if (auto sym = dyn_cast<FlatSymbolRefAttr>(a.getValue()))
      if (a.getName().getValue().ends_with("_grad"))
        fn(sym.getValue());
}
} // namespace

//===----------------------------------------------------------------------===//
// ZeroLayout
//===----------------------------------------------------------------------===//

int64_t ZeroParam::shardBytes() const {
  return tensorBytes(
      RankedTensorType::get({shardElements}, type.getElementType()));
}

int64_t ZeroParam::gatheredBytes(int64_t ranks) const {
  return tensorBytes(
      RankedTensorType::get({ranks * shardElements}, type.getElementType()));
}

int64_t ZeroParam::gradBufferBytes(int64_t ranks) const {
  return 4 * ranks * shardElements;
}

ZeroLayout ZeroLayout::of(ModuleOp module, Block *body, int64_t ranks,
                          int64_t gatherMaxInflight, bool bf16MainGrads) {
  ZeroLayout l;
  l.ranks = std::max<int64_t>(ranks, 1);
  llvm::StringMap<unsigned> index;
  if (module)
    for (ParamOp p : module.getOps<ParamOp>()) {
      ZeroParam zp;
      zp.name = p.getSymName().str();
      zp.type = cast<RankedTensorType>(p.getType());
      zp.trainable = !p.getFrozen();
      zp.shardElements =
          ap::zeroShardElements(zp.type.getNumElements(), l.ranks);
      index[zp.name] = l.params.size();
      l.paramBytes += zp.shardBytes();
      if (zp.trainable) {
        // The main grad (FP32, or BF16 shards); FP32 master and two FP32
        // Adam moments.
        l.gradBytes += (bf16MainGrads ? 2 : 4) * zp.shardElements;
        l.optimizerBytes += 12 * zp.shardElements;
      }
      l.params.push_back(std::move(zp));
    }
  if (!body)
    return l;

  // Per body op: the parameters it reads (param_ref results, through
  // reshapes, as the lowering maps them onto the weight buffers) and those
  // whose main grads it accumulates into (as the lowering's kernels write
  // them).
  SmallVector<Operation *> ops;
  SmallVector<SmallVector<ap::ZeroUse>> reads, writes;
  for (Operation &top : *body) {
    ops.push_back(&top);
    SmallVector<ap::ZeroUse> &r = reads.emplace_back();
    SmallVector<ap::ZeroUse> &w = writes.emplace_back();
    if (!isa<ParamRefOp, ReshapeOp>(top))
      for (Value v : top.getOperands()) {
        while (auto reshape = v.getDefiningOp<ReshapeOp>())
          v = reshape.getInput();
        if (auto ref = v.getDefiningOp<ParamRefOp>()) {
          auto it = index.find(ref.getParam());
          if (it != index.end())
            r.push_back({ap::zeroLayerGroup(it->getKey()), it->second});
        }
      }
    top.walk([&](Operation *op) {
      forEachGradSymbol(op, [&](StringRef sym) {
        auto it = index.find(sym);
        if (it != index.end() && l.params[it->second].trainable)
          w.push_back({ap::zeroLayerGroup(sym), it->second});
      });
    });
  }
  auto windows = [&](ArrayRef<SmallVector<ap::ZeroUse>> uses, bool weights) {
    SmallVector<ZeroWindow> out;
    for (const ap::ZeroWindowSpan &span : ap::splitZeroWindows(uses)) {
      ZeroWindow w;
      w.group = span.group;
      w.first = ops[span.first];
      w.last = ops[span.last];
      w.params.assign(span.params.begin(), span.params.end());
      llvm::sort(w.params);
      for (unsigned p : w.params)
        w.bytes += weights ? l.params[p].gatheredBytes(l.ranks)
                           : l.params[p].gradBufferBytes(l.ranks);
      out.push_back(std::move(w));
    }
    return out;
  };
  l.gathers = windows(reads, /*weights=*/true);
  l.reductions = windows(writes, /*weights=*/false);
  for (size_t w = 0; w < l.gathers.size(); ++w)
    l.gathers[w].gatherBefore =
        l.gathers[ap::zeroGatherAnchor(w, gatherMaxInflight)].first;
  return l;
}

int64_t ZeroLayout::numGathers() const {
  int64_t n = 0;
  for (const ZeroWindow &w : gathers)
    n += w.params.size();
  return n;
}

int64_t ZeroLayout::numReduceScatters() const {
  int64_t n = 0;
  for (const ZeroWindow &w : reductions)
    n += w.params.size();
  return n;
}

//===----------------------------------------------------------------------===//
// DataParallelStep
//===----------------------------------------------------------------------===//

int64_t DataParallelStep::numBuckets() const {
  return llvm::count_if(collectives, [](const PredictedCollective &c) {
    return c.kind == PredictedCollective::Kind::GradBucket;
  });
}

namespace {

/// The comm stream: one collective at a time, in issue order.
struct CommStream {
  const CostModel &cost;
  int64_t ranks;
  double free = 0, busy = 0;

  /// Runs `parts` (bytes of each collective of `kind`) back to back from
  /// `issue` or when the stream is free; returns {start, end}.
  std::pair<double, double> run(Collective kind, double issue,
                                ArrayRef<int64_t> parts) {
    double start = std::max(issue, free), t = start;
    for (int64_t bytes : parts)
      t += cost.collectiveSeconds(kind, bytes, ranks);
    free = t;
    busy += t - start;
    return {start, t};
  }
};

/// The zero3 step (see the header).
DataParallelStep predictZero3(Block &body, const StreamSimulation &sim,
                              const CostModel &cost, DataParallelStep s,
                              const DataParallelOptions &options) {
  Operation *parent = body.getParentOp();
  auto module = parent ? parent->getParentOfType<ModuleOp>() : ModuleOp();
  ZeroLayout layout =
      ZeroLayout::of(module, &body, options.ranks, options.gatherMaxInflight,
                     options.bf16MainGrads);
  s.gatherMaxInflight = options.gatherMaxInflight;
  s.gatherWindows = layout.gathers.size();
  s.gathersPerMicrobatch = layout.numGathers();
  s.reduceScatterWindows = layout.reductions.size();
  s.reduceScattersPerMicrobatch = layout.numReduceScatters();

  // Per body op: the gather windows issued before it, the window it opens
  // (waits for), the grad windows scattered after it.
  llvm::DenseMap<Operation *, SmallVector<unsigned, 2>> gatherAt, scatterAt;
  llvm::DenseMap<Operation *, SmallVector<unsigned, 1>> opens;
  for (auto [w, window] : llvm::enumerate(layout.gathers)) {
    gatherAt[window.gatherBefore].push_back(w);
    opens[window.first].push_back(w);
  }
  for (auto [w, window] : llvm::enumerate(layout.reductions))
    scatterAt[window.last].push_back(w);
  // A window's gathers run as one collective (the step issues them back to
  // back and the runtime groups them: ap_comm_group_begin), so they pay
  // one latency; its reduce-scatters accumulate into the shards and run
  // one by one.
  auto partsOf = [&](const ZeroWindow &w, bool weights) {
    SmallVector<int64_t> parts;
    int64_t gathered = 0;
    for (unsigned p : w.params) {
      if (weights)
        gathered += layout.params[p].gatheredBytes(layout.ranks);
      else
        parts.push_back(layout.params[p].gradBufferBytes(layout.ranks));
    }
    if (weights)
      parts.push_back(gathered);
    return parts;
  };
  CommStream comm{cost, options.ranks};
  // Runs a window's collectives (its gathers as one, its reduce-scatters one
  // per parameter) from `issue`; `list`: adds them to the step's list, times
  // from `t0`. Returns their end.
  auto runWindow = [&](const ZeroWindow &w, bool weights, Operation *at,
                       double issue, double t0, bool list) {
    auto [start, end] =
        comm.run(weights ? Collective::AllGather : Collective::ReduceScatter,
                 issue, partsOf(w, weights));
    if (list) {
      PredictedCollective c;
      c.kind = weights ? PredictedCollective::Kind::GatherWindow
                       : PredictedCollective::Kind::ReduceScatterWindow;
      c.group = w.group;
      c.bytes = w.bytes;
      for (unsigned p : w.params)
        (weights ? c.paramNames : c.gradNames).push_back(layout.params[p].name);
      (weights ? c.params : c.grads) = w.params.size();
      (weights ? c.before : c.after) = at;
      c.issue = issue - t0;
      c.start = start - t0;
      c.end = end - t0;
      s.collectives.push_back(std::move(c));
    }
    return end;
  };
  SmallVector<double> gatherEnd(layout.gathers.size(), 0.0);
  double lastStart = 0; // start of the last microbatch
  for (int64_t m = 0; m < s.microBatches; ++m) {
    bool last = m + 1 == s.microBatches;
    // Start of this microbatch: the ones before and their gather waits.
    double t0 = sim.computeSeconds * m + s.gatherWaitSeconds;
    if (last)
      lastStart = t0;
    // Index in s.collectives of each gather window of the last microbatch.
    llvm::DenseMap<unsigned, size_t> listed;
    double delay = 0; // gather waits so far in this microbatch
    for (const SimulatedOp &so : sim.ops) {
      Operation *op = so.op;
      // Compute reaches the op (before the op's own waits for copies).
      double ready = t0 + delay + so.start;
      double reached = ready - so.stall - so.sideWait;
      for (unsigned w : gatherAt.lookup(op)) {
        listed[w] = s.collectives.size();
        gatherEnd[w] = runWindow(layout.gathers[w], /*weights=*/true, op,
                                 reached, t0, last);
      }
      for (unsigned w : opens.lookup(op)) {
        double wait = std::max(0.0, gatherEnd[w] - ready);
        ready += wait;
        delay += wait;
        s.gatherWaitSeconds += wait;
        if (last)
          s.collectives[listed.lookup(w)].wait = wait;
      }
      double end = t0 + delay + so.end;
      for (unsigned w : scatterAt.lookup(op))
        runWindow(layout.reductions[w], /*weights=*/false, op, end, t0, last);
    }
  }
  // After the loop (the last microbatch's compute ended): the loss sum and
  // the token count.
  double computeEnd = s.computeStepSeconds + s.gatherWaitSeconds;
  for (auto kind : {PredictedCollective::Kind::LossSum,
                    PredictedCollective::Kind::TokenCount}) {
    PredictedCollective c;
    c.kind = kind;
    c.bytes = 4;
    auto [start, end] =
        comm.run(Collective::AllReduce, computeEnd, {int64_t(4)});
    c.issue = computeEnd - lastStart;
    c.start = start - lastStart;
    c.end = end - lastStart;
    s.collectives.push_back(c);
  }
  s.commSeconds = comm.busy;
  s.stepSeconds = std::max(computeEnd, comm.free);
  s.exposedCommSeconds = std::max(0.0, s.stepSeconds - s.computeStepSeconds);
  return s;
}

} // namespace

DataParallelStep DataParallelStep::predict(Block &body,
                                           const StreamSimulation &sim,
                                           const CostModel &cost,
                                           int64_t microBatches,
                                           const DataParallelOptions &options) {
  DataParallelStep s;
  s.mode = options.mode;
  s.ranks = options.ranks;
  s.microBatches = microBatches;
  s.microbatchSeconds = sim.computeSeconds;
  s.computeStepSeconds = sim.computeSeconds * microBatches;
  s.stepSeconds = s.computeStepSeconds;
  if (options.zero3())
    return predictZero3(body, sim, cost, s, options);
  int64_t ranks = options.ranks, bucketBytes = options.bucketBytes;
  s.bucketBytes = bucketBytes;
  if (ranks <= 1)
    return s;

  // Each trainable parameter's main grad, in module order: the order the
  // lowering emits their reductions (ties of the bucketing rule).
  Operation *parent = body.getParentOp();
  auto module = parent ? parent->getParentOfType<ModuleOp>() : ModuleOp();
  struct Grad {
    std::string symbol;
    int64_t bytes;
  };
  SmallVector<Grad> grads;
  llvm::StringMap<unsigned> gradIndex;
  if (module)
    for (ParamOp p : module.getOps<ParamOp>())
      if (!p.getFrozen()) {
        auto type = cast<ShapedType>(p.getType());
        gradIndex[p.getSymName()] = grads.size();
        // FP32 main grads.
        grads.push_back({p.getSymName().str(), 4 * type.getNumElements()});
      }

  // Each grad's last writer in the body (nested regions count as their
  // top-level op, as exec-bucket-grad-reduce counts them).
  llvm::DenseMap<unsigned, std::pair<int64_t, Operation *>> lastWrite;
  int64_t pos = 0;
  for (Operation &top : body) {
    top.walk([&](Operation *op) {
      forEachGradSymbol(op, [&](StringRef sym) {
        auto it = gradIndex.find(sym);
        if (it != gradIndex.end())
          lastWrite[it->second] = {pos, &top};
      });
    });
    ++pos;
  }

  SmallVector<unsigned> written, unwritten;
  SmallVector<ap::GradFinalPoint> points;
  for (unsigned i = 0; i < grads.size(); ++i) {
    auto it = lastWrite.find(i);
    if (it == lastWrite.end()) {
      unwritten.push_back(i);
      continue;
    }
    written.push_back(i);
    points.push_back({it->second.first, grads[i].bytes});
  }

  CommStream comm{cost, ranks};
  auto run = [&](PredictedCollective c, ArrayRef<int64_t> parts) {
    std::tie(c.start, c.end) = comm.run(Collective::AllReduce, c.issue, parts);
    s.commSeconds += c.end - c.start;
    s.collectives.push_back(c);
  };
  for (ArrayRef<unsigned> members : ap::packGradBuckets(points, bucketBytes)) {
    PredictedCollective c;
    c.kind = PredictedCollective::Kind::GradBucket;
    SmallVector<int64_t> parts;
    for (unsigned m : members) {
      parts.push_back(points[m].bytes);
      c.bytes += points[m].bytes;
      c.gradNames.push_back(grads[written[m]].symbol);
    }
    c.grads = members.size();
    c.after = lastWrite[written[members.back()]].second;
    int idx = sim.indexOf(c.after);
    c.issue = idx >= 0 ? sim.ops[idx].end : sim.computeSeconds;
    run(c, parts);
  }
  // After the loop: the loss sum and token count, then the grads no kernel
  // of the loop writes, in the lowering's order.
  PredictedCollective loss;
  loss.kind = PredictedCollective::Kind::LossSum;
  loss.bytes = 4;
  loss.issue = sim.computeSeconds;
  run(loss, {int64_t(4)});
  PredictedCollective count = loss;
  count.kind = PredictedCollective::Kind::TokenCount;
  run(count, {int64_t(4)});
  for (unsigned i : unwritten) {
    PredictedCollective c;
    c.kind = PredictedCollective::Kind::UnwrittenGrad;
    c.bytes = grads[i].bytes;
    c.grads = 1;
    c.gradNames.push_back(grads[i].symbol);
    c.issue = sim.computeSeconds;
    run(c, {grads[i].bytes});
  }
  s.exposedCommSeconds = std::max(0.0, comm.free - sim.computeSeconds);
  s.stepSeconds = s.computeStepSeconds + s.exposedCommSeconds;
  return s;
}
