// RUN: actplace-opt %s -train-print-memory-timeline -o /dev/null | FileCheck %s

// The attention backward's dS tiles grow with T^2: at T = 2^40 (a q of 2^41
// bytes, within the dialect's 2^48-byte limit) they need about 2^80 bytes,
// which wrapped int64 into a small, wrong workspace. Workspaces now saturate
// at 2^56 bytes, more than any device has, and the peak adds up.

// CHECK: workspace max: 72057594037927936 bytes
// CHECK: peak: {{[0-9]+}} bytes
// CHECK-SAME: at train.attention_grad #0
// CHECK: peak breakdown: params=0 grads=0 optimizer=0 activations={{[0-9]+}} workspace=72057594037927936

module attributes {train.micro_batches = 1 : i64} {
  func.func @train_step(%t: tensor<1x1x8xi32>, %l: tensor<1x1x8xi32>, %c: tensor<f32>, %k: tensor<i32>,
                        %q: tensor<1x1099511627776x1x16xbf16>, %lse: tensor<1x1x1099511627776xf32>) -> (tensor<f32>, tensor<i32>) {
    %a, %b = train.microbatch_loop %t, %l : (tensor<1x1x8xi32>, tensor<1x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%tok: tensor<1x8xi32>, %lab: tensor<1x8xi32>):
      %dq, %dk, %dv = train.attention_grad %q, %q, %q, %q, %lse, %q scope<0, core_attn> {scale = 0.25 : f64}
          : (tensor<1x1099511627776x1x16xbf16>, tensor<1x1099511627776x1x16xbf16>, tensor<1x1099511627776x1x16xbf16>, tensor<1x1099511627776x1x16xbf16>, tensor<1x1x1099511627776xf32>, tensor<1x1099511627776x1x16xbf16>)
          -> (tensor<1x1099511627776x1x16xbf16>, tensor<1x1099511627776x1x16xbf16>, tensor<1x1099511627776x1x16xbf16>)
      train.yield %c, %k : tensor<f32>, tensor<i32>
    }
    return %a, %b : tensor<f32>, tensor<i32>
  }
}
