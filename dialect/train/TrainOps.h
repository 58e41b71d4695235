//===- TrainOps.h - train dialect operations ----------------------*- C++
//-*-===//
#ifndef ACTPLACE_DIALECT_TRAIN_TRAINOPS_H
#define ACTPLACE_DIALECT_TRAIN_TRAINOPS_H

#include "dialect/train/TensorShapes.h"
#include "dialect/train/TrainDialect.h"

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialect/train/TrainInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialect/train/TrainOps.h.inc"

#endif // ACTPLACE_DIALECT_TRAIN_TRAINOPS_H
