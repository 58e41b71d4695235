//===- DataParallelCost.cpp - the step on N replicated ranks --------------===//

#include "passes/analysis/DataParallelCost.h"

#include "dialect/train/TrainOps.h"
#include "passes/analysis/GradReduceBuckets.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

#include <algorithm>

using namespace mlir;
using namespace ap::train;

namespace {
/// The parameters a backward op accumulates into: its `*_grad` symbol
/// attributes (TrainBackwardOps.td; the lowering reads the same ones).
void forEachGradSymbol(Operation *op, function_ref<void(StringRef)> fn) {
  for (NamedAttribute a : op->getAttrs())
    if (auto sym = dyn_cast<FlatSymbolRefAttr>(a.getValue()))
      if (a.getName().getValue().ends_with("_grad"))
        fn(sym.getValue());
}
} // namespace

int64_t DataParallelStep::numBuckets() const {
  return llvm::count_if(collectives, [](const PredictedCollective &c) {
    return c.kind == PredictedCollective::Kind::GradBucket;
  });
}

DataParallelStep DataParallelStep::predict(Block &body,
                                           const StreamSimulation &sim,
                                           const CostModel &cost,
                                           int64_t microBatches, int64_t ranks,
                                           int64_t bucketBytes) {
  DataParallelStep s;
  s.ranks = ranks;
  s.bucketBytes = bucketBytes;
  s.microBatches = microBatches;
  s.microbatchSeconds = sim.computeSeconds;
  s.computeStepSeconds = sim.computeSeconds * microBatches;
  s.stepSeconds = s.computeStepSeconds;
  if (ranks <= 1)
    return s;

  // Each trainable parameter's main grad, in module order: the order the
  // lowering emits their reductions (ties of the bucketing rule).
  Operation *parent = body.getParentOp();
  auto module = parent ? parent->getParentOfType<ModuleOp>() : ModuleOp();
  struct Grad {
    std::string symbol;
    int64_t bytes;
  };
  SmallVector<Grad> grads;
  llvm::StringMap<unsigned> gradIndex;
  if (module)
    for (ParamOp p : module.getOps<ParamOp>())
      if (!p.getFrozen()) {
        auto type = cast<ShapedType>(p.getType());
        gradIndex[p.getSymName()] = grads.size();
        // FP32 main grads.
        grads.push_back({p.getSymName().str(), 4 * type.getNumElements()});
      }

  // Each grad's last writer in the body (nested regions count as their
  // top-level op, as exec-bucket-grad-reduce counts them).
  llvm::DenseMap<unsigned, std::pair<int64_t, Operation *>> lastWrite;
  int64_t pos = 0;
  for (Operation &top : body) {
    top.walk([&](Operation *op) {
      forEachGradSymbol(op, [&](StringRef sym) {
        auto it = gradIndex.find(sym);
        if (it != gradIndex.end())
          lastWrite[it->second] = {pos, &top};
      });
    });
    ++pos;
  }

  SmallVector<unsigned> written, unwritten;
  SmallVector<ap::GradFinalPoint> points;
  for (unsigned i = 0; i < grads.size(); ++i) {
    auto it = lastWrite.find(i);
    if (it == lastWrite.end()) {
      unwritten.push_back(i);
      continue;
    }
    written.push_back(i);
    points.push_back({it->second.first, grads[i].bytes});
  }

  double commFree = 0;
  auto run = [&](PredictedCollective c, ArrayRef<int64_t> parts) {
    c.start = std::max(c.issue, commFree);
    double t = c.start;
    for (int64_t bytes : parts)
      t += cost.collectiveSeconds(Collective::AllReduce, bytes, ranks);
    c.end = t;
    commFree = t;
    s.commSeconds += c.end - c.start;
    s.collectives.push_back(c);
  };
  for (ArrayRef<unsigned> members : ap::packGradBuckets(points, bucketBytes)) {
    PredictedCollective c;
    c.kind = PredictedCollective::Kind::GradBucket;
    SmallVector<int64_t> parts;
    for (unsigned m : members) {
      parts.push_back(points[m].bytes);
      c.bytes += points[m].bytes;
      c.gradNames.push_back(grads[written[m]].symbol);
    }
    c.grads = members.size();
    c.after = lastWrite[written[members.back()]].second;
    int idx = sim.indexOf(c.after);
    c.issue = idx >= 0 ? sim.ops[idx].end : sim.computeSeconds;
    run(c, parts);
  }
  // After the loop: the loss sum and token count, then the grads no kernel
  // of the loop writes, in the lowering's order.
  PredictedCollective loss;
  loss.kind = PredictedCollective::Kind::LossSum;
  loss.bytes = 4;
  loss.issue = sim.computeSeconds;
  run(loss, {int64_t(4)});
  PredictedCollective count = loss;
  count.kind = PredictedCollective::Kind::TokenCount;
  run(count, {int64_t(4)});
  for (unsigned i : unwritten) {
    PredictedCollective c;
    c.kind = PredictedCollective::Kind::UnwrittenGrad;
    c.bytes = grads[i].bytes;
    c.grads = 1;
    c.gradNames.push_back(grads[i].symbol);
    c.issue = sim.computeSeconds;
    run(c, {grads[i].bytes});
  }
  s.exposedCommSeconds = std::max(0.0, commFree - sim.computeSeconds);
  s.stepSeconds = s.computeStepSeconds + s.exposedCommSeconds;
  return s;
}
