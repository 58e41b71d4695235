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
  double queueBusyFrom = std::numeric_limits<double>::infinity();
  for (size_t r : order) {
    const ReloadRequest &req = requests[r];
    double deadline = std::min(startOf(req.needIndex), queueBusyFrom);
    ReloadPlan plan;
    plan.anchor = -1;
    plan.deadline = deadline;
    for (int64_t a = req.needIndex - 1; a >= firstAnchor; --a) {
      if (!isAnchor(a))
        continue;
      double start = std::max(opEnd[a], req.ready);
      if (start + req.copySeconds <= deadline) {
        plan.anchor = a;
        plan.start = start;
        break;
      }
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
