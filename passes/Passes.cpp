//===- Passes.cpp - actplace pass and pipeline registration ---------------===//

#include "passes/Passes.h"
#include "passes/analysis/PlacementSearch.h"

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
  Option<bool> fuseRecompute{
      *this, "fuse-recompute", llvm::cl::init(true),
      llvm::cl::desc(
          "Rebuild a recomputed SwiGLU or RMSNorm in its backward kernel")};
  Option<std::string> recomputeStream{
      *this, "recompute-stream", llvm::cl::init("compute"),
      llvm::cl::desc("compute | side: where recompute clones run")};
  Option<bool> report{*this, "report", llvm::cl::init(false),
                      llvm::cl::desc("Print the placement report")};
  Option<std::string> reportFormat{*this, "report-format",
                                   llvm::cl::init("text"),
                                   llvm::cl::desc("text | json")};
  Option<std::string> reportFile{*this, "report-file", llvm::cl::init("-"),
                                 llvm::cl::desc("Report destination")};
};

void buildPlacementPipeline(mlir::OpPassManager &pm,
                            const PlacementPipelineOptions &o) {
  train::PlacementConfig cfg;
  cfg.fraction = o.fraction;
  cfg.minOffloadBytes = o.minOffloadBytes;
  cfg.maxInflight = o.maxInflight;
  cfg.hideRule = o.hideRule;
  cfg.prefetchDepth = o.prefetchDepth;
  cfg.computeDtype = o.computeDtype;
  cfg.cudaGraphs = o.cudaGraphs;
  cfg.profile = o.profile;
  cfg.fuseRecompute = o.fuseRecompute;
  cfg.recomputeStream = o.recomputeStream;
  std::vector<std::string> offload(o.offloadModules.begin(),
                                   o.offloadModules.end()),
      recompute(o.recomputeModules.begin(), o.recomputeModules.end());
  train::addPlacementPasses(pm, cfg, offload, recompute);
  if (o.report) {
    auto r = train::placementPassOptions<TrainPlacementReportOptions>(
        cfg, offload, recompute);
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
      "Placement in order: verify the options, recompute, fuse recompute, "
      "recompute stream, offload scopes, "
      "prefetch anchors (and the report with report=true)",
      buildPlacementPipeline);
}
} // namespace ap
