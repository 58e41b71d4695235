//===- StreamSimulation.h - compute / d2h / h2d queue timing ----*- C++ -*-===//
//
// Predicts when each op of a block runs on the compute stream and when each
// offload (D2H) and reload (H2D) copy runs on its host-link queue, so that
// placement passes can choose prefetch anchors and report hidden versus
// exposed transfer time (docs/architecture.md section 4). Reads the IR only.
//
// Model: the compute stream runs the block's ops in order, each taking
// CostModel::cost(op).seconds. `train.offload` issues a D2H when the compute
// stream reaches it; the copy starts once the d2h queue is free. A
// `train.reload` issues an H2D when reached; it starts once the h2d queue is
// free and its own offload's D2H has ended. `train.wait` stalls compute until
// the H2D of the reload it waits on has ended; the stall is exposed transfer
// time of the wait's scope. When the block belongs to a microbatch loop with
// `train.max_inflight = N`, an offload that finds N D2H copies pending first
// stalls compute until the oldest has ended (exposed time of the offload's
// scope). Each queue runs one copy at a time, in issue order. The link is
// shared as a fluid: while both directions copy, each gets its
// CostModel::copyBandwidth(dir, /*otherDirectionBusy=*/true) share, so a copy
// that overlaps the other direction only in part is slowed only for that
// part. Copies cost compute time (DeviceProfile): either a fixed charge per
// byte at the op that issues the copy (copySlowdownPerByte, in
// CostModel::cost of train.offload / train.reload), or, with the per-op
// h2dSlowdown / d2hSlowdown tables, each op is slowed by the bytes that move
// during its run times its own rate (times sideStreamCopyScale in a block
// with side-stream ops).
//
// Side stream (train-recompute-stream): an op marked `train.side_stream`
// is issued when compute reaches it and does not hold compute up. Side ops
// run in order; while a compute op runs, side work advances at that op's
// CostModel::sideCapacity (seconds of side work per second, 0 for most
// ops), without slowing it. A compute op that reads a side op's result
// first waits for it; while compute waits, side work advances at full
// speed. That wait is recompute time the overlap did not hide
// (sideWaitSeconds), not transfer time. The block ends once the side
// stream has drained (the loop's end barrier).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_STREAMSIMULATION_H
#define ACTPLACE_PASSES_ANALYSIS_STREAMSIMULATION_H

#include "passes/analysis/CostModel.h"

#include "mlir/IR/Block.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <map>
#include <string>

namespace ap::train {

/// One op of the simulated block on the compute stream.
struct SimulatedOp {
  mlir::Operation *op = nullptr;
  /// When the op starts (after any stall) and ends, in seconds from the
  /// start of the block.
  double start = 0, end = 0;
  /// Seconds the compute stream waited before the op (train.wait for its
  /// H2D; train.offload over the max-inflight limit for the oldest D2H).
  double stall = 0;
  /// Seconds the compute stream waited before the op for side-stream work
  /// it reads (not in `stall`: recompute, not transfer).
  double sideWait = 0;
  /// A side-stream op: `start` is when it began on the side stream, `end`
  /// when it completed.
  bool side = false;
};

/// One D2H (offload) or H2D (reload) copy.
struct SimulatedCopy {
  /// The train.offload or train.reload that issues the copy.
  mlir::Operation *op = nullptr;
  CopyDirection direction = CopyDirection::DeviceToHost;
  /// Issued when compute reaches `op`; runs from start to end.
  double issue = 0, start = 0, end = 0;
  /// Until when a D2H's source bytes stay reserved on the device: `end`
  /// stretched by the profile's copyHoldSlack from `issue`.
  double holdEnd = 0;
  int64_t bytes = 0;
  /// scopeKey(op).
  std::string scope;
  /// For a reload: index in `copies` of its offload's D2H (-1 when the host
  /// value does not come from an offload in this block).
  int dependsOn = -1;
};

struct StreamSimulation {
  /// The block's ops in order; `ops[i].op` is the i-th op.
  llvm::SmallVector<SimulatedOp> ops;
  /// Copies in issue order.
  llvm::SmallVector<SimulatedCopy> copies;
  /// End of the last op on the compute stream (stalls included).
  double computeSeconds = 0;
  /// Sum of all compute-stream op durations without stalls
  /// (computeSeconds - exposed - sideWait).
  double busySeconds = 0;
  /// Side-stream work (alone seconds), and the compute stream's waits for
  /// it: the part of sideSeconds the overlap did not hide.
  double sideSeconds = 0, sideWaitSeconds = 0;
  /// When the last copy ends (may be after computeSeconds when D2Hs are
  /// still draining at the end of the block).
  double copyEndSeconds = 0;
  /// Compute-stream stalls (SimulatedOp::stall) per scopeKey of the
  /// stalled op and in total: transfer time not hidden under compute.
  std::map<std::string, double> exposedByScope;
  double exposedSeconds = 0;

  /// Simulates `block` (nested regions are not entered: an op with regions
  /// costs what CostModel::cost says of it, 0 for the microbatch loop).
  static StreamSimulation simulate(mlir::Block &block, const CostModel &cost);

  /// Index of `op` in `ops`, or -1 when it is not an op of the block.
  int indexOf(mlir::Operation *op) const;
  /// The copy an offload or reload issues, or null.
  const SimulatedCopy *copyOf(mlir::Operation *offloadOrReload) const;
  /// Total seconds of all copies of one direction (their end - start).
  double copySeconds(CopyDirection dir) const;

private:
  llvm::DenseMap<mlir::Operation *, int> opIndex;
  llvm::DenseMap<mlir::Operation *, int> copyIndex;
};

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_STREAMSIMULATION_H
