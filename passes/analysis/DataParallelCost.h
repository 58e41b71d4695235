//===- DataParallelCost.h - the step on N replicated ranks ------*- C++ -*-===//
//
// Predicts a training step planned for N replicated data-parallel ranks from
// the train-dialect step, the way the lowering runs it (convert-train-to-exec
// then exec-bucket-grad-reduce):
//
//  - every microbatch's compute stream runs as StreamSimulation predicts it
//    (collectives do not slow compute in this model);
//  - in the last microbatch, each main grad's sum (an fp32 all-reduce of the
//    parameter's elements) is issued on the comm stream after the last
//    kernel that writes it, grads packed into buckets by the rule of
//    exec-bucket-grad-reduce (ap::packGradBuckets, one function for both);
//    a bucket is issued when the last writer of its last grad ends, its
//    reductions run back to back (each is its own collective with its own
//    latency, as the runtime issues them), and the comm stream runs one
//    collective at a time in issue order;
//  - after the loop the loss sum and the token count (4 bytes each), then
//    the sums of grads no kernel of the loop writes, join the comm stream;
//  - the optimizer (finalize_grads, adamw) starts once compute and comm are
//    both done.
//
// So the step is M x (one microbatch) plus the communication the last
// backward did not hide: exposedCommSeconds = max(0, end of the last
// collective - end of the last microbatch's compute). The optimizer's own
// time is the same with and without communication and, as in every step
// prediction of the placement passes, not part of stepSeconds. One rank: no
// collectives, stepSeconds = M x computeSeconds, bit for bit the prediction
// without data parallelism.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_DATAPARALLELCOST_H
#define ACTPLACE_PASSES_ANALYSIS_DATAPARALLELCOST_H

#include "passes/analysis/CostModel.h"
#include "passes/analysis/StreamSimulation.h"

#include "mlir/IR/Block.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <string>

namespace ap::train {

/// One collective on the comm stream of the last microbatch.
struct PredictedCollective {
  enum class Kind { GradBucket, LossSum, TokenCount, UnwrittenGrad };
  Kind kind = Kind::GradBucket;
  /// Bytes summed (a bucket: all its grads) and main grads in it.
  int64_t bytes = 0;
  int64_t grads = 0;
  /// The parameters whose main grads it sums, in the order they run.
  llvm::SmallVector<std::string> gradNames;
  /// The loop-body op after which a bucket is issued; null after the loop.
  mlir::Operation *after = nullptr;
  /// Seconds from the start of the last microbatch: issued, started (the
  /// comm stream free), ended (a bucket: its last reduction).
  double issue = 0, start = 0, end = 0;
};

struct DataParallelStep {
  int64_t ranks = 1, bucketBytes = 0, microBatches = 1;
  /// One microbatch's compute stream (StreamSimulation::computeSeconds).
  double microbatchSeconds = 0;
  /// The loop without communication: microBatches x microbatchSeconds.
  double computeStepSeconds = 0;
  /// computeStepSeconds + exposedCommSeconds: when the optimizer can start.
  double stepSeconds = 0;
  /// The communication the last backward did not hide.
  double exposedCommSeconds = 0;
  /// Seconds the comm stream is busy (every collective's duration).
  double commSeconds = 0;
  /// In comm-stream order: the buckets, then the step-level sums.
  llvm::SmallVector<PredictedCollective> collectives;

  /// Predicts the step whose microbatch loop body is `body` (train
  /// dialect), simulated as `sim` under `cost`, for `ranks` replicated
  /// ranks with buckets of at least `bucketBytes`.
  static DataParallelStep predict(mlir::Block &body,
                                  const StreamSimulation &sim,
                                  const CostModel &cost, int64_t microBatches,
                                  int64_t ranks, int64_t bucketBytes);

  /// Buckets only (GradBucket collectives).
  int64_t numBuckets() const;
};

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_DATAPARALLELCOST_H
