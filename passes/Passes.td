//===- Passes.td - actplace passes -------------------------*- tablegen -*-===//
//
// Every pass of the compiler: one .cpp per pass under transforms/, decisions
// in analysis classes under analysis/ (DESIGN.md section 8).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_TD
#define ACTPLACE_PASSES_TD

include "mlir/Pass/PassBase.td"

def TrainPrintSummary : Pass<"train-print-summary", "mlir::ModuleOp"> {
  let summary = "Print a summary of a train graph: parameters, layers, scopes, op counts";
  let description = [{
    Prints to stdout (or `output=stderr`) the model name, microbatch count,
    graph inputs, parameter counts and bytes (trainable and frozen), the
    leaf modules present in each decoder layer, and how many ops of each kind
    the forward graph holds. Leaves the IR unchanged.
  }];
  let options = [
    Option<"toStderr", "to-stderr", "bool", /*default=*/"false",
           "Print to stderr instead of stdout">
  ];
}

#endif // ACTPLACE_PASSES_TD
