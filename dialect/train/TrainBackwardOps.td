//===- TrainBackwardOps.td - backward ops ------------------*- tablegen -*-===//
//
// Backward ops that train-autodiff emits. Each carries the scope of the
// forward op it differentiates, so the values it reads are the saved
// activations of that scope. Weight gradients are not values: an op
// accumulates them (+=, FP32) into the main-grad buffer of the parameter its
// `*_grad` symbol names, which is a write effect on the main-grad resource.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TRAIN_BACKWARD_OPS_TD
#define ACTPLACE_TRAIN_BACKWARD_OPS_TD

/// A backward op that may accumulate into parameter main grads; its memory
/// effect is a write when a gradient symbol is present.
class Train_AccumulatingGradOp<string mnemonic, list<Trait> traits = []>
    : Train_Op<mnemonic, !listconcat(traits,
        [DeclareOpInterfaceMethods<MemoryEffectsOpInterface>])> {
  let assemblyFormat = [{
    operands `scope` `` $scope attr-dict `:` functional-type(operands, results)
  }];
}

def Train_EmbeddingGradOp : Train_AccumulatingGradOp<"embedding_grad"> {
  let summary = "embedding backward: scatter-add dy rows into the table's main grad";
  let description = [{
    ```mlir
    train.embedding_grad %tokens, %dh scope<-1, embedding> {weight_grad = @model.embed_tokens.weight}
        : (tensor<1x64xi32>, tensor<1x64x32xbf16>) -> ()
    ```
  }];
  let arguments = (ins Train_Tokens:$tokens, Train_Float3D:$result_grad,
                       FlatSymbolRefAttr:$weight_grad, Train_ScopeAttr:$scope,
                       UnitAttr:$vocab_parallel);
  let hasVerifier = 1;
}

def Train_LinearGradOp : Train_AccumulatingGradOp<"linear_grad"> {
  let summary = "linear backward: dx = dy W, dW += dy^T x";
  let description = [{
    `input_grad` is present when the input needs a gradient; `weight_grad`
    names the parameter whose main grad receives dW (absent when frozen).

    ```mlir
    %dx = train.linear_grad %x, %w, %dy scope<0, mlp_fc2> {weight_grad = @down}
        : (tensor<1x64x96xbf16>, tensor<32x96xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x96xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_Float2D:$weight,
                       Train_AnyFloatTensor:$result_grad,
                       OptionalAttr<FlatSymbolRefAttr>:$weight_grad, Train_ScopeAttr:$scope);
  let results = (outs Optional<Train_AnyFloatTensor>:$input_grad);
}

def Train_LinearInputGradOp : Train_ComputeOp<"linear_input_grad"> {
  let summary = "the input half of linear backward: dx = dy W";
  let description = [{
    `train.linear_grad` without its weight gradient and without reading x:
    train-fuse-recompute splits a linear backward in two when its x is a
    recomputed value, so that dx can feed the backward that rebuilds x and
    the weight gradient (a `train.linear_grad` with no result) follows it.

    ```mlir
    %dx = train.linear_input_grad %w, %dy scope<0, mlp_fc2>
        : (tensor<32x96xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x96xbf16>
    ```
  }];
  let arguments = (ins Train_Float2D:$weight, Train_AnyFloatTensor:$result_grad,
                       Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$input_grad);
}

def Train_RMSNormGradOp : Train_AccumulatingGradOp<"rms_norm_grad"> {
  let summary = "RMSNorm backward from the saved input and rstd";
  let arguments = (ins Train_AnyFloatTensor:$input, Train_Float1D:$weight,
                       Train_F32Tensor:$rstd, Train_AnyFloatTensor:$result_grad,
                       UnitAttr:$zero_centered,
                       OptionalAttr<FlatSymbolRefAttr>:$weight_grad, Train_ScopeAttr:$scope);
  let results = (outs Optional<Train_AnyFloatTensor>:$input_grad);
}

def Train_RMSNormGradRebuildOp : Train_AccumulatingGradOp<"rms_norm_grad_rebuild"> {
  let summary = "RMSNorm backward that also writes the forward output";
  let description = [{
    `train.rms_norm_grad` whose second result is the forward's y = x rstd
    w, bit for bit, from the saved rstd: a recomputed norm rebuilt by the
    backward that reads x anyway (train-fuse-recompute), for the weight
    gradients of the linears that read it, which follow this op.
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_Float1D:$weight,
                       Train_F32Tensor:$rstd, Train_AnyFloatTensor:$result_grad,
                       UnitAttr:$zero_centered,
                       OptionalAttr<FlatSymbolRefAttr>:$weight_grad, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$input_grad, Train_AnyFloatTensor:$output);
}

def Train_GatedRMSNormGradOp : Train_AccumulatingGradOp<"gated_rms_norm_grad"> {
  let summary = "gated RMSNorm backward (docs/model-math.md 1.5 ix); optionally also the forward output";
  let description = [{
    `output`, when present, is the forward's y, bit for bit, from the saved
    rstd: a recomputed gated norm rebuilt by its backward
    (train-fuse-recompute).
  }];
  let arguments = (ins Train_Float4D:$input, Train_Float4D:$gate, Train_Float1D:$weight,
                       Train_F32_3D:$rstd, Train_Float4D:$result_grad,
                       OptionalAttr<FlatSymbolRefAttr>:$weight_grad, Train_ScopeAttr:$scope);
  let results = (outs Train_Float4D:$input_grad, Train_Float4D:$gate_grad,
                      Optional<Train_Float4D>:$output);
}

def Train_L2NormGradOp : Train_ComputeOp<"l2_norm_grad"> {
  let summary = "L2 norm backward: dx = rstd (dy - (dy . y) y) from the normalised output";
  let arguments = (ins Train_Float4D:$result, Train_F32_3D:$rstd, Train_Float4D:$result_grad,
                       Train_ScopeAttr:$scope);
  let results = (outs Train_Float4D:$input_grad);
}

def Train_ShortConvGradOp : Train_AccumulatingGradOp<"short_conv_grad",
    [AttrSizedOperandSegments]> {
  let summary = "causal depthwise conv + SiLU backward (recomputes the pre-activation)";
  let description = [{
    One `result_grads` operand per result of the `train.short_conv`, in order
    (a split conv's channel groups: no concat of their gradients).
  }];
  let arguments = (ins Train_Float3D:$input, Train_Float2D:$weight,
                       Variadic<Train_Float3D>:$result_grads,
                       Optional<Train_Tokens>:$doc_starts,
                       OptionalAttr<FlatSymbolRefAttr>:$weight_grad, Train_ScopeAttr:$scope);
  let results = (outs Optional<Train_Float3D>:$input_grad);
  let hasVerifier = 1;
  // Two operand groups of variable length: the packed sequences' document
  // starts are spelled out.
  let assemblyFormat = [{
    $input `,` $weight (`,` $result_grads^)? (`docs` $doc_starts^)? `scope` `` $scope
    attr-dict `:` functional-type(operands, results)
  }];
}

def Train_GDNGatesGradOp : Train_AccumulatingGradOp<"gdn_gates_grad"> {
  let summary = "GDN gates backward: da, db; dA_log and d dt_bias into main grads";
  let arguments = (ins Train_Float3D:$a, Train_F32_1D:$A_log, Train_F32_1D:$dt_bias,
                       Train_F32_3D:$g, Train_Float3D:$beta,
                       Train_F32_3D:$g_grad, Train_Float3D:$beta_grad,
                       OptionalAttr<FlatSymbolRefAttr>:$a_log_grad,
                       OptionalAttr<FlatSymbolRefAttr>:$dt_bias_grad, Train_ScopeAttr:$scope);
  let results = (outs Train_Float3D:$a_input_grad, Train_Float3D:$b_input_grad);
}

def Train_GatedDeltaRuleGradOp : Train_ComputeOp<"gated_delta_rule_grad"> {
  let summary = "gated delta rule backward (docs/model-math.md 1.5): dq, dk, dv, dg, dbeta";
  let description = [{
    Reads the saved q, k (normalised), v, beta, the chunk-local cumulative
    gate sum and T; recomputes W, U, the chunk states and Vnew. `g_grad` is
    the gradient of the per-token g (after the reverse cumulative sum).
  }];
  let arguments = (ins Train_Float4D:$q, Train_Float4D:$k, Train_Float4D:$v,
                       Train_F32_3D:$g_cumsum, Train_Float3D:$beta, Train_Float4D:$chunk_t,
                       Train_Float4D:$result_grad, Optional<Train_Tokens>:$doc_starts,
                       F64Attr:$scale, DefaultValuedAttr<I64Attr, "64">:$chunk_size,
                       Train_ScopeAttr:$scope);
  let results = (outs Train_Float4D:$q_grad, Train_Float4D:$k_grad, Train_Float4D:$v_grad,
                      Train_F32_3D:$g_grad, Train_Float3D:$beta_grad);
  let hasVerifier = 1;
}

def Train_RoPEGradOp : Train_ComputeOp<"rope_grad"> {
  let summary = "RoPE backward: rotate dy by -theta";
  let arguments = (ins Train_Float4D:$result_grad, Optional<Train_Tokens>:$doc_starts,
                       I64Attr:$rotary_dim, F64Attr:$theta, Train_ScopeAttr:$scope);
  let results = (outs Train_Float4D:$input_grad);
  let hasVerifier = 1;
}

def Train_AttentionGradOp : Train_ComputeOp<"attention_grad"> {
  let summary = "causal attention backward (FlashAttention-2 style, deterministic)";
  let arguments = (ins Train_Float4D:$q, Train_Float4D:$k, Train_Float4D:$v,
                       Train_Float4D:$result, Train_F32Tensor:$lse, Train_Float4D:$result_grad,
                       Optional<Train_Tokens>:$doc_starts,
                       F64Attr:$scale, Train_ScopeAttr:$scope);
  let results = (outs Train_Float4D:$q_grad, Train_Float4D:$k_grad, Train_Float4D:$v_grad);
  let hasVerifier = 1;
}

def Train_OutputGateGradOp : Train_ComputeOp<"output_gate_grad"> {
  let summary = "sigmoid output gate backward";
  let arguments = (ins Train_AnyFloatTensor:$input, Train_AnyFloatTensor:$gate,
                       Train_AnyFloatTensor:$result_grad, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$input_grad, Train_AnyFloatTensor:$gate_grad);
}

def Train_SwiGLUGradOp : Train_ComputeOp<"swiglu_grad"> {
  let summary = "SwiGLU backward; optionally also the forward output";
  let description = [{
    `output`, when present, is the forward's y = silu(gate) * up, bit for
    bit: a recomputed SwiGLU fused into its backward (train-fuse-recompute),
    so the activation is written once from the gate and up this op reads
    anyway instead of by a separate clone that reads them again.
  }];
  let arguments = (ins Train_AnyFloatTensor:$gate, Train_AnyFloatTensor:$up,
                       Train_AnyFloatTensor:$result_grad, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$gate_grad, Train_AnyFloatTensor:$up_grad,
                      Optional<Train_AnyFloatTensor>:$output);
}

def Train_SliceGradOp : Train_ComputeOp<"slice_grad"> {
  let summary = "slice backward: dy placed at [offset, offset + size) of dim, zeros elsewhere";
  let arguments = (ins Train_AnyFloatTensor:$result_grad, I64Attr:$dim, I64Attr:$offset,
                       Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$input_grad);
}

def Train_ExpandGradOp : Train_ComputeOp<"expand_grad"> {
  let summary = "expand backward: sum dy over the broadcast dimensions (fixed order)";
  let arguments = (ins Train_AnyFloatTensor:$result_grad, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$input_grad);
}

def Train_LMHeadCrossEntropyGradOp : Train_AccumulatingGradOp<"lm_head_cross_entropy_grad"> {
  let summary = "LM head + cross-entropy backward, chunked: d hidden; d W into the main grad";
  let description = [{
    The gradient of the microbatch's loss sum (seed 1): the step's token
    mean is applied once to all main grads by `train.finalize_grads`, so
    every microbatch's backward is independent of the others' token counts.
  }];
  let arguments = (ins Train_Float3D:$hidden, Train_Float2D:$weight, Train_Tokens:$labels,
                       Train_F32Tensor:$lse,
                       DefaultValuedAttr<I64Attr, "1024">:$chunk_tokens,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       OptionalAttr<FlatSymbolRefAttr>:$weight_grad, Train_ScopeAttr:$scope,
                       UnitAttr:$vocab_parallel);
  let results = (outs Train_Float3D:$hidden_grad);
  let hasVerifier = 1;
}

def Train_LMHeadCrossEntropyWithGradOp
    : Train_AccumulatingGradOp<"lm_head_cross_entropy_with_grad"> {
  let summary = "LM head + cross-entropy and its backward in one chunked pass";
  let description = [{
    The loss of `train.lm_head_cross_entropy` together with the gradient of
    `train.lm_head_cross_entropy_grad` (seed 1 on the loss sum). The seed is
    a constant, so the gradient needs nothing the rest of the backward
    makes: train-autodiff emits this op in place of the loss (default
    `fuse-loss-grad=true`), and each chunk's logits are computed once
    instead of once for the loss and again for its gradient. Same kernels,
    same GEMMs, same order of main-grad accumulation as the two-op form, so
    the results are bitwise those of the pair. It is the microbatch's first
    backward op: the final hidden state and the LSE are no longer saved.

    ```mlir
    %loss, %count, %dh = train.lm_head_cross_entropy_with_grad %h, %table, %labels
        scope<-1, lm_head> {weight_grad = @model.embed_tokens.weight}
        : (tensor<1x4096x1024xbf16>, tensor<248320x1024xbf16>, tensor<1x4096xi32>)
        -> (tensor<f32>, tensor<i32>, tensor<1x4096x1024xbf16>)
    ```
  }];
  let arguments = (ins Train_Float3D:$hidden, Train_Float2D:$weight, Train_Tokens:$labels,
                       DefaultValuedAttr<I64Attr, "1024">:$chunk_tokens,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       OptionalAttr<FlatSymbolRefAttr>:$weight_grad, Train_ScopeAttr:$scope,
                       UnitAttr:$vocab_parallel);
  let results = (outs Train_F32Scalar:$loss_sum, Train_I32Scalar:$token_count,
                      Train_Float3D:$hidden_grad);
  let hasVerifier = 1;
}

#endif // ACTPLACE_TRAIN_BACKWARD_OPS_TD
