//===- actplace-opt.cpp - actplace optimizer driver -----------------------===//
//
// mlir-opt with the train dialect, the actplace passes and the upstream
// dialects actplace graphs use.
//
//===----------------------------------------------------------------------===//

#include "dialect/exec/ExecDialect.h"
#include "dialect/train/TrainDialect.h"
#include "passes/Passes.h"
#include "support/ToolVersion.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  ap::setToolVersionPrinter("actplace-opt");
  mlir::DialectRegistry registry;
  registry.insert<ap::exec::ExecDialect>();
  registry.insert<ap::train::TrainDialect, mlir::func::FuncDialect,
                  mlir::arith::ArithDialect, mlir::scf::SCFDialect,
                  mlir::tensor::TensorDialect>();
  ap::registerAllActplacePasses();
  // The generic cleanups users combine with actplace passes.
  mlir::registerCanonicalizerPass();
  mlir::registerCSEPass();
  mlir::registerSymbolDCEPass();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "actplace optimizer driver: train dialect passes\n",
      registry));
}
