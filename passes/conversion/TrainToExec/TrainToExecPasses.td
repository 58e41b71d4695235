//===- TrainToExecPasses.td - train -> exec conversion -----*- tablegen -*-===//
//
// The lowering of the placed train step to the exec dialect
// (ConvertTrainToExec.cpp in this folder).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_CONVERSION_TRAINTOEXEC_TD
#define ACTPLACE_PASSES_CONVERSION_TRAINTOEXEC_TD

include "mlir/Pass/PassBase.td"

def ConvertTrainToExec : Pass<"convert-train-to-exec", "mlir::ModuleOp"> {
  let summary = "Lower the placed train step to an exec.step (buffers, streams, copies, kernels)";
  let description = [{
    Every tensor of @train_step becomes a buffer (train.reshape a view of
    its input); parameters get persistent weight, FP32 master, main-grad and
    Adam-moment buffers (weight only when frozen); train.offload becomes a
    pinned-slot acquire and a D2H copy on the d2h stream recording an event,
    train.reload an H2D copy on the h2d stream recording an event after
    which the slot is released, train.wait a wait of the compute stream on
    that event. Recomputed ops are ordinary kernel calls. Main grads are
    all-reduced over the data-parallel communicator before finalize_grads.
    Kernel calls declare the workspace the kernel library's query states
    for the CUDA kernels (GEMMs the fixed cuBLASLt workspace). Each D2H carries `done_by_kernel`, the first
    kernel the cost model (with `profile`, the same one placement used)
    predicts to start after the copy ended, stretched by the profile's
    copyHoldSlack; exec-plan-memory keeps the copied bytes until then. Offsets are left to exec-plan-memory.
    A step with side-stream kernels gets `side_sm_percent`, the share of the
    SMs its side GEMMs use, from the profile (`sideSmPercent`, the share the
    cost model's side capacity was measured under) or `side-sm-percent`.
    The step records the data parallelism it is planned for
    (`data_parallel_size`, `data_parallel`) when it is not one replicated
    rank; the binary refuses a launch of another world size.
  }];
  let dependentDialects = ["::ap::exec::ExecDialect"];
  let options = [
    Option<"stepFunction", "step-function", "std::string", "\"train_step\"",
           "The function train-autodiff built">,
    Option<"gemmWorkspaceBytes", "gemm-workspace-bytes", "int64_t", "33554432",
           "Fixed cuBLASLt workspace of GEMM kernels (0 for the host backend)">,
    Option<"profile", "profile", "std::string", "\"\"",
           "JSON device profile of the cost model that predicts when each "
           "D2H is done (done_by_kernel); give the one placement used">,
    Option<"sideSmPercent", "side-sm-percent", "int64_t", "0",
           "Side-stream GEMMs' share of the SMs in percent, written on a step "
           "with side kernels (exec.step side_sm_percent); 0: the profile's "
           "sideSmPercent. Give the placement profile's when `profile` is "
           "another">,
    Option<"dataParallel", "data-parallel", "::ap::train::DataParallelMode",
           "::ap::train::DataParallelMode::Replicate",
           "How data-parallel ranks hold parameters and optimizer state",
           [{::llvm::cl::values(AP_DATA_PARALLEL_VALUES)}]>,
    Option<"dataParallelSize", "data-parallel-size", "int64_t", "1",
           "Data-parallel ranks the per-rank plan is for">,
    Option<"tiedGradParts", "tied-grad-parts", "bool", "false",
           "Accumulate the LM-head part of a tied weight's gradient in a "
           "buffer of its own, added to the main grad once per step (as a "
           "pipeline, whose ends hold one part each, sums it; costs one f32 "
           "copy of the weight)">
  ];
}

#endif // ACTPLACE_PASSES_CONVERSION_TRAINTOEXEC_TD
