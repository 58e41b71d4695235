//===- ExecOps.td - exec dialect operations ----------------*- tablegen -*-===//
//
// The ops of an explicit training-step schedule. Program order is the order
// in which the host enqueues work; each stream runs its ops in that order;
// work on different streams is ordered only by events (a copy records its
// event when it completes, `exec.record` / `exec.wait` order the rest).
// Offsets are byte offsets into the device arena (buffers) or the pinned
// pool (host slots); absent offsets mean "not planned yet".
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_EXEC_OPS_TD
#define ACTPLACE_EXEC_OPS_TD

include "dialect/exec/ExecDialect.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

/// Every tensor an op's buffers and slots hold has static dimensions >= 1,
/// an integer or float element type and at most ap::kMaxTensorBytes bytes
/// (dialect/train/TensorShapes.h).
def Exec_TensorShapes : NativeOpTrait<"TensorShapes"> {
  let cppNamespace = "::ap";
}

class Exec_Op<string mnemonic, list<Trait> traits = []>
    : Op<Exec_Dialect, mnemonic, !listconcat([Exec_TensorShapes], traits)>;

def Exec_AnyBuffer : Type<CPred<"::llvm::isa<::ap::exec::BufferType>($_self)">,
    "device buffer", "::ap::exec::BufferType">;
def Exec_AnyHostSlot : Type<CPred<"::llvm::isa<::ap::exec::HostSlotType>($_self)">,
    "pinned host slot", "::ap::exec::HostSlotType">;
def Exec_AnyEvent : Type<CPred<"::llvm::isa<::ap::exec::EventType>($_self)">,
    "event", "::ap::exec::EventType">,
    BuildableType<"::ap::exec::EventType::get($_builder.getContext())">;

def Exec_NonNegI64 : ConfinedAttr<I64Attr, [IntNonNegative]>;
def Exec_PosI64 : ConfinedAttr<I64Attr, [IntPositive]>;

//===----------------------------------------------------------------------===//
// Structure
//===----------------------------------------------------------------------===//

def Exec_StepOp : Exec_Op<"step", [Symbol, SingleBlock, IsolatedFromAbove]> {
  let summary = "one training step: persistent buffers, microbatch loop, optimizer";
  let description = [{
    The body runs once per optimizer step. Persistent buffers are defined at
    its top level; the `exec.microbatch_loop` runs once per microbatch;
    `exec.return` names the step's outputs (loss, grad norm). After
    exec-plan-memory the step carries `persistent_bytes`,
    `activation_bytes`, `workspace_bytes`, `arena_bytes` (= the three summed:
    what the runtime allocates) and `pinned_bytes`.

    ```mlir
    exec.step @train_step {
      ...
      exec.return %loss, %norm : !exec.buffer<tensor<f32>>, !exec.buffer<tensor<f32>>
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasVerifier = 1;
}

def Exec_ReturnOp : Exec_Op<"return", [Terminator, HasParent<"StepOp">]> {
  let summary = "ends the step; its operands are the step's outputs";
  let arguments = (ins Variadic<Exec_AnyBuffer>:$results);
  let assemblyFormat = "($results^ `:` qualified(type($results)))? attr-dict";
}

def Exec_MicrobatchLoopOp : Exec_Op<"microbatch_loop",
    [SingleBlock, NoTerminator, HasParent<"StepOp">]> {
  let summary = "runs its body once per microbatch: forward then backward";
  let description = [{
    Every buffer and event defined in the body lives for one iteration; the
    device memory plan is the plan of the body. `max_inflight` (> 0) bounds
    the D2H copies pending before compute waits for the oldest one.

    ```mlir
    exec.microbatch_loop count 2 {
      ...
    }
    ```
  }];
  let arguments = (ins Exec_PosI64:$count, OptionalAttr<Exec_NonNegI64>:$max_inflight);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "`count` $count attr-dict-with-keyword $body";
}

//===----------------------------------------------------------------------===//
// Buffers and slots
//===----------------------------------------------------------------------===//

def Exec_BufferOp : Exec_Op<"buffer", [Pure]> {
  let summary = "a transient device buffer: a view into the arena";
  let description = [{
    `bytes` is the tensor's size rounded up to 256; `offset` (a multiple of
    256) is set by exec-plan-memory.

    ```mlir
    %b = exec.buffer offset 512 bytes 8192 : !exec.buffer<tensor<1x64x64xbf16>>
    ```
  }];
  let arguments = (ins OptionalAttr<Exec_NonNegI64>:$offset, Exec_PosI64:$bytes);
  let results = (outs Exec_AnyBuffer:$result);
  let assemblyFormat = "(`offset` $offset^)? `bytes` $bytes attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def Exec_PersistentOp : Exec_Op<"persistent", [HasParent<"StepOp">]> {
  let summary = "a buffer that lives across steps (weights, grads, optimizer state)";
  let description = [{
    `name` is the parameter name (HF naming) or, for role `state`, the name
    of a step value (`loss_sum`, `token_count`). Main grads, master weights
    and Adam moments are f32.

    ```mlir
    %g = exec.persistent "model.norm.weight" main_grad bytes 256 : !exec.buffer<tensor<64xf32>>
    ```
  }];
  let arguments = (ins StrAttr:$name, Exec_BufferRole:$role,
                       OptionalAttr<Exec_NonNegI64>:$offset, Exec_PosI64:$bytes);
  let results = (outs Exec_AnyBuffer:$result);
  let assemblyFormat = [{
    $name $role (`offset` $offset^)? `bytes` $bytes attr-dict `:` qualified(type($result))
  }];
  let hasVerifier = 1;
}

def Exec_ViewOp : Exec_Op<"view", [Pure]> {
  let summary = "the same bytes with another shape (a reshape, no copy)";
  let description = [{
    Without `prefix` the element counts match (a reshape). With `prefix` the
    result is the first elements of the source: a ZeRO-3 parameter gathered
    into a buffer padded to a multiple of the ranks is used through a prefix
    view of its own shape.

    ```mlir
    %v = exec.view %b : !exec.buffer<tensor<4x4xbf16>> to !exec.buffer<tensor<16xbf16>>
    %w = exec.view %g prefix : !exec.buffer<tensor<18xbf16>> to !exec.buffer<tensor<17xbf16>>
    ```
  }];
  let arguments = (ins Exec_AnyBuffer:$source, UnitAttr:$prefix);
  let results = (outs Exec_AnyBuffer:$result);
  let assemblyFormat = "$source (`prefix` $prefix^)? attr-dict `:` qualified(type($source)) `to` qualified(type($result))";
  let hasVerifier = 1;
}

def Exec_ZeroOp : Exec_Op<"zero"> {
  let summary = "sets a buffer to zero (per-microbatch gradient buffers)";
  let description = [{
    Runs on `stream` (compute or comm) in order with that stream's other
    work. ZeRO-3 sharding zeroes each layer group's gathered gradient buffer
    before the backward kernels accumulate into it.

    ```mlir
    exec.zero %g on compute : !exec.buffer<tensor<64xf32>>
    ```
  }];
  let arguments = (ins Exec_AnyBuffer:$buffer, Exec_Stream:$stream);
  let assemblyFormat = "$buffer `on` $stream attr-dict `:` qualified(type($buffer))";
  let hasVerifier = 1;
}

def Exec_PoolAcquireOp : Exec_Op<"pool_acquire"> {
  let summary = "takes a slot of the pinned pool for one offloaded tensor";
  let description = [{
    `slot` names the slot (the runtime checks ownership by it); `offset`
    and `bytes` place it in the pinned pool (256-byte aligned).

    ```mlir
    %s = exec.pool_acquire slot 0 offset 0 bytes 512 : !exec.host<tensor<1x64x4xbf16>>
    ```
  }];
  let arguments = (ins Exec_NonNegI64:$slot, Exec_NonNegI64:$offset, Exec_PosI64:$bytes);
  let results = (outs Exec_AnyHostSlot:$result);
  let assemblyFormat = "`slot` $slot `offset` $offset `bytes` $bytes attr-dict `:` qualified(type($result))";
  let hasVerifier = 1;
}

def Exec_PoolReleaseOp : Exec_Op<"pool_release"> {
  let summary = "returns a slot to the pool once the event (the H2D that read it) completed";
  let arguments = (ins Exec_AnyHostSlot:$slot, Exec_AnyEvent:$after);
  let assemblyFormat = "$slot `after` $after attr-dict `:` qualified(type($slot))";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Streams and events
//===----------------------------------------------------------------------===//

def Exec_EventCreateOp : Exec_Op<"event_create"> {
  let summary = "a fresh event";
  let results = (outs Exec_AnyEvent:$event);
  let assemblyFormat = "attr-dict `:` qualified(type($event))";
}

def Exec_RecordOp : Exec_Op<"record"> {
  let summary = "records the event on a stream after the work enqueued so far";
  let arguments = (ins Exec_AnyEvent:$event, Exec_Stream:$stream);
  let assemblyFormat = "$event `on` $stream attr-dict";
}

def Exec_WaitOp : Exec_Op<"wait"> {
  let summary = "later work of a stream waits until the event completed";
  let arguments = (ins Exec_AnyEvent:$event, Exec_Stream:$stream);
  let assemblyFormat = "$event `on` $stream attr-dict";
}

//===----------------------------------------------------------------------===//
// Work
//===----------------------------------------------------------------------===//

def Exec_LoadInputOp : Exec_Op<"load_input"> {
  let summary = "writes the current microbatch's tokens or labels into a buffer (compute stream)";
  let description = [{
    With `tp_shard` (sequence parallelism) only this rank's block of the
    flattened microbatch: tokens [r N/T, (r + 1) N/T), r this rank of the
    T tensor-parallel ranks.

    ```mlir
    exec.load_input "tokens" to %t : !exec.buffer<tensor<2x64xi32>>
    exec.load_input "labels" to %l tp_shard : !exec.buffer<tensor<1x64xi32>>
    ```
  }];
  let arguments = (ins StrAttr:$name, Exec_AnyBuffer:$dest, UnitAttr:$tp_shard);
  let assemblyFormat = "$name `to` $dest (`tp_shard` $tp_shard^)? attr-dict `:` qualified(type($dest))";
  let hasVerifier = 1;
}

def Exec_KernelOp : Exec_Op<"kernel", [AttrSizedOperandSegments]> {
  let summary = "a kernel call implementing one train op (compute or side stream)";
  let description = [{
    `callee` is the train op it implements; `ins` are read, `outs` are
    written (main-grad and optimizer-state outputs are read and written:
    gradients accumulate). The verifier checks the call against the kernel's
    signature (dialect/exec/KernelSignatures.cpp): how many inputs and
    results it takes, one trailing main-grad output per `*_grad` symbol in
    `args`, and the `args` entries it needs with their kinds. A `test.<name>`
    callee is an opaque kernel for exec pass tests; no emitter lowers it. `args` carries the train op's attributes (scope,
    eps, scale, ...); `workspace` is the scratch the kernel needs, which the
    memory plan includes. `on side` runs it on the side stream (a recompute
    issued ahead so that it overlaps compute-stream kernels that leave SMs
    idle); side kernels have a workspace of their own and GEMMs there are
    asked to use part of the SMs. Without it the call is on compute.

    ```mlir
    exec.kernel "train.linear" ins(%x, %w : !exec.buffer<tensor<1x64x64xbf16>>, !exec.buffer<tensor<128x64xbf16>>)
        outs(%y : !exec.buffer<tensor<1x64x128xbf16>>) workspace 33554432
        args {scope = #train.scope<0, gdn_in_proj>}
    ```
  }];
  let arguments = (ins StrAttr:$callee, Variadic<Exec_AnyBuffer>:$inputs,
                       Variadic<Exec_AnyBuffer>:$outputs,
                       Exec_NonNegI64:$workspace,
                       DefaultValuedAttr<DictionaryAttr, "{}">:$args,
                       DefaultValuedAttr<Exec_Stream, "::ap::exec::Stream::Compute">:$stream);
  let assemblyFormat = [{
    $callee (`ins` `(` $inputs^ `:` qualified(type($inputs)) `)`)?
    (`outs` `(` $outputs^ `:` qualified(type($outputs)) `)`)?
    `workspace` $workspace (`on` $stream^)? (`args` $args^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Exec_D2HOp : Exec_Op<"d2h"> {
  let summary = "copies a device buffer into a pinned slot; records the event on completion";
  let description = [{
    `done_by_kernel = K` (optional): the cost model predicts the copy has
    completed when the K-th `exec.kernel` of the loop body (0-based) starts;
    exec-plan-memory keeps the source's bytes until then, so that reusing
    them does not stall the compute stream on the copy.
  }];
  let arguments = (ins Exec_AnyBuffer:$source, Exec_AnyHostSlot:$slot,
                       Exec_AnyEvent:$event, Exec_Stream:$stream,
                       OptionalAttr<Exec_NonNegI64>:$done_by_kernel);
  let assemblyFormat = [{
    $source `to` $slot `on` $stream `record` $event attr-dict `:` qualified(type($source)) `to` qualified(type($slot))
  }];
  let hasVerifier = 1;
}

def Exec_H2DOp : Exec_Op<"h2d"> {
  let summary = "copies a pinned slot into a device buffer; records the event on completion";
  let arguments = (ins Exec_AnyHostSlot:$slot, Exec_AnyBuffer:$dest,
                       Exec_AnyEvent:$event, Exec_Stream:$stream);
  let assemblyFormat = [{
    $slot `to` $dest `on` $stream `record` $event attr-dict `:` qualified(type($slot)) `to` qualified(type($dest))
  }];
  let hasVerifier = 1;
}

def Exec_AllReduceOp : Exec_Op<"all_reduce"> {
  let summary = "sums a buffer over a communicator in place (main grads, loss sum, token count)";
  let description = [{
    Runs through the runtime's collective API (NCCL on the GPU, MPI with
    fixed-order sums on the host backend; a world of one is a no-op there,
    not here), enqueued on `stream` (comm or compute) and ordered against
    the other streams by the step's events like any other op.

    At the step level it sums what the microbatch loop accumulated. Inside
    the loop it must be marked `last_microbatch`: main grads accumulate over
    microbatches, so a reduction there runs once, in the last microbatch,
    right after the last backward kernel that writes its buffer
    (exec-bucket-grad-reduce places it there so that the reduction overlaps
    the rest of the backward).

    ```mlir
    exec.all_reduce %g over "dp" on comm : !exec.buffer<tensor<64xf32>>
    exec.all_reduce %g over "dp" on comm last_microbatch : !exec.buffer<tensor<64xf32>>
    ```
  }];
  let arguments = (ins Exec_AnyBuffer:$buffer, StrAttr:$communicator,
                       Exec_Stream:$stream, UnitAttr:$last_microbatch);
  let assemblyFormat = "$buffer `over` $communicator `on` $stream (`last_microbatch` $last_microbatch^)? attr-dict `:` qualified(type($buffer))";
  let hasVerifier = 1;
}

def Exec_PipelinePeer : I32EnumAttr<"PipelinePeer", "neighbouring pipeline stage", [
  I32EnumAttrCase<"Prev", 0, "prev">,
  I32EnumAttrCase<"Next", 1, "next">
]> {
  let cppNamespace = "::ap::exec";
}

def Exec_SendOp : Exec_Op<"send"> {
  let summary = "sends a buffer to the neighbouring pipeline stage (comm stream)";
  let description = [{
    A stage of a pipeline-parallel step sends a layer-boundary activation
    to the `next` stage in its forward and the gradient of its input to the
    `prev` stage in its backward. Messages between two neighbours in one
    direction are matched in issue order; `channel` records which boundary
    value this is (the receiver's exec.recv has the same channel). The send
    never blocks the comm stream: the runtime copies the bytes out when the
    stream reaches it, so work ordered after it on the comm stream may
    reuse the buffer.

    ```mlir
    exec.send %h to next channel 0 on comm : !exec.buffer<tensor<1x64x64xbf16>>
    ```
  }];
  let arguments = (ins Exec_AnyBuffer:$buffer, Exec_PipelinePeer:$peer,
                       Exec_NonNegI64:$channel, Exec_Stream:$stream);
  let assemblyFormat = "$buffer `to` $peer `channel` $channel `on` $stream attr-dict `:` qualified(type($buffer))";
  let hasVerifier = 1;
}

def Exec_RecvOp : Exec_Op<"recv"> {
  let summary = "receives a buffer from the neighbouring pipeline stage (comm stream)";
  let description = [{
    The counterpart of exec.send: writes the next message from `peer` into
    `buffer`; the comm stream waits until it arrived, so work ordered after
    it by the step's events reads the data.

    ```mlir
    exec.recv %g from next channel 0 on comm : !exec.buffer<tensor<1x64x64xbf16>>
    ```
  }];
  let arguments = (ins Exec_AnyBuffer:$buffer, Exec_PipelinePeer:$peer,
                       Exec_NonNegI64:$channel, Exec_Stream:$stream);
  let assemblyFormat = "$buffer `from` $peer `channel` $channel `on` $stream attr-dict `:` qualified(type($buffer))";
  let hasVerifier = 1;
}

def Exec_MicrobatchOp : Exec_Op<"microbatch", [HasParent<"MicrobatchLoopOp">]> {
  let summary = "the work after it belongs to microbatch `index` (an unrolled pipeline schedule)";
  let description = [{
    In a step whose microbatch loop runs once and holds the stage's whole
    1F1B schedule (exec-pipeline-schedule), each forward or backward item
    starts with this marker: inputs loaded, losses yielded and
    last-microbatch reductions issued after it are those of microbatch
    `index` (< the step's micro_batches).

    ```mlir
    exec.microbatch 1 forward
    exec.microbatch 0 backward
    ```
  }];
  let arguments = (ins Exec_NonNegI64:$index, UnitAttr:$backward);
  let assemblyFormat = "$index (`backward` $backward^) : (`forward`)? attr-dict";
  let hasVerifier = 1;
}

def Exec_AllGatherOp : Exec_Op<"all_gather"> {
  let summary = "gathers every rank's shard into one full buffer (sharded parameters)";
  let description = [{
    `full` receives the ranks' `shard`s one after another in rank order
    (rank r's at element r x shard size), so `full` has N times the
    elements of `shard`, N the step's `data_parallel_size` when it has one.
    Used by ZeRO-3 sharding to assemble a layer group's parameters before
    its forward and again before its backward. Runs through the runtime's
    collective API on `stream` (comm or compute); a world of one copies.

    ```mlir
    exec.all_gather %shard into %full over "dp" on comm : !exec.buffer<tensor<32xbf16>> to !exec.buffer<tensor<64xbf16>>
    ```
  }];
  let arguments = (ins Exec_AnyBuffer:$shard, Exec_AnyBuffer:$full,
                       StrAttr:$communicator, Exec_Stream:$stream);
  let assemblyFormat = [{
    $shard `into` $full `over` $communicator `on` $stream attr-dict `:` qualified(type($shard)) `to` qualified(type($full))
  }];
  let hasVerifier = 1;
}

def Exec_ReduceScatterOp : Exec_Op<"reduce_scatter"> {
  let summary = "sums a full buffer over ranks and keeps this rank's shard of the sum (sharded grads)";
  let description = [{
    `shard` receives block r of the element-wise sum over ranks of `full`
    (r this rank; blocks of shard size in rank order), so `full` has N
    times the elements of `shard`. With `accumulate` the block is added to
    what `shard` holds (a sharded main grad summing microbatches) instead of
    overwriting it. `full` is scratch afterwards: the runtime may reduce in
    place. Sums have a fixed order on every backend (MPI: rank order; NCCL:
    its deterministic ring). Used by ZeRO-3 sharding to reduce a layer
    group's gradients into the sharded main grads. Runs on `stream` (comm or
    compute); a world of one copies (or adds).

    ```mlir
    exec.reduce_scatter %full into %shard over "dp" on comm : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<32xf32>>
    exec.reduce_scatter %full into %shard over "dp" on comm accumulate : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<32xf32>>
    ```
  }];
  let arguments = (ins Exec_AnyBuffer:$full, Exec_AnyBuffer:$shard,
                       StrAttr:$communicator, Exec_Stream:$stream,
                       UnitAttr:$accumulate);
  let assemblyFormat = [{
    $full `into` $shard `over` $communicator `on` $stream (`accumulate` $accumulate^)? attr-dict `:` qualified(type($full)) `to` qualified(type($shard))
  }];
  let hasVerifier = 1;
}

#endif // ACTPLACE_EXEC_OPS_TD
