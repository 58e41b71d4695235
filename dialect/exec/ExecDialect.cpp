//===- ExecDialect.cpp - exec dialect -------------------------------------===//

#include "dialect/exec/ExecDialect.h"
#include "dialect/exec/ExecOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace ap::exec;

#include "dialect/exec/ExecDialect.cpp.inc"
#include "dialect/exec/ExecEnums.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "dialect/exec/ExecTypes.cpp.inc"

void ExecDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "dialect/exec/ExecTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "dialect/exec/ExecOps.cpp.inc"
      >();
}

int64_t ap::exec::tensorBytes(RankedTensorType type) {
  int64_t width = type.getElementType().getIntOrFloatBitWidth();
  return type.getNumElements() * std::max<int64_t>(1, width / 8);
}
