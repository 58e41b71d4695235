//===- ExecScheduleStreams.cpp - exec-schedule-streams --------------------===//
//
// Applies StreamSchedule: inserts the event records and stream waits that
// order every cross-stream use of memory. Running it again adds nothing.
//
//===----------------------------------------------------------------------===//

#include "dialect/exec/ExecOps.h"
#include "passes/Passes.h"
#include "passes/analysis/ExecStreamSchedule.h"

#include "llvm/ADT/DenseSet.h"

namespace ap {
#define GEN_PASS_DEF_EXECSCHEDULESTREAMS
#include "passes/exec/ExecPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::exec;

namespace {
struct ExecScheduleStreamsPass
    : ap::impl::ExecScheduleStreamsBase<ExecScheduleStreamsPass> {
  using Base::Base;

  void runOnOperation() override {
    for (StepOp step : getOperation().getOps<StepOp>()) {
      StreamSchedule schedule(step);
      OpBuilder b(step.getContext());
      SmallVector<Value> created(schedule.numNewEvents);
      SmallVector<std::pair<WaitOp, const StreamInsertion *>> inserted;
      for (const StreamInsertion &ins : schedule.insertions) {
        if (ins.before)
          b.setInsertionPoint(ins.before);
        else
          b.setInsertionPointToEnd(ins.block);
        Location loc = ins.before ? ins.before->getLoc() : step.getLoc();
        if (ins.kind == StreamInsertion::Record) {
          Value ev =
              EventCreateOp::create(b, loc, EventType::get(b.getContext()));
          created[ins.newEvent] = ev;
          RecordOp::create(b, loc, ev, ins.stream);
          ++numRecords;
        } else {
          Value ev = ins.event ? ins.event : created[ins.newEvent];
          WaitOp w = WaitOp::create(b, loc, ev, ins.stream);
          inserted.push_back({w, &ins});
          ++numWaits;
        }
      }
      // Then drop the waits that order nothing new (several reload waits
      // before one consumer, a plan wait next to a covering one).
      llvm::DenseSet<Operation *> removed;
      for (WaitOp w : findRedundantWaits(step)) {
        removed.insert(w);
        w.erase();
        ++numRemoved;
      }
      if (remarks)
        for (auto [w, ins] : inserted)
          if (!removed.count(w.getOperation()))
            mlir::emitRemark(w.getLoc())
                << "exec-schedule-streams: " << explainWait(*ins);
      // Records nobody waits for any more order nothing.
      SmallVector<RecordOp> unused;
      step.walk([&](RecordOp r) {
        Value ev = r.getEvent();
        if (llvm::all_of(ev.getUsers(),
                         [](Operation *u) { return isa<RecordOp>(u); }))
          unused.push_back(r);
      });
      for (RecordOp r : unused) {
        Value ev = r.getEvent();
        r.erase();
        if (ev.use_empty())
          if (Operation *def = ev.getDefiningOp<EventCreateOp>())
            def->erase();
      }
    }
  }
};
} // namespace
