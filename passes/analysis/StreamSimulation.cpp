//===- StreamSimulation.cpp - compute / d2h / h2d queue timing ------------===//

#include "passes/analysis/StreamSimulation.h"

#include "dialect/train/TrainOps.h"
#include "passes/analysis/GraphSummary.h"

#include <deque>
#include <limits>

using namespace mlir;
using namespace ap::train;

namespace {

/// The two copy queues sharing the host link, advanced in time by the
/// compute walk. Compute only ever moves forward and every copy is issued at
/// the compute time it is reached, so advancing the queues to that time
/// before enqueueing keeps the fluid model exact: no copy is ever given
/// bandwidth retroactively.
class CopyEngine {
public:
  CopyEngine(const CostModel &cost, SmallVectorImpl<SimulatedCopy> &copies)
      : cost(cost), copies(copies) {}

  int enqueue(SimulatedCopy copy) {
    advanceTo(copy.issue);
    int id = copies.size();
    copies.push_back(std::move(copy));
    remaining.push_back(static_cast<double>(copies.back().bytes));
    done.push_back(false);
    started.push_back(false);
    queues[queueOf(id)].push_back(id);
    return id;
  }

  /// Runs the queues until time `t`.
  void advanceTo(double t) { run(t, -1); }
  /// Runs the queues until copy `id` has ended; returns its end.
  double finish(int id) {
    run(std::numeric_limits<double>::infinity(), id);
    return copies[id].end;
  }
  /// Bytes moved so far in `dir`, up to the time the queues have run to.
  double moved(CopyDirection dir) const {
    return movedBytes[dir == CopyDirection::DeviceToHost ? 0 : 1];
  }
  /// D2H copies issued and not yet ended, oldest first.
  const std::deque<int> &pendingDeviceToHost() const { return queues[0]; }
  /// Runs every queued copy to its end.
  void drain() {
    for (int id = 0, e = copies.size(); id < e; ++id)
      if (!done[id])
        finish(id);
  }

private:
  int queueOf(int id) const {
    return copies[id].direction == CopyDirection::DeviceToHost ? 0 : 1;
  }
  bool runnable(int id) const {
    int dep = copies[id].dependsOn;
    return copies[id].issue <= now && (dep < 0 || done[dep]);
  }

  void run(double until, int untilDone) {
    const double inf = std::numeric_limits<double>::infinity();
    while (untilDone >= 0 ? !done[untilDone] : now < until) {
      int active[2] = {-1, -1};
      bool progressed = false;
      for (int q = 0; q < 2; ++q) {
        if (queues[q].empty() || !runnable(queues[q].front()))
          continue;
        int id = queues[q].front();
        if (!started[id]) {
          started[id] = true;
          copies[id].start = now;
        }
        if (remaining[id] <= 0) {
          complete(id, now);
          progressed = true;
          continue;
        }
        active[q] = id;
      }
      if (progressed)
        continue;
      bool both = active[0] >= 0 && active[1] >= 0;
      double rate[2], next = untilDone >= 0 ? inf : until;
      for (int q = 0; q < 2; ++q) {
        if (active[q] < 0)
          continue;
        rate[q] = cost.copyBandwidth(copies[active[q]].direction, both);
        next = std::min(next, now + remaining[active[q]] / rate[q]);
      }
      // Nothing can run and nothing will arrive: a reload waiting on a copy
      // that never ends. Not reachable for well-formed blocks; stop rather
      // than spin.
      if (next == inf)
        return;
      double dt = next - now;
      for (int q = 0; q < 2; ++q) {
        int id = active[q];
        if (id < 0)
          continue;
        if (now + remaining[id] / rate[q] <= next) {
          movedBytes[q] += remaining[id];
          complete(id, next);
        } else {
          movedBytes[q] += rate[q] * dt;
          remaining[id] -= rate[q] * dt;
        }
      }
      now = next;
    }
  }

  void complete(int id, double t) {
    remaining[id] = 0;
    done[id] = true;
    copies[id].end = t;
    queues[queueOf(id)].pop_front();
  }

  const CostModel &cost;
  SmallVectorImpl<SimulatedCopy> &copies;
  SmallVector<double> remaining;
  SmallVector<bool> done, started;
  std::deque<int> queues[2];
  double movedBytes[2] = {0, 0};
  double now = 0;
};

/// The side stream's queue: ops in issue order with their remaining alone
/// seconds, advanced by the compute walk at the rate the compute op beside
/// them leaves free.
class SideQueue {
public:
  explicit SideQueue(SmallVectorImpl<SimulatedOp> &ops) : ops(ops) {}

  void enqueue(int opIndex, double seconds) {
    pending.push_back({opIndex, seconds, false});
    done[ops[opIndex].op] = false;
  }
  /// Whether `op` is a side op that has not completed.
  bool running(Operation *op) const {
    auto it = done.find(op);
    return it != done.end() && !it->second;
  }
  /// Advances from `t` for `dt` seconds at `rate` seconds of side work per
  /// second. Every queued item was issued at or before `t`.
  void advance(double t, double dt, double rate) {
    while (rate > 0 && !pending.empty()) {
      Item &front = pending.front();
      SimulatedOp &s = ops[front.op];
      if (!front.begun) {
        front.begun = true;
        s.start = t;
      }
      double need = front.remaining / rate;
      if (need > dt) {
        front.remaining -= dt * rate;
        return;
      }
      t += need;
      dt -= need;
      s.end = t;
      done[s.op] = true;
      pending.pop_front();
    }
  }
  /// Runs the queue alone (rate 1) from `t` until `op` has completed;
  /// returns when it did.
  double finish(double t, Operation *op) {
    while (running(op)) {
      int front = pending.front().op;
      advance(t, pending.front().remaining, 1.0);
      t = ops[front].end;
    }
    return t;
  }
  /// Runs everything left from `t`; returns when the last item completed.
  double drain(double t) {
    if (!pending.empty())
      t = finish(t, ops[pending.back().op].op);
    return t;
  }

private:
  struct Item {
    int op;
    double remaining;
    bool begun;
  };
  SmallVectorImpl<SimulatedOp> &ops;
  std::deque<Item> pending;
  llvm::DenseMap<Operation *, bool> done;
};

} // namespace

StreamSimulation StreamSimulation::simulate(Block &block,
                                            const CostModel &cost) {
  StreamSimulation sim;
  CopyEngine engine(cost, sim.copies);
  // docs/architecture.md section 4: compute waits for a D2H when more than
  // max-inflight offloads would be pending.
  int64_t maxInflight = 0;
  if (Operation *parent = block.getParentOp())
    if (auto attr = parent->getAttrOfType<IntegerAttr>(kMaxInflightAttrName))
      maxInflight = attr.getInt();
  // Copies in a block that runs side-stream recompute land beside the
  // side GEMMs too (DeviceProfile::sideStreamCopyScale).
  const double besideScale =
      llvm::any_of(block,
                   [](Operation &o) {
                     return o.getDiscardableAttr(kSideStreamAttrName) !=
                            nullptr;
                   })
          ? cost.profile().sideStreamCopyScale
          : 1.0;
  double t = 0;
  size_t numOps = block.getOperations().size();
  sim.ops.reserve(numOps);
  sim.opIndex.reserve(numOps);
  SideQueue side(sim.ops);
  auto stallUntil = [&](SimulatedOp &s, double ready) {
    if (ready <= t)
      return;
    s.stall += ready - t;
    sim.exposedByScope[scopeKey(s.op)] += ready - t;
    sim.exposedSeconds += ready - t;
    t = ready;
  };
  for (Operation &op : block) {
    sim.opIndex[&op] = sim.ops.size();
    SimulatedOp s;
    s.op = &op;
    if (op.getDiscardableAttr(kSideStreamAttrName)) {
      // Issued now, run beside the compute ops that follow.
      double seconds = cost.cost(&op).seconds;
      s.side = true;
      s.start = s.end = t;
      sim.ops.push_back(s);
      sim.sideSeconds += seconds;
      side.enqueue(sim.ops.size() - 1, seconds);
      continue;
    }
    // Reading a side op's result: wait for it (the side stream runs alone
    // meanwhile).
    for (Value v : op.getOperands())
      if (Operation *def = v.getDefiningOp(); def && side.running(def)) {
        double ready = side.finish(t, def);
        s.sideWait += ready - t;
        sim.sideWaitSeconds += ready - t;
        t = ready;
      }
    if (auto offload = dyn_cast<OffloadOp>(op)) {
      if (maxInflight > 0) {
        engine.advanceTo(t);
        while (static_cast<int64_t>(engine.pendingDeviceToHost().size()) >=
               maxInflight) {
          int oldest = engine.pendingDeviceToHost().front();
          stallUntil(s, engine.finish(oldest));
          // A D2H has no dependency, so it always ends; stop rather than
          // spin should that ever change.
          if (!engine.pendingDeviceToHost().empty() &&
              engine.pendingDeviceToHost().front() == oldest)
            break;
        }
      }
      SimulatedCopy c;
      c.op = &op;
      c.direction = CopyDirection::DeviceToHost;
      c.issue = t;
      c.bytes = tensorBytes(offload.getInput().getType());
      c.scope = scopeKey(&op);
      sim.copyIndex[&op] = engine.enqueue(std::move(c));
    } else if (auto reload = dyn_cast<ReloadOp>(op)) {
      SimulatedCopy c;
      c.op = &op;
      c.direction = CopyDirection::HostToDevice;
      c.issue = t;
      c.bytes = tensorBytes(reload.getResult().getType());
      c.scope = scopeKey(&op);
      if (Operation *src = reload.getHost().getDefiningOp()) {
        auto it = sim.copyIndex.find(src);
        if (it != sim.copyIndex.end())
          c.dependsOn = it->second;
      }
      sim.copyIndex[&op] = engine.enqueue(std::move(c));
    } else if (auto wait = dyn_cast<WaitOp>(op)) {
      Operation *src = wait.getInput().getDefiningOp();
      auto it = src ? sim.copyIndex.find(src) : sim.copyIndex.end();
      if (it != sim.copyIndex.end()) {
        engine.advanceTo(t);
        stallUntil(s, engine.finish(it->second));
      }
    }
    double seconds = cost.cost(&op).seconds;
    // Copies slow the ops they run beside: charge the op for the bytes that
    // move during its own (unslowed) run. The queues may run ahead to t +
    // seconds: every later copy is issued at or after the op's end.
    if (seconds > 0 && cost.profile().slowdownBesideCopies()) {
      engine.advanceTo(t);
      const double h0 = engine.moved(CopyDirection::HostToDevice),
                   d0 = engine.moved(CopyDirection::DeviceToHost);
      engine.advanceTo(t + seconds);
      seconds += besideScale *
                 ((engine.moved(CopyDirection::HostToDevice) - h0) *
                      cost.slowdownBeside(&op, CopyDirection::HostToDevice) +
                  (engine.moved(CopyDirection::DeviceToHost) - d0) *
                      cost.slowdownBeside(&op, CopyDirection::DeviceToHost));
    }
    s.start = t;
    s.end = t + seconds;
    sim.busySeconds += seconds;
    side.advance(t, seconds, cost.sideCapacity(&op));
    t = s.end;
    sim.ops.push_back(s);
  }
  // The block ends when the side stream has drained.
  double drained = side.drain(t);
  sim.sideWaitSeconds += drained - t;
  t = drained;
  sim.computeSeconds = t;
  engine.drain();
  const double slack = cost.profile().copyHoldSlack;
  for (SimulatedCopy &c : sim.copies) {
    sim.copyEndSeconds = std::max(sim.copyEndSeconds, c.end);
    c.holdEnd = c.issue + (c.end - c.issue) * (1.0 + slack);
  }
  return sim;
}

int StreamSimulation::indexOf(Operation *op) const {
  auto it = opIndex.find(op);
  return it == opIndex.end() ? -1 : it->second;
}

const SimulatedCopy *StreamSimulation::copyOf(Operation *op) const {
  auto it = copyIndex.find(op);
  return it == copyIndex.end() ? nullptr : &copies[it->second];
}

double StreamSimulation::copySeconds(CopyDirection dir) const {
  double s = 0;
  for (const SimulatedCopy &c : copies)
    if (c.direction == dir)
      s += c.end - c.start;
  return s;
}
