// RUN: split-file %s %t
// RUN: actplace-opt %t/keep.mlir -train-print-memory-timeline -o /dev/null | FileCheck %s --check-prefix=KEEP
// RUN: actplace-opt %t/placed.mlir -train-print-memory-timeline -o /dev/null | FileCheck %s --check-prefix=PLACED
// RUN: actplace-opt %t/placed.mlir -train-print-memory-timeline=per-op=true -o /dev/null | FileCheck %s --check-prefix=PLACED-OPS
// RUN: actplace-opt %t/early.mlir -train-print-memory-timeline -o /dev/null | FileCheck %s --check-prefix=EARLY

// One body three ways: no placement (keep), %a offloaded after its producer
// and reloaded right before its backward consumer (placed), and reloaded one
// op earlier so the copy hides under the LM-head backward (early).
// B = 1, T = 64, D = 64, V = 64; fc1 64 -> 32, fc2 32 -> 64.
//
// Constants: params 8192 + 4096 + 4096 = 16384; 8192 trainable elements:
// grads 4 * 8192 = 32768, optimizer 12 * 8192 = 98304; sum 147456.
// LM-head workspace (c = 64 tokens, V = 64): bf16 logits 8192 + 768 = 8960.
//
// keep: at the LM-head backward (#7) live are the tokens and labels
// (256 + 256), %h 8192, %a 4096, %b 8192, loss and count 8, lse 256,
// %db 8192 = 29448; total 147456 + 29448 + 8960 = 185864.
// KEEP: activations max: 29448 bytes
// KEEP: peak: 185864 bytes (0.18 MiB) at train.lm_head_cross_entropy_grad #7
// KEEP: activation peak: 29448 bytes (0.03 MiB) at train.lm_head_cross_entropy_grad #7
// KEEP-NEXT: activations at peak by scope:
// KEEP-NEXT:   inputs 512
// KEEP-NEXT:   L0.mlp_fc1 4096
// KEEP-NEXT:   L0.mlp_fc2 8192
// KEEP-NEXT:   model.embedding 8192
// KEEP-NEXT:   model.lm_head 8456
// KEEP-NEXT: body time:
// KEEP-NOT: {{^}}exposed

// placed: %a (1x64x32xbf16 = 4096 bytes) leaves the device once its D2H
// (4096 B / 55e9 B/s = 0.074 us, issued at 8.008 us) has ended, i.e. before
// the LM head starts at 12.012 us; it is back from the reload (#9) to its
// consumer (#11). The activation peak is the keep peak minus exactly %a:
// 29448 - 4096 = 25352 (and the reload region, 256 + 8192 + 8 + 8192 +
// 4096 + 4096 = 24840 at #11, stays below it).
// PLACED: pinned host max: 4096 bytes
// PLACED: peak: 181768 bytes (0.17 MiB) at train.lm_head_cross_entropy_grad #8
// PLACED: activation peak: 25352 bytes (0.02 MiB) at train.lm_head_cross_entropy_grad #8
// PLACED-NEXT: activations at peak by scope:
// PLACED-NEXT:   inputs 512
// PLACED-NEXT:   L0.mlp_fc2 8192
// PLACED-NEXT:   model.embedding 8192
// PLACED-NEXT:   model.lm_head 8456
// The reload is issued where it stands, right before its wait, so the whole
// H2D (0.074 us) is exposed. Busy time: embedding 4.00416, linears 4.004096
// each, LM head 4.008322 (33288 bytes), its grad 4.026752 (107008 bytes),
// linear_grads 4.009216 and 4.01024, embedding_grad 4.010304 = 32.077 us.
// PLACED-NEXT: body time: 32.152 us (busy 32.077 us, exposed 0.074 us)
// PLACED-NEXT: copies: d2h 1 x 4096 bytes in 0.074 us, h2d 1 x 4096 bytes in 0.074 us, last copy ends at 20.122 us
// PLACED-NEXT: exposed L0.mlp_fc1 0.074 us

// PLACED-OPS: #3 train.linear L0.mlp_fc1 total=160256 act=12800 ws=0 host=0
// The D2H is in flight while fc2 reads %a: still on the device.
// PLACED-OPS-NEXT: #4 train.offload L0.mlp_fc1 total=160256 act=12800 ws=0 host=4096
// PLACED-OPS-NEXT: #5 train.param_ref - total=160256 act=12800 ws=0 host=4096
// PLACED-OPS-NEXT: #6 train.linear L0.mlp_fc2 total=168448 act=20992 ws=0 host=4096
// %a is gone from here on: 512 + 8192 + 8192 + 8 + 256.
// PLACED-OPS-NEXT: #7 train.lm_head_cross_entropy model.lm_head total=173576 act=17160 ws=8960 host=4096
// PLACED-OPS-NEXT: #8 train.lm_head_cross_entropy_grad model.lm_head total=181768 act=25352 ws=8960 host=4096
// The reload's buffer: 256 + 8192 + 8 + 8192 + 4096.
// PLACED-OPS-NEXT: #9 train.reload L0.mlp_fc1 total=168200 act=20744 ws=0 host=4096 flops=0 bytes=0 dur=0.000 start=20.047{{$}}
// The pinned slot is free once the H2D has ended (before the wait resumes).
// PLACED-OPS-NEXT: #10 train.wait L0.mlp_fc1 total=168200 act=20744 ws=0 host=0 flops=0 bytes=0 dur=0.000 start=20.122 stall=0.074{{$}}
// PLACED-OPS-NEXT: #11 train.linear_grad L0.mlp_fc2 total=172296 act=24840 ws=0 host=0
// PLACED-OPS: copy d2h L0.mlp_fc1 #4 bytes=4096 issue=8.008 start=8.008 end=8.083
// PLACED-OPS-NEXT: copy h2d L0.mlp_fc1 #9 bytes=4096 issue=20.047 start=20.047 end=20.122

// early: the H2D (issued at 16.021 us) ends under the LM-head backward, so
// nothing is exposed, but %a is back on the device during that op: the peak
// is the keep peak again.
// EARLY: peak: 185864 bytes (0.18 MiB) at train.lm_head_cross_entropy_grad #9
// EARLY: activation peak: 29448 bytes (0.03 MiB) at train.lm_head_cross_entropy_grad #9
// EARLY: body time: 32.077 us (busy 32.077 us, exposed 0.000 us)
// EARLY-NOT: {{^}}exposed

//--- keep.mlir
module attributes {train.micro_batches = 1 : i64} {
  train.param @embed : tensor<64x64xbf16> init<normal, 0.0, 0.02>
  train.param @fc1 : tensor<32x64xbf16> init<normal, 0.0, 0.02>
  train.param @fc2 : tensor<64x32xbf16> init<normal, 0.0, 0.02>
  func.func @train_step(%tok: tensor<1x1x64xi32>, %lab: tensor<1x1x64xi32>) -> tensor<f32> {
    %loss, %count = train.microbatch_loop %tok, %lab : (tensor<1x1x64xi32>, tensor<1x1x64xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x64xi32>, %l: tensor<1x64xi32>):
      %e = train.param_ref @embed : tensor<64x64xbf16>
      %h = train.embedding %t, %e scope<-1, embedding> : (tensor<1x64xi32>, tensor<64x64xbf16>) -> tensor<1x64x64xbf16>
      %w1 = train.param_ref @fc1 : tensor<32x64xbf16>
      %a = train.linear %h, %w1 scope<0, mlp_fc1> : (tensor<1x64x64xbf16>, tensor<32x64xbf16>) -> tensor<1x64x32xbf16>
      %w2 = train.param_ref @fc2 : tensor<64x32xbf16>
      %b = train.linear %a, %w2 scope<0, mlp_fc2> : (tensor<1x64x32xbf16>, tensor<64x32xbf16>) -> tensor<1x64x64xbf16>
      %ls, %n, %lse = train.lm_head_cross_entropy %b, %e, %l scope<-1, lm_head> : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x64xf32>)
      %db = train.lm_head_cross_entropy_grad %b, %e, %l, %lse scope<-1, lm_head> {weight_grad = @embed} : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>, tensor<1x64xf32>) -> tensor<1x64x64xbf16>
      %da = train.linear_grad %a, %w2, %db scope<0, mlp_fc2> {weight_grad = @fc2} : (tensor<1x64x32xbf16>, tensor<64x32xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x32xbf16>
      %dh = train.linear_grad %h, %w1, %da scope<0, mlp_fc1> {weight_grad = @fc1} : (tensor<1x64x64xbf16>, tensor<32x64xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x64xbf16>
      train.embedding_grad %t, %dh scope<-1, embedding> {weight_grad = @embed} : (tensor<1x64xi32>, tensor<1x64x64xbf16>) -> ()
      train.yield %ls, %n : tensor<f32>, tensor<i32>
    }
    %mean = train.loss_mean %loss, %count : (tensor<f32>, tensor<i32>) -> tensor<f32>
    return %mean : tensor<f32>
  }
}

//--- placed.mlir
module attributes {train.micro_batches = 1 : i64} {
  train.param @embed : tensor<64x64xbf16> init<normal, 0.0, 0.02>
  train.param @fc1 : tensor<32x64xbf16> init<normal, 0.0, 0.02>
  train.param @fc2 : tensor<64x32xbf16> init<normal, 0.0, 0.02>
  func.func @train_step(%tok: tensor<1x1x64xi32>, %lab: tensor<1x1x64xi32>) -> tensor<f32> {
    %loss, %count = train.microbatch_loop %tok, %lab : (tensor<1x1x64xi32>, tensor<1x1x64xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x64xi32>, %l: tensor<1x64xi32>):
      %e = train.param_ref @embed : tensor<64x64xbf16>
      %h = train.embedding %t, %e scope<-1, embedding> : (tensor<1x64xi32>, tensor<64x64xbf16>) -> tensor<1x64x64xbf16>
      %w1 = train.param_ref @fc1 : tensor<32x64xbf16>
      %a = train.linear %h, %w1 scope<0, mlp_fc1> : (tensor<1x64x64xbf16>, tensor<32x64xbf16>) -> tensor<1x64x32xbf16>
      %ha = train.offload %a scope<0, mlp_fc1> : (tensor<1x64x32xbf16>) -> !train.host<tensor<1x64x32xbf16>>
      %w2 = train.param_ref @fc2 : tensor<64x32xbf16>
      %b = train.linear %a, %w2 scope<0, mlp_fc2> : (tensor<1x64x32xbf16>, tensor<64x32xbf16>) -> tensor<1x64x64xbf16>
      %ls, %n, %lse = train.lm_head_cross_entropy %b, %e, %l scope<-1, lm_head> : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x64xf32>)
      %db = train.lm_head_cross_entropy_grad %b, %e, %l, %lse scope<-1, lm_head> {weight_grad = @embed} : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>, tensor<1x64xf32>) -> tensor<1x64x64xbf16>
      %ra = train.reload %ha scope<0, mlp_fc1> : (!train.host<tensor<1x64x32xbf16>>) -> tensor<1x64x32xbf16>
      %a2 = train.wait %ra scope<0, mlp_fc1> : (tensor<1x64x32xbf16>) -> tensor<1x64x32xbf16>
      %da = train.linear_grad %a2, %w2, %db scope<0, mlp_fc2> {weight_grad = @fc2} : (tensor<1x64x32xbf16>, tensor<64x32xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x32xbf16>
      %dh = train.linear_grad %h, %w1, %da scope<0, mlp_fc1> {weight_grad = @fc1} : (tensor<1x64x64xbf16>, tensor<32x64xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x64xbf16>
      train.embedding_grad %t, %dh scope<-1, embedding> {weight_grad = @embed} : (tensor<1x64xi32>, tensor<1x64x64xbf16>) -> ()
      train.yield %ls, %n : tensor<f32>, tensor<i32>
    }
    %mean = train.loss_mean %loss, %count : (tensor<f32>, tensor<i32>) -> tensor<f32>
    return %mean : tensor<f32>
  }
}

//--- early.mlir
module attributes {train.micro_batches = 1 : i64} {
  train.param @embed : tensor<64x64xbf16> init<normal, 0.0, 0.02>
  train.param @fc1 : tensor<32x64xbf16> init<normal, 0.0, 0.02>
  train.param @fc2 : tensor<64x32xbf16> init<normal, 0.0, 0.02>
  func.func @train_step(%tok: tensor<1x1x64xi32>, %lab: tensor<1x1x64xi32>) -> tensor<f32> {
    %loss, %count = train.microbatch_loop %tok, %lab : (tensor<1x1x64xi32>, tensor<1x1x64xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x64xi32>, %l: tensor<1x64xi32>):
      %e = train.param_ref @embed : tensor<64x64xbf16>
      %h = train.embedding %t, %e scope<-1, embedding> : (tensor<1x64xi32>, tensor<64x64xbf16>) -> tensor<1x64x64xbf16>
      %w1 = train.param_ref @fc1 : tensor<32x64xbf16>
      %a = train.linear %h, %w1 scope<0, mlp_fc1> : (tensor<1x64x64xbf16>, tensor<32x64xbf16>) -> tensor<1x64x32xbf16>
      %ha = train.offload %a scope<0, mlp_fc1> : (tensor<1x64x32xbf16>) -> !train.host<tensor<1x64x32xbf16>>
      %w2 = train.param_ref @fc2 : tensor<64x32xbf16>
      %b = train.linear %a, %w2 scope<0, mlp_fc2> : (tensor<1x64x32xbf16>, tensor<64x32xbf16>) -> tensor<1x64x64xbf16>
      %ls, %n, %lse = train.lm_head_cross_entropy %b, %e, %l scope<-1, lm_head> : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x64xf32>)
      %ra = train.reload %ha scope<0, mlp_fc1> : (!train.host<tensor<1x64x32xbf16>>) -> tensor<1x64x32xbf16>
      %db = train.lm_head_cross_entropy_grad %b, %e, %l, %lse scope<-1, lm_head> {weight_grad = @embed} : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>, tensor<1x64xf32>) -> tensor<1x64x64xbf16>
      %a2 = train.wait %ra scope<0, mlp_fc1> : (tensor<1x64x32xbf16>) -> tensor<1x64x32xbf16>
      %da = train.linear_grad %a2, %w2, %db scope<0, mlp_fc2> {weight_grad = @fc2} : (tensor<1x64x32xbf16>, tensor<64x32xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x32xbf16>
      %dh = train.linear_grad %h, %w1, %da scope<0, mlp_fc1> {weight_grad = @fc1} : (tensor<1x64x64xbf16>, tensor<32x64xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x64xbf16>
      train.embedding_grad %t, %dh scope<-1, embedding> {weight_grad = @embed} : (tensor<1x64xi32>, tensor<1x64x64xbf16>) -> ()
      train.yield %ls, %n : tensor<f32>, tensor<i32>
    }
    %mean = train.loss_mean %loss, %count : (tensor<f32>, tensor<i32>) -> tensor<f32>
    return %mean : tensor<f32>
  }
}
