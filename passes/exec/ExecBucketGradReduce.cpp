//===- ExecBucketGradReduce.cpp - exec-bucket-grad-reduce -----------------===//
//
// Applies GradReduceBuckets: moves each bucket's main-grad all-reduces into
// the microbatch loop after the bucket's last writer, marked
// last_microbatch.
//
//===----------------------------------------------------------------------===//

#include "dialect/exec/ExecOps.h"
#include "passes/Passes.h"
#include "passes/analysis/GradReduceBuckets.h"

#include "llvm/ADT/DenseMap.h"

namespace ap {
#define GEN_PASS_DEF_EXECBUCKETGRADREDUCE
#include "passes/exec/ExecPasses.h.inc"
} // namespace ap

using namespace mlir;
using namespace ap::exec;

namespace {
struct ExecBucketGradReducePass
    : ap::impl::ExecBucketGradReduceBase<ExecBucketGradReducePass> {
  using Base::Base;

  void runOnOperation() override {
    if (bucketBytes < 0) {
      getOperation().emitError()
          << "exec-bucket-grad-reduce: bucket-bytes " << int64_t(bucketBytes)
          << " (expected 0 or more)";
      return signalPassFailure();
    }
    for (StepOp step : getOperation().getOps<StepOp>()) {
      auto size = step->getAttrOfType<IntegerAttr>(kDataParallelSizeAttr);
      auto mode = step->getAttrOfType<StringAttr>(kDataParallelModeAttr);
      // ZeRO-3 reduce-scatters its grads per window (exec-shard-params).
      if (!size || size.getInt() <= 1 || (mode && mode.getValue() == "zero3"))
        continue;
      GradReduceBuckets plan(step, bucketBytes);
      // Buckets closed by the same kernel (one that writes several grads,
      // bucket-bytes small) go after each other in bucket order, as the
      // cost model (DataParallelCost) issues them.
      llvm::DenseMap<Operation *, Operation *> lastPlaced;
      for (GradBucket &bucket : plan.buckets) {
        OpBuilder b(bucket.after->getContext());
        Operation *&last = lastPlaced[bucket.after];
        b.setInsertionPointAfter(last ? last : bucket.after);
        for (AllReduceOp ar : bucket.reductions) {
          last = AllReduceOp::create(b, ar.getLoc(), ar.getBuffer(),
                                     ar.getCommunicator(), Stream::Comm,
                                     /*last_microbatch=*/true);
          ar.erase();
          ++numMoved;
        }
        ++numBuckets;
      }
      numStayed += plan.numUnwritten;
    }
  }
};
} // namespace
