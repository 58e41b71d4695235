//===- MemoryTimeline.h - device bytes live at each op ----------*- C++ -*-===//
//
// Predicts the device memory of `@train_step` op by op in program order: the
// microbatch loop body (one microbatch; every body value dies before the next
// iteration, DESIGN.md section 4), then the ops after the loop (grad
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
//  * workspace: CostModel::cost(op).workspaceBytes of the op itself;
//  * pinnedHost (host side, not in total()): pinned slots in use, from the
//    offload until the H2D of the last reload of the slot has ended (until
//    the end of the body when nothing reloads it).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_MEMORYTIMELINE_H
#define ACTPLACE_PASSES_ANALYSIS_MEMORYTIMELINE_H

#include "passes/analysis/CostModel.h"
#include "passes/analysis/StreamSimulation.h"

#include "mlir/IR/BuiltinOps.h"
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
};

class MemoryTimeline {
public:
  /// The timeline of `@train_step` in `module`. Without a `@train_step`
  /// function the timeline is empty (hasStep() is false); without a
  /// microbatch loop it has no activations.
  static MemoryTimeline compute(mlir::ModuleOp module, const CostModel &cost);

  bool hasStep() const { return !pts.empty(); }
  /// One point per op in program order (the loop body's ops in place of the
  /// loop op).
  llvm::ArrayRef<MemoryPoint> points() const { return pts; }
  /// Program-order index of `op`, or -1.
  int indexOf(mlir::Operation *op) const;

  int64_t peakBytes() const;
  mlir::Operation *peakOp() const;
  int64_t activationPeakBytes() const;
  mlir::Operation *activationPeakOp() const;
  int64_t pinnedHostPeakBytes() const;

  /// Activation bytes per scope ("L<layer>.<leaf>", "model.<leaf>",
  /// "inputs") live while `at` runs; scopes with no live bytes are absent.
  std::map<std::string, int64_t> activationsByScope(mlir::Operation *at) const;

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
  StreamSimulation sim;
  unsigned bodyFirst = 0;
  int64_t numMicroBatches = 1;
  int peakIdx = -1, actPeakIdx = -1, hostPeakIdx = -1;
};

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_MEMORYTIMELINE_H
