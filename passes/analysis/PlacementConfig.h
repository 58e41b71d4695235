//===- PlacementConfig.h - the placement options, validated -------*- C++
//-*-===//
//
// Every placement pass takes the same options (passes/PlacementOptions.td);
// this is their parsed form with aliases expanded to leaves, and the rules
// that decide which scopes are selected.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_PLACEMENTCONFIG_H
#define ACTPLACE_PASSES_ANALYSIS_PLACEMENTCONFIG_H

#include "passes/PassEnums.h"
#include "passes/analysis/CostModel.h"
#include "passes/analysis/DataParallelCost.h"
#include "passes/analysis/SavedActivations.h"

#include "mlir/IR/Diagnostics.h"

#include <set>
#include <string>
#include <vector>

namespace ap::train {

struct PlacementConfig {
  std::vector<std::string> offloadModules, recomputeModules;
  double fraction = 1.0;
  int64_t minOffloadBytes = 0;
  int64_t maxInflight = 0;
  HideRule hideRule = HideRule::On;
  int64_t prefetchDepth = 0;
  ComputeDtype computeDtype = ComputeDtype::BF16;
  bool cudaGraphs = false;
  std::string profile;
  bool fuseRecompute = true;
  /// Where recompute clones run (train-recompute-stream).
  RecomputeStream recomputeStream = RecomputeStream::Compute;
  /// Data-parallel ranks, how they hold the parameters, the main-grad
  /// bucket size (replicate) and the windows gathered ahead (zero3) the
  /// step prediction and the memory timeline assume (DataParallelCost.h;
  /// exec-bucket-grad-reduce and exec-shard-params place the collectives
  /// the same way). 1 replicated rank: no communication.
  DataParallelMode dataParallel = DataParallelMode::Replicate;
  int64_t dataParallelSize = 1;
  int64_t gradBucketBytes = 26214400;
  int64_t gatherMaxInflight = 1;
  /// Zero3: the main-grad shards' type (exec-shard-params' main-grad-dtype).
  MainGradDtype mainGradDtype = MainGradDtype::F32;

  /// Leaves the options select, after alias expansion.
  std::set<std::string> offloadLeaves, recomputeLeaves;

  /// Expands aliases and checks every rule; reports the first violation
  /// through `emitError` and fails.
  llvm::LogicalResult
  validate(llvm::function_ref<mlir::InFlightDiagnostic()> emitError);

  bool offloading() const { return !offloadLeaves.empty(); }

  /// The data-parallel settings above, as the cost model takes them.
  DataParallelOptions dataParallelOptions() const {
    DataParallelOptions o;
    o.mode = dataParallel;
    o.ranks = dataParallelSize;
    o.bucketBytes = gradBucketBytes;
    o.gatherMaxInflight = gatherMaxInflight;
    o.bf16MainGrads = mainGradDtype == MainGradDtype::BF16;
    return o;
  }

  /// The cost model, with the constants of the `profile` file when one is
  /// named; a bad file is reported on `diagnosticOp`.
  mlir::FailureOr<CostModel> costModel(mlir::Operation *diagnosticOp) const;
  bool hideRuleOn() const { return hideRule == HideRule::On; }

  /// True when `op` (a forward op) is recomputed under this config: its scope
  /// is selected, or it is an L2 norm reading a recomputed gdn_prep output
  /// (so the recurrence's q and k are rebuilt from the conv input too).
  bool isRecomputed(mlir::Operation *op) const;
};

/// Records the placement decision for result `index` of `op` in its
/// `train.placement` attribute (read by the placement report), unless an
/// UnrecordedPlacements is alive on this thread.
void recordPlacement(mlir::Operation *op, unsigned index,
                     llvm::StringRef decision);

/// While one is alive, the placement passes on this thread leave out what
/// only a person reads (the train.placement attributes the report reads,
/// the reasons they spell, remarks, train-verify-placement-config's
/// warnings): nothing the memory timeline or the cost model reads. The
/// placement search places thousands of clones and only measures them.
class UnrecordedPlacements {
public:
  UnrecordedPlacements();
  ~UnrecordedPlacements();
  UnrecordedPlacements(const UnrecordedPlacements &) = delete;
  UnrecordedPlacements &operator=(const UnrecordedPlacements &) = delete;
  /// Whether the passes on this thread record their decisions.
  static bool recording();

private:
  bool before;
};

} // namespace ap::train

/// Fills a PlacementConfig from a pass generated with PlacementOptions.
#define AP_PLACEMENT_CONFIG()                                                  \
  [&] {                                                                        \
    ::ap::train::PlacementConfig c;                                            \
    c.offloadModules.assign(offloadModules.begin(), offloadModules.end());     \
    c.recomputeModules.assign(recomputeModules.begin(),                        \
                              recomputeModules.end());                         \
    c.fraction = fraction;                                                     \
    c.minOffloadBytes = minOffloadBytes;                                       \
    c.maxInflight = maxInflight;                                               \
    c.hideRule = hideRule;                                                     \
    c.prefetchDepth = prefetchDepth;                                           \
    c.computeDtype = computeDtype;                                             \
    c.cudaGraphs = cudaGraphs;                                                 \
    c.profile = profile;                                                       \
    c.fuseRecompute = fuseRecompute;                                           \
    c.recomputeStream = recomputeStream;                                       \
    c.dataParallel = dataParallel;                                             \
    c.dataParallelSize = dataParallelSize;                                     \
    c.gradBucketBytes = gradBucketBytes;                                       \
    c.gatherMaxInflight = gatherMaxInflight;                                   \
    c.mainGradDtype = mainGradDtype;                                           \
    return c;                                                                  \
  }()

#endif // ACTPLACE_PASSES_ANALYSIS_PLACEMENTCONFIG_H
