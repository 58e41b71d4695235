// RUN: actplace-opt %s -train-print-memory-timeline -o /dev/null | FileCheck %s

// The workspace comes from the kernel library's query
// (attentionBackwardWorkspaceBytes), called with the op's shapes. At
// T = 2^30 (every size fits the kernel's int32 args) the dS tiles of the one
// (batch, head) pair are tiles (tiles + 1) / 2 * 64 * 64 * 2 bytes with
// tiles = 2^24: 2^60 + 2^36, plus D = 2^32: more than the 2^56 bytes a plan
// states at most, so the workspace is the cap (the query's 64-bit sum does
// not wrap; train-print-memory-timeline-huge-workspace.mlir has a T beyond
// int32).

// CHECK: workspace max: 72057594037927936 bytes
// CHECK: peak breakdown: params=0 grads=0 optimizer=0 activations={{[0-9]+}} workspace=72057594037927936

module attributes {train.micro_batches = 1 : i64} {
  func.func @train_step(%t: tensor<1x1x8xi32>, %l: tensor<1x1x8xi32>, %c: tensor<f32>, %k: tensor<i32>,
                        %q: tensor<1x1073741824x1x16xbf16>, %lse: tensor<1x1x1073741824xf32>) -> (tensor<f32>, tensor<i32>) {
    %a, %b = train.microbatch_loop %t, %l : (tensor<1x1x8xi32>, tensor<1x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%tok: tensor<1x8xi32>, %lab: tensor<1x8xi32>):
      %dq, %dk, %dv = train.attention_grad %q, %q, %q, %q, %lse, %q scope<0, core_attn> {scale = 0.25 : f64}
          : (tensor<1x1073741824x1x16xbf16>, tensor<1x1073741824x1x16xbf16>, tensor<1x1073741824x1x16xbf16>, tensor<1x1073741824x1x16xbf16>, tensor<1x1x1073741824xf32>, tensor<1x1073741824x1x16xbf16>)
          -> (tensor<1x1073741824x1x16xbf16>, tensor<1x1073741824x1x16xbf16>, tensor<1x1073741824x1x16xbf16>)
      train.yield %c, %k : tensor<f32>, tensor<i32>
    }
    return %a, %b : tensor<f32>, tensor<i32>
  }
}
