//===- ExecOps.h - exec dialect operations ----------------------*- C++ -*-===//
#ifndef ACTPLACE_DIALECT_EXEC_EXECOPS_H
#define ACTPLACE_DIALECT_EXEC_EXECOPS_H

#include "dialect/exec/ExecDialect.h"
#include "dialect/train/TensorShapes.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#define GET_OP_CLASSES
#include "dialect/exec/ExecOps.h.inc"

#endif // ACTPLACE_DIALECT_EXEC_EXECOPS_H
