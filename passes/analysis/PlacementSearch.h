//===- PlacementSearch.h - choose offload + recompute for a goal --*- C++
//-*-===//
//
// The joint placement choice docs/architecture.md section 4 promises: instead
// of a person listing modules, the compiler picks which leaves to recompute and
// which to offload so that one goal holds (a share of the activation peak
// removed, a device-peak budget, or a step-time budget) at the least
// predicted step time (or, for a step budget, the most bytes removed).
//
// Every candidate is placed for real: the placement passes run on a copy of
// the differentiated module (one per thread, its backward part copied again
// for each candidate) and the memory timeline with its stream
// simulation (the cost model, under the given profile) gives the activation
// peak, the device peak and the step time. So the choice accounts for what
// whole-leaf estimates miss: values shared between scopes, the hide rule,
// the copy links' capacity and the profile's copy slowdown.
//
// The search is greedy on cost per byte: from nothing placed, take the move
// (a leaf kept -> recomputed or offloaded, offloaded -> recomputed or back,
// and pairs of leaves that share saved values) with the least predicted
// extra time per byte removed (bytes beyond the goal's need not counted),
// until the goal holds; then improve by single
// moves (or, when none helps, pairs) that keep the goal and lower the step
// (or, under a step budget, remove more). It descends several times: taking
// any move; taking recompute moves until none helps and only then offload;
// once per leaf the better of those placed, with that leaf kept through
// the greedy; and from the best's recompute set (offloads dropped),
// recompute first. The best end wins (the earliest on a tie). Deterministic:
// ties break on the move's spelling.
//
// Not every candidate is placed: a greedy step places the moves with no
// prediction from their last measured change and the 10 best predicted,
// and the improvement places only pairs whose halves, added up, come near
// an improvement. Each batch is placed on a few threads, and a cache may
// be shared by searches of one module and configuration
// (docs/placement-search.md, "Speed").
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_PLACEMENTSEARCH_H
#define ACTPLACE_PASSES_ANALYSIS_PLACEMENTSEARCH_H

#include "passes/analysis/PlacementConfig.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/Error.h"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ap::train {

struct PlacementGoal {
  enum class Kind { ActivationCut, MemoryBudget, StepBudget };
  Kind kind = Kind::ActivationCut;
  /// ActivationCut: share of the activation peak to remove, (0, 1].
  /// MemoryBudget: bytes the predicted device peak may reach.
  /// StepBudget: predicted step-time increase allowed, share of the step.
  double value = 0;
  /// MemoryBudget: judge each placement by MemoryTimeline's
  /// workspaceRegionPeakBytes (every op's workspace at the largest, as the
  /// planned arena holds it) instead of the timeline's peak, so that a
  /// choice meeting the budget leaves its planned arena over it only by
  /// the activations' packing. actplace-compile sets it where it plans the
  /// choice's arena; the train-plan-budget pass keeps the timeline's peak.
  /// The device peaks a search reports are then that bound. Searches
  /// sharing a PlacementSearchCache must agree on it.
  bool workspaceRegion = false;

  /// From the three options; exactly one must be set (activation-cut and
  /// step-budget > 0 or unset = 0 / -1, memory-budget non-empty). Memory
  /// budgets take B, KiB, MiB, GiB, KB, MB, GB suffixes or plain bytes.
  static llvm::Expected<PlacementGoal> fromOptions(double activationCut,
                                                   llvm::StringRef memoryBudget,
                                                   double stepBudget);
  /// Whether any of the three options asks for a search.
  static bool requested(double activationCut, llvm::StringRef memoryBudget,
                        double stepBudget);
  /// "activation-cut=0.6", "memory-budget=19327352832 bytes", ...
  std::string str() const;
};

/// One placement the search evaluated: its leaves and its predicted totals.
struct PlacementChoice {
  std::vector<std::string> recompute, offload;
  int64_t activationPeakBefore = 0, activationPeakAfter = 0;
  int64_t peakBefore = 0, peakAfter = 0;
  double stepBefore = 0, stepAfter = 0;
  /// Data-parallel ranks of the prediction and, for more than one, the
  /// communication the step does not hide (part of stepAfter,
  /// DataParallelCost.h).
  int64_t ranks = 1;
  bool zero3 = false;
  double exposedCommAfter = 0;

  double removedShare() const;
  double extraShare() const;
  /// "recompute-modules=a,b offload-modules=c" (pass-option spelling; empty
  /// when nothing is placed).
  std::string options() const;
  /// "removed 41.2 % of the activation peak, peak 18.1 GiB, step +2.31 %"
  /// (and, on several ranks, the exposed communication, "zero3" when the
  /// ranks shard, and that the peak is per rank).
  std::string summary() const;
};

struct PlacementSearchStep {
  std::string move;
  PlacementChoice after;
  /// The descent it belongs to: its number from 0 and its heading
  /// ("descent 2 (recompute first)", "descent 5 (greedy without gdn_prep)";
  /// the last moves, which drop placements that act on nothing, have a
  /// number of their own).
  int start = 0;
  std::string descent;
};

struct PlacementSearchResult {
  PlacementChoice best;
  bool goalMet = false;
  /// The descent that found `best`, and its accepted moves in order
  /// (greedy, then improvements).
  int start = 0;
  std::vector<PlacementSearchStep> trail;
  int64_t evaluations = 0;
};

/// Placements already evaluated, by state, for searches of one module under
/// one configuration (only the goal may differ): actplace-compile searches
/// again for a lower predicted peak when the planned arena is over the
/// budget, and most candidates of the second search were placed by the
/// first. Opaque to callers.
struct PlacementSearchCache {
  std::map<std::string, std::optional<PlacementChoice>> placed;
  /// PlacementGoal::workspaceRegion of the placements in `placed` (set by
  /// the first search that uses the cache; a later search with the other
  /// setting is refused).
  std::optional<bool> workspaceRegion;
};

/// How much of the search runs. `Full` is every descent the header comment
/// lists. `Screen` runs the first two (any move first; recompute first) and
/// the final clean-up: about a sixth of the placements on Qwen3.5-0.8B, and
/// on the recorded cases within half a percent of the full search's step.
/// actplace-compile screens with it: to learn a choice's arena gap before
/// the full search, and to rank micro-batch sizes so that only the
/// contenders get a full search. A full search with the same cache places
/// nothing the screen placed, since its first two descents are the same.
enum class PlacementSearchDepth { Full, Screen };

/// The options struct of a placement pass (passes/PlacementOptions.td)
/// with `cfg`'s settings and the given module lists.
template <typename Options>
Options placementPassOptions(const PlacementConfig &cfg,
                             llvm::ArrayRef<std::string> offload,
                             llvm::ArrayRef<std::string> recompute) {
  Options o;
  o.offloadModules.assign(offload.begin(), offload.end());
  o.recomputeModules.assign(recompute.begin(), recompute.end());
  o.fraction = cfg.fraction;
  o.minOffloadBytes = cfg.minOffloadBytes;
  o.maxInflight = cfg.maxInflight;
  o.hideRule = cfg.hideRule;
  o.prefetchDepth = cfg.prefetchDepth;
  o.computeDtype = cfg.computeDtype;
  o.cudaGraphs = cfg.cudaGraphs;
  o.profile = cfg.profile;
  o.fuseRecompute = cfg.fuseRecompute;
  o.recomputeStream = cfg.recomputeStream;
  o.dataParallel = cfg.dataParallel;
  o.dataParallelSize = cfg.dataParallelSize;
  o.gradBucketBytes = cfg.gradBucketBytes;
  o.gatherMaxInflight = cfg.gatherMaxInflight;
  o.mainGradDtype = cfg.mainGradDtype;
  return o;
}

/// Adds the placement stage of buildPipeline (passes/Pipeline.h: verify,
/// recompute, fuse recompute, recompute stream, offload scopes, prefetch
/// anchors) to `pm` with `cfg`'s settings and the given module lists.
void addPlacementPasses(mlir::OpPassManager &pm, const PlacementConfig &cfg,
                        llvm::ArrayRef<std::string> offload,
                        llvm::ArrayRef<std::string> recompute);

/// Searches placements of `module` (differentiated, not yet placed) for
/// `goal`. `base` supplies everything but the module lists (profile, hide
/// rule, fraction, ...; its lists must be empty). `progress` is called once
/// per accepted move; `depth` limits the descents. Fails (with a diagnostic on
/// the module) only when the base configuration or the unplaced step cannot be
/// evaluated; an unreachable goal is a result with goalMet false and the best
/// found.
mlir::FailureOr<PlacementSearchResult>
searchPlacement(mlir::ModuleOp module, const PlacementConfig &base,
                const PlacementGoal &goal,
                std::function<void(const PlacementSearchStep &)> progress = {},
                PlacementSearchCache *cache = nullptr,
                PlacementSearchDepth depth = PlacementSearchDepth::Full);

/// A candidate the passes reject is skipped silently (the user asked for a
/// goal, not for that combination), while searches may run side by side in
/// one context and share its diagnostic handlers. So the search drops only
/// the diagnostics of the threads placing its candidates: it registers
/// dropPlacingDiagnostics on the context while placing and marks each
/// placing thread with a PlacingThread; diagnostics of any other thread
/// (another search's lowering, the caller) pass on to the next handler.
mlir::LogicalResult dropPlacingDiagnostics(mlir::Diagnostic &diag);
/// Marks the constructing thread as placing candidates until destroyed
/// (nests).
class PlacingThread {
public:
  PlacingThread();
  ~PlacingThread();
  PlacingThread(const PlacingThread &) = delete;
  PlacingThread &operator=(const PlacingThread &) = delete;

private:
  bool outer;
};

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_PLACEMENTSEARCH_H
