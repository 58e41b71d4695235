//===- ExecStreamSchedule.h - cross-stream ordering -------------*- C++ -*-===//
//
// Decides the event records and waits an exec.step needs so that every use
// of memory on one stream is ordered after the conflicting uses on other
// streams (read after write, write after read, write after write), in the
// device arena and in the pinned pool alike. Program order is enqueue
// order; each stream runs its ops in order; streams are ordered only by
// events. Vector clocks track, per stream, how far it is known to be
// ordered after every other stream (directly or through chains of waits),
// so a wait is added only where no existing one already orders the pair,
// and it uses the earliest event that suffices (an existing record or copy
// event when there is one, otherwise a new record right after the op that
// must complete).
//
// The microbatch loop body is scheduled on its own: at its start the
// copy streams wait for the compute stream (ordering them after the
// previous iteration), at its end the compute stream waits for every copy
// stream (so nothing of an iteration is in flight in the next one, which
// is what lets the memory plan and the pinned pool be those of one
// microbatch). At the step level the loop counts as compute work touching
// every outside buffer it uses; the step ends with compute waiting for
// every other stream. `max_inflight` on the loop bounds the D2H copies
// pending when a new one is issued: compute waits for the oldest first.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_EXECSTREAMSCHEDULE_H
#define ACTPLACE_PASSES_ANALYSIS_EXECSTREAMSCHEDULE_H

#include "dialect/exec/ExecOps.h"

#include "llvm/ADT/SmallVector.h"

#include <string>

namespace ap::exec {

/// One record or wait to insert. Inserted right before `before` (at the end
/// of `block` when null), in the order of the list.
struct StreamInsertion {
  enum Kind { Record, Wait } kind;
  mlir::Block *block;
  mlir::Operation *before;
  Stream stream;
  /// An event that exists in the IR, or null when `newEvent` names one the
  /// schedule creates (its Record comes first in the list).
  mlir::Value event;
  int newEvent = -1;
  /// Why: "RAW", "WAR", "WAW" (a conflict on bytes), "barrier-start",
  /// "barrier-end", "max-inflight".
  const char *reason = "";
  /// For a wait: the stream whose work it waits for.
  Stream waitsFor = Stream::Compute;
};

/// One sentence saying why a wait of `stream` for `waitsFor` was needed.
std::string explainWait(const StreamInsertion &wait);

class StreamSchedule {
public:
  explicit StreamSchedule(StepOp step);

  llvm::SmallVector<StreamInsertion> insertions;
  int numNewEvents = 0;
};

/// Waits of `step` that order nothing new: in a run of waits of one stream
/// (no work or record of that stream between them), a wait whose event is
/// implied by the others' (its clock is covered by theirs). Removing them
/// leaves every stream's ordering after the run unchanged. Typical sources:
/// wait anchors of several reloads before one consumer (the h2d stream
/// completes in order, so the latest covers the rest), a memory-plan reuse
/// wait next to a schedule wait that covers it.
llvm::SmallVector<WaitOp> findRedundantWaits(StepOp step);

} // namespace ap::exec

#endif // ACTPLACE_PASSES_ANALYSIS_EXECSTREAMSCHEDULE_H
