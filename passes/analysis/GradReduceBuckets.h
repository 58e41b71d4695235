//===- GradReduceBuckets.h - where main-grad all-reduces go -----*- C++ -*-===//
//
// Decides where a replicated data-parallel step sums its main grads. The
// lowering sums every main grad over "dp" after the microbatch loop, so all
// communication waits for the whole backward. A main grad is final once the
// last microbatch's last kernel that writes it ran; from there its sum can
// run on the comm stream while the rest of the backward computes.
//
// Grads are taken in the order of their last writer in the loop body
// (backward order: the last layers' grads first) and packed greedily into
// buckets of at least `bucketBytes` (the last bucket takes what is left).
// A bucket's reductions go right after the last writer of its last grad,
// marked last_microbatch, so a bucket is issued once all its grads are
// final and the stream schedule's events order it after those writers and
// the step's optimizer after it. Larger buckets mean fewer, more efficient
// collectives and later starts; 0 puts every grad in a bucket of its own.
//
// Only step-level all-reduces over "dp" of main-grad buffers move; the loss
// sum and token count are known only after the loop and stay. A grad no
// kernel of the loop writes stays at the step level too.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_GRADREDUCEBUCKETS_H
#define ACTPLACE_PASSES_ANALYSIS_GRADREDUCEBUCKETS_H

#include "dialect/exec/ExecOps.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>

namespace ap {

/// One main grad to bucket: where its last writer sits in the microbatch
/// loop body (any order-preserving position) and its bytes.
struct GradFinalPoint {
  int64_t position = 0;
  int64_t bytes = 0;
};

/// The bucketing rule, one place for the pass (exec IR) and the cost model
/// (train IR, passes/analysis/DataParallelCost.h): `grads` in step order
/// (the order the lowering emits their reductions, the module's parameter
/// order) are taken by their last writer's position, ties in step order,
/// and packed greedily into buckets of at least `bucketBytes` (the last
/// takes the rest). Returns each bucket's grads, as indices into `grads`,
/// in issue order.
llvm::SmallVector<llvm::SmallVector<unsigned>>
packGradBuckets(llvm::ArrayRef<GradFinalPoint> grads, int64_t bucketBytes);

} // namespace ap

namespace ap::exec {

struct GradBucket {
  /// The step-level reductions that move, in issue order.
  llvm::SmallVector<AllReduceOp> reductions;
  /// The loop-body op after which the bucket is issued.
  mlir::Operation *after = nullptr;
  int64_t bytes = 0;
};

class GradReduceBuckets {
public:
  GradReduceBuckets(StepOp step, int64_t bucketBytes);

  llvm::SmallVector<GradBucket> buckets;
  /// Main-grad reductions that stay after the loop (no writer in it).
  int64_t numUnwritten = 0;
};

} // namespace ap::exec

#endif // ACTPLACE_PASSES_ANALYSIS_GRADREDUCEBUCKETS_H
