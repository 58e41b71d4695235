// RUN: actplace-opt %s --verify-roundtrip | FileCheck %s
// RUN: actplace-opt %s -mlir-print-op-generic | actplace-opt | FileCheck %s
// Embedding, linear, norms, MLP, residual and the loss.

// CHECK-LABEL: func.func @dense
func.func @dense(%tok: tensor<2x8xi32>, %table: tensor<32x16xbf16>, %w: tensor<24x16xbf16>,
                 %nw: tensor<16xbf16>, %gate: tensor<2x8x24xbf16>, %wd: tensor<16x24xbf16>)
    -> (tensor<f32>, tensor<i32>) {
  // CHECK: train.embedding %{{.*}}, %{{.*}} scope<-1, embedding> : (tensor<2x8xi32>, tensor<32x16xbf16>) -> tensor<2x8x16xbf16>
  %h = train.embedding %tok, %table scope<-1, embedding> : (tensor<2x8xi32>, tensor<32x16xbf16>) -> tensor<2x8x16xbf16>
  // CHECK: train.rms_norm %{{.*}}, %{{.*}} scope<0, mlp_norm> {eps = 9.9999999999999995E-7 : f64, zero_centered}
  %x = train.rms_norm %h, %nw scope<0, mlp_norm> {eps = 1.0e-06 : f64, zero_centered} : (tensor<2x8x16xbf16>, tensor<16xbf16>) -> tensor<2x8x16xbf16>
  // CHECK: train.rms_norm %{{.*}}, %{{.*}} scope<0, mlp_norm> {eps = 1.000000e-05 : f64} :
  %x2 = train.rms_norm %x, %nw scope<0, mlp_norm> {eps = 1.0e-05 : f64} : (tensor<2x8x16xbf16>, tensor<16xbf16>) -> tensor<2x8x16xbf16>
  // CHECK: train.linear %{{.*}}, %{{.*}} scope<0, mlp_fc1> : (tensor<2x8x16xbf16>, tensor<24x16xbf16>) -> tensor<2x8x24xbf16>
  %up = train.linear %x2, %w scope<0, mlp_fc1> : (tensor<2x8x16xbf16>, tensor<24x16xbf16>) -> tensor<2x8x24xbf16>
  // CHECK: train.swiglu %{{.*}}, %{{.*}} scope<0, mlp_act>
  %a = train.swiglu %gate, %up scope<0, mlp_act> : (tensor<2x8x24xbf16>, tensor<2x8x24xbf16>) -> tensor<2x8x24xbf16>
  %down = train.linear %a, %wd scope<0, mlp_fc2> : (tensor<2x8x24xbf16>, tensor<16x24xbf16>) -> tensor<2x8x16xbf16>
  // CHECK: train.add %{{.*}}, %{{.*}} scope<0, mlp_fc2>
  %h1 = train.add %h, %down scope<0, mlp_fc2> : (tensor<2x8x16xbf16>, tensor<2x8x16xbf16>) -> tensor<2x8x16xbf16>
  // CHECK: train.lm_head_cross_entropy %{{.*}}, %{{.*}}, %{{.*}} scope<-1, lm_head> {chunk_tokens = 4 : i64}
  // CHECK-SAME: -> (tensor<f32>, tensor<i32>)
  %loss, %count = train.lm_head_cross_entropy %h1, %table, %tok scope<-1, lm_head> {chunk_tokens = 4 : i64}
      : (tensor<2x8x16xbf16>, tensor<32x16xbf16>, tensor<2x8xi32>) -> (tensor<f32>, tensor<i32>)
  return %loss, %count : tensor<f32>, tensor<i32>
}

// The loss with its gradient in one op (what train-autodiff emits): loss,
// count and d hidden; the tied table's main grad is named by symbol.
// CHECK-LABEL: func.func @loss_with_grad
func.func @loss_with_grad(%h: tensor<2x8x16xbf16>, %table: tensor<32x16xbf16>, %tok: tensor<2x8xi32>)
    -> (tensor<f32>, tensor<i32>, tensor<2x8x16xbf16>) {
  // CHECK: train.lm_head_cross_entropy_with_grad %{{.*}}, %{{.*}}, %{{.*}} scope<-1, lm_head> {chunk_tokens = 4 : i64, weight_grad = @table}
  // CHECK-SAME: -> (tensor<f32>, tensor<i32>, tensor<2x8x16xbf16>)
  %loss, %count, %dh = train.lm_head_cross_entropy_with_grad %h, %table, %tok scope<-1, lm_head> {chunk_tokens = 4 : i64, weight_grad = @table}
      : (tensor<2x8x16xbf16>, tensor<32x16xbf16>, tensor<2x8xi32>) -> (tensor<f32>, tensor<i32>, tensor<2x8x16xbf16>)
  return %loss, %count, %dh : tensor<f32>, tensor<i32>, tensor<2x8x16xbf16>
}

// CHECK-LABEL: func.func @f32_model
func.func @f32_model(%x: tensor<1x4x8xf32>, %w: tensor<8x8xf32>) -> tensor<1x4x8xf32> {
  // CHECK: train.linear {{.*}} : (tensor<1x4x8xf32>, tensor<8x8xf32>) -> tensor<1x4x8xf32>
  %y = train.linear %x, %w scope<2, attn_proj> : (tensor<1x4x8xf32>, tensor<8x8xf32>) -> tensor<1x4x8xf32>
  return %y : tensor<1x4x8xf32>
}
