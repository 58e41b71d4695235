//===- actplace-translate.cpp - Translations out of the exec dialect ------===//
//
// `actplace-translate --emit-llvm-step step.mlir`: the planned and scheduled
// exec.step lowered to the LLVM dialect (codegen/EmitLLVM.h), the form
// binaries are built from; `--emit-cpp step.mlir -o step.cpp`: the same step
// as readable C++ (codegen/EmitCpp.h).
//
//===----------------------------------------------------------------------===//
#include "codegen/EmitCpp.h"
#include "codegen/EmitLLVM.h"
#include "support/ToolVersion.h"

#include "mlir/Support/LogicalResult.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  ap::setToolVersionPrinter("actplace-translate");
  ap::codegen::registerEmitCppTranslation();
  ap::codegen::registerEmitLLVM();
  return mlir::failed(
      mlir::mlirTranslateMain(argc, argv, "actplace translation driver\n"));
}
