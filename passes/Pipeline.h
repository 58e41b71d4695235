//===- Pipeline.h - The compiler's pass pipeline, built once ----*- C++ -*-===//
//
// One options struct for a whole compile and one function that turns it into
// passes: actplace-compile, the registered train-placement-pipeline, the
// placement search and train-plan-budget all build their pass managers here,
// so no pipeline is spelled as a string and no option twice. The stages are
// those of docs/architecture.md: autodiff (train-autodiff), placement
// (verify, recompute, fuse recompute, recompute stream, offload scopes,
// prefetch anchors, and the report when asked), lowering
// (convert-train-to-exec, exec-plan-memory, exec-schedule-streams and, by
// default, exec-defer-side-issue).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_PIPELINE_H
#define ACTPLACE_PASSES_PIPELINE_H

#include "passes/Passes.h"
#include "passes/analysis/PlacementConfig.h"

#include "mlir/Pass/PassManager.h"

#include <string>
#include <vector>

namespace ap {

/// Where the lowering issues side-stream runs (exec-defer-side-issue).
enum class SideIssue : uint8_t {
  WithRun,   ///< where the run sits in the schedule
  AfterHost, ///< after the kernel it overlaps (the default)
};

enum class PipelineStage : uint8_t {
  Autodiff = 0,
  Placement = 1,
  Lowering = 2
};

/// Everything a compile decides, by stage.
struct CompileOptions {
  /// train-autodiff (loss fusion, optimizer and schedule settings).
  TrainAutodiffOptions autodiff;
  /// The placement: module lists, fraction, hide rule, profile, ...
  train::PlacementConfig placement;
  /// Adds train-placement-report after the placement passes.
  bool report = false;
  train::ReportFormat reportFormat = train::ReportFormat::Text;
  std::string reportFile = "-";
  /// Non-empty: a second report, as JSON, into this file.
  std::string jsonReportFile;
  /// convert-train-to-exec (GEMM workspace, the profile that predicts copy
  /// completion).
  ConvertTrainToExecOptions lowering;
  /// exec-bucket-grad-reduce (runs when lowering.dataParallelSize > 1).
  ExecBucketGradReduceOptions gradBuckets;
  /// exec-shard-params (runs when lowering.dataParallel is "zero3").
  ExecShardParamsOptions zeroShard;
  SideIssue sideIssue = SideIssue::AfterHost;
  /// exec-generate-kernels (runs when `generatedKernels`): kernelgen's
  /// kernels for the element-wise and row-wise calls, `fuseKernels` fusing
  /// residual add + RMSNorm.
  bool generatedKernels = false;
  /// With generatedKernels: only these train ops (empty: every op that has
  /// a group; --kernels=auto's choice).
  std::vector<std::string> generatedOps;
  bool fuseKernels = true;
  /// And RMSNorm backward + residual add pairs (exec-generate-kernels
  /// fuse-norm-grad-add).
  bool fuseNormGradAdd = false;
  /// And the chains of residual adds forming an RMSNorm backward's dy
  /// (exec-generate-kernels fuse-dy-sum).
  bool fuseDySum = false;
  /// Pipeline parallelism: `pipelineStages` > 1 compiles stage
  /// `pipelineStage` (train-pipeline-stage first in the placement stage,
  /// exec-pipeline-schedule after the lowering); `pipelineLayers` are the
  /// decoder layers per stage (empty: even, or with `pipelineBalanceCost`
  /// the split whose slowest stage is fastest under the cost model, whose
  /// profile is `pipelineProfile`).
  int64_t pipelineStages = 1, pipelineStage = 0;
  std::vector<int64_t> pipelineLayers;
  bool pipelineBalanceCost = false;
  std::string pipelineProfile;
};

/// Adds the passes of stages `first` to `last` (inclusive) for `options`.
void buildPipeline(mlir::OpPassManager &pm, const CompileOptions &options,
                   PipelineStage first = PipelineStage::Autodiff,
                   PipelineStage last = PipelineStage::Lowering);

/// Registers train-placement-pipeline (the placement stage, with the
/// placement options and report=, report-format=, report-file=).
void registerActplacePipelines();

} // namespace ap

#endif // ACTPLACE_PASSES_PIPELINE_H
