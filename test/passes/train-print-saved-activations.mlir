// RUN: actplace-opt %s -train-autodiff -train-print-saved-activations -o /dev/null | FileCheck %s
// RUN: actplace-opt %s -train-autodiff=fuse-loss-grad=false -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=UNFUSED
// RUN: actplace-import %models/tiny-hybrid.json --seq 64 | actplace-opt -train-autodiff -train-print-saved-activations -o /dev/null | FileCheck %s --check-prefix=TINY
// RUN: not actplace-opt %s -train-print-saved-activations -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOSTEP

// A model small enough to count by hand: B = 1, T = 4, D = 8, V = 32, bf16.
//   tokens, labels [1,4] i32                      16 bytes each
//   h = embedding [1,4,8] bf16                    64 (read by the norm's backward)
//   rstd [1,4] f32                                16
//   x = norm output [1,4,8]                       64 (read by the linear's backward)
//   h2 = h + y [1,4,8]                            64 (read by the head)
// The loss and its gradient are one op (fuse-loss-grad, the default), the
// first backward op: h2 and the labels cross into it; the residual add and y
// need nothing saved: 6 values, 240 bytes. Body: #0-#6 forward, #7 the head
// with its backward, #8 linear, #9 norm, #10 the residual gradient sum, #11
// the embedding backward.
// With fuse-loss-grad=false the loss also saves its LSE [1,4] f32 (16
// bytes) for the head's backward, which recomputes the logits: 7 values,
// 256 bytes; #0-#7 forward, #8 the head's backward.
module attributes {train.micro_batches = 1 : i64} {
  train.param @E : tensor<32x8xbf16> init<normal, 0.0, 0.02>
  train.param @n : tensor<8xbf16> init<zeros>
  train.param @w : tensor<8x8xbf16> init<normal, 0.0, 0.02>
  func.func @forward(%tok: tensor<1x4xi32>, %lab: tensor<1x4xi32>) -> (tensor<f32>, tensor<i32>) {
    %E = train.param_ref @E : tensor<32x8xbf16>
    %h = train.embedding %tok, %E scope<-1, embedding> : (tensor<1x4xi32>, tensor<32x8xbf16>) -> tensor<1x4x8xbf16>
    %n = train.param_ref @n : tensor<8xbf16>
    %x = train.rms_norm %h, %n scope<0, mlp_norm> {eps = 1.0e-06 : f64, zero_centered} : (tensor<1x4x8xbf16>, tensor<8xbf16>) -> tensor<1x4x8xbf16>
    %w = train.param_ref @w : tensor<8x8xbf16>
    %y = train.linear %x, %w scope<0, mlp_fc1> : (tensor<1x4x8xbf16>, tensor<8x8xbf16>) -> tensor<1x4x8xbf16>
    %h2 = train.add %h, %y scope<0, mlp_fc2> : (tensor<1x4x8xbf16>, tensor<1x4x8xbf16>) -> tensor<1x4x8xbf16>
    %l, %c = train.lm_head_cross_entropy %h2, %E, %lab scope<-1, lm_head> : (tensor<1x4x8xbf16>, tensor<32x8xbf16>, tensor<1x4xi32>) -> (tensor<f32>, tensor<i32>)
    return %l, %c : tensor<f32>, tensor<i32>
  }
}

// CHECK: saved activations: 6 values, 240 bytes (0.00 MiB) per microbatch; backward starts at #7
// CHECK: #-1 block argument 0 model.inputs tensor<1x4xi32> 16 bytes uses #{{[0-9]+}}..#{{[0-9]+}} needed-by model.embedding
// CHECK: #-1 block argument 1 model.inputs tensor<1x4xi32> 16 bytes uses #7..#7 needed-by model.lm_head
// CHECK: #1 train.embedding result 0 model.embedding tensor<1x4x8xbf16> 64 bytes uses #{{[0-9]+}}..#{{[0-9]+}} needed-by L0.mlp_norm
// CHECK: #3 train.rms_norm result 0 L0.mlp_norm tensor<1x4x8xbf16> 64 bytes {{.*}} needed-by L0.mlp_fc1
// CHECK: #3 train.rms_norm result 1 L0.mlp_norm tensor<1x4xf32> 16 bytes {{.*}} needed-by L0.mlp_norm
// CHECK: #6 train.add result 0 L0.mlp_fc2 tensor<1x4x8xbf16> 64 bytes uses #7..#7 needed-by model.lm_head
// CHECK-NOT: lm_head_cross_entropy result
// CHECK: bytes by producing scope:
// CHECK:   L0.mlp_fc2: 64
// CHECK:   L0.mlp_norm: 80
// CHECK:   model.embedding: 64
// CHECK:   model.inputs: 32
// CHECK-NOT: model.lm_head:

// UNFUSED: saved activations: 7 values, 256 bytes (0.00 MiB) per microbatch; backward starts at #8
// UNFUSED: #-1 block argument 1 model.inputs tensor<1x4xi32> 16 bytes uses #8..#8 needed-by model.lm_head
// UNFUSED: #6 train.add result 0 L0.mlp_fc2 tensor<1x4x8xbf16> 64 bytes uses #8..#8 needed-by model.lm_head
// UNFUSED: #7 train.lm_head_cross_entropy result 2 model.lm_head tensor<1x4xf32> 16 bytes uses #8..#8 needed-by model.lm_head
// UNFUSED: bytes by producing scope:
// UNFUSED:   model.lm_head: 16

// One GDN layer of tiny-hybrid (B = 1, T = 64, Hk = 2, Hv = 4, dk = dv = 16):
// the normalised q is [1,64,2,16] bf16 = 4096 bytes, read by the L2 norm
// backward and the recurrence backward, counted once; its rstd 64*2*4 = 512;
// the recurrence's g cumsum [1,64,4] f32 = 1024 and T [1,64,4,64] bf16 = 32768.
// TINY: #18 train.l2_norm result 0 L0.gdn_core_attn tensor<1x64x2x16xbf16> 4096 bytes {{.*}} needed-by L0.gdn_core_attn
// TINY: #18 train.l2_norm result 1 L0.gdn_core_attn tensor<1x64x2xf32> 512 bytes
// TINY: #23 train.gated_delta_rule result 1 L0.gdn_core_attn tensor<1x64x4xf32> 1024 bytes
// TINY: #23 train.gated_delta_rule result 2 L0.gdn_core_attn tensor<1x64x4x64xbf16> 32768 bytes
// The attention output is read by core_attn (its backward) and attn_proj (the gate's).
// TINY: #59 train.attention result 0 L2.core_attn tensor<1x64x4x16xbf16> 8192 bytes {{.*}} needed-by L2.attn_proj,L2.core_attn

// NOSTEP: error: no train.microbatch_loop: run train-autodiff first
