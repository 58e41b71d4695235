//===- EmitLLVM.h - exec.step -> LLVM dialect and object file ---*- C++ -*-===//
//
// The path that builds training binaries. lowerStepToLLVM replaces a module
// holding the train.param table and one planned, scheduled exec.step by
// LLVM-dialect functions and constants: the step as calls into the
// runtime's C ABI (runtime/abi.h) in program order, kernel args structs as
// constant byte images copied into a stack buffer with their pointers
// stored at run time, the program description (ap_program and its tables)
// as constant globals, and a `main` calling ap_train_main. emitObjectFile
// translates that module to LLVM IR and compiles it in process with LLVM's
// target machine for the host: no C++ compiler runs at model-compile time.
// docs/codegen.md describes the mapping.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_CODEGEN_EMITLLVM_H
#define ACTPLACE_CODEGEN_EMITLLVM_H

#include "codegen/StepSink.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LogicalResult.h"
#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <string>

namespace ap::codegen {

/// Rewrites `module` in place into the LLVM dialect (everything else it held
/// is erased). Fails with a diagnostic naming the op, leaving the module
/// as it was, for anything the step walk cannot translate.
mlir::LogicalResult lowerStepToLLVM(mlir::ModuleOp module,
                                    EmittedPlan *plan = nullptr);

/// The LLVM-dialect `module` as a relocatable object for the host (PIC, the
/// host's triple and data layout) at `path`. `optLevel` 0-3 is LLVM's code
/// generation level. On failure returns false and sets `error`.
/// A pipelined binary: each module of `stages` (one planned exec.step
/// each, stage k at index k) lowered under the prefix "s<k>.", and a main
/// that passes the stage programs to ap_train_main_stages; the result
/// replaces the contents of `into` (which may be one of `stages`, walked
/// before it is replaced). `plans`, if given, has one entry per stage.
mlir::LogicalResult lowerStagesToLLVM(mlir::ModuleOp into,
                                      llvm::ArrayRef<mlir::ModuleOp> stages,
                                      EmittedPlan *plans = nullptr);

bool emitObjectFile(mlir::ModuleOp module, llvm::StringRef path, int optLevel,
                    std::string &error);

/// Registers `actplace-translate --emit-llvm-step` (prints the LLVM-dialect
/// module) and `--emit-llvm-ir` (its LLVM IR).
void registerEmitLLVM();

} // namespace ap::codegen

#endif // ACTPLACE_CODEGEN_EMITLLVM_H
