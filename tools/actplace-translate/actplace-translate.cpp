//===- actplace-translate.cpp - Translations out of the exec dialect ------===//
//
// `actplace-translate --emit-cpp step.mlir -o step.cpp`: the planned and
// scheduled exec.step as one C++ source file (codegen/EmitCpp.h).
//
//===----------------------------------------------------------------------===//
#include "codegen/EmitCpp.h"
#include "support/ToolVersion.h"

#include "mlir/Support/LogicalResult.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  ap::setToolVersionPrinter("actplace-translate");
  ap::codegen::registerEmitCppTranslation();
  return mlir::failed(
      mlir::mlirTranslateMain(argc, argv, "actplace translation driver\n"));
}
