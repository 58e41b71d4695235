//===- PrefetchPlanner.cpp - as-late-as-possible reload schedule ----------===//

#include "passes/analysis/PrefetchPlanner.h"

#include "llvm/ADT/STLExtras.h"

#include <algorithm>
#include <limits>
#include <numeric>

using namespace ap::train;

llvm::SmallVector<ReloadPlan>
ap::train::planReloads(llvm::ArrayRef<double> opEnd, int64_t firstAnchor,
                       const std::function<bool(int64_t)> &isAnchor,
                       llvm::ArrayRef<ReloadRequest> requests) {
  llvm::SmallVector<ReloadPlan> plans(requests.size());
  llvm::SmallVector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  // Latest deadline first; ties keep request order reversed so the FIFO
  // issue order matches the request order.
  llvm::stable_sort(order, [&](size_t a, size_t b) {
    return requests[a].needIndex > requests[b].needIndex;
  });
  auto startOf = [&](int64_t i) { return i <= 0 ? 0.0 : opEnd[i - 1]; };
  // The op ends of a timeline without stalls never step back. Then whether
  // an op delivers in time, max(opEnd[a], ready) + copy <= deadline, holds
  // up to some op and not after it (adding a constant keeps doubles in
  // order), and the latest anchor that delivers is the latest anchor at or
  // before the last op that does: found by bisection instead of a walk
  // back from the consumer over every op that is too late (the placement
  // search plans reloads for thousands of placed clones). Ends that step
  // back (or NaN) get the walk.
  bool ordered = true;
  for (size_t i = 1; i < opEnd.size() && ordered; ++i)
    ordered = opEnd[i] >= opEnd[i - 1];
  double queueBusyFrom = std::numeric_limits<double>::infinity();
  for (size_t r : order) {
    const ReloadRequest &req = requests[r];
    double deadline = std::min(startOf(req.needIndex), queueBusyFrom);
    ReloadPlan plan;
    plan.anchor = -1;
    plan.deadline = deadline;
    auto delivers = [&](int64_t a) {
      return std::max(opEnd[a], req.ready) + req.copySeconds <= deadline;
    };
    int64_t from = req.needIndex - 1;
    if (ordered && from >= firstAnchor) {
      // The first op in [firstAnchor, needIndex) that does not deliver.
      int64_t lo = firstAnchor, hi = req.needIndex;
      while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (delivers(mid))
          lo = mid + 1;
        else
          hi = mid;
      }
      from = lo - 1;
    }
    for (int64_t a = from; a >= firstAnchor; --a) {
      if (!isAnchor(a) || !delivers(a))
        continue;
      plan.anchor = a;
      plan.start = std::max(opEnd[a], req.ready);
      break;
    }
    if (plan.anchor < 0) {
      // Nothing delivers it in time: issue as early as backward allows,
      // but always before the consumer. When no anchor precedes it (the
      // first backward op reads the value, e.g. the LM head's), the reload
      // keeps its place right before the consumer (anchor -1).
      for (int64_t a = firstAnchor; a < req.needIndex && plan.anchor < 0; ++a)
        if (isAnchor(a))
          plan.anchor = a;
      plan.start = std::max(plan.anchor >= 0 ? opEnd[plan.anchor]
                                             : startOf(req.needIndex),
                            req.ready);
      plan.late = true;
    }
    plan.end = plan.start + req.copySeconds;
    queueBusyFrom = std::min(queueBusyFrom, plan.start);
    plans[r] = plan;
  }
  return plans;
}
