//===- Passes.cpp - actplace pass and pipeline registration ---------------===//

#include "passes/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"
#include "mlir/Pass/PassRegistry.h"

namespace ap {
#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

namespace {
/// The placement options of Passes.td, spelled once for the pipeline.
struct PlacementPipelineOptions
    : mlir::PassPipelineOptions<PlacementPipelineOptions> {
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
  Option<std::string> hideRule{*this, "hide-rule", llvm::cl::init("on"),
                               llvm::cl::desc("on | off")};
  Option<int64_t> prefetchDepth{*this, "prefetch-depth", llvm::cl::init(0),
                                llvm::cl::desc("0: cost model; N: reference "
                                               "rule")};
  Option<std::string> computeDtype{*this, "compute-dtype",
                                   llvm::cl::init("bf16"),
                                   llvm::cl::desc("Compute dtype")};
  Option<bool> cudaGraphs{*this, "cuda-graphs", llvm::cl::init(false),
                          llvm::cl::desc("CUDA-graph capture")};
  Option<std::string> profile{*this, "profile", llvm::cl::init(""),
                              llvm::cl::desc("JSON device profile")};
  Option<bool> report{*this, "report", llvm::cl::init(false),
                      llvm::cl::desc("Print the placement report")};
  Option<std::string> reportFormat{*this, "report-format",
                                   llvm::cl::init("text"),
                                   llvm::cl::desc("text | json")};
  Option<std::string> reportFile{*this, "report-file", llvm::cl::init("-"),
                                 llvm::cl::desc("Report destination")};
};

template <typename PassOptions>
PassOptions placementOptions(const PlacementPipelineOptions &o) {
  PassOptions p;
  p.offloadModules.assign(o.offloadModules.begin(), o.offloadModules.end());
  p.recomputeModules.assign(o.recomputeModules.begin(),
                            o.recomputeModules.end());
  p.fraction = o.fraction;
  p.minOffloadBytes = o.minOffloadBytes;
  p.maxInflight = o.maxInflight;
  p.hideRule = o.hideRule;
  p.prefetchDepth = o.prefetchDepth;
  p.computeDtype = o.computeDtype;
  p.cudaGraphs = o.cudaGraphs;
  p.profile = o.profile;
  return p;
}

void buildPlacementPipeline(mlir::OpPassManager &pm,
                            const PlacementPipelineOptions &o) {
  pm.addPass(createTrainVerifyPlacementConfig(
      placementOptions<TrainVerifyPlacementConfigOptions>(o)));
  pm.addPass(createTrainRecompute(placementOptions<TrainRecomputeOptions>(o)));
  pm.addPass(
      createTrainOffloadScopes(placementOptions<TrainOffloadScopesOptions>(o)));
  pm.addPass(createTrainPrefetchAnchors(
      placementOptions<TrainPrefetchAnchorsOptions>(o)));
  if (o.report) {
    auto r = placementOptions<TrainPlacementReportOptions>(o);
    r.reportFormat = o.reportFormat;
    r.reportFile = o.reportFile;
    pm.addPass(createTrainPlacementReport(r));
  }
}
} // namespace

void registerAllActplacePasses() {
  registerActplacePasses();
  mlir::PassPipelineRegistration<PlacementPipelineOptions>(
      "train-placement-pipeline",
      "Placement in order: verify the options, recompute, offload scopes, "
      "prefetch anchors (and the report with report=true)",
      buildPlacementPipeline);
}
} // namespace ap
