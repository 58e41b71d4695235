//===- MemoryTimeline.h - device bytes live at each op ----------*- C++ -*-===//
//
// Predicts the device memory of `@train_step` op by op in program order: the
// microbatch loop body (one microbatch; every body value dies before the next
// iteration, docs/architecture.md section 4), then the ops after the loop (grad
// finalisation, AdamW). Used by train-print-memory-timeline and by placement
// passes and reports to compare the peak before and after placement.
//
// Categories:
//  * params: the compute copy of every parameter (its declared type);
//  * grads: an FP32 main grad per trainable parameter;
//  * optimizer: FP32 master weight and two FP32 Adam moments per trainable
//    parameter (12 bytes per element);
//  * activations: tensors defined in the loop body (block arguments, the
//    token and label tensors, included). A buffer lives from its definition
//    to its last use; views (train.reshape) and train.wait results share the
//    buffer of their input; values used by train.yield live to the end of
//    the body. An offloaded value leaves the device at the first op that
//    starts after both its last device use and its D2H's end
//    (StreamSimulation); a reload result occupies memory from the reload to
//    the last use of its wait. param_ref results are params, not
//    activations;
//  * workspace: kernelWorkspaceBytes(op) (KernelWorkspace.h), the kernel
//    library's own query, for the op itself;
//  * pinnedHost (host side, not in total()): pinned slots in use, from the
//    offload until the H2D of the last reload of the slot has ended (until
//    the end of the body when nothing reloads it).
//
// Under data-parallel zero3 (DataParallelOptions, DataParallelCost.h) every
// byte count is per rank: params, grads and optimizer are this rank's
// shards (ceil(numel / N) elements of each parameter), and in the loop
// body params also hold the gathered weights of each window (N shards of
// each of its parameters) from the op its gathers are issued before to the
// window's last op, grads the fp32 grad buffers of each grad window from
// its first op to its last (ZeroLayout).
//
// A saved activation may occupy several buffers: its own, a reload's, a
// recompute clone's. MemoryTimeline::offDeviceAt names the activations that
// are off the device at a point although the step reads them again later.
// PlacementMemoryDelta compares a placed step with the same step with
// placement undone and explains the difference at any point by those values
// (and by named other terms, should there be any).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_MEMORYTIMELINE_H
#define ACTPLACE_PASSES_ANALYSIS_MEMORYTIMELINE_H

#include "dialect/train/TrainOps.h"
#include "passes/analysis/CostModel.h"
#include "passes/analysis/DataParallelCost.h"
#include "passes/analysis/StreamSimulation.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <map>
#include <string>

namespace ap::train {

/// Device bytes live while `op` runs, per category.
struct MemoryPoint {
  mlir::Operation *op = nullptr;
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0;
  int64_t total() const {
    return params + grads + optimizer + activations + workspace;
  }
  /// Pinned host bytes holding offloaded activations (not device memory).
  int64_t pinnedHost = 0;
  /// Zero3: the part of params that is gathered weights and the part of
  /// grads that is window grad buffers (both in total() already).
  int64_t gatheredParams = 0, gradWindows = 0;
};

/// One device buffer holding an activation.
struct ActivationBuffer {
  /// The value that owns the buffer (a block argument, an op result, a
  /// reload result); aliases (reshape, wait) are folded into it.
  mlir::Value value;
  /// scopeKey of its defining op; "inputs" for block arguments.
  std::string scope;
  int64_t bytes = 0;
  /// Program-order indices of the first and last point it occupies.
  unsigned first = 0, last = 0;
  /// True when it has a train.offload user: it then leaves the device at
  /// the first op starting after its D2H and its last device use.
  bool offloaded = false;

  /// How the buffer got its contents.
  enum class Origin { Computed, Reload, Recompute };
  Origin origin = Origin::Computed;
  /// The forward value (or block argument) whose bytes the buffer holds: the
  /// buffer's own value, the offloaded value for a reload, the forward result
  /// a recompute clone copies. Buffers with one original are one activation
  /// leaving and returning to the device.
  mlir::Value original;
  /// Last point that reads the buffer on the device (before an offloaded
  /// buffer's wait for its D2H).
  unsigned lastUse = 0;
  /// True when an op of the step itself reads it: not only train.offload or
  /// recompute clones (the unplaced step has neither).
  bool readByStep = false;
};

/// A saved activation that is not on the device at some point although the
/// step reads it again later: offloaded (its D2H has ended and the device
/// copy is freed, its reload's buffer is not allocated yet; that buffer is
/// reserved from the reload op, where the H2D is issued, not from when the
/// copy lands) or recomputed (the forward copy is dead, the clone has not
/// run yet).
struct OffDeviceValue {
  /// ActivationBuffer::original.
  mlir::Value value;
  std::string scope;
  int64_t bytes = 0;
  /// Whether a reload or a recompute clone brings it back.
  ActivationBuffer::Origin returnsBy = ActivationBuffer::Origin::Reload;
  /// The last point it occupied and the point its next buffer starts at.
  unsigned leftAfter = 0, backAt = 0;
};

class MemoryTimeline {
public:
  /// The timeline of `@train_step` in `module` on one of the data-parallel
  /// ranks `dp` describes. Without a `@train_step` function the timeline is
  /// empty (hasStep() is false); without a microbatch loop it has no
  /// activations.
  /// What a timeline holds. `Full`: everything below. `Peaks`: the points,
  /// the peaks, the simulation and each buffer's bytes and extent, but no
  /// buffer's scope or original and no returning groups (so offDeviceAt and
  /// PlacementMemoryDelta have nothing to explain with); origin is set only
  /// where a pipeline stage holds several microbatches (stagePeakBytes
  /// reads it). For the placement search, which predicts thousands of
  /// placed clones and reads only their peaks and step time: matching each
  /// recompute clone to its forward op and spelling each op's scope serve
  /// the reports, not those numbers.
  enum class Detail { Full, Peaks };

  static MemoryTimeline compute(mlir::ModuleOp module, const CostModel &cost,
                                const DataParallelOptions &dp = {},
                                Detail detail = Detail::Full);

  bool hasStep() const { return !pts.empty(); }
  /// One point per op in program order (the loop body's ops in place of the
  /// loop op).
  llvm::ArrayRef<MemoryPoint> points() const { return pts; }
  /// Program-order index of `op`, or -1.
  int indexOf(mlir::Operation *op) const;

  int64_t peakBytes() const;
  mlir::Operation *peakOp() const;
  /// The peak with every op's kernel workspace at the largest any op asks
  /// for: max over points of (total - workspace), plus the largest
  /// workspace. The planned arena holds one workspace region of that size
  /// for the whole step beside the packed activations (exec-plan-memory),
  /// so this, not peakBytes(), is what the arena cannot go below; the two
  /// differ where the peak's own op needs less workspace than another op.
  int64_t workspaceRegionPeakBytes() const;
  /// Device bytes one microbatch keeps from its forward to its backward:
  /// buffers the forward computed (neither offloaded nor reloaded nor
  /// recomputed) that the backward still reads. A pipeline stage that
  /// holds k microbatches in flight (1F1B) holds k - 1 more of these at
  /// its peak than this one-microbatch timeline shows.
  int64_t heldAcrossBackwardBytes() const;
  int64_t activationPeakBytes() const;
  mlir::Operation *activationPeakOp() const;
  int64_t pinnedHostPeakBytes() const;

  /// Activation bytes per scope ("L<layer>.<leaf>", "model.<leaf>",
  /// "inputs") live while `at` runs; scopes with no live bytes are absent.
  std::map<std::string, int64_t> activationsByScope(mlir::Operation *at) const;

  /// Saved activations off the device while the op at `point` runs, in
  /// definition order.
  llvm::SmallVector<OffDeviceValue> offDeviceAt(unsigned point) const;

  llvm::ArrayRef<ActivationBuffer> buffers() const { return bufs; }
  /// The stream simulation of the loop body the timeline used (empty when
  /// there is no loop). Body op k is point bodyBegin() + k.
  const StreamSimulation &bodySimulation() const { return sim; }
  unsigned bodyBegin() const { return bodyFirst; }
  /// Microbatches per step (the loop's leading dimension; 1 without a loop).
  int64_t microBatches() const { return numMicroBatches; }

private:
  llvm::SmallVector<MemoryPoint> pts;
  llvm::SmallVector<ActivationBuffer> bufs;
  llvm::DenseMap<mlir::Operation *, unsigned> index;
  /// Indices into bufs of the originals with more than one buffer.
  llvm::SmallVector<llvm::SmallVector<unsigned, 2>> returningGroups;
  StreamSimulation sim;
  unsigned bodyFirst = 0;
  int64_t numMicroBatches = 1;
  int peakIdx = -1, actPeakIdx = -1, hostPeakIdx = -1;
};

/// Microbatches a pipeline stage holds in flight at its peak under 1F1B:
/// min(P - s, microbatches) for stage s of P (module attributes
/// train.pipeline_stages / train.pipeline_stage); 1 for a whole step.
int64_t pipelineInflight(mlir::ModuleOp module, int64_t microBatches);

/// The timeline's peak with the other microbatches a pipeline stage holds
/// in flight: peakBytes() + (pipelineInflight - 1) x
/// heldAcrossBackwardBytes(); with `workspaceRegion`,
/// workspaceRegionPeakBytes() in place of peakBytes().
int64_t stagePeakBytes(mlir::ModuleOp module, const MemoryTimeline &timeline,
                       bool workspaceRegion = false);

/// The forward op each recompute clone (an op carrying
/// train.recomputed) of `body` copies: the same op name, attributes other
/// than the placement ones and operands, where operands of the clone may be
/// results of earlier clones of the forward op's producers. Clones that match
/// no forward op are absent.
llvm::DenseMap<mlir::Operation *, mlir::Operation *>
recomputedOriginals(mlir::Block &body);

/// Undoes placement in `body`: waits read the offloaded value again,
/// recompute clones (recomputedOriginals) are replaced by the forward ops
/// they copy, fused recomputes (fusedRecomputes) are split back, and
/// offloads, reloads, waits and those clones are erased.
void unplace(mlir::Block &body);

/// The ops train-fuse-recompute made: a backward that also writes a
/// recomputed activation (train.swiglu_grad or train.gated_rms_norm_grad
/// with their output, train.rms_norm_grad_rebuild) and each linear backward
/// it split: its train.linear_input_grad (null when it had no dx), its
/// dW-only train.linear_grad, which reads the activation, and the reshape
/// between them (null when none). unplace turns them back into the plain
/// backward and whole linear_grads of the forward value.
struct FusedLinear {
  LinearInputGradOp dx;
  LinearGradOp dw;
  ReshapeOp view;
};
struct FusedRecompute {
  mlir::Operation *grad = nullptr;
  mlir::Value output;
  llvm::SmallVector<FusedLinear> linears;
  /// For a SwiGLU whose linear is frozen: the dx op with no dW partner.
  LinearInputGradOp unpairedDx;
};
llvm::SmallVector<FusedRecompute> fusedRecomputes(mlir::Block &body);

/// The activation a fused recompute's backward writes: the output of
/// train.swiglu_grad or train.gated_rms_norm_grad, the second result of
/// train.rms_norm_grad_rebuild; null for any other op.
mlir::Value rebuiltOutputOf(mlir::Operation *op);
/// True for that activation: recomputed like a clone's result.
bool isRebuiltActivation(mlir::Value v);

/// One named term of the difference between the unplaced and the placed
/// step at a point that is not an off-device value.
struct MemoryDeltaTerm {
  /// What holds the bytes, e.g. "recompute temporary".
  std::string term;
  /// The activation (ActivationBuffer::original of the placed step); null
  /// for workspace and persistent state.
  mlir::Value value;
  std::string scope;
  /// Contribution to unplaced minus placed bytes (negative: the placed step
  /// holds more).
  int64_t bytes = 0;
};

/// The unplaced and placed device bytes at one point of the placed step and
/// what makes up their difference.
struct MemoryDeltaAtPoint {
  /// Program-order index in the placed timeline.
  unsigned placedPoint = 0;
  /// The same op in the unplaced timeline; -1 for placement ops and
  /// recompute clones, which the unplaced step does not have. Then the
  /// unplaced bytes are those live between its ops unplacedBefore and
  /// unplacedBefore + 1 (buffers spanning the gap, no workspace).
  int unplacedPoint = -1;
  int unplacedBefore = -1;
  int64_t placedBytes = 0, unplacedBytes = 0;
  llvm::SmallVector<OffDeviceValue> offDevice;
  int64_t offDeviceBytes = 0;
  llvm::SmallVector<MemoryDeltaTerm> otherTerms;
  int64_t otherTermsBytes = 0;
  int64_t difference() const { return unplacedBytes - placedBytes; }
  /// Zero unless the two timelines disagree with their own buffers.
  int64_t unaccounted() const {
    return difference() - offDeviceBytes - otherTermsBytes;
  }
};

/// A placed step's memory timeline against the same step with placement
/// undone (unplace on a clone of the module). Ops of the placed step that
/// the unplaced one also has are matched by position: unplace only erases
/// ops, so the n-th surviving op of the placed module is the n-th op of the
/// clone. At any placed point the difference of the two totals splits,
/// activation by activation (ActivationBuffer::original), into the bytes off
/// the device (MemoryTimeline::offDeviceAt) and other terms, each named:
/// "reloaded before the original left" (its D2H still in flight),
/// "reloaded twice (one buffer offloaded twice)", "recomputed while the
/// original is on the device", "recompute temporary" (a clone's result the
/// unplaced step does not keep there), "reloaded for recomputed readers",
/// "held for recomputed readers", "D2H in flight" (held past its last read
/// when the unplaced step no longer keeps it), "workspace of a recompute
/// clone". MemoryDeltaAtPoint::unaccounted() is what none of them explains:
/// zero unless the analysis is wrong.
class PlacementMemoryDelta {
public:
  static PlacementMemoryDelta compute(mlir::ModuleOp placed,
                                      const CostModel &cost,
                                      const DataParallelOptions &dp = {});

  /// The clone with placement undone.
  mlir::ModuleOp unplacedModule() const { return *unplacedOwner; }
  const MemoryTimeline &placedTimeline() const { return placedTl; }
  const MemoryTimeline &unplacedTimeline() const { return unplacedTl; }
  /// The same op in the other timeline, or -1.
  int unplacedPointOf(unsigned placedPoint) const;
  int placedPointOf(unsigned unplacedPoint) const;
  /// The unplaced step's op for an op of the placed module, or null.
  mlir::Operation *unplacedOpOf(mlir::Operation *placedOp) const;

  MemoryDeltaAtPoint at(unsigned placedPoint) const;

private:
  mlir::OwningOpRef<mlir::ModuleOp> unplacedOwner;
  MemoryTimeline placedTl, unplacedTl;
  llvm::SmallVector<int> toUnplaced, toPlaced;
  llvm::DenseMap<mlir::Operation *, mlir::Operation *> unplacedOp;
  /// Unplaced buffer values -> the placed values they stand for.
  llvm::DenseMap<mlir::Value, mlir::Value> placedValueOf;
};

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_MEMORYTIMELINE_H
