//===- ExecPlanMemory.cpp - exec-plan-memory ------------------------------===//
//
// Applies MemoryPlan: writes every buffer's arena offset, adds the waits a
// region freed by an offload needs before its next writer, and records the
// plan's sizes on the step (what the runtime allocates and reports beside
// the measured peak).
//
//===----------------------------------------------------------------------===//

#include "dialect/exec/ExecOps.h"
#include "passes/Passes.h"
#include "passes/analysis/ExecMemoryPlan.h"

#include "llvm/Support/raw_ostream.h"

namespace ap {
#define GEN_PASS_DEF_EXECPLANMEMORY
#include "passes/exec/ExecPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::exec;

namespace {
struct ExecPlanMemoryPass : ap::impl::ExecPlanMemoryBase<ExecPlanMemoryPass> {
  using Base::Base;

  void runOnOperation() override {
    for (StepOp step : getOperation().getOps<StepOp>()) {
      MemoryPlan plan(step);
      if (!plan.valid())
        return signalPassFailure();
      OpBuilder b(step.getContext());
      auto i64 = [&](int64_t v) { return b.getI64IntegerAttr(v); };
      for (auto [op, offset] : plan.persistent) {
        if (auto p = dyn_cast<PersistentOp>(op))
          p.setOffsetAttr(i64(offset));
        else
          cast<BufferOp>(op).setOffsetAttr(i64(offset));
      }
      for (PlannedBuffer &p : plan.transients)
        p.op.setOffsetAttr(i64(plan.persistentBytes + p.offset));
      for (const ReuseWait &w : plan.reuseWaits) {
        b.setInsertionPoint(w.before);
        WaitOp::create(b, w.before->getLoc(), w.event, w.stream);
      }
      step->setAttr(kPersistentBytesAttr, i64(plan.persistentBytes));
      step->setAttr(kActivationBytesAttr, i64(plan.activationBytes));
      step->setAttr(kWorkspaceBytesAttr, i64(plan.workspaceBytes));
      if (plan.sideWorkspaceBytes)
        step->setAttr(kSideWorkspaceBytesAttr, i64(plan.sideWorkspaceBytes));
      step->setAttr(kArenaBytesAttr, i64(plan.arenaBytes()));
      step->setAttr(kPinnedBytesAttr, i64(plan.pinnedBytes));
      if (printPlan)
        plan.print(llvm::outs());
    }
  }
};
} // namespace
