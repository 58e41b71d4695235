// RUN: actplace-opt %s -train-print-memory-timeline -o /dev/null | FileCheck %s

// The workspace comes from the kernel library's query
// (gdnChunkBackwardWorkspaceBytes for the CUDA backend), called with the
// op's shapes. With dk = dv = 2^28 (every size fits the kernel's int32 args,
// every tensor the dialect's 2^48 bytes) the fp32 chunk states alone are
// B Hv NT dk dv 4 = 2^58 bytes: more than the 2^56 bytes a plan states at
// most, so the workspace is the cap (the query's 64-bit sum does not wrap;
// train-print-memory-timeline-huge-workspace.mlir has a T beyond int32). The
// attention backward cannot get there: past T = 16320 it keeps its scratch
// linear in T (kernels/workspace.cpp).

// CHECK: workspace max: 72057594037927936 bytes
// CHECK: peak breakdown: params=0 grads=0 optimizer=0 activations={{[0-9]+}} workspace=72057594037927936

module attributes {train.micro_batches = 1 : i64} {
  func.func @train_step(%t: tensor<1x1x8xi32>, %l: tensor<1x1x8xi32>, %c: tensor<f32>, %k: tensor<i32>,
                        %q: tensor<1x64x1x268435456xbf16>, %g: tensor<1x64x1xf32>, %b: tensor<1x64x1xbf16>, %tm: tensor<1x64x1x64xbf16>) -> (tensor<f32>, tensor<i32>) {
    %a, %r = train.microbatch_loop %t, %l : (tensor<1x1x8xi32>, tensor<1x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%tok: tensor<1x8xi32>, %lab: tensor<1x8xi32>):
      %dq, %dk, %dv, %dg, %db = train.gated_delta_rule_grad %q, %q, %q, %g, %b, %tm, %q scope<0, gdn_core_attn> {scale = 0.25 : f64}
          : (tensor<1x64x1x268435456xbf16>, tensor<1x64x1x268435456xbf16>, tensor<1x64x1x268435456xbf16>, tensor<1x64x1xf32>, tensor<1x64x1xbf16>, tensor<1x64x1x64xbf16>, tensor<1x64x1x268435456xbf16>)
          -> (tensor<1x64x1x268435456xbf16>, tensor<1x64x1x268435456xbf16>, tensor<1x64x1x268435456xbf16>, tensor<1x64x1xf32>, tensor<1x64x1xbf16>)
      train.yield %c, %k : tensor<f32>, tensor<i32>
    }
    return %a, %r : tensor<f32>, tensor<i32>
  }
}
