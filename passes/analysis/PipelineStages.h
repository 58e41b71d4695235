//===- PipelineStages.h - which pipeline stage runs each op -----*- C++ -*-===//
//
// Decides, for a pipeline-parallel step of P stages, which stage runs each op
// of the microbatch loop body, and which values cross a stage boundary.
//
// Decoder layers are split into P contiguous ranges (given as layers per
// stage, or as even as the layer count allows, the earlier stages taking
// the remainder, or balanced by the cost model: balanceByCost). An op runs on
// the stage of its scope's layer; the model-level leaves go to the ends:
// `embedding` to the first stage, `final_norm` and `lm_head` (and the yield of
// the loss) to the last. One rule moves backward work up: an op whose every
// operand computed in the body comes from one later stage runs there (the add
// that sums the two gradients of a layer's input, residual and norm branch, is
// scoped to the layer that produced that input, but both terms are made one
// stage up), so one gradient tensor crosses each boundary instead of two.
// Parameter reads (train.param_ref) run wherever they are used; block arguments
// (tokens, labels) are loaded by every stage that uses them. So is
// train.doc_starts (packed sequences): a function of the tokens alone, it is
// not a crossing; train-pipeline-stage computes it again on every other
// stage that uses it, from that stage's own tokens.
//
// Every value used on another stage than its own is a crossing. A crossing
// must go to a neighbouring stage: forward values to the next, gradients to
// the previous; anything else is refused with the value and both stages
// named. Crossings are numbered per boundary and direction (the channel) in
// body order, so a sender and its receiver agree without talking.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_ANALYSIS_PIPELINESTAGES_H
#define ACTPLACE_PASSES_ANALYSIS_PIPELINESTAGES_H

#include "dialect/train/TrainOps.h"
#include "passes/analysis/CostModel.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <string>

namespace ap::train {

class PipelineStages {
public:
  struct Crossing {
    mlir::Value value;
    int from = 0, to = 0;
    /// Index among the crossings of the same (from, to) pair, body order.
    int64_t channel = 0;
  };

  /// Assigns the ops of `loop`'s body to `stages` stages. `layersPerStage`
  /// is empty (even split) or has one positive count per stage summing to
  /// the layer count. Errors are reported on `loop` and name the option
  /// (`optionName`, e.g. "--pipeline-stages") or the value at fault.
  static mlir::FailureOr<PipelineStages>
  assign(MicrobatchLoopOp loop, int64_t stages,
         llvm::ArrayRef<int64_t> layersPerStage,
         llvm::StringRef optionName = "--pipeline-stages");

  int64_t numStages() const { return int64_t(firstLayer.size()) - 1; }
  int64_t numLayers() const { return firstLayer.back(); }
  /// Stage s runs layers [firstLayer[s], firstLayer[s + 1]).
  llvm::SmallVector<int64_t> firstLayer;
  /// The stage of every body op but train.param_ref.
  llvm::DenseMap<mlir::Operation *, int> stageOf;
  llvm::SmallVector<Crossing> crossings;

  /// Layer counts per stage that minimise the largest stage's predicted
  /// compute time per microbatch (forward and backward ops of its layers
  /// under `cost`, the embedding on the first stage, the final norm, LM
  /// head and loss on the last; communication and the 1F1B bubbles left
  /// out), each stage at least one layer. Ties go to the split whose
  /// earlier stages hold more layers. `stageSeconds` receives each stage's
  /// predicted time when given.
  static mlir::FailureOr<llvm::SmallVector<int64_t>>
  balanceByCost(MicrobatchLoopOp loop, int64_t stages, const CostModel &cost,
                llvm::SmallVectorImpl<double> *stageSeconds = nullptr);

  /// Each stage's predicted compute time per microbatch (as balanceByCost
  /// counts it) for `layersPerStage`.
  static llvm::SmallVector<double>
  stageSeconds(MicrobatchLoopOp loop, llvm::ArrayRef<int64_t> layersPerStage,
               const CostModel &cost);

  int stageOfLayer(int64_t layer) const;
  /// "layers 0-2" / "layer 3" for diagnostics and reports.
  std::string layerRange(int stage) const;
};

} // namespace ap::train

#endif // ACTPLACE_PASSES_ANALYSIS_PIPELINESTAGES_H
