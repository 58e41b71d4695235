// RUN: actplace-opt %s -split-input-file -verify-diagnostics | FileCheck %s
// Tensor parallelism: split parameters, train.tp_copy / train.tp_reduce,
// and one diagnostic per verifier rule.

// CHECK-LABEL: module attributes {train.tensor_parallel = 2 : i64}
// CHECK: train.param @w : tensor<32x64xbf16> init<normal, 0.000000e+00, 2.000000e-02> split 0 segments [64]
// CHECK: train.param @qkv : tensor<3x8xbf16> init<normal, 0.000000e+00, 2.000000e-02> split 0 segments [2, 2, 2]
// CHECK: train.param @n : tensor<16xbf16> init<ones> tp_grad_sum
// CHECK: train.tp_copy %{{.*}} scope<0, mlp_fc1>
// CHECK: train.tp_reduce %{{.*}} scope<0, mlp_fc2>
module attributes {train.tensor_parallel = 2 : i64} {
  train.param @w : tensor<32x64xbf16> init <normal, 0.0, 0.02> split 0 segments [64]
  train.param @qkv : tensor<3x8xbf16> init <normal, 0.0, 0.02> split 0 segments [2, 2, 2]
  train.param @n : tensor<16xbf16> init <ones, 0.0, 0.0> tp_grad_sum
  func.func @f(%x: tensor<1x4x64xbf16>) -> tensor<1x4x64xbf16> {
    %c = train.tp_copy %x scope<0, mlp_fc1> : (tensor<1x4x64xbf16>) -> tensor<1x4x64xbf16>
    %r = train.tp_reduce %c scope<0, mlp_fc2> : (tensor<1x4x64xbf16>) -> tensor<1x4x64xbf16>
    return %r : tensor<1x4x64xbf16>
  }
}

// -----

module attributes {train.tensor_parallel = 2 : i64} {
  // expected-error @+1 {{dimension 0 is 16, expected 32 (the segments' extents 64 / 2 tensor-parallel ranks)}}
  train.param @w : tensor<16x64xbf16> init <normal, 0.0, 0.02> split 0 segments [64]
}

// -----

module attributes {train.tensor_parallel = 2 : i64} {
  // expected-error @+1 {{segment extent 3 is not a positive multiple of the tensor-parallel size 2}}
  train.param @w : tensor<3x64xbf16> init <normal, 0.0, 0.02> split 0 segments [3, 3]
}

// -----

module attributes {train.tensor_parallel = 2 : i64} {
  // expected-error @+1 {{split dimension 2 is not below the rank 2 of 'tensor<32x64xbf16>'}}
  train.param @w : tensor<32x64xbf16> init <normal, 0.0, 0.02> split 2 segments [64]
}

// -----

module {
  // expected-error @+1 {{is split, but the module's 'train.tensor_parallel' is 1 or absent}}
  train.param @w : tensor<32x64xbf16> init <normal, 0.0, 0.02> split 0 segments [64]
}

// -----

module attributes {train.tensor_parallel = 2 : i64} {
  // expected-error @+1 {{'tp_grad_sum' belongs on a replicated parameter of a module with 'train.tensor_parallel' of at least 2}}
  train.param @w : tensor<32x64xbf16> init <normal, 0.0, 0.02> split 0 segments [64] tp_grad_sum
}

// -----

module {
  func.func @no_group(%x: tensor<1x4x64xbf16>) {
    // expected-error @+1 {{needs a module with 'train.tensor_parallel' of at least 2}}
    %c = train.tp_copy %x scope<0, mlp_fc1> : (tensor<1x4x64xbf16>) -> tensor<1x4x64xbf16>
    return
  }
}

// -----

// expected-error @+1 {{'train.tensor_parallel' is a module attribute, a positive integer; got 0 : i64}}
module attributes {train.tensor_parallel = 0 : i64} {
}

// -----

// Sequence parallelism: 2 x 8 tokens, 8 a rank.
// CHECK-LABEL: module attributes {train.sequence_parallel, train.tensor_parallel = 2 : i64}
// CHECK: train.sp_shard %{{.*}} scope<-1, embedding> : (tensor<2x8xi32>) -> tensor<1x8xi32>
// CHECK: train.sp_gather %{{.*}} scope<0, mlp_fc1> : (tensor<1x8x64xbf16>) -> tensor<2x8x64xbf16>
// CHECK: train.sp_scatter %{{.*}} scope<0, mlp_fc2> : (tensor<2x8x64xbf16>) -> tensor<1x8x64xbf16>
module attributes {train.sequence_parallel, train.tensor_parallel = 2 : i64} {
  func.func @f(%t: tensor<2x8xi32>, %x: tensor<1x8x64xbf16>) -> (tensor<1x8xi32>, tensor<1x8x64xbf16>) {
    %ts = train.sp_shard %t scope<-1, embedding> : (tensor<2x8xi32>) -> tensor<1x8xi32>
    %g = train.sp_gather %x scope<0, mlp_fc1> : (tensor<1x8x64xbf16>) -> tensor<2x8x64xbf16>
    %s = train.sp_scatter %g scope<0, mlp_fc2> : (tensor<2x8x64xbf16>) -> tensor<1x8x64xbf16>
    return %ts, %s : tensor<1x8xi32>, tensor<1x8x64xbf16>
  }
}

// -----

module attributes {train.sequence_parallel, train.tensor_parallel = 2 : i64} {
  func.func @wrong_shard(%x: tensor<1x4x64xbf16>) {
    // expected-error @+1 {{shard 'tensor<1x4x64xbf16>' must be [1, 8, ...]: 16 tokens over 2 tensor-parallel ranks}}
    %g = train.sp_gather %x scope<0, mlp_fc1> : (tensor<1x4x64xbf16>) -> tensor<2x8x64xbf16>
    return
  }
}

// -----

module attributes {train.sequence_parallel, train.tensor_parallel = 2 : i64} {
  func.func @width(%x: tensor<1x8x32xbf16>) {
    // expected-error @+1 {{shard 'tensor<1x8x32xbf16>' and whole 'tensor<2x8x64xbf16>' differ in dimension 2}}
    %g = train.sp_gather %x scope<0, mlp_fc1> : (tensor<1x8x32xbf16>) -> tensor<2x8x64xbf16>
    return
  }
}

// -----

module attributes {train.tensor_parallel = 2 : i64} {
  func.func @no_sp(%x: tensor<2x8x64xbf16>) {
    // expected-error @+1 {{needs a module with 'train.sequence_parallel'}}
    %s = train.sp_scatter %x scope<0, mlp_fc2> : (tensor<2x8x64xbf16>) -> tensor<1x8x64xbf16>
    return
  }
}

// -----

// expected-error @+1 {{'train.sequence_parallel' is a unit module attribute of a module with 'train.tensor_parallel' of at least 2}}
module attributes {train.sequence_parallel} {
}

// -----

module attributes {train.tensor_parallel = 2 : i64} {
  // Segments past any tensor extent are refused before they are added up.
  // expected-error @+1 {{segment extent 4611686018427387904 is not a positive multiple of the tensor-parallel size 2}}
  train.param @w : tensor<32x64xbf16> init <normal, 0.0, 0.02> split 0 segments [4611686018427387904, 4611686018427387904, 64]
}

// -----

// A vocab-parallel embedding and LM head outside a tensor-parallel module.
func.func @vocab_parallel_alone(%t: tensor<2x4xi32>, %e: tensor<16x8xbf16>, %h: tensor<2x4x8xbf16>) {
  // expected-error @+1 {{'train.embedding' op vocab_parallel needs a module split over tensor-parallel ranks ('train.tensor_parallel' of at least 2), got none}}
  %y = train.embedding %t, %e scope<-1, embedding> {vocab_parallel} : (tensor<2x4xi32>, tensor<16x8xbf16>) -> tensor<2x4x8xbf16>
  return
}

// -----

module attributes {train.tensor_parallel = 1 : i64} {
  func.func @vocab_parallel_one_rank(%t: tensor<2x4xi32>, %e: tensor<16x8xbf16>, %h: tensor<2x4x8xbf16>) {
    // expected-error @+1 {{'train.lm_head_cross_entropy' op vocab_parallel needs a module split over tensor-parallel ranks ('train.tensor_parallel' of at least 2), got 1}}
    %l, %c = train.lm_head_cross_entropy %h, %e, %t scope<-1, lm_head> {vocab_parallel} : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>) -> (tensor<f32>, tensor<i32>)
    return
  }
}

// -----

// In a tensor-parallel module both take the rank's rows.
module attributes {train.tensor_parallel = 2 : i64} {
  func.func @vocab_parallel_ok(%t: tensor<2x4xi32>, %e: tensor<16x8xbf16>, %h: tensor<2x4x8xbf16>) {
    %y = train.embedding %t, %e scope<-1, embedding> {vocab_parallel} : (tensor<2x4xi32>, tensor<16x8xbf16>) -> tensor<2x4x8xbf16>
    %l, %c = train.lm_head_cross_entropy %h, %e, %t scope<-1, lm_head> {vocab_parallel} : (tensor<2x4x8xbf16>, tensor<16x8xbf16>, tensor<2x4xi32>) -> (tensor<f32>, tensor<i32>)
    return
  }
}
