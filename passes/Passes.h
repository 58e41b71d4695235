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

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

/// Registers every actplace pass (and pipeline) with the global registry.
void registerAllActplacePasses();

} // namespace ap

#endif // ACTPLACE_PASSES_PASSES_H
