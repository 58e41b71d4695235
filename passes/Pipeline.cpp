//===- Pipeline.cpp - The compiler's pass pipeline, built once ------------===//
#include "passes/Pipeline.h"

#include "passes/analysis/PlacementSearch.h"

#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

namespace ap {

namespace {
/// The placement stage: the six placement passes with one option set, then
/// the report(s).
void addPlacementStage(OpPassManager &pm, const CompileOptions &o) {
  const train::PlacementConfig &cfg = o.placement;
  const std::vector<std::string> &off = cfg.offloadModules,
                                 &re = cfg.recomputeModules;
  using train::placementPassOptions;
  pm.addPass(createTrainVerifyPlacementConfig(
      placementPassOptions<TrainVerifyPlacementConfigOptions>(cfg, off, re)));
  pm.addPass(createTrainRecompute(
      placementPassOptions<TrainRecomputeOptions>(cfg, off, re)));
  pm.addPass(createTrainFuseRecompute(
      placementPassOptions<TrainFuseRecomputeOptions>(cfg, off, re)));
  pm.addPass(createTrainRecomputeStream(
      placementPassOptions<TrainRecomputeStreamOptions>(cfg, off, re)));
  pm.addPass(createTrainOffloadScopes(
      placementPassOptions<TrainOffloadScopesOptions>(cfg, off, re)));
  pm.addPass(createTrainPrefetchAnchors(
      placementPassOptions<TrainPrefetchAnchorsOptions>(cfg, off, re)));
  auto report = [&](train::ReportFormat format, const std::string &file) {
    auto r = placementPassOptions<TrainPlacementReportOptions>(cfg, off, re);
    r.reportFormat = format;
    r.reportFile = file;
    pm.addPass(createTrainPlacementReport(r));
  };
  if (o.report)
    report(o.reportFormat, o.reportFile);
  // The JSON report is a second run of the report pass (same options), so
  // the text report and what is printed from it stay as they are.
  if (!o.jsonReportFile.empty())
    report(train::ReportFormat::Json, o.jsonReportFile);
}
} // namespace

void buildPipeline(OpPassManager &pm, const CompileOptions &o,
                   PipelineStage first, PipelineStage last) {
  auto runs = [&](PipelineStage s) { return first <= s && s <= last; };
  if (runs(PipelineStage::Autodiff))
    pm.addPass(createTrainAutodiff(o.autodiff));
  if (runs(PipelineStage::Placement)) {
    if (o.pipelineStages > 1) {
      TrainPipelineStageOptions stage;
      stage.stages = o.pipelineStages;
      stage.stage = o.pipelineStage;
      stage.layers.assign(o.pipelineLayers.begin(), o.pipelineLayers.end());
      stage.balance = o.pipelineBalanceCost ? train::StageBalance::Cost
                                            : train::StageBalance::Layers;
      stage.profile = o.pipelineProfile;
      pm.addPass(createTrainPipelineStage(stage));
    }
    addPlacementStage(pm, o);
  }
  if (runs(PipelineStage::Lowering)) {
    pm.addPass(createConvertTrainToExec(o.lowering));
    if (o.pipelineStages > 1)
      pm.addPass(createExecPipelineSchedule());
    if (o.lowering.dataParallel == train::DataParallelMode::Zero3)
      pm.addPass(createExecShardParams(o.zeroShard));
    else if (o.lowering.dataParallelSize > 1)
      pm.addPass(createExecBucketGradReduce(o.gradBuckets));
    if (o.generatedKernels) {
      ExecGenerateKernelsOptions gen;
      gen.fuse = o.fuseKernels;
      gen.fuseNormGradAdd = o.fuseNormGradAdd;
      gen.fuseDySum = o.fuseDySum;
      gen.ops.assign(o.generatedOps.begin(), o.generatedOps.end());
      pm.addPass(createExecGenerateKernels(gen));
    }
    pm.addPass(createExecPlanMemory());
    pm.addPass(createExecScheduleStreams());
    if (o.sideIssue == SideIssue::AfterHost)
      pm.addPass(createExecDeferSideIssue());
  }
}

void train::addPlacementPasses(OpPassManager &pm, const PlacementConfig &cfg,
                               llvm::ArrayRef<std::string> offload,
                               llvm::ArrayRef<std::string> recompute) {
  CompileOptions o;
  o.placement = cfg;
  o.placement.offloadModules.assign(offload.begin(), offload.end());
  o.placement.recomputeModules.assign(recompute.begin(), recompute.end());
  buildPipeline(pm, o, PipelineStage::Placement, PipelineStage::Placement);
}

namespace {
/// train-placement-pipeline's options: the placement options of
/// PlacementOptions.td (one spelling, PlacementOptions) and the report's.
struct PlacementPipelineOptions
    : PassPipelineOptions<PlacementPipelineOptions> {
  ListOption<std::string> offloadModules{
      *this, "offload-modules",
      llvm::cl::desc("Leaf modules or aliases to offload")};
  ListOption<std::string> recomputeModules{
      *this, "recompute-modules",
      llvm::cl::desc("Leaf modules or aliases to recompute")};
  Option<double> fraction{*this, "fraction", llvm::cl::init(1.0),
                          llvm::cl::desc("Fraction of eligible scopes")};
  Option<int64_t> minOffloadBytes{*this, "min-offload-bytes", llvm::cl::init(0),
                                  llvm::cl::desc("Minimum bytes per scope")};
  Option<int64_t> maxInflight{*this, "max-inflight", llvm::cl::init(0),
                              llvm::cl::desc("Most pending D2H copies")};
  Option<train::HideRule> hideRule{
      *this, "hide-rule", llvm::cl::init(train::HideRule::On),
      llvm::cl::desc("on | off"),
      llvm::cl::values(clEnumValN(train::HideRule::On, "on", ""),
                       clEnumValN(train::HideRule::Off, "off", ""))};
  Option<int64_t> prefetchDepth{*this, "prefetch-depth", llvm::cl::init(0),
                                llvm::cl::desc("0: cost model; N: reference "
                                               "rule")};
  Option<train::ComputeDtype> computeDtype{
      *this, "compute-dtype", llvm::cl::init(train::ComputeDtype::BF16),
      llvm::cl::desc("Compute dtype"),
      llvm::cl::values(AP_COMPUTE_DTYPE_VALUES)};
  Option<bool> cudaGraphs{*this, "cuda-graphs", llvm::cl::init(false),
                          llvm::cl::desc("CUDA-graph capture")};
  Option<std::string> profile{*this, "profile", llvm::cl::init(""),
                              llvm::cl::desc("JSON device profile")};
  Option<bool> fuseRecompute{
      *this, "fuse-recompute", llvm::cl::init(true),
      llvm::cl::desc(
          "Rebuild a recomputed SwiGLU or RMSNorm in its backward kernel")};
  Option<train::RecomputeStream> recomputeStream{
      *this, "recompute-stream",
      llvm::cl::init(train::RecomputeStream::Compute),
      llvm::cl::desc("compute | side: where recompute clones run"),
      llvm::cl::values(
          clEnumValN(train::RecomputeStream::Compute, "compute", ""),
          clEnumValN(train::RecomputeStream::Side, "side", ""))};
  Option<train::DataParallelMode> dataParallel{
      *this, "data-parallel",
      llvm::cl::init(train::DataParallelMode::Replicate),
      llvm::cl::desc("replicate | zero3: how the ranks hold parameters"),
      llvm::cl::values(AP_DATA_PARALLEL_VALUES)};
  Option<int64_t> dataParallelSize{
      *this, "data-parallel-size", llvm::cl::init(1),
      llvm::cl::desc("Data-parallel ranks the prediction assumes")};
  Option<int64_t> gradBucketBytes{
      *this, "grad-bucket-bytes", llvm::cl::init(26214400),
      llvm::cl::desc("Smallest main-grad bucket the prediction assumes")};
  Option<int64_t> gatherMaxInflight{
      *this, "gather-max-inflight", llvm::cl::init(1),
      llvm::cl::desc("zero3: windows gathered ahead the prediction assumes")};
  Option<train::MainGradDtype> mainGradDtype{
      *this, "main-grad-dtype", llvm::cl::init(train::MainGradDtype::F32),
      llvm::cl::desc("zero3: main-grad shard type the per-rank memory "
                     "assumes"),
      llvm::cl::values(clEnumValN(train::MainGradDtype::F32, "f32", ""),
                       clEnumValN(train::MainGradDtype::BF16, "bf16", ""))};
  Option<bool> report{*this, "report", llvm::cl::init(false),
                      llvm::cl::desc("Print the placement report")};
  Option<train::ReportFormat> reportFormat{
      *this, "report-format", llvm::cl::init(train::ReportFormat::Text),
      llvm::cl::desc("text | json"),
      llvm::cl::values(clEnumValN(train::ReportFormat::Text, "text", ""),
                       clEnumValN(train::ReportFormat::Json, "json", ""))};
  Option<std::string> reportFile{*this, "report-file", llvm::cl::init("-"),
                                 llvm::cl::desc("Report destination")};
};

void buildRegisteredPlacementPipeline(OpPassManager &pm,
                                      const PlacementPipelineOptions &p) {
  CompileOptions o;
  train::PlacementConfig &cfg = o.placement;
  cfg.offloadModules.assign(p.offloadModules.begin(), p.offloadModules.end());
  cfg.recomputeModules.assign(p.recomputeModules.begin(),
                              p.recomputeModules.end());
  cfg.fraction = p.fraction;
  cfg.minOffloadBytes = p.minOffloadBytes;
  cfg.maxInflight = p.maxInflight;
  cfg.hideRule = p.hideRule;
  cfg.prefetchDepth = p.prefetchDepth;
  cfg.computeDtype = p.computeDtype;
  cfg.cudaGraphs = p.cudaGraphs;
  cfg.profile = p.profile;
  cfg.fuseRecompute = p.fuseRecompute;
  cfg.recomputeStream = p.recomputeStream;
  cfg.dataParallel = p.dataParallel;
  cfg.dataParallelSize = p.dataParallelSize;
  cfg.gradBucketBytes = p.gradBucketBytes;
  cfg.gatherMaxInflight = p.gatherMaxInflight;
  cfg.mainGradDtype = p.mainGradDtype;
  o.report = p.report;
  o.reportFormat = p.reportFormat;
  o.reportFile = p.reportFile;
  buildPipeline(pm, o, PipelineStage::Placement, PipelineStage::Placement);
}
} // namespace

void registerActplacePipelines() {
  PassPipelineRegistration<PlacementPipelineOptions>(
      "train-placement-pipeline",
      "Placement in order: verify the options, recompute, fuse recompute, "
      "recompute stream, offload scopes, prefetch anchors (and the report "
      "with report=true)",
      buildRegisteredPlacementPipeline);
}

} // namespace ap
