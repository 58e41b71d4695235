//===- ExecPipelineSchedule.cpp - exec-pipeline-schedule ------------------===//
//
// Lays out a pipeline stage's microbatches in one-forward-one-backward
// order (see ExecPasses.td): the body is cloned per microbatch and item.
//
//===----------------------------------------------------------------------===//

#include "dialect/exec/ExecOps.h"
#include "passes/Passes.h"

#include "mlir/IR/IRMapping.h"

namespace ap {
#define GEN_PASS_DEF_EXECPIPELINESCHEDULE
#include "passes/exec/ExecPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::exec;

/// The 1F1B order of stage `stage` of `stages` over `micro` microbatches:
/// (microbatch, backward) items.
static SmallVector<std::pair<int64_t, bool>>
oneForwardOneBackward(int64_t stages, int64_t stage, int64_t micro) {
  SmallVector<std::pair<int64_t, bool>> items;
  int64_t warmup = std::min(stages - 1 - stage, micro);
  for (int64_t m = 0; m < warmup; ++m)
    items.push_back({m, false});
  for (int64_t m = 0; m < micro; ++m) {
    if (m + warmup < micro)
      items.push_back({m + warmup, false});
    items.push_back({m, true});
  }
  return items;
}

namespace {
struct ExecPipelineSchedulePass
    : ap::impl::ExecPipelineScheduleBase<ExecPipelineSchedulePass> {
  using Base::Base;

  void runOnOperation() override {
    for (StepOp step : getOperation().getOps<StepOp>())
      if (failed(run(step)))
        return signalPassFailure();
  }

  LogicalResult run(StepOp step) {
    auto stages = step->getAttrOfType<IntegerAttr>("pipeline_stages");
    auto stage = step->getAttrOfType<IntegerAttr>("pipeline_stage");
    auto micro = step->getAttrOfType<IntegerAttr>("micro_batches");
    if (!stages || stages.getInt() <= 1)
      return success();
    if (!stage || !micro)
      return step.emitError("exec-pipeline-schedule: a pipeline step needs "
                            "pipeline_stage and micro_batches");
    // The last stage runs each microbatch's forward then its backward: the
    // loop as it is.
    if (stage.getInt() == stages.getInt() - 1)
      return success();
    MicrobatchLoopOp loop;
    step.walk([&](MicrobatchLoopOp l) { loop = l; });
    if (!loop)
      return step.emitError("exec-pipeline-schedule: no exec.microbatch_loop");
    if (loop.getCount() != micro.getInt())
      return loop.emitError()
             << "exec-pipeline-schedule: the loop runs " << loop.getCount()
             << " times, the step has " << micro.getInt() << " microbatches";
    Block &body = loop.getBody().front();

    // The backward starts where the gradient of the stage's output arrives.
    // (The buffer the gradient lands in, declared right before the
    // receive, goes with it.)
    SmallVector<Operation *> forward, backward;
    bool inBackward = false;
    for (Operation &op : body) {
      if (auto recv = dyn_cast<RecvOp>(op);
          recv && recv.getPeer() == PipelinePeer::Next && !inBackward) {
        inBackward = true;
        Operation *dest = recv.getBuffer().getDefiningOp();
        if (!forward.empty() && forward.back() == dest)
          backward.push_back(forward.pop_back_val());
      }
      (inBackward ? backward : forward).push_back(&op);
    }
    if (backward.empty())
      return loop.emitError("exec-pipeline-schedule: stage ")
             << stage.getInt()
             << " receives no gradient from the next stage, so its "
                "backward cannot be found";

    // Pinned slots: the body's slots repeated once per microbatch in
    // flight. 1F1B runs microbatch j's forward after microbatch
    // j - (warm-up + 1)'s whole backward, where that one released its
    // slots (after its reloads, which its backward kernels waited for), so
    // j takes set j mod (warm-up + 1) and the stage holds warm-up + 1 sets,
    // not one per microbatch.
    int64_t slots = 0, pinned = 0;
    for (Operation &op : body)
      if (auto a = dyn_cast<PoolAcquireOp>(op)) {
        slots = std::max(slots, int64_t(a.getSlot()) + 1);
        pinned = std::max(pinned, int64_t(a.getOffset() + a.getBytes()));
      }
    // Kernel ordinals of the body (done_by_kernel counts exec.kernel ops).
    DenseMap<Operation *, int64_t> ordinal;
    int64_t kernels = 0;
    for (Operation &op : body)
      if (isa<KernelOp>(op))
        ordinal[&op] = kernels++;

    OpBuilder b(loop);
    auto unrolled = MicrobatchLoopOp::create(b, loop.getLoc(), 1,
                                             loop.getMaxInflightAttr());
    Block *out = &unrolled.getBody().emplaceBlock();
    b.setInsertionPointToStart(out);
    int64_t count = micro.getInt();
    const int64_t slotSets =
        std::min(stages.getInt() - 1 - stage.getInt(), count) + 1;
    SmallVector<IRMapping> maps(count);
    // New ordinal of kernel k of microbatch m's clone (k = kernels: the end
    // of its backward).
    SmallVector<SmallVector<int64_t>> newOrdinal(
        count, SmallVector<int64_t>(kernels + 1, -1));
    SmallVector<D2HOp> d2hs;
    SmallVector<int64_t> d2hMicro;
    int64_t next = 0;
    for (auto [m, isBackward] :
         oneForwardOneBackward(stages.getInt(), stage.getInt(), count)) {
      MicrobatchOp::create(b, loop.getLoc(), m, isBackward);
      for (Operation *op : isBackward ? backward : forward) {
        Operation *clone = b.clone(*op, maps[m]);
        if (auto k = ordinal.find(op); k != ordinal.end())
          newOrdinal[m][k->second] = next++;
        if (auto a = dyn_cast<PoolAcquireOp>(clone)) {
          int64_t set = m % slotSets;
          a.setSlot(a.getSlot() + uint64_t(set * slots));
          a.setOffset(a.getOffset() + uint64_t(set * pinned));
        }
        if (auto d = dyn_cast<D2HOp>(clone); d && d.getDoneByKernel()) {
          d2hs.push_back(d);
          d2hMicro.push_back(m);
        }
      }
      if (isBackward)
        newOrdinal[m][kernels] = next;
      ++numItems;
    }
    for (auto [d, m] : llvm::zip(d2hs, d2hMicro)) {
      int64_t k = std::min<int64_t>(*d.getDoneByKernel(), kernels);
      d.setDoneByKernel(uint64_t(newOrdinal[m][k]));
    }
    loop.erase();
    return success();
  }
};
} // namespace
