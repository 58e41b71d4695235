//===- PassEnums.h - Enum-valued pass options -------------------*- C++ -*-===//
//
// The fixed sets of choices the passes' options take (the pass .td files
// spell their values with llvm::cl::values), declared before the generated
// option structs that hold them.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_PASSENUMS_H
#define ACTPLACE_PASSES_PASSENUMS_H

#include <cstdint>

namespace ap::train {

/// hide-rule: keep the last offload scopes whose reload cannot hide under
/// backward compute (On), or offload them anyway (Off).
enum class HideRule : uint8_t { On, Off };
/// recompute-stream: where recompute clones run.
enum class RecomputeStream : uint8_t { Compute, Side };
/// report-format of train-placement-report.
enum class ReportFormat : uint8_t { Text, Json };
/// data-parallel: how the data-parallel ranks hold parameters, main grads
/// and optimizer state (all of them on every rank, or 1/N each, ZeRO-3).
enum class DataParallelMode : uint8_t { Replicate, Zero3 };
/// main-grad-dtype of exec-shard-params: the element type of the ZeRO-3
/// main-grad shards (backward kernels accumulate in f32 either way).
enum class MainGradDtype : uint8_t { F32, BF16 };
/// compute-dtype: the element type the step computes in (the verifier
/// knows them all; offload requires BF16).
enum class ComputeDtype : uint8_t { BF16, F16, F32, FP8, FP4 };
/// balance of train-pipeline-stage: layers per stage as even as possible,
/// or the split whose slowest stage the cost model predicts fastest.
enum class StageBalance : uint8_t { Layers, Cost };

/// The option spelling of a compute dtype.
inline const char *computeDtypeName(ComputeDtype d) {
  switch (d) {
  case ComputeDtype::BF16:
    return "bf16";
  case ComputeDtype::F16:
    return "f16";
  case ComputeDtype::F32:
    return "f32";
  case ComputeDtype::FP8:
    return "fp8";
  case ComputeDtype::FP4:
    return "fp4";
  }
  return "?";
}
/// The option spelling of a data-parallel mode, also the value of an
/// exec.step's data_parallel attribute.
inline const char *dataParallelName(DataParallelMode m) {
  return m == DataParallelMode::Zero3 ? "zero3" : "replicate";
}

} // namespace ap::train

// The llvm::cl::values of the enums that several option sets take (the
// pass .td options, the pipeline's options and actplace-compile), spelled
// once here; expanded where llvm/Support/CommandLine.h is included.
#define AP_DATA_PARALLEL_VALUES                                                \
  clEnumValN(::ap::train::DataParallelMode::Replicate, "replicate",            \
             "every rank holds all parameters, main grads and optimizer "      \
             "state; main grads are summed over ranks in buckets on the "      \
             "comm stream during the last microbatch's backward (default)"),   \
      clEnumValN(::ap::train::DataParallelMode::Zero3, "zero3",                \
                 "each rank holds 1/N of every parameter, main grad and "      \
                 "optimizer state; a layer group's weights are gathered "      \
                 "before its forward and its backward, its grads "             \
                 "reduce-scattered after")
#define AP_COMPUTE_DTYPE_VALUES                                                \
  clEnumValN(::ap::train::ComputeDtype::BF16, "bf16", "bfloat16 (default)"),   \
      clEnumValN(::ap::train::ComputeDtype::F16, "f16", "float16"),            \
      clEnumValN(::ap::train::ComputeDtype::F32, "f32", "float32"),            \
      clEnumValN(::ap::train::ComputeDtype::FP8, "fp8", "8-bit float"),        \
      clEnumValN(::ap::train::ComputeDtype::FP4, "fp4", "4-bit float")

namespace ap::train {} // namespace ap::train

#endif // ACTPLACE_PASSES_PASSENUMS_H
