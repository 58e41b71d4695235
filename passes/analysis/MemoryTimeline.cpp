//===- MemoryTimeline.cpp - device bytes live at each op of a step --------===//

#include "passes/analysis/MemoryTimeline.h"

#include "dialect/train/TrainOps.h"
#include "passes/analysis/GraphSummary.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <algorithm>

using namespace mlir;
using namespace ap::train;

namespace {

/// Index of the last body point whose op starts before `t`, and not before
/// `atLeast` (the buffer is held while the op at that index runs).
unsigned lastPointStartingBefore(const StreamSimulation &sim, double t,
                                 unsigned bodyBegin, unsigned atLeast) {
  // Ops start in non-decreasing time order.
  auto it =
      std::partition_point(sim.ops.begin(), sim.ops.end(),
                           [&](const SimulatedOp &s) { return s.start < t; });
  unsigned n = static_cast<unsigned>(it - sim.ops.begin());
  unsigned last = n == 0 ? bodyBegin : bodyBegin + n - 1;
  return std::max(last, atLeast);
}

} // namespace

MemoryTimeline MemoryTimeline::compute(ModuleOp module, const CostModel &cost) {
  MemoryTimeline tl;
  auto step = module.lookupSymbol<func::FuncOp>("train_step");
  if (!step || step.getBody().empty())
    return tl;

  // Constant categories.
  int64_t params = 0, grads = 0, optimizer = 0;
  for (auto param : module.getOps<ParamOp>()) {
    auto type = cast<ShapedType>(param.getType());
    params += tensorBytes(type);
    if (!param.getFrozen()) {
      grads += 4 * type.getNumElements();
      optimizer += 12 * type.getNumElements();
    }
  }

  // Program order: the function's ops with the loop replaced by its body.
  MicrobatchLoopOp loop;
  for (Operation &op : step.getBody().front()) {
    if (auto l = dyn_cast<MicrobatchLoopOp>(op)) {
      loop = l;
      tl.bodyFirst = tl.pts.size();
      for (Operation &inner : l.getBody().front()) {
        tl.index[&inner] = tl.pts.size();
        tl.pts.push_back({&inner});
      }
      continue;
    }
    tl.index[&op] = tl.pts.size();
    tl.pts.push_back({&op});
  }
  for (MemoryPoint &p : tl.pts) {
    p.params = params;
    p.grads = grads;
    p.optimizer = optimizer;
    p.workspace = cost.cost(p.op).workspaceBytes;
  }

  if (loop) {
    tl.numMicroBatches =
        cast<ShapedType>(loop.getTokens().getType()).getDimSize(0);
    Block &body = loop.getBody().front();
    tl.sim = StreamSimulation::simulate(body, cost);
    const unsigned begin = tl.bodyFirst;
    const unsigned end = begin + tl.sim.ops.size() - 1;

    // Point index of the body op that holds `user` (users may sit in
    // nested regions).
    auto useIndex = [&](Operation *user) -> int {
      Operation *anc = body.findAncestorOpInBlock(*user);
      return anc ? static_cast<int>(tl.index.lookup(anc)) : -1;
    };

    // One buffer per root value, in definition order.
    auto addBuffer = [&](Value root, unsigned first, std::string scope) {
      if (!isa<RankedTensorType>(root.getType()))
        return;
      ActivationBuffer buf;
      buf.value = root;
      buf.scope = std::move(scope);
      buf.bytes = tensorBytes(root.getType());
      buf.first = first;
      // Walk the root and its aliases (reshape / wait results) for uses.
      unsigned lastDevice = first;
      double d2hEnd = -1;
      int offloadIdx = -1;
      SmallVector<Value> worklist{root};
      while (!worklist.empty()) {
        Value v = worklist.pop_back_val();
        for (OpOperand &use : v.getUses()) {
          Operation *user = use.getOwner();
          int idx = useIndex(user);
          if (idx < 0)
            continue;
          if (isa<OffloadOp>(user)) {
            const SimulatedCopy *copy = tl.sim.copyOf(user);
            d2hEnd = std::max(d2hEnd, copy ? copy->end : 0.0);
            offloadIdx = std::max(offloadIdx, idx);
            continue;
          }
          lastDevice = std::max(lastDevice, static_cast<unsigned>(idx));
          if (isa<ReshapeOp, WaitOp>(user) && user->getOperand(0) == v)
            worklist.push_back(user->getResult(0));
        }
      }
      buf.last = lastDevice;
      if (offloadIdx >= 0) {
        unsigned afterCopy = lastPointStartingBefore(
            tl.sim, d2hEnd, begin,
            std::max<unsigned>(lastDevice, static_cast<unsigned>(offloadIdx)));
        buf.last = std::min(afterCopy, end);
        buf.offloaded = true;
      }
      tl.bufs.push_back(std::move(buf));
    };

    for (BlockArgument arg : body.getArguments())
      addBuffer(arg, begin, "inputs");
    for (Operation &op : body) {
      // Views and waits alias an existing buffer; param_ref results are
      // parameters.
      if (isa<ReshapeOp, WaitOp, ParamRefOp>(op))
        continue;
      std::string scope = scopeKey(&op);
      for (Value r : op.getResults())
        addBuffer(r, tl.index.lookup(&op), scope);
    }

    // Difference arrays keep this linear in ops + buffers.
    SmallVector<int64_t> act(tl.pts.size() + 1, 0), host(tl.pts.size() + 1, 0);
    for (const ActivationBuffer &b : tl.bufs) {
      act[b.first] += b.bytes;
      act[b.last + 1] -= b.bytes;
    }
    // Pinned slots: from the offload to the end of the last H2D reading it.
    for (Operation &op : body) {
      auto offload = dyn_cast<OffloadOp>(op);
      if (!offload)
        continue;
      unsigned first = tl.index.lookup(&op);
      unsigned last = end;
      bool reloaded = false;
      double h2dEnd = 0;
      unsigned lastReload = first;
      for (Operation *user : offload.getHost().getUsers()) {
        if (!isa<ReloadOp>(user))
          continue;
        int idx = useIndex(user);
        if (idx < 0)
          continue;
        reloaded = true;
        lastReload = std::max(lastReload, static_cast<unsigned>(idx));
        if (const SimulatedCopy *copy = tl.sim.copyOf(user))
          h2dEnd = std::max(h2dEnd, copy->end);
      }
      if (reloaded)
        last = std::min(
            lastPointStartingBefore(tl.sim, h2dEnd, begin, lastReload), end);
      int64_t bytes = tensorBytes(offload.getInput().getType());
      host[first] += bytes;
      host[last + 1] -= bytes;
    }
    int64_t runAct = 0, runHost = 0;
    for (unsigned i = 0; i < tl.pts.size(); ++i) {
      runAct += act[i];
      runHost += host[i];
      tl.pts[i].activations = runAct;
      tl.pts[i].pinnedHost = runHost;
    }
  }

  // Peaks: the first point reaching the maximum.
  for (unsigned i = 0; i < tl.pts.size(); ++i) {
    const MemoryPoint &p = tl.pts[i];
    if (tl.peakIdx < 0 || p.total() > tl.pts[tl.peakIdx].total())
      tl.peakIdx = i;
    if (tl.actPeakIdx < 0 || p.activations > tl.pts[tl.actPeakIdx].activations)
      tl.actPeakIdx = i;
    if (tl.hostPeakIdx < 0 || p.pinnedHost > tl.pts[tl.hostPeakIdx].pinnedHost)
      tl.hostPeakIdx = i;
  }
  return tl;
}

int MemoryTimeline::indexOf(Operation *op) const {
  auto it = index.find(op);
  return it == index.end() ? -1 : static_cast<int>(it->second);
}

int64_t MemoryTimeline::peakBytes() const {
  return peakIdx < 0 ? 0 : pts[peakIdx].total();
}
Operation *MemoryTimeline::peakOp() const {
  return peakIdx < 0 ? nullptr : pts[peakIdx].op;
}
int64_t MemoryTimeline::activationPeakBytes() const {
  return actPeakIdx < 0 ? 0 : pts[actPeakIdx].activations;
}
Operation *MemoryTimeline::activationPeakOp() const {
  return actPeakIdx < 0 ? nullptr : pts[actPeakIdx].op;
}
int64_t MemoryTimeline::pinnedHostPeakBytes() const {
  return hostPeakIdx < 0 ? 0 : pts[hostPeakIdx].pinnedHost;
}

std::map<std::string, int64_t>
MemoryTimeline::activationsByScope(Operation *at) const {
  std::map<std::string, int64_t> result;
  int i = indexOf(at);
  if (i < 0)
    return result;
  for (const ActivationBuffer &b : bufs)
    if (b.first <= static_cast<unsigned>(i) &&
        static_cast<unsigned>(i) <= b.last)
      result[b.scope] += b.bytes;
  return result;
}
