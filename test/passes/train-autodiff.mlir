// RUN: actplace-import %models/tiny-hybrid.json --seq 64 --micro-batches 2 | actplace-opt -train-autodiff --verify-roundtrip | FileCheck %s
// RUN: actplace-import %models/tiny-hybrid.json --seq 64 --freeze model.layers.0. | actplace-opt -train-autodiff | FileCheck %s --check-prefix=FROZEN0
// RUN: actplace-import %models/tiny-hybrid.json --seq 64 --freeze model.layers.0.,model.embed_tokens | actplace-opt -train-autodiff | FileCheck %s --check-prefix=FROZENHEAD
// RUN: actplace-import %models/tiny-hybrid.json --seq 64 --micro-batches 2 | actplace-opt -train-autodiff=fuse-loss-grad=false --verify-roundtrip | FileCheck %s --check-prefix=UNFUSED
// RUN: actplace-import %models/qwen3.5-0.8b.json --seq 4096 --micro-batches 4 | actplace-opt -train-autodiff -o %t.qwen.mlir
// RUN: grep -c "= train.gated_delta_rule_grad" %t.qwen.mlir | FileCheck %s --check-prefix=QWEN-GDN
// RUN: grep -c "= train.attention_grad" %t.qwen.mlir | FileCheck %s --check-prefix=QWEN-ATTN
// RUN: grep -c "^ *train.adamw" %t.qwen.mlir | FileCheck %s --check-prefix=QWEN-PARAMS

// The step: a loop over [M, B, T] microbatches, then finalisation.
// CHECK-LABEL: func.func @train_step(%{{.*}}: tensor<2x1x64xi32> {train.input = "tokens"}, %{{.*}}: tensor<2x1x64xi32> {train.input = "labels"}) -> (tensor<f32>, tensor<f32>)
// CHECK: train.microbatch_loop %{{.*}}, %{{.*}} : (tensor<2x1x64xi32>, tensor<2x1x64xi32>) -> (tensor<f32>, tensor<i32>)
// CHECK: ^bb0(%{{.*}}: tensor<1x64xi32>, %{{.*}}: tensor<1x64xi32>):

// Forward ops whose backward reads intermediates now return them.
// CHECK: train.rms_norm {{.*}} scope<0, attn_norm> {{.*}} -> (tensor<1x64x64xbf16>, tensor<1x64xf32>)
// CHECK: train.l2_norm {{.*}} scope<0, gdn_core_attn> {{.*}} -> (tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>)
// CHECK: train.gated_delta_rule {{.*}} -> (tensor<1x64x4x16xbf16>, tensor<1x64x4xf32>, tensor<1x64x4x64xbf16>)
// CHECK: train.gated_rms_norm {{.*}} -> (tensor<1x64x4x16xbf16>, tensor<1x64x4xf32>)
// CHECK: train.attention {{.*}} scope<2, core_attn> {{.*}} -> (tensor<1x64x4x16xbf16>, tensor<1x4x64xf32>)
// The loss and its gradient are one op where the loss was (fuse-loss-grad,
// the default): no LSE is saved for a second logits pass. It is the first
// backward op.
// CHECK-NOT: train.lm_head_cross_entropy {{.*}} -> (tensor<f32>, tensor<i32>, tensor<1x64xf32>)
// CHECK: %[[LOSS:.*]], %[[COUNT:.*]], %{{.*}} = train.lm_head_cross_entropy_with_grad {{.*}} scope<-1, lm_head> {weight_grad = @model.embed_tokens.weight} : (tensor<1x64x64xbf16>, tensor<256x64xbf16>, tensor<1x64xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x64x64xbf16>)
// CHECK-NOT: train.lm_head_cross_entropy

// Backward, last layer first; each backward op carries its forward op's scope.
// CHECK: train.rms_norm_grad {{.*}} scope<-1, final_norm> {weight_grad = @model.norm.weight, zero_centered}
// CHECK: train.swiglu_grad {{.*}} scope<5, mlp_act> : (tensor<1x64x128xbf16>, tensor<1x64x128xbf16>, tensor<1x64x128xbf16>) -> (tensor<1x64x128xbf16>, tensor<1x64x128xbf16>)
// MLA: the attention backward, the shared rotary key summed over heads.
// CHECK: train.attention_grad {{.*}} scope<4, core_attn> {{.*}} -> (tensor<1x64x4x24xbf16>, tensor<1x64x4x24xbf16>, tensor<1x64x4x16xbf16>)
// CHECK: train.expand_grad {{.*}} scope<4, mla_up_proj> : (tensor<1x64x4x8xbf16>) -> tensor<1x64x1x8xbf16>
// CHECK: train.rope_grad {{.*}} scope<4, mla_up_proj> {rotary_dim = 8 : i64
// Gated attention: gate backward, then attention, RoPE and q/k norms.
// CHECK: train.output_gate_grad {{.*}} scope<2, attn_proj>
// CHECK: train.attention_grad {{.*}} scope<2, core_attn> {{.*}} -> (tensor<1x64x4x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>)
// CHECK: train.rms_norm_grad {{.*}} scope<2, qkv_linear> {weight_grad = @model.layers.2.self_attn.k_norm.weight, zero_centered}
// The q slice and gate slice gradients are one concat, not zero-padded sums.
// CHECK: train.concat {{.*}} scope<2, qkv_linear> {dim = 3 : i64} : (tensor<1x64x4x16xbf16>, tensor<1x64x4x16xbf16>) -> tensor<1x64x4x32xbf16>
// GDN (grouped value heads, Hv = 2 Hk).
// CHECK: train.gated_rms_norm_grad {{.*}} scope<0, gdn_norm_out> {weight_grad = @model.layers.0.linear_attn.norm.weight} : {{.*}} -> (tensor<1x64x4x16xbf16>, tensor<1x64x4x16xbf16>)
// CHECK: train.gated_delta_rule_grad {{.*}} scope<0, gdn_core_attn> {scale = 2.500000e-01 : f64} : (tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x4x16xbf16>, tensor<1x64x4xf32>, tensor<1x64x4xbf16>, tensor<1x64x4x64xbf16>, tensor<1x64x4x16xbf16>) -> (tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x4x16xbf16>, tensor<1x64x4xf32>, tensor<1x64x4xbf16>)
// CHECK: train.gdn_gates_grad {{.*}} {a_log_grad = @model.layers.0.linear_attn.A_log, dt_bias_grad = @model.layers.0.linear_attn.dt_bias}
// CHECK: train.l2_norm_grad {{.*}} scope<0, gdn_core_attn>
// q, k, v are the conv's three results: their gradients feed the conv
// backward as three operands, no concat.
// CHECK-NOT: train.concat {{.*}} scope<0, gdn_prep>
// CHECK: train.short_conv_grad {{.*}} scope<0, gdn_prep> {weight_grad = @model.layers.0.linear_attn.conv1d.weight} : (tensor<1x64x128xbf16>, tensor<128x4xbf16>, tensor<1x64x32xbf16>, tensor<1x64x32xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x128xbf16>
// CHECK: train.linear_grad {{.*}} scope<0, gdn_in_proj> {weight_grad = @model.layers.0.linear_attn.in_proj_qkv.weight}
// The tied table gets both the head's and the embedding's gradient.
// CHECK: train.embedding_grad {{.*}} scope<-1, embedding> {weight_grad = @model.embed_tokens.weight}
// CHECK: train.yield %[[LOSS]], %[[COUNT]]
// CHECK: %[[NORM:.*]] = train.finalize_grads %{{.*}} {max_norm = 1.000000e+00 : f64}
// CHECK: %[[LR:.*]] = train.lr_schedule {max_lr = 3.000000e-04 : f64, min_lr = 3.000000e-05 : f64, total_steps = 10000 : i64, warmup_steps = 100 : i64}
// Weight decay skips norms, A_log, dt_bias and 1-D parameters.
// CHECK: train.adamw @model.embed_tokens.weight, %[[LR]] {weight_decay = 1.000000e-01 : f64}
// CHECK: train.adamw @model.layers.0.input_layernorm.weight, %[[LR]] {weight_decay = 0.000000e+00 : f64}
// CHECK: train.adamw @model.layers.0.linear_attn.conv1d.weight, %[[LR]] {weight_decay = 1.000000e-01 : f64}
// CHECK: train.adamw @model.layers.0.linear_attn.A_log, %[[LR]] {weight_decay = 0.000000e+00 : f64}
// CHECK: train.loss_mean
// CHECK: return %{{.*}}, %[[NORM]] : tensor<f32>, tensor<f32>
// CHECK-NOT: func.func @forward

// Layer 0 frozen: no weight gradients there, but its input gradient still
// flows to the trainable embedding below it.
// FROZEN0: train.linear_grad {{.*}} scope<0, gdn_out_proj> : (
// FROZEN0-NOT: weight_grad = @model.layers.0.
// FROZEN0: train.embedding_grad {{.*}} {weight_grad = @model.embed_tokens.weight}
// FROZEN0-NOT: train.adamw @model.layers.0.

// Embedding and layer 0 frozen: nothing below layer 1 is trainable, so
// layer 0 gets no backward work at all. The tied head still trains the
// table? No: it is frozen, so the head's grad has no weight_grad either.
// FROZENHEAD: train.lm_head_cross_entropy_with_grad {{.*}} scope<-1, lm_head> :
// FROZENHEAD: train.rms_norm_grad {{.*}} scope<1, mlp_norm>
// FROZENHEAD-NOT: scope<0,
// FROZENHEAD: train.yield
// FROZENHEAD-NOT: train.adamw @model.embed_tokens.weight

// fuse-loss-grad=false: the loss returns its LSE, and its gradient op reads
// it at the start of the backward (same kernels, a second logits pass).
// UNFUSED: %[[L:.*]], %[[C:.*]], %[[LSE:.*]] = train.lm_head_cross_entropy {{.*}} -> (tensor<f32>, tensor<i32>, tensor<1x64xf32>)
// UNFUSED-NEXT: train.lm_head_cross_entropy_grad {{.*}}, %[[LSE]] scope<-1, lm_head> {weight_grad = @model.embed_tokens.weight} : (tensor<1x64x64xbf16>, tensor<256x64xbf16>, tensor<1x64xi32>, tensor<1x64xf32>) -> tensor<1x64x64xbf16>
// UNFUSED-NOT: train.lm_head_cross_entropy_with_grad
// UNFUSED: train.yield %[[L]], %[[C]]

// QWEN-GDN: 18
// QWEN-ATTN: 6
// QWEN-PARAMS: 320
