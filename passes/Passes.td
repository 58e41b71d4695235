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

def TrainAutodiff : Pass<"train-autodiff", "mlir::ModuleOp"> {
  let summary = "Build the training step: microbatch loop of forward + backward, grad finalisation, AdamW";
  let description = [{
    Turns the one-microbatch `@forward` graph into `@train_step(tokens,
    labels: [M, B, T]) -> (loss, grad_norm)` (DESIGN.md section 4):

    * a `train.microbatch_loop` whose body is the forward graph followed by
      explicit backward ops built through DifferentiableOpInterface; forward
      ops whose backward reads intermediates (norm rstd, attention LSE, GDN
      cumulative gates and T, the loss LSE) return them, so every saved
      activation is an SSA value used across the forward/backward boundary;
    * weight gradients accumulate in FP32 main grads (named by symbol on the
      backward ops); frozen parameters get none, but input gradients still
      flow through frozen ops when something upstream is trainable, and ops
      that influence no trainable parameter get no backward work;
    * `train.finalize_grads` (token mean over the step, global norm, clip),
      `train.lr_schedule` (linear warmup + cosine decay) and one
      `train.adamw` per trainable parameter. Weight decay skips 1-D
      parameters and names containing a `no-decay` entry.
  }];
  let dependentDialects = ["::mlir::func::FuncDialect", "::ap::train::TrainDialect"];
  let options = [
    Option<"maxGradNorm", "max-grad-norm", "double", "1.0",
           "Clip the global gradient norm to this (0 disables clipping)">,
    Option<"maxLr", "lr", "double", "3.0e-4", "Peak learning rate">,
    Option<"minLr", "min-lr", "double", "3.0e-5", "Final learning rate of the cosine decay">,
    Option<"warmupSteps", "warmup-steps", "int64_t", "100", "Linear warmup steps">,
    Option<"totalSteps", "total-steps", "int64_t", "10000", "Steps of the whole schedule">,
    Option<"weightDecay", "weight-decay", "double", "0.1", "AdamW weight decay">,
    Option<"beta1", "beta1", "double", "0.9", "AdamW beta1">,
    Option<"beta2", "beta2", "double", "0.95", "AdamW beta2">,
    Option<"adamEps", "eps", "double", "1.0e-8", "AdamW epsilon">,
    ListOption<"noDecay", "no-decay", "std::string",
               "Parameters whose name contains one of these get no weight decay "
               "(default: norm, A_log, dt_bias; 1-D parameters never decay)">
  ];
}

def TrainPrintMemoryTimeline : Pass<"train-print-memory-timeline", "mlir::ModuleOp"> {
  let summary = "Print the predicted device-memory timeline of @train_step and its peak";
  let description = [{
    Walks the training step in program order (the microbatch loop body, then
    the optimizer) and prints, per category (parameters, FP32 main grads,
    optimizer state, activations, kernel workspaces, in-flight copies), the
    bytes live at each op and the predicted peak with the op where it occurs
    and the activation bytes per scope live there. Offloaded values stop
    occupying device memory once their D2H has completed; reloaded values
    occupy it from their reload to their last use.
  }];
  let options = [
    Option<"perOp", "per-op", "bool", "false", "Print one line per op, not only the peak">,
    Option<"profile", "profile", "std::string", "\"\"",
           "JSON device profile overriding the cost model's constants">
  ];
}

#endif // ACTPLACE_PASSES_TD
