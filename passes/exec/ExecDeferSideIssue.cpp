//===- ExecDeferSideIssue.cpp - exec-defer-side-issue ---------------------===//
//
// Issues each run of side-stream work after the compute kernel that follows
// it. train-recompute-stream places a recompute run right before the kernel
// it is meant to overlap (the host), and the lowering keeps that order, so
// the runtime enqueued the side GEMMs first: their CTAs took their SMs
// before the host's first, wide kernel could, and that kernel ran on the
// rest. Enqueued after the host, the side work meets SMs the host already
// holds and takes what its sequential passes leave idle (measured with
// runtime_offload_bench overlap: side work issued with or just after the
// GDN chunk backward hides; see bench/notes/runtime.md).
//
// The target is the host train-recompute-stream chose (the compute kernel
// marked `train.side_host`), past the compute kernels before it (the norms
// that feed later runs): issued after one of those, a run's GEMMs started
// while they ran and held most SMs (measured with --op-timeline: the norm
// recompute took twice as long; bench/notes/training.md). Side runs met on the
// way join the run, in order. Without a host ahead, or when something orders
// against the run before it, the run moves past the next compute kernel alone,
// as before.
//
// Only the host (CPU) issue order changes. Ops are moved past an op only
// when it does not order against them: no wait for an event they record,
// no record of an event they wait for, no region or host-side op. Each stream
// then sees the same ops in the same order and every wait the same last record,
// so the device executes the same dependency graph; placement's bits do
// not change. `done_by_kernel` ordinals are renumbered to keep naming the
// same kernel.
//
//===----------------------------------------------------------------------===//

#include "dialect/exec/ExecOps.h"
#include "dialect/train/TrainDialect.h"
#include "passes/Passes.h"
#include "passes/analysis/ExecMemoryPlan.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

namespace ap {
#define GEN_PASS_DEF_EXECDEFERSIDEISSUE
#include "passes/exec/ExecPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::exec;

namespace {

/// Marks the ops of a moved run.
constexpr llvm::StringLiteral kIssuedAfterHost = "exec.issued_after_host";

/// The stream an op enqueues work or ordering on (the memory plan's
/// streamOf, plus waits and records), or none for ops that only define
/// values (buffers, views, events) or run on the host.
std::optional<Stream> streamOf(Operation *op) {
  if (auto w = dyn_cast<WaitOp>(op))
    return w.getStream();
  if (auto r = dyn_cast<RecordOp>(op))
    return r.getStream();
  return ap::exec::streamOf(op);
}

/// Ops that define values and enqueue nothing: a run may move past them.
bool definesOnly(Operation *op) {
  return isa<BufferOp, ViewOp, EventCreateOp>(op);
}

/// A compute kernel that train-recompute-stream issued side work before.
bool isSideHost(Operation *op) {
  auto k = dyn_cast<KernelOp>(op);
  return k && k.getStream() == Stream::Compute &&
         k.getArgs().get(ap::train::kSideHostAttrName);
}

/// The event an op records (a record, or a copy's completion event).
Value recordedEvent(Operation *op) {
  if (auto r = dyn_cast<RecordOp>(op))
    return r.getEvent();
  if (auto c = dyn_cast<D2HOp>(op))
    return c.getEvent();
  if (auto c = dyn_cast<H2DOp>(op))
    return c.getEvent();
  return {};
}

struct ExecDeferSideIssuePass
    : ap::impl::ExecDeferSideIssueBase<ExecDeferSideIssuePass> {
  using Base::Base;

  /// Moves the side runs of `block`; returns how many moved.
  unsigned deferRuns(Block &block) {
    unsigned moved = 0;
    for (Operation *op = block.empty() ? nullptr : &block.front(); op;) {
      std::optional<Stream> s = streamOf(op);
      if (!s || *s != Stream::Side) {
        op = op->getNextNode();
        continue;
      }
      // The run: side-stream ops, with value definitions between them.
      SmallVector<Operation *> run;
      llvm::DenseSet<Value> runRecords, runWaits;
      auto absorb = [&](Operation *side) {
        run.push_back(side);
        if (Value e = recordedEvent(side))
          runRecords.insert(e);
        if (auto w = dyn_cast<WaitOp>(side))
          runWaits.insert(w.getEvent());
      };
      Operation *cur = op;
      for (; cur; cur = cur->getNextNode()) {
        std::optional<Stream> cs = streamOf(cur);
        if (cs && *cs == Stream::Side) {
          absorb(cur);
          continue;
        }
        if (!definesOnly(cur))
          break;
      }
      const size_t ownOps = run.size();
      // Walk towards the host past ops that do not order against the run;
      // `first` is the next compute kernel, the target without a host.
      Operation *target = nullptr, *first = nullptr;
      for (Operation *next = cur; next; next = next->getNextNode()) {
        if (definesOnly(next))
          continue;
        std::optional<Stream> ns = streamOf(next);
        if (ns && *ns == Stream::Side && first) {
          absorb(next); // a later run joins, keeping its order
          continue;
        }
        if (!ns || *ns == Stream::Side || next->getNumRegions())
          break;
        if (auto w = dyn_cast<WaitOp>(next);
            w && runRecords.count(w.getEvent()))
          break;
        if (Value e = recordedEvent(next); e && runWaits.count(e))
          break;
        if (auto k = dyn_cast<KernelOp>(next);
            k && k.getStream() == Stream::Compute) {
          if (!first)
            first = next;
          if (isSideHost(next)) {
            target = next;
            break;
          }
        }
      }
      if (!target) {
        run.resize(ownOps);
        target = first;
      }
      Operation *resume = cur;
      // A run moved once stays: the pass is idempotent.
      if (llvm::all_of(
              run, [](Operation *r) { return r->hasAttr(kIssuedAfterHost); }))
        target = nullptr;
      if (target) {
        Operation *after = target;
        for (Operation *r : run) {
          r->moveAfter(after);
          r->setAttr(kIssuedAfterHost, UnitAttr::get(r->getContext()));
          after = r;
        }
        resume = after->getNextNode();
        ++moved;
      }
      op = resume;
    }
    return moved;
  }

  void runOnOperation() override {
    for (StepOp step : getOperation().getOps<StepOp>()) {
      // Kernel ordinals of the loop body before the moves: done_by_kernel
      // names a kernel by its ordinal there.
      for (MicrobatchLoopOp loop : step.getBody().getOps<MicrobatchLoopOp>()) {
        Block &body = loop.getBody().front();
        SmallVector<Operation *> kernelsBefore;
        for (Operation &op : body)
          if (isa<KernelOp>(op))
            kernelsBefore.push_back(&op);
        numRunsMoved += deferRuns(body);
        llvm::DenseMap<Operation *, int64_t> ordinalAfter;
        for (Operation &op : body)
          if (isa<KernelOp>(op))
            ordinalAfter[&op] = int64_t(ordinalAfter.size());
        OpBuilder b(loop.getContext());
        for (D2HOp d2h : body.getOps<D2HOp>())
          if (auto k = d2h.getDoneByKernel())
            if (int64_t(*k) < int64_t(kernelsBefore.size()))
              d2h.setDoneByKernelAttr(
                  b.getI64IntegerAttr(ordinalAfter[kernelsBefore[*k]]));
      }
      numRunsMoved += deferRuns(step.getBody().front());
    }
  }
};

} // namespace
