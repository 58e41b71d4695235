//===- DataParallelCost.h - the step on N data-parallel ranks ---*- C++ -*-===//
//
// Predicts a training step planned for N data-parallel ranks from the
// train-dialect step, the way the lowering runs it.
//
// Replicate (convert-train-to-exec then exec-bucket-grad-reduce):
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
// collective - end of the last microbatch's compute).
//
// ZeRO-3 (convert-train-to-exec then exec-shard-params, whose decision is
// passes/analysis/ZeroShardPlan.h): the same windows, found on the train
// IR by the same rule (ap::splitZeroWindows, one function for both): the
// weights a window reads are the train.param_ref results its ops use
// (through train.reshape), the grads it accumulates are named by its ops'
// `*_grad` symbol attributes. Every microbatch, in program order:
//
//  - before the first op of window w - K (K = gather-max-inflight; the
//    first window for w < K) each parameter of weight window w is
//    all-gathered: one collective per parameter of N x ceil(numel / N)
//    elements of its dtype, issued when compute reaches that op;
//  - the window's first op waits until its last gather ended: the wait
//    delays that op and everything after it in the microbatch (the
//    simulated microbatch shifted; side-stream ops are treated like
//    compute ops), so unhidden gather time lengthens the step;
//  - after the last op of a grad window each of its main grads is
//    reduce-scattered: one collective per parameter of N x ceil(numel / N)
//    fp32 elements, issued when that op ends;
//  - the comm stream runs one collective at a time in issue order, across
//    microbatches (a microbatch's last reduce-scatters can hold up the
//    next one's first gathers); after the loop the loss sum and the token
//    count follow, and no main grad is summed there.
//
// Then stepSeconds = when the last of compute and comm ends, and
// exposedCommSeconds = stepSeconds - computeStepSeconds: the gather waits
// plus the tail after the last microbatch's compute.
//
// Prices (CostModel::collectiveSeconds, DeviceProfile's NCCL bus-bandwidth
// convention): an all-reduce of S bytes over N ranks moves 2(N-1)/N x S,
// an all-gather or a reduce-scatter (N-1)/N x S, S being the whole
// gathered (or scattered) buffer, plus the collective's latency each.
//
// The optimizer's own time is the same with and without communication and,
// as in every step prediction of the placement passes, not part of
// stepSeconds. One rank: no collective costs anything, stepSeconds = M x
// computeSeconds, bit for bit the prediction without data parallelism.
//
// ZeroLayout also gives the memory timeline (MemoryTimeline.h) its per-rank
// bytes under zero3: the persistent state sharded, the gathered weights
// and the grad buffers of the windows where they are live.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_DATAPARALLELCOST_H
#define ACTPLACE_PASSES_ANALYSIS_DATAPARALLELCOST_H

#include "passes/PassEnums.h"
#include "passes/analysis/CostModel.h"
#include "passes/analysis/StreamSimulation.h"

#include "mlir/IR/Block.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <string>

namespace ap::train {

/// How the step's data-parallel ranks hold the parameters: the placement
/// options data-parallel, data-parallel-size, grad-bucket-bytes and
/// gather-max-inflight (PlacementConfig::dataParallelOptions).
struct DataParallelOptions {
  DataParallelMode mode = DataParallelMode::Replicate;
  int64_t ranks = 1;
  /// Replicate: the smallest main-grad bucket.
  int64_t bucketBytes = 26214400;
  /// Zero3: windows gathered ahead of the one computing.
  int64_t gatherMaxInflight = 1;
  /// Zero3: main-grad shards are bf16 (2 bytes an element, not 4).
  bool bf16MainGrads = false;
  bool zero3() const { return mode == DataParallelMode::Zero3; }
};

/// A parameter of the step under zero3, in module order.
struct ZeroParam {
  std::string name;
  mlir::RankedTensorType type;
  bool trainable = true;
  /// ceil(numel / ranks).
  int64_t shardElements = 0;
  /// This rank's shard of the compute copy (the parameter's dtype).
  int64_t shardBytes() const;
  /// A gathered copy: ranks x shardElements of the parameter's dtype.
  int64_t gatheredBytes(int64_t ranks) const;
  /// A window's fp32 grad buffer: ranks x shardElements x 4.
  int64_t gradBufferBytes(int64_t ranks) const;
};

/// One ZeRO-3 window of the train-dialect loop body (ZeroShardPlan.h).
struct ZeroWindow {
  std::string group;
  /// The window's first and last op in the loop body.
  mlir::Operation *first = nullptr, *last = nullptr;
  /// Weight windows: the body op before which its gathers are issued.
  mlir::Operation *gatherBefore = nullptr;
  /// Indices into ZeroLayout::params, in module order.
  llvm::SmallVector<unsigned> params;
  /// Gathered weights, or fp32 grad buffers, of all its parameters.
  int64_t bytes = 0;
};

/// Where a zero3 step's gathers and reduce-scatters go and what each rank
/// holds: ZeroShardPlan's decision, made on the train IR.
struct ZeroLayout {
  int64_t ranks = 1;
  llvm::SmallVector<ZeroParam> params;
  /// Weight windows in body order of their first use, grad windows in
  /// body order of their first write.
  llvm::SmallVector<ZeroWindow> gathers, reductions;
  /// This rank's persistent state (MemoryTimeline's categories): weight
  /// shards; main-grad shards (fp32, or bf16 with `bf16MainGrads`); fp32
  /// master and Adam moment shards.
  int64_t paramBytes = 0, gradBytes = 0, optimizerBytes = 0;

  /// The layout of `module`'s parameters over `ranks`, with the windows of
  /// the microbatch loop body `body` (none when it is null).
  static ZeroLayout of(mlir::ModuleOp module, mlir::Block *body, int64_t ranks,
                       int64_t gatherMaxInflight, bool bf16MainGrads = false);
  /// Collectives per microbatch: one per parameter of each window.
  int64_t numGathers() const;
  int64_t numReduceScatters() const;
};

/// One collective on the comm stream of the last microbatch.
struct PredictedCollective {
  enum class Kind {
    GradBucket,
    LossSum,
    TokenCount,
    UnwrittenGrad,
    GatherWindow,
    ReduceScatterWindow
  };
  Kind kind = Kind::GradBucket;
  /// Bytes summed (a bucket: all its grads; a window: its parameters'
  /// gathered or scattered buffers) and main grads in it.
  int64_t bytes = 0;
  int64_t grads = 0;
  /// The parameters whose main grads it sums, in the order they run.
  llvm::SmallVector<std::string> gradNames;
  /// The loop-body op after which a bucket or a reduce-scatter window is
  /// issued; null after the loop.
  mlir::Operation *after = nullptr;
  /// Zero3 windows: the layer group; for a gather window, its parameters,
  /// the body op its gathers are issued before and how long the window's
  /// first op waited for them.
  std::string group;
  int64_t params = 0;
  llvm::SmallVector<std::string> paramNames;
  mlir::Operation *before = nullptr;
  double wait = 0;
  /// Seconds from the start of the last microbatch: issued, started (the
  /// comm stream free), ended (a bucket or window: its last collective).
  double issue = 0, start = 0, end = 0;
};

struct DataParallelStep {
  DataParallelMode mode = DataParallelMode::Replicate;
  int64_t ranks = 1, bucketBytes = 0, microBatches = 1;
  /// Zero3: gather-max-inflight, windows and collectives per microbatch,
  /// and the compute stream's waits for gathers over the step.
  int64_t gatherMaxInflight = 0;
  int64_t gatherWindows = 0, gathersPerMicrobatch = 0;
  int64_t reduceScatterWindows = 0, reduceScattersPerMicrobatch = 0;
  double gatherWaitSeconds = 0;
  /// One microbatch's compute stream (StreamSimulation::computeSeconds).
  double microbatchSeconds = 0;
  /// The loop without communication: microBatches x microbatchSeconds.
  double computeStepSeconds = 0;
  /// computeStepSeconds + exposedCommSeconds: when the optimizer can start.
  double stepSeconds = 0;
  /// The communication compute did not hide (stepSeconds -
  /// computeStepSeconds).
  double exposedCommSeconds = 0;
  /// Seconds the comm stream is busy (every collective's duration; zero3:
  /// over the whole step, replicate: the last microbatch and after).
  double commSeconds = 0;
  /// In comm-stream order: the buckets (replicate) or the last
  /// microbatch's windows (zero3), then the step-level sums.
  llvm::SmallVector<PredictedCollective> collectives;

  /// Predicts the step whose microbatch loop body is `body` (train
  /// dialect), simulated as `sim` under `cost`, on the ranks `options`
  /// describe.
  static DataParallelStep predict(mlir::Block &body,
                                  const StreamSimulation &sim,
                                  const CostModel &cost, int64_t microBatches,
                                  const DataParallelOptions &options);

  /// Buckets only (GradBucket collectives).
  int64_t numBuckets() const;
};

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_DATAPARALLELCOST_H
