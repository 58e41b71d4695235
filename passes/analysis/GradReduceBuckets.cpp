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

SmallVector<SmallVector<unsigned>>
ap::packGradBuckets(ArrayRef<GradFinalPoint> grads, int64_t bucketBytes) {
  SmallVector<unsigned> order(grads.size());
  for (unsigned i = 0; i < grads.size(); ++i)
    order[i] = i;
  llvm::stable_sort(order, [&](unsigned a, unsigned b) {
    return grads[a].position < grads[b].position;
  });
  SmallVector<SmallVector<unsigned>> buckets;
  SmallVector<unsigned> open;
  int64_t openBytes = 0;
  for (unsigned i : order) {
    open.push_back(i);
    openBytes += grads[i].bytes;
    if (openBytes >= bucketBytes) {
      buckets.push_back(std::move(open));
      open.clear();
      openBytes = 0;
    }
  }
  if (!open.empty())
    buckets.push_back(std::move(open));
  return buckets;
}

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
    Operation *writer;
    AllReduceOp reduction;
  };
  SmallVector<Final> finals;
  SmallVector<GradFinalPoint> points;
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
    finals.push_back({it->second.second, ar});
    points.push_back(
        {it->second.first, tensorBytes(ar.getBuffer().getType().getTensor())});
  }

  for (ArrayRef<unsigned> members : packGradBuckets(points, bucketBytes)) {
    GradBucket bucket;
    for (unsigned i : members) {
      bucket.reductions.push_back(finals[i].reduction);
      bucket.bytes += points[i].bytes;
    }
    bucket.after = finals[members.back()].writer;
    buckets.push_back(std::move(bucket));
  }
}
