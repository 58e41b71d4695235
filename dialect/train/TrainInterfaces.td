//===- TrainInterfaces.td - train op interfaces ------------*- tablegen -*-===//
#ifndef ACTPLACE_TRAIN_INTERFACES_TD
#define ACTPLACE_TRAIN_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Train_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::ap::train";
  let description = [{
    A forward op that train-autodiff can differentiate. The op says which
    intermediates its backward reads (by returning them as explicit results,
    so every saved byte is an SSA value placement passes can see) and builds
    its backward ops from the gradients of its results.
  }];
  let methods = [
    InterfaceMethod<[{
        Returns an op equivalent to this one that also returns the
        intermediates its backward reads (norm rstd, attention LSE, the GDN
        cumulative gates and T matrix). Replaces and erases this op when it
        has to create a new one; returns this op when nothing is needed.
      }], "::mlir::Operation *", "withSavedResults",
      (ins "::mlir::OpBuilder &":$builder),
      /*methodBody=*/"", /*defaultImplementation=*/"return $_op.getOperation();">,
    InterfaceMethod<[{
        Builds the backward of this op at the builder's insertion point.
        `resultGrads` holds the gradient of each result (null for results no
        gradient reaches and for saved intermediates). `operandNeedsGrad` says
        which operands need an input gradient. `paramGradSymbol` maps an
        operand to the trainable parameter whose main grad receives its
        gradient (null when the operand is not a trainable parameter).
        Appends one gradient per operand (null where none) to `operandGrads`.
      }], "::llvm::LogicalResult", "buildBackward",
      (ins "::mlir::OpBuilder &":$builder,
           "::llvm::ArrayRef<::mlir::Value>":$resultGrads,
           "::llvm::ArrayRef<bool>":$operandNeedsGrad,
           "::llvm::function_ref<::mlir::FlatSymbolRefAttr(::mlir::Value)>":$paramGradSymbol,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandGrads)>,
  ];
}

#endif // ACTPLACE_TRAIN_INTERFACES_TD
