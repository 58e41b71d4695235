//===- Passes.h - actplace passes ---------------------------------*- C++
//-*-===//
#ifndef ACTPLACE_PASSES_PASSES_H
#define ACTPLACE_PASSES_PASSES_H

#include "dialect/train/TrainDialect.h"
#include "passes/PassEnums.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace ap {

// Every pass, by area: one generated header per .td file.
#define GEN_PASS_DECL
#include "passes/train/TrainPasses.h.inc"
#define GEN_PASS_DECL
#include "passes/conversion/TrainToExec/TrainToExecPasses.h.inc"
#define GEN_PASS_DECL
#include "passes/exec/ExecPasses.h.inc"

/// Registers every actplace pass (and pipeline) with the global registry.
void registerAllActplacePasses();

} // namespace ap

#endif // ACTPLACE_PASSES_PASSES_H
