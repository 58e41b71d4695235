//===- EmitCpp.h - exec -> C++ training step --------------------*- C++ -*-===//
//
// Translates a module holding the `train.param` table and one planned and
// scheduled `exec.step` (after convert-train-to-exec, exec-plan-memory and
// exec-schedule-streams) into one C++ source file: the parameter table, the
// buffer plan, the pinned slots, the offload scopes and the step function,
// calling only the kernel entries (kernels/kernels.h), the runtime
// (runtime/runtime.h) and the driver (runtime/trainer.h), which provides
// main() through ap::rt::trainMain. docs/codegen.md describes the mapping.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_CODEGEN_EMITCPP_H
#define ACTPLACE_CODEGEN_EMITCPP_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/Support/raw_ostream.h"

namespace ap::codegen {

/// Planned sizes of the emitted step, for tools that report them.
struct EmittedPlan {
  uint64_t arenaBytes = 0, persistentBytes = 0, activationBytes = 0,
           workspaceBytes = 0, sideWorkspaceBytes = 0, pinnedBytes = 0,
           scratchBytes = 0;
  size_t numParams = 0, numSlots = 0, numScopes = 0;
};

/// Writes the C++ file to `os`. Fails with a diagnostic naming the op for
/// anything it cannot translate (an op without a mapping, a buffer without a
/// planned offset, a copy whose scope cannot be found).
mlir::LogicalResult emitCpp(mlir::ModuleOp module, llvm::raw_ostream &os,
                            EmittedPlan *plan = nullptr);

/// Registers the `--emit-cpp` translation for actplace-translate.
void registerEmitCppTranslation();

} // namespace ap::codegen

#endif // ACTPLACE_CODEGEN_EMITCPP_H
