//===- ZeroShardPlan.h - where ZeRO-3 gathers and reductions go -*- C++ -*-===//
//
// Decides how a ZeRO-3 step (data_parallel = "zero3", N ranks) holds and
// moves its parameters. Every parameter's persistent buffers (bf16 weight,
// fp32 master, main grad and Adam moments) shrink to this rank's shard:
// ceil(numel / N) elements, the flattened parameter padded with zeros to a
// multiple of N, rank r holding block r. This is per-parameter partitioning
// (every rank holds 1/N of every tensor), so a parameter's shard is
// contiguous and the optimizer, clipping and checkpoints work tensor by
// tensor on shards.
//
// Inside the microbatch loop, parameters are used in windows: a window is a
// maximal run of body ops that use one layer group's parameters (the group
// of "model.layers.<i>.*" is the layer; any other parameter is a group of
// its own) with no use of another group's between them. A layer's forward
// and its backward are two windows; a tied embedding used by the embedding
// and by the LM head is used in four. Per window:
//   - weights: each parameter the window reads is all-gathered on the comm
//     stream into a transient buffer of N x shard elements, used through a
//     prefix view of the parameter's own shape and released after the
//     window's last use. The gathers of window w are issued right before
//     the first op of window w - K (K = gather-max-inflight): while a
//     window computes, the next K windows' parameters are gathered, so at
//     most K + 1 windows' gathered buffers are live. K = 0 gathers each
//     window right before it (no prefetch).
//   - main grads: each parameter the window's kernels accumulate into gets
//     a transient fp32 buffer of N x shard elements, zeroed on the compute
//     stream before the window's first op and reduce-scattered on the comm
//     stream after its last op into the rank's main-grad shard
//     (accumulate: microbatches and windows add up there).
// The stream schedule orders all of it against compute and copies; the
// memory plan counts the gathered and gradient buffers like any transient.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_ZEROSHARDPLAN_H
#define ACTPLACE_PASSES_ANALYSIS_ZEROSHARDPLAN_H

#include "dialect/exec/ExecOps.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <string>

namespace ap {

/// Elements per rank of a parameter of `numel` elements over `ranks`.
inline int64_t zeroShardElements(int64_t numel, int64_t ranks) {
  return (numel + ranks - 1) / ranks;
}

/// The ZeRO-3 layer group of a parameter name: "model.layers.<i>" for the
/// layers' parameters, the name itself otherwise.
std::string zeroLayerGroup(llvm::StringRef paramName);

/// One parameter a loop-body op uses (reads, or accumulates the grad of):
/// its layer group and the caller's index for the parameter.
struct ZeroUse {
  std::string group;
  unsigned param = 0;
};

/// A window of the rule above over loop-body positions.
struct ZeroWindowSpan {
  std::string group;
  /// Positions (indices into the `uses` given) of the window's first and
  /// last op.
  unsigned first = 0, last = 0;
  /// The parameters used, each once, in the order of their first use.
  llvm::SmallVector<unsigned> params;
};

/// The window rule, one place for the pass (exec IR, ZeroShardPlan) and
/// the cost model (train IR, passes/analysis/DataParallelCost.h): `uses[i]`
/// are the parameters body op i uses (empty for ops that use none). An op
/// extends its group's open window when that group was used after every
/// other group so far, and opens a new window otherwise (an op using two
/// groups decides for each; one using several parameters of one group
/// decides once). Windows are returned in the order of their first op.
llvm::SmallVector<ZeroWindowSpan>
splitZeroWindows(llvm::ArrayRef<llvm::SmallVector<ZeroUse>> uses);

/// The window before whose first op the gathers of weight window `w` go
/// under gather-max-inflight `k`: w - k, or the first window.
inline size_t zeroGatherAnchor(size_t w, int64_t k) {
  size_t ahead = k > 0 ? static_cast<size_t>(k) : 0;
  return w >= ahead ? w - ahead : 0;
}

} // namespace ap

namespace ap::exec {

/// One window: body ops of one group using its parameters.
struct ShardWindow {
  std::string group;
  /// The window's first and last op in the loop body.
  mlir::Operation *first = nullptr, *last = nullptr;
  /// The full-size persistent buffers the window uses (weights) or
  /// accumulates into (main grads), in parameter order.
  llvm::SmallVector<PersistentOp> buffers;
  /// Weights only: the body op before which the window's gathers go.
  mlir::Operation *gatherBefore = nullptr;
};

class ZeroShardPlan {
public:
  /// `step` must carry data_parallel = "zero3"; `gatherMaxInflight` >= 0.
  ZeroShardPlan(StepOp step, int64_t gatherMaxInflight);

  /// Weight windows in body order of their first use.
  llvm::SmallVector<ShardWindow> gathers;
  /// Main-grad windows in body order of their first write.
  llvm::SmallVector<ShardWindow> reductions;
  /// Every parameter buffer that becomes a shard (weights, masters, main
  /// grads, moments), in step order.
  llvm::SmallVector<PersistentOp> sharded;
  int64_t ranks = 1;
};

} // namespace ap::exec

#endif // ACTPLACE_PASSES_ANALYSIS_ZEROSHARDPLAN_H
