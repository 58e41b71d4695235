//===- GradReduceBuckets.cpp - where main-grad all-reduces go -------------===//

#include "passes/analysis/GradReduceBuckets.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace ap::exec;

namespace {
/// The persistent main-grad buffer a value is (through views), or null.
PersistentOp mainGradOf(Value v) {
  while (auto view = v.getDefiningOp<ViewOp>())
    v = view.getSource();
  auto p = v.getDefiningOp<PersistentOp>();
  return p && p.getRole() == BufferRole::MainGrad ? p : PersistentOp();
}
} // namespace

GradReduceBuckets::GradReduceBuckets(StepOp step, int64_t bucketBytes) {
  MicrobatchLoopOp loop;
  for (Operation &op : step.getBody().front())
    if (auto l = dyn_cast<MicrobatchLoopOp>(op))
      loop = l;
  if (!loop)
    return;

  // The step-level reductions over "dp" of main grads, by buffer.
  llvm::DenseMap<Operation *, AllReduceOp> reductionOf;
  for (Operation &op : step.getBody().front())
    if (auto ar = dyn_cast<AllReduceOp>(op))
      if (ar.getCommunicator() == "dp")
        if (PersistentOp g = mainGradOf(ar.getBuffer()))
          reductionOf.try_emplace(g, ar);
  if (reductionOf.empty())
    return;

  // Position and op of each grad's last writer in the loop body (nested
  // regions count as their top-level op).
  Block &body = loop.getBody().front();
  llvm::DenseMap<Operation *, std::pair<int64_t, Operation *>> lastWrite;
  int64_t pos = 0;
  for (Operation &top : body) {
    top.walk([&](KernelOp k) {
      for (Value out : k.getOutputs())
        if (PersistentOp g = mainGradOf(out))
          if (reductionOf.count(g))
            lastWrite[g] = {pos, &top};
    });
    ++pos;
  }

  struct Final {
    int64_t pos;
    Operation *writer;
    AllReduceOp reduction;
    int64_t bytes;
  };
  SmallVector<Final> finals;
  // Step order of the reductions keeps ties (one kernel writing several
  // grads) in a fixed order.
  for (Operation &op : step.getBody().front()) {
    auto ar = dyn_cast<AllReduceOp>(op);
    if (!ar)
      continue;
    PersistentOp g = mainGradOf(ar.getBuffer());
    if (!g || reductionOf.lookup(g) != ar)
      continue;
    auto it = lastWrite.find(g);
    if (it == lastWrite.end()) {
      ++numUnwritten;
      continue;
    }
    finals.push_back({it->second.first, it->second.second, ar,
                      tensorBytes(ar.getBuffer().getType().getTensor())});
  }
  llvm::stable_sort(finals, [](const Final &a, const Final &b) {
    return a.pos < b.pos;
  });

  GradBucket open;
  for (const Final &f : finals) {
    open.reductions.push_back(f.reduction);
    open.bytes += f.bytes;
    open.after = f.writer;
    if (open.bytes >= bucketBytes) {
      buckets.push_back(std::move(open));
      open = GradBucket();
    }
  }
  if (!open.reductions.empty())
    buckets.push_back(std::move(open));
}
