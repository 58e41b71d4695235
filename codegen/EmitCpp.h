//===- EmitCpp.h - exec -> C++ training step --------------------*- C++ -*-===//
//
// Translates a module holding the `train.param` table and one planned and
// scheduled `exec.step` (after convert-train-to-exec, exec-plan-memory and
// exec-schedule-streams) into one readable C++ source file: the parameter
// table, the buffer plan, the pinned slots, the offload scopes and the step
// function, calling only the runtime's C ABI (runtime/abi.h) with the kernel
// library's args structs (kernels/kernels.h). The same calls as the LLVM
// path (EmitLLVM.h), which builds binaries; docs/codegen.md describes the
// mapping.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_CODEGEN_EMITCPP_H
#define ACTPLACE_CODEGEN_EMITCPP_H

#include "codegen/StepSink.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/Support/raw_ostream.h"

namespace ap::codegen {

/// Writes the C++ file to `os`. Fails with a diagnostic naming the op for
/// anything it cannot translate (an op without a mapping, a buffer without a
/// planned offset, a copy whose scope cannot be found).
mlir::LogicalResult emitCpp(mlir::ModuleOp module, llvm::raw_ostream &os,
                            EmittedPlan *plan = nullptr);

/// A pipelined binary's C++: each stage (one module each, stage k at index
/// k) in namespace stage<k>, then a main that passes the stage programs to
/// ap_train_main_stages. `plans`, if given, has one entry per stage.
mlir::LogicalResult emitCppStages(llvm::ArrayRef<mlir::ModuleOp> stages,
                                  llvm::raw_ostream &os,
                                  EmittedPlan *plans = nullptr);

/// Registers the `--emit-cpp` translation for actplace-translate.
void registerEmitCppTranslation();

} // namespace ap::codegen

#endif // ACTPLACE_CODEGEN_EMITCPP_H
