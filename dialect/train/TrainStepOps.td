//===- TrainStepOps.td - training step structure -----------*- tablegen -*-===//
//
// The step train-autodiff builds (docs/architecture.md section 4): a microbatch loop of
// forward then backward, then finalising the gradients (token mean, global
// norm, clipping) and AdamW on FP32 master weights.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TRAIN_STEP_OPS_TD
#define ACTPLACE_TRAIN_STEP_OPS_TD

include "mlir/Interfaces/ControlFlowInterfaces.td"

def Train_MicrobatchLoopOp : Train_Op<"microbatch_loop",
    [SingleBlock, RecursiveMemoryEffects]> {
  let summary = "runs its body once per microbatch: forward then backward";
  let description = [{
    `tokens` and `labels` are [M, B, T]; the body's block arguments are one
    microbatch's [B, T] tokens and labels. The body yields its loss sum and
    token count; the results are their sums over the M microbatches, in
    microbatch order. Memory is planned for the body: every value defined
    in it dies before the next iteration.

    ```mlir
    %loss, %count = train.microbatch_loop %tokens, %labels
        : (tensor<4x1x64xi32>, tensor<4x1x64xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%tok: tensor<1x64xi32>, %lab: tensor<1x64xi32>):
      ...
      train.yield %l, %n : tensor<f32>, tensor<i32>
    }
    ```
  }];
  let arguments = (ins Train_Tensor<[I32], [3], "3-D i32 tensor [M, B, T]">:$tokens,
                       Train_Tensor<[I32], [3], "3-D i32 tensor [M, B, T]">:$labels);
  let results = (outs Train_F32Scalar:$loss_sum, Train_I32Scalar:$token_count);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    $tokens `,` $labels attr-dict `:` functional-type(operands, results) $body
  }];
  let hasVerifier = 1;
}

def Train_YieldOp : Train_Op<"yield", [Pure, Terminator, HasParent<"MicrobatchLoopOp">]> {
  let summary = "ends a microbatch: its loss sum and token count";
  let description = [{
    Yields the microbatch's loss sum (f32) and token count (i32). A pipeline
    stage without the LM head (`train-pipeline-stage`) computes no loss and
    yields nothing: its loop results are 0 until the step sums them over the
    pipeline's stages.

    ```mlir
    train.yield %loss, %count : tensor<f32>, tensor<i32>
    train.yield
    ```
  }];
  let arguments = (ins Variadic<AnyRankedTensor>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The loss sum and token count, or null on a stage without the loss.
    ::mlir::Value getLossSum() { return getValues().empty() ? nullptr : getValues()[0]; }
    ::mlir::Value getTokenCount() { return getValues().empty() ? nullptr : getValues()[1]; }
  }];
}

def Train_PipelinePeer : I32EnumAttr<"PipelinePeer", "neighbouring pipeline stage", [
  I32EnumAttrCase<"Prev", 0, "prev">,
  I32EnumAttrCase<"Next", 1, "next">
]> {
  let cppNamespace = "::ap::train";
}

def Train_PipelineSendOp : Train_Op<"pipeline_send", [HasParent<"MicrobatchLoopOp">]> {
  let summary = "sends one microbatch's boundary value to the neighbouring pipeline stage";
  let description = [{
    On a stage of a pipeline-parallel step (`train-pipeline-stage`): the
    forward sends a layer-boundary activation to the `next` stage, the
    backward sends the gradient of the stage's input to the `prev` stage.
    `channel` numbers the values crossing one boundary in one direction in
    body order; the matching `train.pipeline_recv` on the neighbour has the
    same channel and the opposite peer. Each microbatch sends once per
    channel, in microbatch order.

    ```mlir
    train.pipeline_send %h next channel 0 : tensor<1x64x64xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$value, Train_PipelinePeer:$peer,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$channel);
  let assemblyFormat = "$value $peer `channel` $channel attr-dict `:` type($value)";
}

def Train_PipelineRecvOp : Train_Op<"pipeline_recv", [HasParent<"MicrobatchLoopOp">]> {
  let summary = "receives one microbatch's boundary value from the neighbouring pipeline stage";
  let description = [{
    The counterpart of `train.pipeline_send`: the forward of stage s > 0
    receives its input activation from the `prev` stage, the backward of a
    stage s < last receives the gradient of its output from the `next`
    stage (the first backward op of such a stage).

    ```mlir
    %g = train.pipeline_recv next channel 0 : tensor<1x64x64xbf16>
    ```
  }];
  let arguments = (ins Train_PipelinePeer:$peer,
                       ConfinedAttr<I64Attr, [IntNonNegative]>:$channel);
  let results = (outs Train_AnyFloatTensor:$value);
  let assemblyFormat = "$peer `channel` $channel attr-dict `:` type($value)";
}

def Train_FinalizeGradsOp : Train_Op<"finalize_grads"> {
  let summary = "main grads /= step token count; global norm (fixed order); clip";
  let description = [{
    Divides every main grad by the step's token count (the loss is the
    token-weighted mean over the step), computes the global L2 norm in a
    fixed order over parameters and elements, and scales all grads by
    min(1, max_norm / norm) when `max_norm` > 0. Returns the norm before
    clipping.

    ```mlir
    %norm = train.finalize_grads %count {max_norm = 1.0 : f64} : (tensor<i32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins Train_I32Scalar:$token_count, F64Attr:$max_norm);
  let results = (outs Train_F32Scalar:$grad_norm);
  let assemblyFormat = "$token_count attr-dict `:` functional-type(operands, results)";
}

def Train_LRScheduleOp : Train_Op<"lr_schedule"> {
  let summary = "learning rate of the current step: linear warmup then cosine decay";
  let description = [{
    lr(s) = max_lr * (s + 1) / warmup_steps for s < warmup_steps, then
    min_lr + (max_lr - min_lr) * (1 + cos(pi * p)) / 2 with
    p = (s - warmup_steps) / max(1, total_steps - warmup_steps), clamped to 1.
    `s` is the optimizer step counter held by the runtime (0-based).
  }];
  let arguments = (ins F64Attr:$max_lr, F64Attr:$min_lr, I64Attr:$warmup_steps,
                       I64Attr:$total_steps);
  let results = (outs Train_F32Scalar:$lr);
  let assemblyFormat = "attr-dict `:` type($lr)";
}

def Train_AdamWOp : Train_Op<"adamw"> {
  let summary = "AdamW on a parameter's FP32 master weight; refreshes its compute copy";
  let description = [{
    m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
    w -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay w),
    then the bf16 compute copy is rounded from the FP32 master. Main grads
    are zeroed for the next step.
  }];
  let arguments = (ins FlatSymbolRefAttr:$param, Train_F32Scalar:$lr,
                       F64Attr:$weight_decay,
                       DefaultValuedAttr<F64Attr, "0.9">:$beta1,
                       DefaultValuedAttr<F64Attr, "0.95">:$beta2,
                       DefaultValuedAttr<F64Attr, "1.0e-8">:$eps);
  let assemblyFormat = "$param `,` $lr attr-dict `:` type($lr)";
}

def Train_LossMeanOp : Train_Op<"loss_mean", [Pure]> {
  let summary = "the step's loss: loss sum / token count";
  let arguments = (ins Train_F32Scalar:$loss_sum, Train_I32Scalar:$token_count);
  let results = (outs Train_F32Scalar:$loss);
  let assemblyFormat = "$loss_sum `,` $token_count attr-dict `:` functional-type(operands, results)";
}

#endif // ACTPLACE_TRAIN_STEP_OPS_TD
