// RUN: actplace-opt %s -train-print-memory-timeline -o /dev/null | FileCheck %s
// RUN: actplace-opt %s -train-print-memory-timeline=per-op=true -o /dev/null | FileCheck %s --check-prefix=PEROP

// A hand-written step: embedding (V = 32, D = 16), one linear (16 -> 16),
// tied LM head + cross-entropy, their backward, then the optimizer.
// One microbatch is B = 1, T = 8 tokens.
//
// Constant categories:
//   params    = @embed 32*16*2 + @fc 16*16*2 + @frozen_scale 16*4
//             = 1024 + 512 + 64                                  = 1600
//   grads     = 4 * (512 + 256) trainable elements               = 3072
//   optimizer = 12 * (512 + 256)                                 = 9216
//   sum                                                          = 13888
//
// Activation buffers (bytes, [first op, last op]):
//   %t tokens 1x8xi32  32 [#0, #7]   %l labels 32 [#0, #5]   (scope inputs)
//   %h  1x8x16xbf16   256 [#1, #6]   %y 256 [#3, #5]
//   %ls, %n 4 + 4      [#4, #8] (yielded)   %lse 1x8xf32 32 [#4, #5]
//   %dy 256 [#5, #6]   %dh 256 [#6, #7]
// Workspace of the LM head ops (chunk c = min(4, 8) = 4 tokens, V = 32):
//   align256(4*32*2) (bf16 logits, overwritten by their gradient)
//   + align256(4*12) = 256 + 256 = 512 at #4 and #5.
// Peak: #5 = 13888 + (64 + 256 + 256 + 8 + 32 + 256) + 512 = 13888 + 872
// + 512 = 15272.

// CHECK: memory timeline of @train_step: 15 ops, body #0..#8, 2 microbatches
// CHECK: params: 1600 bytes (0.00 MiB)
// CHECK-NEXT: grads: 3072 bytes
// CHECK-NEXT: optimizer: 9216 bytes
// CHECK-NEXT: activations max: 872 bytes
// CHECK-NEXT: workspace max: 512 bytes
// CHECK-NEXT: pinned host max: 0 bytes
// CHECK-NEXT: peak: 15272 bytes (0.01 MiB) at train.lm_head_cross_entropy_grad #5
// CHECK-NEXT: peak breakdown: params=1600 grads=3072 optimizer=9216 activations=872 workspace=512
// CHECK-NEXT: peak with the workspace region: 15272 bytes (0.01 MiB)
// CHECK-NEXT: activation peak: 872 bytes (0.00 MiB) at train.lm_head_cross_entropy_grad #5
// CHECK-NEXT: activations at peak by scope:
// CHECK-NEXT:   inputs 64
// CHECK-NEXT:   L0.mlp_fc1 256
// CHECK-NEXT:   model.embedding 256
// CHECK-NEXT:   model.lm_head 296
// Six kernels of 4 us launch latency each; all are memory-bound here:
// 17352 bytes / 4e12 B/s = 0.0043 us. After the loop five launches and
// 9216 + 4 + 17408 + 8704 + 12 bytes; step = 2 * 24.0043 + 20.0088.
// CHECK-NEXT: body time: 24.004 us (busy 24.004 us, exposed 0.000 us)
// CHECK-NEXT: copies: d2h 0 x 0 bytes in 0.000 us, h2d 0 x 0 bytes in 0.000 us, last copy ends at 0.000 us
// CHECK-NEXT: step time: 68.018 us (2 x body + 20.009 us after the loop)
// CHECK-NOT: #0

// Per op: total = 13888 + act + ws. FLOPs: linear 2*8*16*16 = 4096; LM head
// 2*N*V*D = 2*8*32*16 = 8192, its grad 6*N*V*D = 24576; linear_grad dx + dW
// = 8192; embedding_grad one add per element of dh = 128; finalize_grads
// 3 * 768; adamw 12 * numel.
// Bytes: embedding 32 + 2*256; linear 256 + 512 + 256; LM head operands and
// results 256 + 1024 + 32 + 4 + 4 + 32 plus bf16 logits 4*N*V = 1024;
// its grad 256 + 1024 + 32 + 32 + 256 + N*V*12 = 3072 + main grad 8*512;
// linear_grad dy 256 + W 512 + dx 256 + x 256 + main grad 8*256;
// embedding_grad 32 + 256 + 8*128; finalize_grads 12*768;
// adamw numel*(24 + 4 + 4 + 2).
// PEROP: #0 train.param_ref - total=13952 act=64 ws=0 host=0 flops=0 bytes=0 dur=0.000 start=0.000{{$}}
// PEROP-NEXT: #1 train.embedding model.embedding total=14208 act=320 ws=0 host=0 flops=0 bytes=544 dur=4.000 start=0.000{{$}}
// PEROP-NEXT: #2 train.param_ref - total=14208 act=320 ws=0 host=0 flops=0 bytes=0 dur=0.000 start=4.000{{$}}
// PEROP-NEXT: #3 train.linear L0.mlp_fc1 total=14464 act=576 ws=0 host=0 flops=4096 bytes=1024 dur=4.000 start=4.000{{$}}
// PEROP-NEXT: #4 train.lm_head_cross_entropy model.lm_head total=15016 act=616 ws=512 host=0 flops=8192 bytes=2376 dur=4.001 start=8.000{{$}}
// PEROP-NEXT: #5 train.lm_head_cross_entropy_grad model.lm_head total=15272 act=872 ws=512 host=0 flops=24576 bytes=8768 dur=4.002 start=12.001{{$}}
// PEROP-NEXT: #6 train.linear_grad L0.mlp_fc1 total=14696 act=808 ws=0 host=0 flops=8192 bytes=3328 dur=4.001 start=16.003{{$}}
// PEROP-NEXT: #7 train.embedding_grad model.embedding total=14184 act=296 ws=0 host=0 flops=128 bytes=1312 dur=4.000 start=20.004{{$}}
// PEROP-NEXT: #8 train.yield - total=13896 act=8 ws=0 host=0 flops=0 bytes=0 dur=0.000 start=24.004{{$}}
// PEROP-NEXT: #9 train.finalize_grads - total=13888 act=0 ws=0 host=0 flops=2304 bytes=9216 dur=4.002{{$}}
// PEROP-NEXT: #10 train.lr_schedule - total=13888 act=0 ws=0 host=0 flops=0 bytes=4 dur=4.000{{$}}
// PEROP-NEXT: #11 train.adamw - total=13888 act=0 ws=0 host=0 flops=6144 bytes=17408 dur=4.004{{$}}
// PEROP-NEXT: #12 train.adamw - total=13888 act=0 ws=0 host=0 flops=3072 bytes=8704 dur=4.002{{$}}
// PEROP-NEXT: #13 train.loss_mean - total=13888 act=0 ws=0 host=0 flops=0 bytes=12 dur=4.000{{$}}
// PEROP-NEXT: #14 func.return - total=13888 act=0 ws=0 host=0 flops=0 bytes=0 dur=0.000{{$}}
// PEROP-NOT: copy

module attributes {train.micro_batches = 2 : i64} {
  train.param @embed : tensor<32x16xbf16> init<normal, 0.0, 0.02>
  train.param @fc : tensor<16x16xbf16> init<normal, 0.0, 0.02>
  train.param @frozen_scale : tensor<16xf32> init<ones> frozen
  func.func @train_step(%tok: tensor<2x1x8xi32>, %lab: tensor<2x1x8xi32>) -> (tensor<f32>, tensor<f32>) {
    %loss, %count = train.microbatch_loop %tok, %lab : (tensor<2x1x8xi32>, tensor<2x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x8xi32>, %l: tensor<1x8xi32>):
      %e = train.param_ref @embed : tensor<32x16xbf16>
      %h = train.embedding %t, %e scope<-1, embedding> : (tensor<1x8xi32>, tensor<32x16xbf16>) -> tensor<1x8x16xbf16>
      %w = train.param_ref @fc : tensor<16x16xbf16>
      %y = train.linear %h, %w scope<0, mlp_fc1> : (tensor<1x8x16xbf16>, tensor<16x16xbf16>) -> tensor<1x8x16xbf16>
      %ls, %n, %lse = train.lm_head_cross_entropy %y, %e, %l scope<-1, lm_head> {chunk_tokens = 4 : i64} : (tensor<1x8x16xbf16>, tensor<32x16xbf16>, tensor<1x8xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x8xf32>)
      %dy = train.lm_head_cross_entropy_grad %y, %e, %l, %lse scope<-1, lm_head> {chunk_tokens = 4 : i64, weight_grad = @embed} : (tensor<1x8x16xbf16>, tensor<32x16xbf16>, tensor<1x8xi32>, tensor<1x8xf32>) -> tensor<1x8x16xbf16>
      %dh = train.linear_grad %h, %w, %dy scope<0, mlp_fc1> {weight_grad = @fc} : (tensor<1x8x16xbf16>, tensor<16x16xbf16>, tensor<1x8x16xbf16>) -> tensor<1x8x16xbf16>
      train.embedding_grad %t, %dh scope<-1, embedding> {weight_grad = @embed} : (tensor<1x8xi32>, tensor<1x8x16xbf16>) -> ()
      train.yield %ls, %n : tensor<f32>, tensor<i32>
    }
    %norm = train.finalize_grads %count {max_norm = 1.0 : f64} : (tensor<i32>) -> tensor<f32>
    %lr = train.lr_schedule {max_lr = 3.0e-04 : f64, min_lr = 3.0e-05 : f64, total_steps = 100 : i64, warmup_steps = 10 : i64} : tensor<f32>
    train.adamw @embed, %lr {weight_decay = 0.1 : f64} : tensor<f32>
    train.adamw @fc, %lr {weight_decay = 0.1 : f64} : tensor<f32>
    %mean = train.loss_mean %loss, %count : (tensor<f32>, tensor<i32>) -> tensor<f32>
    return %mean, %norm : tensor<f32>, tensor<f32>
  }
}
