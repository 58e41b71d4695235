//===- PlacementOptions.td - the placement passes' options --*- tablegen -*-===//
//
// The one option set every placement pass takes (docs/architecture.md
// section 4), so the pipeline and every pass read the same spelling of
// each choice. Included by train/TrainPasses.td; passes/Pipeline.cpp
// spells the same options for train-placement-pipeline.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_PLACEMENTOPTIONS_TD
#define ACTPLACE_PASSES_PLACEMENTOPTIONS_TD

include "mlir/Pass/PassBase.td"

defvar PlacementOptions = [
  ListOption<"offloadModules", "offload-modules", "std::string",
             "Leaf modules or aliases whose saved activations go to pinned host memory">,
  ListOption<"recomputeModules", "recompute-modules", "std::string",
             "Leaf modules or aliases whose forward ops are recomputed in backward">,
  Option<"fraction", "fraction", "double", "1.0",
         "Of the eligible offload scopes in forward order, offload the first ceil(f * n)">,
  Option<"minOffloadBytes", "min-offload-bytes", "int64_t", "0",
         "Scopes with fewer offloadable bytes per microbatch stay on the device">,
  Option<"maxInflight", "max-inflight", "int64_t", "0",
         "Most D2H copies pending before compute waits (0: no limit)">,
  Option<"hideRule", "hide-rule", "::ap::train::HideRule",
         "::ap::train::HideRule::On",
         "on: keep the last scopes whose reload cannot hide under backward compute; off: offload them anyway",
         [{::llvm::cl::values(
             clEnumValN(::ap::train::HideRule::On, "on", "keep unhidable scopes"),
             clEnumValN(::ap::train::HideRule::Off, "off", "offload them anyway"))}]>,
  Option<"prefetchDepth", "prefetch-depth", "int64_t", "0",
         "0: cost-model anchors; N: issue each reload N offloaded scopes ahead (the reference rule)">,
  Option<"computeDtype", "compute-dtype", "std::string", "\"bf16\"",
         "Compute dtype the step runs in (offload requires bf16)">,
  Option<"cudaGraphs", "cuda-graphs", "bool", "false",
         "Capture the step as a CUDA graph (not supported with offload)">,
  Option<"profile", "profile", "std::string", "\"\"",
         "JSON device profile overriding the cost model's constants">,
  Option<"fuseRecompute", "fuse-recompute", "bool", "true",
         "Rebuild a recomputed SwiGLU or RMSNorm inside its backward kernel instead of by a clone (train-fuse-recompute; same bits)">,
  Option<"recomputeStream", "recompute-stream", "::ap::train::RecomputeStream",
         "::ap::train::RecomputeStream::Compute",
         "compute: recompute right before its use; side: issue it ahead on a second stream beside kernels that leave SMs idle (train-recompute-stream; same bits)",
         [{::llvm::cl::values(
             clEnumValN(::ap::train::RecomputeStream::Compute, "compute", "right before its use"),
             clEnumValN(::ap::train::RecomputeStream::Side, "side", "ahead, on the side stream"))}]>,
  // The step's data-parallel ranks and grad buckets, for the cost model
  // only (passes/analysis/DataParallelCost.h): the placement is per rank
  // either way. The bucket default is exec-bucket-grad-reduce's.
  Option<"dataParallelSize", "data-parallel-size", "int64_t", "1",
         "Replicated data-parallel ranks the step is planned for: the predicted step sums the main grads over them on the comm stream">,
  Option<"gradBucketBytes", "grad-bucket-bytes", "int64_t", "26214400",
         "Smallest main-grad bucket in bytes the prediction assumes (as exec-bucket-grad-reduce's bucket-bytes; 0: one per grad)">,
];

#endif // ACTPLACE_PASSES_PLACEMENTOPTIONS_TD
