//===- PrefetchPlanner.h - as-late-as-possible reload schedule ----*- C++
//-*-===//
//
// Chooses, for every reload, the backward op after which its H2D is issued.
// Reloads share one FIFO h2d queue, so they are scheduled from the last
// deadline backwards: each copy ends before its consumer starts and before
// the next copy in the queue begins, and starts as late as that allows
// (least device memory held) but never before its own D2H has ended.
// Used by train-offload-scopes (hide rule) and train-prefetch-anchors.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_PREFETCHPLANNER_H
#define ACTPLACE_PASSES_ANALYSIS_PREFETCHPLANNER_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <functional>

namespace ap::train {

struct ReloadRequest {
  /// Body index of the first op that needs the value.
  int64_t needIndex = 0;
  /// When the value's D2H has ended (seconds from the body start).
  double ready = 0;
  /// Seconds the H2D takes.
  double copySeconds = 0;
};

struct ReloadPlan {
  /// Body index of the op after which the reload is issued; always before
  /// the consumer. -1: no anchor precedes the consumer, so the reload stays
  /// right before it.
  int64_t anchor = 0;
  double start = 0, end = 0;
  /// When the copy has to be done: its consumer's start, or earlier when the
  /// copies needed after it occupy the queue from then on.
  double deadline = 0;
  /// True when no anchor delivers the copy by its deadline.
  bool late = false;
};

/// `opEnd[i]` is when body op i ends on the compute stream (no stalls);
/// anchors are ops with index >= `firstAnchor` for which `isAnchor` holds.
/// Returns one plan per request, in request order.
llvm::SmallVector<ReloadPlan>
planReloads(llvm::ArrayRef<double> opEnd, int64_t firstAnchor,
            const std::function<bool(int64_t)> &isAnchor,
            llvm::ArrayRef<ReloadRequest> requests);

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_PREFETCHPLANNER_H
