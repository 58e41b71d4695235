// RUN: actplace-opt %s --verify-roundtrip | FileCheck %s
// RUN: actplace-opt %s -mlir-print-op-generic | actplace-opt | FileCheck %s

// CHECK: module attributes {train.micro_batches = 4 : i64, train.model = "params"}
module attributes {train.micro_batches = 4 : i64, train.model = "params"} {
  // CHECK: train.param @w0 : tensor<8x4xbf16> init<normal, 0.000000e+00, 2.000000e-02>
  train.param @w0 : tensor<8x4xbf16> init<normal, 0.0, 0.02>
  // CHECK: train.param @n0 : tensor<4xbf16> init<zeros>
  train.param @n0 : tensor<4xbf16> init<zeros>
  // CHECK: train.param @n1 : tensor<4xf32> init<ones> frozen
  train.param @n1 : tensor<4xf32> init<ones> frozen
  // CHECK: train.param @a_log : tensor<2xf32> init<log_uniform, 1.000000e-02, 1.600000e+01>
  train.param @a_log : tensor<2xf32> init<log_uniform, 0.01, 16.0>
  // CHECK: train.param @u : tensor<3xf32> init<uniform, -1.000000e+00, 1.000000e+00>
  train.param @u : tensor<3xf32> init<uniform, -1.0, 1.0>
  // CHECK: train.param @model.layers.0.mlp.up_proj.weight : tensor<2x2xbf16>
  train.param @model.layers.0.mlp.up_proj.weight : tensor<2x2xbf16> init<normal, 0.0, 0.02>

  // CHECK-LABEL: func.func @refs
  func.func @refs() -> (tensor<8x4xbf16>, tensor<4xf32>) {
    // CHECK: train.param_ref @w0 : tensor<8x4xbf16>
    %0 = train.param_ref @w0 : tensor<8x4xbf16>
    // CHECK: train.param_ref @n1 : tensor<4xf32>
    %1 = train.param_ref @n1 : tensor<4xf32>
    return %0, %1 : tensor<8x4xbf16>, tensor<4xf32>
  }
}
