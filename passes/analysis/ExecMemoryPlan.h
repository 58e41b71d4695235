//===- ExecMemoryPlan.h - device-arena plan ---------------------*- C++ -*-===//
//
// Decides where every buffer of an exec.step lives in the one device arena
// the runtime allocates: [persistent | activations | workspace | side
// workspace].
//   - Persistent buffers (and buffers defined at the step's top level) are
//     laid out one after another in program order; they live across steps.
//   - Transient buffers of the microbatch loop body share the activation
//     part. A buffer is live from its first user to its last user in body
//     order (views extend their root); buffers live at the same time never
//     overlap. Placement is greedy by size (largest first, lowest offset that
//     fits), which is deterministic and close to the live-bytes peak.
//   - A region a D2H copy reads is reusable only once that copy completed:
//     the plan lists, for the first later writer of an overlapping region, a
//     wait on the copy's event on the writer's stream (docs/architecture.md
// section 4,
//     offload rule (a)). When the lowering predicted when the copy ends
//     (`done_by_kernel`), the bytes stay reserved until then, so the wait
//     is not expected to stall compute.
//   - One workspace region, the largest kernel workspace: kernels run one at
//     a time on the compute stream. Kernels on the side stream (recompute
//     issued ahead) run beside them and have a region of their own.
//   - A side-stream kernel may run any time between its issue and the
//     compute stream's first wait for the side stream's later work (at the
//     first compute use of its outputs or of a later side kernel's): every
//     buffer it reads or writes stays live until then, so that no compute
//     kernel in between reuses the bytes (which would make compute wait for
//     the side stream and undo the overlap).
// Everything is 256-byte aligned.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_EXECMEMORYPLAN_H
#define ACTPLACE_PASSES_ANALYSIS_EXECMEMORYPLAN_H

#include "dialect/exec/ExecOps.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/raw_ostream.h"

namespace ap::exec {

/// One transient buffer of the loop body.
struct PlannedBuffer {
  BufferOp op;
  int64_t bytes = 0;
  /// First and last body position (inclusive) at which the buffer is used.
  int64_t start = 0, end = 0;
  /// Offset relative to the start of the activation region.
  int64_t offset = 0;
  /// The op that first touches the buffer and its stream.
  mlir::Operation *firstUser = nullptr;
  /// Events of the D2H copies that read the buffer.
  llvm::SmallVector<mlir::Value, 1> d2hEvents;
  /// Last body position its bytes stay reserved for a D2H still predicted
  /// to be running (`done_by_kernel`), or -1; `end` includes it.
  int64_t holdUntil = -1;
};

/// A wait the plan needs: `event` on `stream` right before `before`.
struct ReuseWait {
  mlir::Value event;
  Stream stream;
  mlir::Operation *before;
};

class MemoryPlan {
public:
  /// Plans `step`; emits an error and leaves valid() false when the step
  /// cannot be planned (a transient buffer outside the loop, ...).
  explicit MemoryPlan(StepOp step);

  bool valid() const { return ok; }

  int64_t persistentBytes = 0, activationBytes = 0, workspaceBytes = 0,
          sideWorkspaceBytes = 0, pinnedBytes = 0;
  int64_t arenaBytes() const {
    return persistentBytes + activationBytes + workspaceBytes +
           sideWorkspaceBytes;
  }
  /// Absolute arena offsets of persistent (and step-level) buffers.
  llvm::SmallVector<std::pair<mlir::Operation *, int64_t>> persistent;
  /// Transient buffers in body order, offsets relative to the activation
  /// region (absolute = persistentBytes + offset).
  llvm::SmallVector<PlannedBuffer> transients;
  llvm::SmallVector<ReuseWait> reuseWaits;

  /// One line per transient buffer (index, offset, bytes, live range, type)
  /// and a summary; the test-print format of exec-plan-memory.
  void print(llvm::raw_ostream &os) const;

private:
  bool ok = true;
};

/// The stream an op's work runs on, or none for host-side ops (buffers,
/// views, events, pool operations).
std::optional<Stream> streamOf(mlir::Operation *op);

} // namespace ap::exec

#endif // ACTPLACE_PASSES_ANALYSIS_EXECMEMORYPLAN_H
