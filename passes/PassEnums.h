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

} // namespace ap::train

#endif // ACTPLACE_PASSES_PASSENUMS_H
