//===- ExecPasses.td - exec-dialect passes -----------------*- tablegen -*-===//
//
// The passes on the exec dialect: memory plan, stream schedule and issue
// order (one .cpp per pass in this folder; decisions in passes/analysis/).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_PASSES_EXEC_EXECPASSES_TD
#define ACTPLACE_PASSES_EXEC_EXECPASSES_TD

include "mlir/Pass/PassBase.td"

def ExecPipelineSchedule : Pass<"exec-pipeline-schedule", "mlir::ModuleOp"> {
  let summary = "Unroll a pipeline stage's microbatch loop into its 1F1B order";
  let description = [{
    On a stage s < P - 1 of a pipeline-parallel step (`pipeline_stages` P,
    `pipeline_stage` s on the exec.step), the loop body's forward (the ops
    before the receive of the output's gradient) and backward are cloned
    once per microbatch and laid out in one-forward-one-backward order:
    P - 1 - s warm-up forwards, then a forward and a backward in turn, then
    the remaining backwards. The loop then runs once; each item starts with
    `exec.microbatch` (the runtime's current microbatch). Every value of a
    microbatch is its own clone, so up to P - s microbatches' saved
    activations live at once and exec-plan-memory places them by the real
    schedule. Pinned slots come in one set per microbatch in flight
    (min(P - 1 - s, microbatches) + 1 sets; microbatch j takes set j mod
    that, whose previous user's backward ran before j's forward); a D2H's
    done_by_kernel points
    at the same kernel of its own microbatch's clone. The last stage runs
    forward and backward of each microbatch in turn, the loop as it is.
  }];
  let statistics = [
    Statistic<"numItems", "items", "Forward and backward items laid out">
  ];
}

def ExecPlanMemory : Pass<"exec-plan-memory", "mlir::ModuleOp"> {
  let summary = "Static offsets of every buffer in one device arena; the planned peak";
  let description = [{
    Arena layout: persistent buffers in program order, then the activation
    region shared by the microbatch loop's buffers (live from first to last
    use in body order, views extending their root; greedy by size, lowest
    fitting offset), then one workspace region as large as the largest
    kernel workspace. A region a D2H copy read is reusable only after that
    copy's event: the pass adds `exec.wait` before the next writer.
    Everything is 256-byte aligned. Records `persistent_bytes`,
    `activation_bytes`, `workspace_bytes`, `arena_bytes` (the planned peak
    the runtime allocates) and `pinned_bytes` on the step.
  }];
  let options = [
    Option<"printPlan", "print-plan", "bool", "false",
           "Print the plan: one line per transient buffer and the totals">
  ];
}

def ExecBucketGradReduce : Pass<"exec-bucket-grad-reduce", "mlir::ModuleOp"> {
  let summary = "Sum main grads over data-parallel ranks in buckets, each as soon as its grads are final";
  let description = [{
    On a step planned for several replicated data-parallel ranks
    (`data_parallel_size` > 1), moves the step-level `exec.all_reduce` of
    each main grad into the microbatch loop, right after the last kernel
    that writes it, marked `last_microbatch`: the reductions run on the comm
    stream in the last microbatch while the rest of its backward computes.
    Grads are packed in backward order into buckets of at least
    `bucket-bytes`; a bucket is issued after the last writer of its last
    grad (GradReduceBuckets in passes/analysis). Run before
    exec-schedule-streams, which orders each bucket after its writers and
    the optimizer after the buckets. A step of one rank is left unchanged
    (its reductions are no-ops). Idempotent.
  }];
  let statistics = [
    Statistic<"numBuckets", "buckets", "Buckets issued inside the microbatch loop">,
    Statistic<"numMoved", "moved", "Main-grad all-reduces moved into the loop">,
    Statistic<"numStayed", "stayed", "Main-grad all-reduces left after the loop (no writer in it)">
  ];
  let options = [
    Option<"bucketBytes", "bucket-bytes", "int64_t", "26214400",
           "Smallest bucket in bytes of main grads (the last one takes the "
           "rest); 0: one bucket per grad">
  ];
}

def ExecGenerateKernels : Pass<"exec-generate-kernels", "mlir::ModuleOp"> {
  let summary = "Run the step's element-wise and row-wise kernels as generated kernels, fusing residual add + RMSNorm";
  let description = [{
    Marks every exec.step `kernels = "generated"` (with `ops`, also
    `generated_ops`, the train ops that take generated kernels; the others
    keep the library's): the emitter then
    launches kernelgen's kernels for the calls that have a group (SwiGLU,
    residual add, RMSNorm forward and backward) instead of the library's
    (docs/kernelgen.md). With `fuse`, each residual add whose output the
    next kernel normalizes (AddNormFusion in passes/analysis: same block and
    stream, only buffer declarations between, bf16 or f32) becomes one
    `train.add_rms_norm` call at the norm's place, reading a, b and the norm
    weight and writing h, y and rstd, which only a generated kernel
    implements. Records `fused_add_norm` (pairs) and
    `fused_saved_bytes` (the reads of h the fused kernels save in one pass
    over the step's text) on the step. With `fuse-norm-grad-add`, each
    RMSNorm backward whose dx only the next kernel, a residual add, reads
    (NormGradAddFusion: no rebuilt y, dx used by nothing else, same block
    and stream, only buffer declarations between) becomes one
    `train.rms_norm_grad_add` call at the add's place, reading x, w, rstd,
    dy and the add's other input and writing the sum and the weight grad;
    dx's buffer goes. Records `fused_norm_grad_add` and
    `fused_norm_grad_saved_bytes` (dx's write and read). With
    `fuse-dy-sum`, after those, each chain of up to three residual adds
    whose sum an RMSNorm backward reads as dy (DySumFusion: each sum read
    only by the next kernel of the chain, back to back, one type and shape)
    goes into that backward: `train.rms_norm_grad_sum` reading x, w, rstd
    and dy's 2 to 4 addends in summation order, or, for a
    `train.rms_norm_grad_add`, the same call with the addends in dy's place;
    the sums' buffers go. Records `fused_dy_sum` (chains), `fused_dy_sum_adds`
    and `fused_dy_sum_saved_bytes` (each sum's write and read). Run before
    exec-plan-memory, which then keeps the fused call's outputs off its
    inputs.

    ```mlir
    exec.kernel "train.add" ins(%a, %b : ...) outs(%h : ...) workspace 0
    exec.kernel "train.rms_norm" ins(%h, %w : ...) outs(%y, %rstd : ...)
        workspace 0 args {eps = 1.0e-06 : f64, zero_centered}
    // becomes
    exec.kernel "train.add_rms_norm" ins(%a, %b, %w : ...)
        outs(%h, %y, %rstd : ...) workspace 0
        args {eps = 1.0e-06 : f64, zero_centered}
    ```
  }];
  let statistics = [
    Statistic<"numFused", "fused", "Residual add + RMSNorm pairs fused into one generated kernel">,
    Statistic<"numRejected", "rejected", "Residual add + RMSNorm pairs left apart (AddNormFusion's conditions)">,
    Statistic<"numFusedGradAdd", "fused-grad-add", "RMSNorm backward + residual add pairs fused into one generated kernel">,
    Statistic<"numFusedDySum", "fused-dy-sum", "Chains of residual adds fused into the RMSNorm backward that reads their sum">
  ];
  let options = [
    Option<"fuse", "fuse", "bool", "true",
           "Fuse residual add + RMSNorm pairs (false: generated kernels, "
           "one per call)">,
    Option<"fuseNormGradAdd", "fuse-norm-grad-add", "bool", "false",
           "Fuse RMSNorm backward + residual add pairs into "
           "train.rms_norm_grad_add (NormGradAddFusion)">,
    Option<"fuseDySum", "fuse-dy-sum", "bool", "false",
           "Fuse the chains of residual adds forming an RMSNorm backward's "
           "dy into that backward (DySumFusion)">,
    ListOption<"ops", "ops", "std::string",
               "Only these train ops get generated kernels (recorded as the "
               "step's generated_ops; empty: every op that has a group)">
  ];
}

def ExecShardParams : Pass<"exec-shard-params", "mlir::ModuleOp"> {
  let summary = "ZeRO-3: shard parameters, grads and optimizer state; gather per layer group, reduce-scatter its grads";
  let description = [{
    On a step planned for ZeRO-3 (`data_parallel = "zero3"`, N =
    `data_parallel_size`): every parameter's weight, master, main grad and
    Adam moments become this rank's shard (ceil(numel / N) elements, the
    flattened parameter zero-padded to a multiple of N, rank r holding block
    r). In the microbatch loop, each window of one layer group's uses (its
    forward, its backward; ZeroShardPlan in passes/analysis) all-gathers the
    weights it reads on the comm stream into transient buffers, read
    through prefix views of the parameter's shape; the gathers of a window
    are issued `gather-max-inflight` windows ahead (0: right before it).
    Main grads a window accumulates into are transient fp32 buffers, zeroed
    before the window and reduce-scattered (accumulate) into the shard on
    the comm stream after it; with `main-grad-dtype=bf16` the shards are
    bf16 (FP32 masters either way) and each scatter rounds its sum once. The optimizer and clipping after the loop work
    on the shards. Run after convert-train-to-exec and before
    exec-plan-memory, which counts the gathered buffers, and
    exec-schedule-streams, which orders them. Other steps are left
    unchanged.
  }];
  let statistics = [
    Statistic<"numSharded", "sharded", "Persistent parameter buffers turned into shards">,
    Statistic<"numGathers", "gathers", "All-gathers per microbatch">,
    Statistic<"numReduceScatters", "reduce-scatters", "Reduce-scatters per microbatch">
  ];
  let options = [
    Option<"gatherMaxInflight", "gather-max-inflight", "int64_t", "1",
           "Windows whose parameters are gathered ahead of the one computing "
           "(0: gather each right before it)">,
    Option<"mainGradDtype", "main-grad-dtype", "::ap::train::MainGradDtype",
           "::ap::train::MainGradDtype::F32",
           "Element type of the main-grad shards",
           [{::llvm::cl::values(
               clEnumValN(::ap::train::MainGradDtype::F32, "f32",
                          "fp32 main grads (default)"),
               clEnumValN(::ap::train::MainGradDtype::BF16, "bf16",
                          "bf16 main grads: each reduce-scatter adds its f32 "
                          "sum into the shard, rounding once"))}]>
  ];
}

def ExecScheduleStreams : Pass<"exec-schedule-streams", "mlir::ModuleOp"> {
  let summary = "Insert the event records and waits that order every cross-stream use";
  let description = [{
    Every read or write of device (arena) or pinned (pool) bytes on one
    stream is ordered after the conflicting earlier accesses on other
    streams: a reload's use after its H2D, a reload's H2D after its own
    D2H, a write into an offloaded region after the D2H that read it, a
    pinned slot's next D2H after the H2D that read it, the all-reduce after
    the loop's grads, the optimizer after the all-reduce. Vector clocks
    skip pairs already ordered (directly or transitively) and a wait uses
    the earliest sufficient event, reusing copy events and records; new
    records go right after the op that must complete. The loop body starts
    with the copy streams waiting for compute and ends with compute waiting
    for the copy streams; `max_inflight` bounds pending D2H copies.
    Finally, in each run of waits of one stream, a wait implied by the
    others is removed. Idempotent.
  }];
  let statistics = [
    Statistic<"numRecords", "records", "Event records inserted">,
    Statistic<"numWaits", "waits", "Stream waits inserted">,
    Statistic<"numRemoved", "removed-waits", "Waits implied by others, removed">
  ];
  let options = [
    Option<"remarks", "remarks", "bool", "false",
           "Emit a remark per inserted wait saying why it is needed">
  ];
}

def ExecDeferSideIssue : Pass<"exec-defer-side-issue", "mlir::ModuleOp"> {
  let summary = "Issue each run of side-stream work after the compute kernel that follows it";
  let description = [{
    A recompute run on the side stream sits right before the kernel it
    overlaps (its host). Enqueued first, its GEMMs took their SMs before
    the host's first, wide kernel could. This pass moves each run of side
    ops (waits, kernels, records; value definitions stay) to right after
    the next compute-stream kernel, when nothing between orders against the
    run (a wait for an event the run records, a record of an event it
    waits for, other side work, a region). Only the host issue order
    changes: every stream sees the same ops in the same order and every
    wait the same last record. `done_by_kernel` is renumbered to name the
    same kernel. Run after exec-schedule-streams. Idempotent.
  }];
  let statistics = [
    Statistic<"numRunsMoved", "runs-moved", "Side runs issued after their host">
  ];
}

#endif // ACTPLACE_PASSES_EXEC_EXECPASSES_TD
