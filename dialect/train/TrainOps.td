//===- TrainOps.td - train dialect operations --------------*- tablegen -*-===//
//
// Forward ops of hybrid GDN / MLA / attention / MLP language models. Element
// and rank rules are declarative type constraints; shape relations between
// operands are checked in TrainOps.cpp with messages that name the operand,
// the dimension, what was expected and what was found.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TRAIN_OPS_TD
#define ACTPLACE_TRAIN_OPS_TD

include "dialect/train/TrainDialect.td"
include "dialect/train/TrainInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

/// A statically shaped ranked tensor whose element type is one of `elts` and
/// whose rank is one of `ranks` (any rank when empty).
class Train_Tensor<list<Type> elts, list<int> ranks, string desc>
    : Type<And<[
        IsRankedTensorTypePred,
        HasStaticShapePred,
        !if(!empty(ranks), CPred<"true">, HasAnyRankOfPred<ranks>),
        Concat<"[](::mlir::Type elementType) { return (",
               SubstLeaves<"$_self", "elementType", AnyTypeOf<elts>.predicate>,
               "); }(::llvm::cast<::mlir::ShapedType>($_self).getElementType())">
      ]>, desc, "::mlir::RankedTensorType">;

def Train_Float : AnyTypeOf<[BF16, F32]>;
def Train_AnyFloatTensor : Train_Tensor<[BF16, F32], [], "static bf16 or f32 tensor">;
def Train_Float1D : Train_Tensor<[BF16, F32], [1], "1-D static bf16 or f32 tensor">;
def Train_Float2D : Train_Tensor<[BF16, F32], [2], "2-D static bf16 or f32 tensor">;
def Train_Float3D : Train_Tensor<[BF16, F32], [3], "3-D static bf16 or f32 tensor [B, T, X]">;
def Train_Float4D : Train_Tensor<[BF16, F32], [4], "4-D static bf16 or f32 tensor [B, T, H, d]">;
def Train_F32_1D : Train_Tensor<[F32], [1], "1-D static f32 tensor">;
def Train_F32_3D : Train_Tensor<[F32], [3], "3-D static f32 tensor [B, T, H]">;
def Train_Tokens : Train_Tensor<[I32], [2], "2-D static i32 tensor [B, T] of token ids">;
def Train_F32Scalar : Train_Tensor<[F32], [0], "0-D f32 tensor">;
def Train_I32Scalar : Train_Tensor<[I32], [0], "0-D i32 tensor">;
def Train_ParamType : Train_Tensor<[BF16, F32], [], "static bf16 or f32 tensor">;
def Train_F32Tensor : Train_Tensor<[F32], [], "static f32 tensor">;

//===----------------------------------------------------------------------===//
// Base classes
//===----------------------------------------------------------------------===//

/// Every tensor an op carries has static dimensions >= 1 and at most
/// ap::kMaxTensorBytes bytes (dialect/train/TensorShapes.h).
def Train_TensorShapes : NativeOpTrait<"TensorShapes"> {
  let cppNamespace = "::ap";
}

class Train_Op<string mnemonic, list<Trait> traits = []>
    : Op<Train_Dialect, mnemonic, !listconcat([Train_TensorShapes], traits)>;

/// A differentiable op whose backward reads only its operands and results.
def DifferentiableOp : DeclareOpInterfaceMethods<Train_DifferentiableOpInterface>;
/// A differentiable op whose backward also reads intermediates it returns
/// as extra results after train-autodiff.
def DifferentiableSavingOp : DeclareOpInterfaceMethods<Train_DifferentiableOpInterface,
    ["withSavedResults"]>;

/// A compute op: pure, carries its module scope, prints operands, the scope,
/// remaining attributes and a functional type.
class Train_ComputeOp<string mnemonic, list<Trait> traits = []>
    : Train_Op<mnemonic, !listconcat(traits, [Pure])> {
  let assemblyFormat = [{
    operands `scope` `` $scope attr-dict `:` functional-type(operands, results)
  }];
}

//===----------------------------------------------------------------------===//
// Parameters
//===----------------------------------------------------------------------===//

def Train_ParamOp : Train_Op<"param", [Symbol]> {
  let summary = "declares a trainable (or frozen) model parameter";
  let description = [{
    A module-level parameter: its shape and compute dtype, how it is
    initialised and whether it is frozen (frozen parameters get no weight
    gradient and no optimizer state). Names follow the HF checkpoint naming so
    weights can be mapped to and from safetensors files.

    ```mlir
    train.param @model.embed_tokens.weight : tensor<248320x1024xbf16> init <normal, 0.0, 0.02>
    train.param @model.layers.0.linear_attn.A_log : tensor<16xf32> init <log_uniform, 1.0e-02, 1.6e+01> frozen
    ```

    Under tensor parallelism (module attribute `train.tensor_parallel` = N)
    a parameter with `split` holds this rank's part of the whole tensor:
    along dimension `tp_dim` the whole tensor is the concatenation of
    `tp_segments` (their whole extents, e.g. the q, k and v rows of a fused
    projection), and rank r holds block r of N of every segment, in segment
    order. `$type` is that part's type. A parameter without `split` is
    replicated: every rank holds all of it. A replicated parameter that
    ranks apply to their own heads only (the per-head norms inside a
    tensor-parallel region) is `tp_grad_sum`: each rank's gradient is a
    partial sum, summed over the `tp` group once per step before the norm.

    ```mlir
    train.param @model.layers.0.mlp.gate_proj.weight : tensor<32x64xbf16> init <normal, 0.0, 0.02> split 0 segments [64]
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<Train_ParamType>:$type,
                       Train_InitAttr:$init,
                       UnitAttr:$frozen,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntNonNegative]>>:$tp_dim,
                       OptionalAttr<DenseI64ArrayAttr>:$tp_segments,
                       UnitAttr:$tp_grad_sum);
  let assemblyFormat = [{
    $sym_name `:` $type `init` `` $init (`frozen` $frozen^)?
    (`split` $tp_dim^ `segments` $tp_segments)?
    (`tp_grad_sum` $tp_grad_sum^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Train_ParamRefOp : Train_Op<"param_ref",
    [Pure, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "the value of a declared parameter";
  let description = [{
    ```mlir
    %w = train.param_ref @model.layers.0.mlp.down_proj.weight : tensor<1024x3584xbf16>
    ```
    The result type must equal the parameter's declared type.
  }];
  let arguments = (ins FlatSymbolRefAttr:$param);
  let results = (outs Train_ParamType:$result);
  let assemblyFormat = "$param attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Embedding, linear, norms
//===----------------------------------------------------------------------===//

def Train_EmbeddingOp : Train_ComputeOp<"embedding", [DifferentiableOp]> {
  let summary = "token embedding lookup";
  let description = [{
    `out[b, t, :] = table[tokens[b, t], :]`. Token ids outside [0, V) are a
    data error reported by the runtime.

    With `vocab_parallel` (a module split over tensor-parallel ranks) the
    table is this rank's block of the vocabulary's rows (rank r holds rows
    [r V', (r + 1) V') of the whole table, V' its first dimension): ids of
    other ranks' rows give zero rows, so the ranks' outputs sum to the
    lookup (a train.tp_reduce or train.sp_scatter follows), and ids outside
    [0, V' x ranks) are the data error.

    ```mlir
    %h = train.embedding %tokens, %table scope<-1, embedding>
        : (tensor<1x4096xi32>, tensor<248320x1024xbf16>) -> tensor<1x4096x1024xbf16>
    ```
  }];
  let arguments = (ins Train_Tokens:$tokens, Train_Float2D:$table, Train_ScopeAttr:$scope,
                       UnitAttr:$vocab_parallel);
  let results = (outs Train_Float3D:$result);
  let hasVerifier = 1;
}

def Train_DocStartsOp : Train_ComputeOp<"doc_starts"> {
  let summary = "packed sequences: where each token's document begins";
  let description = [{
    Several documents packed into one sequence are separated by a
    `separator` token (the end-of-document id), which ends its document:
    a document begins at t = 0 and right after every separator. `result[b,
    t]` is the position in row b of the first token of t's document. The
    ops that mix tokens along the sequence (`train.short_conv`,
    `train.gated_delta_rule`, `train.rope`, `train.attention` and their
    backwards) take it as their `doc_starts` operand and treat each
    document as its own sequence. Not differentiable (a function of the
    token ids).

    ```mlir
    %starts = train.doc_starts %tokens scope<-1, embedding> {separator = 248044 : i64}
        : (tensor<1x4096xi32>) -> tensor<1x4096xi32>
    ```
  }];
  let arguments = (ins Train_Tokens:$tokens, I64Attr:$separator, Train_ScopeAttr:$scope);
  let results = (outs Train_Tokens:$result);
  let hasVerifier = 1;
}

def Train_LinearOp : Train_ComputeOp<"linear", [DifferentiableOp]> {
  let summary = "linear layer without bias, y = x W^T";
  let description = [{
    `x` is [..., K] and `weight` is [O, K] (HF layout); the result is [..., O].
    Inputs and result share the element type.

    ```mlir
    %y = train.linear %x, %w scope<0, gdn_in_proj>
        : (tensor<1x4096x1024xbf16>, tensor<6144x1024xbf16>) -> tensor<1x4096x6144xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_Float2D:$weight, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let hasVerifier = 1;
}

def Train_RMSNormOp : Train_ComputeOp<"rms_norm", [DifferentiableSavingOp]> {
  let summary = "RMSNorm over the last dimension, plain (w) or zero-centred (1 + w)";
  let description = [{
    `y = x * rsqrt(mean(x^2) + eps) * w`, or `* (1 + w)` with `zero_centered`
    (Qwen3.5's model norms, whose weights start at 0). Computed in f32.
    Also the q/k norms over head_dim ([B, T, H, d] inputs with a [d] weight).
    After train-autodiff the op also returns `rstd` (f32, the input shape
    without its last dimension), which its backward reads.

    ```mlir
    %n = train.rms_norm %h, %w scope<0, attn_norm> {eps = 1.0e-06 : f64, zero_centered}
        : (tensor<1x4096x1024xbf16>, tensor<1024xbf16>) -> tensor<1x4096x1024xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_Float1D:$weight,
                       F64Attr:$eps, UnitAttr:$zero_centered, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result, Optional<Train_F32Tensor>:$rstd);
  let hasVerifier = 1;
}

def Train_GatedRMSNormOp : Train_ComputeOp<"gated_rms_norm", [DifferentiableSavingOp]> {
  let summary = "GDN output norm: w * (o * rstd) * silu(z) per token and head";
  let description = [{
    `o` and `z` are [B, T, Hv, dv]; `weight` is [dv] (plain weight, init ones).
    `rstd = 1 / sqrt(mean_dv(o^2) + eps)`, computed in f32; returned as a
    second result [B, T, Hv] after train-autodiff.

    ```mlir
    %y = train.gated_rms_norm %o, %z, %w scope<0, gdn_norm_out> {eps = 1.0e-06 : f64}
        : (tensor<1x4096x16x128xbf16>, tensor<1x4096x16x128xbf16>, tensor<128xbf16>)
        -> tensor<1x4096x16x128xbf16>
    ```
  }];
  let arguments = (ins Train_Float4D:$input, Train_Float4D:$gate, Train_Float1D:$weight,
                       F64Attr:$eps, Train_ScopeAttr:$scope);
  let results = (outs Train_Float4D:$result, Optional<Train_F32_3D>:$rstd);
  let hasVerifier = 1;
}

def Train_L2NormOp : Train_ComputeOp<"l2_norm", [DifferentiableSavingOp]> {
  let summary = "L2 normalisation over the last dimension (GDN q and k)";
  let description = [{
    `y = x / sqrt(sum(x^2) + eps)`, eps inside the square root, in f32.
    After train-autodiff the op also returns `rstd` [B, T, H] (f32).

    ```mlir
    %qn = train.l2_norm %q scope<0, gdn_core_attn> {eps = 1.0e-06 : f64}
        : (tensor<1x4096x16x128xbf16>) -> tensor<1x4096x16x128xbf16>
    ```
  }];
  let arguments = (ins Train_Float4D:$input, F64Attr:$eps, Train_ScopeAttr:$scope);
  let results = (outs Train_Float4D:$result, Optional<Train_F32_3D>:$rstd);
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// GDN
//===----------------------------------------------------------------------===//

def Train_ShortConvOp : Train_ComputeOp<"short_conv", [DifferentiableOp]> {
  let summary = "causal depthwise short convolution followed by SiLU";
  let description = [{
    `pre[b, t, c] = sum_j w[c, j] * x[b, t - (Kc - 1) + j, c]` with zeros before
    each sequence start (every batch row is a sequence), then `y = silu(pre)`.
    `x` is [B, T, C], `weight` is [C, Kc] with 1 <= Kc <= 8, no bias.
    With `doc_starts` (packed sequences, `train.doc_starts`) every document
    is a sequence: the window of token t reads x only from its document's
    first token on.

    With more than one result the output channels are split, in order, into
    groups of the results' sizes [B, T, C_i] (summing to C): the GDN layer's
    q, k and v come out of the conv in their own tensors, where a slice of
    one [B, T, C] result would copy them (and its backward would concat
    their gradients).

    ```mlir
    %y = train.short_conv %mixed, %w scope<0, gdn_prep>
        : (tensor<1x4096x6144xbf16>, tensor<6144x4xbf16>) -> tensor<1x4096x6144xbf16>
    %q, %k, %v = train.short_conv %mixed, %w scope<0, gdn_prep>
        : (tensor<1x4096x6144xbf16>, tensor<6144x4xbf16>)
        -> (tensor<1x4096x2048xbf16>, tensor<1x4096x2048xbf16>, tensor<1x4096x2048xbf16>)
    ```
  }];
  let arguments = (ins Train_Float3D:$input, Train_Float2D:$weight,
                       Optional<Train_Tokens>:$doc_starts, Train_ScopeAttr:$scope);
  let results = (outs Variadic<Train_Float3D>:$outputs);
  let hasVerifier = 1;
}

def Train_GDNGatesOp : Train_ComputeOp<"gdn_gates", [DifferentiableOp]> {
  let summary = "GDN gates: beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias)";
  let description = [{
    `a` and `b` are [B, T, Hv] projections; `A_log` and `dt_bias` are [Hv]
    f32 parameters. `g` (a log-space decay, <= 0) is f32; `beta` is bf16 or
    f32. softplus uses threshold 20.

    ```mlir
    %g, %beta = train.gdn_gates %a, %b, %A_log, %dt_bias scope<0, gdn_core_attn>
        : (tensor<1x4096x16xbf16>, tensor<1x4096x16xbf16>, tensor<16xf32>, tensor<16xf32>)
        -> (tensor<1x4096x16xf32>, tensor<1x4096x16xbf16>)
    ```
  }];
  let arguments = (ins Train_Float3D:$a, Train_Float3D:$b, Train_F32_1D:$A_log,
                       Train_F32_1D:$dt_bias, Train_ScopeAttr:$scope);
  let results = (outs Train_F32_3D:$g, Train_Float3D:$beta);
  let hasVerifier = 1;
}

def Train_GatedDeltaRuleOp : Train_ComputeOp<"gated_delta_rule", [DifferentiableSavingOp]> {
  let summary = "the GDN recurrence (gated delta rule), chunked";
  let description = [{
    Per sequence and value head h (key head h / (Hv / Hk)), with state
    S in R^{dk x dv} starting at zero:
    `S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`,
    `o_t = scale * S_t^T q_t`. Inputs q, k are L2-normalised [B, T, Hk, dk],
    v is [B, T, Hv, dv], g (f32) and beta are [B, T, Hv]. Computed in chunks of
    `chunk_size` = 64 tokens (WY form, docs/model-math.md 1.4); head dims up to 256;
    Hv must be a multiple of Hk. After train-autodiff the op also returns
    what its backward reads beside q, k, v and beta (docs/model-math.md 1.5): the
    chunk-local cumulative sum of g (f32 [B, T, Hv]) and the per-chunk
    T = (I + A)^-1 rows ([B, T, Hv, 64], the storage type of v).
    With `doc_starts` (packed sequences) the state restarts at zero at every
    document's first token, and the chunks restart there: each document is
    computed as its own sequence.

    ```mlir
    %o = train.gated_delta_rule %q, %k, %v, %g, %beta scope<0, gdn_core_attn>
        {chunk_size = 64 : i64, scale = 0.088388347648318433 : f64}
        : (tensor<1x4096x16x128xbf16>, tensor<1x4096x16x128xbf16>, tensor<1x4096x16x128xbf16>,
           tensor<1x4096x16xf32>, tensor<1x4096x16xbf16>) -> tensor<1x4096x16x128xbf16>
    ```
  }];
  let arguments = (ins Train_Float4D:$q, Train_Float4D:$k, Train_Float4D:$v,
                       Train_F32_3D:$g, Train_Float3D:$beta,
                       Optional<Train_Tokens>:$doc_starts,
                       F64Attr:$scale, DefaultValuedAttr<I64Attr, "64">:$chunk_size,
                       Train_ScopeAttr:$scope);
  let results = (outs Train_Float4D:$result, Variadic<Train_AnyFloatTensor>:$saved);
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// The saved cumulative gate sum and T matrix, when materialised.
    ::mlir::Value getGCumsum() { return getSaved().empty() ? nullptr : getSaved()[0]; }
    ::mlir::Value getChunkT() { return getSaved().empty() ? nullptr : getSaved()[1]; }
  }];
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

def Train_RoPEOp : Train_ComputeOp<"rope", [DifferentiableOp]> {
  let summary = "rotary position embedding (rotate-half) on the first rotary_dim dims";
  let description = [{
    Positions are 0..T-1 within each batch row (with `doc_starts`, packed
    sequences: within each document). Dims [0, rotary_dim) of every
    head are rotated in rotate-half pairing (i, i + rotary_dim / 2) with
    frequencies theta^(-2i / rotary_dim); the remaining dims pass through.
    rotary_dim must be even and at most the head dim.

    ```mlir
    %qr = train.rope %q scope<3, qkv_linear> {rotary_dim = 64 : i64, theta = 1.0e+07 : f64}
        : (tensor<1x4096x8x256xbf16>) -> tensor<1x4096x8x256xbf16>
    ```
  }];
  let arguments = (ins Train_Float4D:$input, Optional<Train_Tokens>:$doc_starts,
                       I64Attr:$rotary_dim, F64Attr:$theta, Train_ScopeAttr:$scope);
  let results = (outs Train_Float4D:$result);
  let hasVerifier = 1;
}

def Train_AttentionOp : Train_ComputeOp<"attention", [DifferentiableSavingOp]> {
  let summary = "causal softmax attention with grouped-query heads";
  let description = [{
    `o = softmax_causal(q k^T * scale) v` per batch row, softmax in f32. q is
    [B, T, Hq, Dqk], k is [B, T, Hkv, Dqk], v is [B, T, Hkv, Dv] with Hq a
    multiple of Hkv (GQA); Dqk may differ from Dv (MLA: 192 and 128). Head dims
    up to 256. An output gate, where the model has one, is a separate
    `train.output_gate` in the `attn_proj` scope, because docs/architecture.md places the
    gate there and the attention output is then needed by both scopes.
    After train-autodiff the op also returns the softmax log-sum-exp
    `lse` (f32 [B, Hq, T]) its backward reads. With `doc_starts` (packed
    sequences) a query sees only the keys of its own document.

    ```mlir
    %o = train.attention %q, %k, %v scope<3, core_attn> {scale = 6.250000e-02 : f64}
        : (tensor<1x4096x8x256xbf16>, tensor<1x4096x2x256xbf16>, tensor<1x4096x2x256xbf16>)
        -> tensor<1x4096x8x256xbf16>
    ```
  }];
  let arguments = (ins Train_Float4D:$q, Train_Float4D:$k, Train_Float4D:$v,
                       Optional<Train_Tokens>:$doc_starts,
                       F64Attr:$scale, Train_ScopeAttr:$scope);
  let results = (outs Train_Float4D:$result, Optional<Train_F32Tensor>:$lse);
  let hasVerifier = 1;
}

def Train_OutputGateOp : Train_ComputeOp<"output_gate", [SameOperandsAndResultType, DifferentiableOp]> {
  let summary = "sigmoid output gate: y = o * sigmoid(gate)";
  let description = [{
    ```mlir
    %y = train.output_gate %o, %gate scope<3, attn_proj>
        : (tensor<1x4096x8x256xbf16>, tensor<1x4096x8x256xbf16>) -> tensor<1x4096x8x256xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_AnyFloatTensor:$gate,
                       Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
}

//===----------------------------------------------------------------------===//
// Tensor parallelism (Megatron's f and g)
//===----------------------------------------------------------------------===//

def Train_TensorParallelCopyOp : Train_ComputeOp<"tp_copy", [SameOperandsAndResultType, DifferentiableOp]> {
  let summary = "enters a tensor-parallel region: identity forward, gradient summed over the tensor-parallel ranks";
  let description = [{
    Marks a replicated activation (the same on every tensor-parallel rank)
    that feeds column-parallel projections, each rank computing its own
    heads or channels from it. Forward it is the identity (a view, no
    copy); its gradient is the sum over the `tp` group of the ranks' partial
    input gradients (`train.tp_reduce` of the result's gradient), so that
    everything before it sees the whole model's gradient.

    ```mlir
    %xr = train.tp_copy %x scope<0, mlp_fc1>
        : (tensor<1x64x64xbf16>) -> tensor<1x64x64xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let hasVerifier = 1;
}

def Train_TensorParallelReduceOp : Train_ComputeOp<"tp_reduce", [SameOperandsAndResultType, DifferentiableOp]> {
  let summary = "leaves a tensor-parallel region: sums the ranks' partial results; gradient passed through";
  let description = [{
    The output of a row-parallel projection on one rank is a partial sum
    over that rank's heads or channels; `train.tp_reduce` sums it over the
    `tp` group (a fixed-order all-reduce) into the replicated activation.
    Its gradient is the result's gradient, the same on every rank. Its
    input must have no other user: the sum is taken in place.

    ```mlir
    %y = train.tp_reduce %partial scope<0, mlp_fc2>
        : (tensor<1x64x64xbf16>) -> tensor<1x64x64xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let hasVerifier = 1;
}

def Train_SequenceParallelGatherOp : Train_ComputeOp<"sp_gather", [DifferentiableOp]> {
  let summary = "enters a tensor-parallel region under sequence parallelism: all-gathers the token shards";
  let description = [{
    With sequence parallelism (module attribute `train.sequence_parallel`)
    the residual stream between tensor-parallel regions is split over the
    `tp` group by tokens: rank r holds tokens [r N/T, (r + 1) N/T) of the
    microbatch's N = B x T, as a `[1, N/T, ...]` tensor. This op gathers
    the shards in rank order into the whole `[B, T, ...]` activation the
    region's column-parallel projections read; its gradient is the
    reduce-scatter of the result's gradient (each rank's partial gradient
    summed, each rank keeping its tokens).

    ```mlir
    %x = train.sp_gather %xs scope<0, mlp_fc1>
        : (tensor<1x32x64xbf16>) -> tensor<1x64x64xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let hasVerifier = 1;
}

def Train_SequenceParallelScatterOp : Train_ComputeOp<"sp_scatter", [DifferentiableOp]> {
  let summary = "leaves a tensor-parallel region under sequence parallelism: reduce-scatters the partial output";
  let description = [{
    Sums a row-parallel projection's partial `[B, T, ...]` output over the
    `tp` group and keeps this rank's token shard `[1, N/T, ...]` of the sum
    (see `train.sp_gather`); its gradient is the all-gather of the shards'
    gradients. Its input must have no other user: the runtime may reduce in
    place.

    ```mlir
    %ys = train.sp_scatter %partial scope<0, mlp_fc2>
        : (tensor<1x64x64xbf16>) -> tensor<1x32x64xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let hasVerifier = 1;
}

def Train_SequenceParallelShardOp : Train_ComputeOp<"sp_shard"> {
  let summary = "this rank's token shard of the microbatch's token ids or labels";
  let description = [{
    Under sequence parallelism the embedding and the loss run on the
    rank's tokens only: `[B, T]` ids in, tokens [r N/T, (r + 1) N/T) of the
    flattened microbatch out as `[1, N/T]`, r this rank in the `tp` group.
    Not differentiable (integer ids).

    ```mlir
    %ts = train.sp_shard %tokens scope<-1, embedding>
        : (tensor<2x32xi32>) -> tensor<1x32xi32>
    ```
  }];
  let arguments = (ins Train_Tokens:$input, Train_ScopeAttr:$scope);
  let results = (outs Train_Tokens:$result);
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// MLP, residual
//===----------------------------------------------------------------------===//

def Train_SwiGLUOp : Train_ComputeOp<"swiglu", [SameOperandsAndResultType, DifferentiableOp]> {
  let summary = "SwiGLU activation: y = silu(gate) * up";
  let description = [{
    ```mlir
    %a = train.swiglu %gate, %up scope<0, mlp_act>
        : (tensor<1x4096x3584xbf16>, tensor<1x4096x3584xbf16>) -> tensor<1x4096x3584xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$gate, Train_AnyFloatTensor:$up,
                       Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
}

def Train_AddOp : Train_ComputeOp<"add", [SameOperandsAndResultType, Commutative, DifferentiableOp]> {
  let summary = "elementwise add (residual connections)";
  let description = [{
    ```mlir
    %h1 = train.add %h0, %out scope<0, gdn_out_proj>
        : (tensor<1x4096x1024xbf16>, tensor<1x4096x1024xbf16>) -> tensor<1x4096x1024xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$lhs, Train_AnyFloatTensor:$rhs,
                       Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
}

//===----------------------------------------------------------------------===//
// Views: reshape, slice, concat, expand
//===----------------------------------------------------------------------===//

def Train_ReshapeOp : Train_ComputeOp<"reshape", [DifferentiableOp]> {
  let summary = "row-major reshape (a view: no data moves)";
  let description = [{
    ```mlir
    %z4 = train.reshape %z scope<0, gdn_in_proj>
        : (tensor<1x4096x2048xbf16>) -> tensor<1x4096x16x128xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let hasVerifier = 1;
}

def Train_SliceOp : Train_ComputeOp<"slice", [DifferentiableOp]> {
  let summary = "contiguous slice [offset, offset + size) of one dimension";
  let description = [{
    The result has `size` elements in dimension `dim` and the input's extent
    elsewhere.

    ```mlir
    %q = train.slice %qkv scope<0, gdn_prep> {dim = 2 : i64, offset = 0 : i64}
        : (tensor<1x4096x6144xbf16>) -> tensor<1x4096x2048xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, I64Attr:$dim, I64Attr:$offset,
                       Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let hasVerifier = 1;
}

def Train_ConcatOp : Train_ComputeOp<"concat", [DifferentiableOp]> {
  let summary = "concatenation along one dimension";
  let description = [{
    ```mlir
    %qf = train.concat %q_nope, %q_pe scope<0, mla_up_proj> {dim = 3 : i64}
        : (tensor<1x64x16x128xbf16>, tensor<1x64x16x64xbf16>) -> tensor<1x64x16x192xbf16>
    ```
  }];
  let arguments = (ins Variadic<Train_AnyFloatTensor>:$inputs, I64Attr:$dim,
                       Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let hasVerifier = 1;
}

def Train_ExpandOp : Train_ComputeOp<"expand", [DifferentiableOp]> {
  let summary = "broadcast size-1 dimensions to the result shape";
  let description = [{
    Used for MLA's shared rotary key, [B, T, 1, dr] -> [B, T, H, dr]; its
    gradient sums over the broadcast dimensions.

    ```mlir
    %kpe = train.expand %kpe1 scope<0, mla_up_proj>
        : (tensor<1x64x1x64xbf16>) -> tensor<1x64x16x64xbf16>
    ```
  }];
  let arguments = (ins Train_AnyFloatTensor:$input, Train_ScopeAttr:$scope);
  let results = (outs Train_AnyFloatTensor:$result);
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

def Train_LMHeadCrossEntropyOp : Train_ComputeOp<"lm_head_cross_entropy", [DifferentiableSavingOp]> {
  let summary = "tied LM head + cross-entropy, computed in token chunks";
  let description = [{
    `logits = h W^T` ([B, T, V]) followed by the cross-entropy against
    `labels`; returns the sum of the per-token losses over tokens whose label
    is not `ignore_index`, and the number of such tokens (the step's loss is the
    token-weighted mean over all microbatches). Lowerings compute logits in
    chunks of `chunk_tokens` tokens so [B*T, V] is never materialised whole.
    With tied embeddings `weight` is the embedding table. After
    train-autodiff the op also returns the per-token log-sum-exp of the
    logits (f32 [B, T]) so its backward recomputes each chunk's logits once.

    With `vocab_parallel` `weight` is this tensor-parallel rank's block of
    the vocabulary's rows (as for train.embedding): each chunk's softmax
    statistics are exchanged between the ranks, so the loss sum, the token
    count and the LSE are the whole vocabulary's and equal on every rank;
    `hidden` must be the whole sequence on every rank, and its gradient is
    this rank's partial sum.

    ```mlir
    %loss, %count = train.lm_head_cross_entropy %h, %table, %labels scope<-1, lm_head>
        {chunk_tokens = 1024 : i64}
        : (tensor<1x4096x1024xbf16>, tensor<248320x1024xbf16>, tensor<1x4096xi32>)
        -> (tensor<f32>, tensor<i32>)
    ```
  }];
  let arguments = (ins Train_Float3D:$hidden, Train_Float2D:$weight, Train_Tokens:$labels,
                       DefaultValuedAttr<I64Attr, "1024">:$chunk_tokens,
                       DefaultValuedAttr<I64Attr, "-100">:$ignore_index,
                       Train_ScopeAttr:$scope, UnitAttr:$vocab_parallel);
  let results = (outs Train_F32Scalar:$loss_sum, Train_I32Scalar:$token_count,
                      Optional<Train_F32Tensor>:$lse);
  let hasVerifier = 1;
}

include "dialect/train/TrainBackwardOps.td"
include "dialect/train/TrainStepOps.td"
include "dialect/train/TrainPlacementOps.td"

#endif // ACTPLACE_TRAIN_OPS_TD
