//===- TrainPasses.td - train-dialect passes ---------------*- tablegen -*-===//
//
// The passes on the train dialect: autodiff, the placement passes and
// the reports (one .cpp per pass in this folder; decisions in
// passes/analysis/, docs/architecture.md section 8).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_TRAIN_TRAINPASSES_TD
#define ACTPLACE_PASSES_TRAIN_TRAINPASSES_TD

include "mlir/Pass/PassBase.td"
include "passes/PlacementOptions.td"

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
    labels: [M, B, T]) -> (loss, grad_norm)` (docs/architecture.md section 4):

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
      parameters and names containing a `no-decay` entry;
    * by default the loss and its gradient are one op,
      `train.lm_head_cross_entropy_with_grad`, where the loss was: the
      microbatch's first backward op (`fuse-loss-grad=false` keeps the pair).
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
               "(default: norm, A_log, dt_bias; 1-D parameters never decay)">,
    Option<"fuseLossGrad", "fuse-loss-grad", "bool", "true",
           "Compute the loss and its gradient in one op "
           "(train.lm_head_cross_entropy_with_grad) where the loss was, each "
           "chunk's logits once; false keeps train.lm_head_cross_entropy and "
           "its train.lm_head_cross_entropy_grad at the start of the backward "
           "(the same bits either way)">
  ];
}

def TrainPrintSavedActivations : Pass<"train-print-saved-activations", "mlir::ModuleOp"> {
  let summary = "Print every saved activation: producer, scope, bytes, def point, backward uses";
  let description = [{
    After train-autodiff: one line per value defined in the forward part of
    the microbatch body and read by its backward part, with its producing op
    and result index, the producer's scope, type, bytes, the body index of
    its definition and of its first and last backward use, and the scopes
    whose backward reads it; then bytes per producing scope and the total.
  }];
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

def TrainPipelineStage : Pass<"train-pipeline-stage", "mlir::ModuleOp"> {
  let summary = "Keep one pipeline stage of the training step: its layers, its parameters, sends and receives at its boundaries";
  let description = [{
    Runs after train-autodiff. PipelineStages (passes/analysis) assigns the
    microbatch body's ops to `stages` stages (`layers`: decoder layers per
    stage, default as even as possible); this pass keeps stage `stage`:
    its ops, the parameters they read or accumulate gradients into and
    their AdamW updates. Each value the stage gives a neighbour gets a
    `train.pipeline_send` after its producer; each value it takes gets a
    `train.pipeline_recv` (forward inputs before their first use, gradients
    at the start of the stage's backward). A stage without the LM head
    yields no loss. The module records `train.pipeline_stages`,
    `train.pipeline_stage` and the stage's first and end layer.
    Errors: more stages than layers, layer counts that do not add up, fewer
    microbatches than stages, a value used two stages away.
  }];
  let dependentDialects = ["::ap::train::TrainDialect"];
  let options = [
    Option<"stages", "stages", "int64_t", "1", "Pipeline stages (--pipeline-parallel)">,
    Option<"stage", "stage", "int64_t", "0", "The stage to keep, 0-based">,
    ListOption<"layers", "layers", "int64_t",
               "Decoder layers per stage (--pipeline-stages); empty: even split">,
    Option<"balance", "balance", "::ap::train::StageBalance",
           "::ap::train::StageBalance::Layers",
           "Without `layers`: how the layers are split into stages",
           [{::llvm::cl::values(
               clEnumValN(::ap::train::StageBalance::Layers, "layers",
                          "as even as possible"),
               clEnumValN(::ap::train::StageBalance::Cost, "cost",
                          "the split whose slowest stage is fastest under "
                          "the cost model"))}]>,
    Option<"profile", "profile", "std::string", "\"\"",
           "JSON device profile for balance=cost">
  ];
  let statistics = [
    Statistic<"numLayers", "stage-layers", "Decoder layers of the kept stage">,
    Statistic<"numSends", "sends", "Values sent to a neighbouring stage">,
    Statistic<"numRecvs", "recvs", "Values received from a neighbouring stage">,
    Statistic<"numErased", "erased-ops", "Body ops of other stages removed">
  ];
}

//===----------------------------------------------------------------------===//
// Placement. Every pass takes PlacementOptions (passes/PlacementOptions.td).
//===----------------------------------------------------------------------===//

def TrainVerifyPlacementConfig : Pass<"train-verify-placement-config", "mlir::ModuleOp"> {
  let summary = "Reject unsupported placement options with clear diagnostics";
  let description = [{
    Errors: unknown module names (listing the known leaves and aliases),
    fraction outside [0, 1], negative byte or in-flight limits, hide-rule not
    on/off, compute-dtype other than bf16 together with offload, a scope both
    offloaded and recomputed, cuda-graphs together with offload. Warns when a
    selected module does not occur in the model.
  }];
  let options = PlacementOptions;
}

def TrainRecompute : Pass<"train-recompute", "mlir::ModuleOp"> {
  let summary = "Recompute the selected scopes' forward ops right before their first backward use";
  let description = [{
    Every backward use of a value produced by a forward op of a selected
    scope is redirected to a clone of that op (marked `train.recomputed`)
    placed before the first such use, built from inputs that are kept,
    offloaded or themselves recomputed. Selecting `gdn_prep` also recomputes
    the q/k L2 norms that read its output, so the recurrence's q, k and v are
    rebuilt from the saved conv input and need not be stored.
  }];
  let options = PlacementOptions;
}

def TrainFuseRecompute : Pass<"train-fuse-recompute", "mlir::ModuleOp"> {
  let summary = "Fold a recomputed SwiGLU or RMSNorm into its backward kernel";
  let description = [{
    After train-recompute, a recomputed `train.swiglu` or `train.rms_norm`
    whose output only the weight gradients of the linears after it read
    (mlp_fc2; the projections after attn_norm and mlp_norm) is rebuilt by
    its own backward, which reads the same inputs anyway. Each of those
    `train.linear_grad` ops is split into `train.linear_input_grad` (dx, in
    its place) and a `train.linear_grad` without result (dW) right after
    the backward: `train.swiglu_grad` with its `output` result, or
    `train.rms_norm_grad_rebuild`, which reads the forward's saved rstd.
    The clone is dropped. dW is the same sum of the same products, so no bit
    changes; the activation costs one store instead of a kernel that reads
    its inputs again. Off with fuse-recompute=false.
  }];
  let options = PlacementOptions;
}

def TrainRecomputeStream : Pass<"train-recompute-stream", "mlir::ModuleOp"> {
  let summary = "Issue recompute clones ahead on the side stream, beside kernels that leave SMs idle";
  let description = [{
    With recompute-stream=side: every run of consecutive recompute clones
    (train.recomputed, after train-fuse-recompute) in the backward moves to
    right before the nearest earlier backward op whose side capacity in the
    cost model is positive (the GDN chunk backward on the H200), and its
    ops are marked `train.side_stream`: they run on the side stream,
    concurrently with that op, and the compute stream waits for them only
    at their first use. A run whose operands are not all available there
    (a reload issued later) or that has no such op before it stays where it
    is, on the compute stream. Kernels and inputs are those of the clones,
    so no bit changes. Without the option the pass does nothing.
  }];
  let options = PlacementOptions;
}

def TrainOffloadScopes : Pass<"train-offload-scopes", "mlir::ModuleOp"> {
  let summary = "Offload the saved activations of the selected scopes to pinned host memory";
  let description = [{
    A saved activation leaves the device only if every scope that reads it
    in backward is offloaded (or the value is recomputed); otherwise it stays
    and the decision names the scope that keeps it. Eligible scopes are
    filtered by min-offload-bytes, then the first ceil(fraction * n) in
    forward order are offloaded, then (hide-rule=on) the last ones whose
    reload cannot hide under backward compute are kept. Inserts
    `train.offload` after the producer and `train.reload` + `train.wait`
    before the first backward use (train-prefetch-anchors moves the reload).
  }];
  let options = PlacementOptions;
}

def TrainPrefetchAnchors : Pass<"train-prefetch-anchors", "mlir::ModuleOp"> {
  let summary = "Choose where each reload is issued (prefetch anchor)";
  let description = [{
    Default: the latest backward op after which the simulated H2D queue still
    delivers the copy before its consumer (least device memory while hiding
    the copy). prefetch-depth=N: the reload of a scope is issued when the
    backward of the N-th later offloaded scope has produced its input
    gradient. Every reload stays ordered after its own offload.
  }];
  let options = PlacementOptions;
}

def TrainPlanBudget : Pass<"train-plan-budget", "mlir::ModuleOp"> {
  let summary = "Choose offload and recompute jointly for a memory or step-time goal, then place";
  let description = [{
    Exactly one goal: `activation-cut=F` (remove at least F of the
    activation peak at the least predicted step time), `memory-budget=B`
    (a predicted device peak, the memory timeline's, of at most B, e.g.
    18GiB, at the least step time; actplace-compile bounds the planned
    arena instead, see docs/placement-search.md) or `step-budget=F` (the most activation bytes removed with the
    predicted step at most F longer). Every candidate is placed on a clone
    by the placement passes and predicted with the memory timeline and
    stream simulation (`profile` when given), so shared values, the hide
    rule and copy costs count. Greedy on predicted time per byte removed,
    then single-move improvements (PlacementSearch.h). The module is then
    placed with the chosen lists, as train-placement-pipeline would with
    them; the search's moves and the chosen options are written to
    `log-file`. An unreachable goal is an error naming the best placement
    found. The other placement options (hide-rule, fraction, ...) apply to
    every candidate; offload-modules and recompute-modules must be empty.
  }];
  let options = !listconcat(PlacementOptions, [
    Option<"activationCut", "activation-cut", "double", "0",
           "Share of the activation peak to remove, (0, 1]">,
    Option<"memoryBudget", "memory-budget", "std::string", "\"\"",
           "Predicted device peak allowed (18GiB, 19.5GB, 512MiB, bytes)">,
    Option<"stepBudget", "step-budget", "double", "-1",
           "Predicted step-time increase allowed, share of the step (0.03 = 3 %)">,
    Option<"logFile", "log-file", "std::string", "\"-\"",
           "Where the search writes its moves (- = stderr, empty = nowhere)">
  ]);
}

def TrainPlacementReport : Pass<"train-placement-report", "mlir::ModuleOp"> {
  let summary = "Report every saved activation's placement, anchors and predicted costs";
  let options = !listconcat(PlacementOptions, [
    Option<"reportFormat", "report-format", "::ap::train::ReportFormat",
           "::ap::train::ReportFormat::Text", "text or json",
           [{::llvm::cl::values(
               clEnumValN(::ap::train::ReportFormat::Text, "text", "a table"),
               clEnumValN(::ap::train::ReportFormat::Json, "json", "one JSON object"))}]>,
    Option<"reportFile", "report-file", "std::string", "\"-\"", "Where to write the report (- = stdout)">
  ]);
}

#endif // ACTPLACE_PASSES_TRAIN_TRAINPASSES_TD
