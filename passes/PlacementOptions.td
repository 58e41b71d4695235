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
  Option<"computeDtype", "compute-dtype", "::ap::train::ComputeDtype",
         "::ap::train::ComputeDtype::BF16",
         "Compute dtype the step runs in (offload requires bf16)",
         [{::llvm::cl::values(AP_COMPUTE_DTYPE_VALUES)}]>,
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
  // The step's data-parallel ranks, how they hold the parameters, grad
  // buckets (replicate) and gathers ahead (zero3), for the cost model and
  // the memory timeline only (passes/analysis/DataParallelCost.h): the
  // placement is per rank either way. The defaults are
  // exec-bucket-grad-reduce's and exec-shard-params'.
  Option<"dataParallel", "data-parallel", "::ap::train::DataParallelMode",
         "::ap::train::DataParallelMode::Replicate",
         "replicate: every rank holds all parameters and optimizer state; zero3: each rank holds 1/N of them and gathers each layer group's weights for its forward and backward",
         [{::llvm::cl::values(AP_DATA_PARALLEL_VALUES)}]>,
  Option<"dataParallelSize", "data-parallel-size", "int64_t", "1",
         "Data-parallel ranks the step is planned for: the predicted step sums the main grads over them on the comm stream (replicate) or gathers and reduce-scatters per layer group (zero3)">,
  Option<"gradBucketBytes", "grad-bucket-bytes", "int64_t", "26214400",
         "Smallest main-grad bucket in bytes the prediction assumes (as exec-bucket-grad-reduce's bucket-bytes; 0: one per grad)">,
  Option<"gatherMaxInflight", "gather-max-inflight", "int64_t", "1",
         "zero3: layer-group windows whose weights are gathered ahead of the one computing (as exec-shard-params' gather-max-inflight)">,
  Option<"mainGradDtype", "main-grad-dtype", "::ap::train::MainGradDtype",
         "::ap::train::MainGradDtype::F32",
         "zero3: the main-grad shards' type the per-rank memory assumes (as exec-shard-params' main-grad-dtype)",
         [{::llvm::cl::values(
             clEnumValN(::ap::train::MainGradDtype::F32, "f32", "f32 main-grad shards (default)"),
             clEnumValN(::ap::train::MainGradDtype::BF16, "bf16", "bf16 main-grad shards"))}]>,
];

#endif // ACTPLACE_PASSES_PLACEMENTOPTIONS_TD
