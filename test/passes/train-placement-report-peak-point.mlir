// RUN: split-file %s %t
// RUN: actplace-opt %t/placed.mlir -train-placement-report -o /dev/null | FileCheck %s --check-prefix=TEXT
// RUN: actplace-opt %t/placed.mlir -train-placement-report=report-format=json -o /dev/null | FileCheck %s --check-prefix=JSON
// RUN: actplace-opt %t/placed.mlir -train-print-memory-timeline -o /dev/null | FileCheck %s --check-prefix=TIMELINE
// RUN: actplace-opt %t/early.mlir -train-placement-report=profile=%t/slow-d2h.json -o /dev/null | FileCheck %s --check-prefix=EARLY

// The peak points of the placement report: at the op where the placed step
// peaks, the bytes of the same op in the step with placement undone, and the
// activations off the device there, which make up the difference.
//
// An MLP between the embedding and the tied LM head; B = 1, T = 64, D = 64,
// V = 64, gate/up 64 -> 32, down 32 -> 64. The gate projection %a
// (1x64x32xbf16 = 4096 bytes) is offloaded after its producer and reloaded
// for the backward; the SwiGLU output %m (4096 bytes) is recomputed from the
// reloaded %a and the kept %u right before the down projection's backward.
//
// Constants: params 8192 + 3 x 4096 = 20480; 10240 trainable elements:
// grads 40960, optimizer 122880; sum 184320. LM-head workspace 8960.
//
// Unplaced (offload, reload, wait and the clone gone; the down projection's
// backward reads %m, the SwiGLU backward %a): the peak is the LM-head
// backward (#10 there) with tokens and labels 512, %h 8192, %a 4096, %u 4096,
// %m 4096, %b 8192, loss and count 8, lse 256 and %db 8192 = 37640 bytes of
// activations: 184320 + 37640 + 8960 = 230920.
//
// Placed: %a left the device after the SwiGLU (#7, its last forward read;
// its 0.074 us D2H ended at 8.083 us, before the SwiGLU started at 12.012)
// and comes back at the reload (#12); the forward %m is dead after the down
// projection (#9) and comes back with the clone (#14). The LM-head backward
// (#11) is the placed peak: 37640 - 4096 - 4096 = 29448 of activations,
// 184320 + 29448 + 8960 = 222728. The difference, 8192 bytes, is exactly
// %a and %m.
// TEXT: predicted device peak: 230920 -> 222728 bytes
// TEXT: predicted device bytes at the placed peak #11 train.lm_head_cross_entropy_grad (model.lm_head): before 230920 (at #10 train.lm_head_cross_entropy_grad (model.lm_head)) -> after 222728 bytes, difference 8192 = off the device 8192 bytes (2 values) + other terms 0 bytes + unaccounted 0 bytes
// TEXT-NEXT: off the device: #3 train.linear#0 | L0.mlp_fc1 | 4096 bytes | offloaded | left after #7 train.swiglu (L0.mlp_act) | back at #12 train.reload (L0.mlp_act)
// TEXT-NEXT: off the device: #6 train.swiglu#0 | L0.mlp_act | 4096 bytes | recomputed | left after #9 train.linear (L0.mlp_fc2) | back at #14 train.swiglu (L0.mlp_act)
// The unplaced step peaks at the same op.
// TEXT-NEXT: predicted device bytes at the unplaced peak #11 train.lm_head_cross_entropy_grad (model.lm_head): before 230920 (at #10 train.lm_head_cross_entropy_grad (model.lm_head)) -> after 222728 bytes, difference 8192 = off the device 8192 bytes (2 values) + other terms 0 bytes + unaccounted 0 bytes
// TEXT-NOT: other term:

// JSON: "peak_points": {
// JSON-NEXT: "placed_peak": {
// JSON-NEXT: "bytes_after": 222728,
// JSON-NEXT: "bytes_before": 230920,
// JSON-NEXT: "difference_bytes": 8192,
// JSON-NEXT: "gap_after_op_before": null,
// JSON-NEXT: "off_device": [
// JSON-NEXT: {
// JSON-NEXT: "back_at": "#12 train.reload (L0.mlp_act)",
// JSON-NEXT: "bytes": 4096,
// JSON-NEXT: "kind": "offloaded",
// JSON-NEXT: "left_after": "#7 train.swiglu (L0.mlp_act)",
// JSON-NEXT: "scope": "L0.mlp_fc1",
// JSON-NEXT: "value": "#3 train.linear#0"
// JSON-NEXT: },
// JSON-NEXT: {
// JSON-NEXT: "back_at": "#14 train.swiglu (L0.mlp_act)",
// JSON-NEXT: "bytes": 4096,
// JSON-NEXT: "kind": "recomputed",
// JSON-NEXT: "left_after": "#9 train.linear (L0.mlp_fc2)",
// JSON-NEXT: "scope": "L0.mlp_act",
// JSON-NEXT: "value": "#6 train.swiglu#0"
// JSON-NEXT: }
// JSON-NEXT: ],
// JSON-NEXT: "off_device_bytes": 8192,
// JSON-NEXT: "op": "#11 train.lm_head_cross_entropy_grad (model.lm_head)",
// JSON-NEXT: "op_before": "#10 train.lm_head_cross_entropy_grad (model.lm_head)",
// JSON-NEXT: "other_terms": [],
// JSON-NEXT: "other_terms_bytes": 0,
// JSON-NEXT: "unaccounted_bytes": 0
// JSON-NEXT: },
// JSON-NEXT: "unplaced_peak": {

// The same values from the placed step alone (MemoryTimeline::offDeviceAt),
// named by their points in it.
// TIMELINE: peak: 222728 bytes (0.21 MiB) at train.lm_head_cross_entropy_grad #11
// TIMELINE: off the device at peak: 8192 bytes in 2 values
// TIMELINE-NEXT: train.linear #3#0 L0.mlp_fc1 4096 offloaded left after #7 back at #12
// TIMELINE-NEXT: train.swiglu #7#0 L0.mlp_act 4096 recomputed left after #9 back at #14

// early: the reload is issued before the LM-head backward, and the D2H runs
// at 1 MB/s (4.096 ms for %a), so %a is still on the device for its D2H
// when its reload's buffer is allocated (#11): at the LM-head backward (#12)
// it is held twice. Only %m is off the device (+4096); the second copy of
// %a is named as another term (-4096); the placed peak equals the unplaced
// one, 184320 + 37640 + 8960 = 230920.
// EARLY: predicted device peak: 230920 -> 230920 bytes
// EARLY: predicted device bytes at the placed peak #12 train.lm_head_cross_entropy_grad (model.lm_head): before 230920 (at #10 train.lm_head_cross_entropy_grad (model.lm_head)) -> after 230920 bytes, difference 0 = off the device 4096 bytes (1 values) + other terms -4096 bytes + unaccounted 0 bytes
// EARLY-NEXT: off the device: #6 train.swiglu#0 | L0.mlp_act | 4096 bytes | recomputed | left after #9 train.linear (L0.mlp_fc2) | back at #14 train.swiglu (L0.mlp_act)
// EARLY-NEXT: other term: reloaded before the original left | #3 train.linear#0 | L0.mlp_fc1 | -4096 bytes

//--- slow-d2h.json
{"d2hBandwidth": 1e6}

//--- placed.mlir
module attributes {train.micro_batches = 1 : i64} {
  train.param @embed : tensor<64x64xbf16> init<normal, 0.0, 0.02>
  train.param @gate : tensor<32x64xbf16> init<normal, 0.0, 0.02>
  train.param @up : tensor<32x64xbf16> init<normal, 0.0, 0.02>
  train.param @down : tensor<64x32xbf16> init<normal, 0.0, 0.02>
  func.func @train_step(%tok: tensor<1x1x64xi32>, %lab: tensor<1x1x64xi32>) -> tensor<f32> {
    %loss, %count = train.microbatch_loop %tok, %lab : (tensor<1x1x64xi32>, tensor<1x1x64xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x64xi32>, %l: tensor<1x64xi32>):
      %e = train.param_ref @embed : tensor<64x64xbf16>
      %h = train.embedding %t, %e scope<-1, embedding> : (tensor<1x64xi32>, tensor<64x64xbf16>) -> tensor<1x64x64xbf16>
      %wg = train.param_ref @gate : tensor<32x64xbf16>
      %a = train.linear %h, %wg scope<0, mlp_fc1> : (tensor<1x64x64xbf16>, tensor<32x64xbf16>) -> tensor<1x64x32xbf16>
      %ha = train.offload %a scope<0, mlp_act> : (tensor<1x64x32xbf16>) -> !train.host<tensor<1x64x32xbf16>>
      %wu = train.param_ref @up : tensor<32x64xbf16>
      %u = train.linear %h, %wu scope<0, mlp_fc1> : (tensor<1x64x64xbf16>, tensor<32x64xbf16>) -> tensor<1x64x32xbf16>
      %m = train.swiglu %a, %u scope<0, mlp_act> : (tensor<1x64x32xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x32xbf16>
      %wd = train.param_ref @down : tensor<64x32xbf16>
      %b = train.linear %m, %wd scope<0, mlp_fc2> : (tensor<1x64x32xbf16>, tensor<64x32xbf16>) -> tensor<1x64x64xbf16>
      %ls, %n, %lse = train.lm_head_cross_entropy %b, %e, %l scope<-1, lm_head> : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x64xf32>)
      %db = train.lm_head_cross_entropy_grad %b, %e, %l, %lse scope<-1, lm_head> {weight_grad = @embed} : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>, tensor<1x64xf32>) -> tensor<1x64x64xbf16>
      %ra = train.reload %ha scope<0, mlp_act> : (!train.host<tensor<1x64x32xbf16>>) -> tensor<1x64x32xbf16>
      %a2 = train.wait %ra scope<0, mlp_act> : (tensor<1x64x32xbf16>) -> tensor<1x64x32xbf16>
      %m2 = train.swiglu %a2, %u scope<0, mlp_act> {train.recomputed} : (tensor<1x64x32xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x32xbf16>
      %dm = train.linear_grad %m2, %wd, %db scope<0, mlp_fc2> {weight_grad = @down} : (tensor<1x64x32xbf16>, tensor<64x32xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x32xbf16>
      %da, %du = train.swiglu_grad %a2, %u, %dm scope<0, mlp_act> : (tensor<1x64x32xbf16>, tensor<1x64x32xbf16>, tensor<1x64x32xbf16>) -> (tensor<1x64x32xbf16>, tensor<1x64x32xbf16>)
      %dh1 = train.linear_grad %h, %wg, %da scope<0, mlp_fc1> {weight_grad = @gate} : (tensor<1x64x64xbf16>, tensor<32x64xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x64xbf16>
      %dh2 = train.linear_grad %h, %wu, %du scope<0, mlp_fc1> {weight_grad = @up} : (tensor<1x64x64xbf16>, tensor<32x64xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x64xbf16>
      %dh = train.add %dh1, %dh2 scope<0, mlp_fc1> : (tensor<1x64x64xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x64xbf16>
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
  train.param @gate : tensor<32x64xbf16> init<normal, 0.0, 0.02>
  train.param @up : tensor<32x64xbf16> init<normal, 0.0, 0.02>
  train.param @down : tensor<64x32xbf16> init<normal, 0.0, 0.02>
  func.func @train_step(%tok: tensor<1x1x64xi32>, %lab: tensor<1x1x64xi32>) -> tensor<f32> {
    %loss, %count = train.microbatch_loop %tok, %lab : (tensor<1x1x64xi32>, tensor<1x1x64xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x64xi32>, %l: tensor<1x64xi32>):
      %e = train.param_ref @embed : tensor<64x64xbf16>
      %h = train.embedding %t, %e scope<-1, embedding> : (tensor<1x64xi32>, tensor<64x64xbf16>) -> tensor<1x64x64xbf16>
      %wg = train.param_ref @gate : tensor<32x64xbf16>
      %a = train.linear %h, %wg scope<0, mlp_fc1> : (tensor<1x64x64xbf16>, tensor<32x64xbf16>) -> tensor<1x64x32xbf16>
      %ha = train.offload %a scope<0, mlp_act> : (tensor<1x64x32xbf16>) -> !train.host<tensor<1x64x32xbf16>>
      %wu = train.param_ref @up : tensor<32x64xbf16>
      %u = train.linear %h, %wu scope<0, mlp_fc1> : (tensor<1x64x64xbf16>, tensor<32x64xbf16>) -> tensor<1x64x32xbf16>
      %m = train.swiglu %a, %u scope<0, mlp_act> : (tensor<1x64x32xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x32xbf16>
      %wd = train.param_ref @down : tensor<64x32xbf16>
      %b = train.linear %m, %wd scope<0, mlp_fc2> : (tensor<1x64x32xbf16>, tensor<64x32xbf16>) -> tensor<1x64x64xbf16>
      %ls, %n, %lse = train.lm_head_cross_entropy %b, %e, %l scope<-1, lm_head> : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x64xf32>)
      %ra = train.reload %ha scope<0, mlp_act> : (!train.host<tensor<1x64x32xbf16>>) -> tensor<1x64x32xbf16>
      %db = train.lm_head_cross_entropy_grad %b, %e, %l, %lse scope<-1, lm_head> {weight_grad = @embed} : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>, tensor<1x64xf32>) -> tensor<1x64x64xbf16>
      %a2 = train.wait %ra scope<0, mlp_act> : (tensor<1x64x32xbf16>) -> tensor<1x64x32xbf16>
      %m2 = train.swiglu %a2, %u scope<0, mlp_act> {train.recomputed} : (tensor<1x64x32xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x32xbf16>
      %dm = train.linear_grad %m2, %wd, %db scope<0, mlp_fc2> {weight_grad = @down} : (tensor<1x64x32xbf16>, tensor<64x32xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x32xbf16>
      %da, %du = train.swiglu_grad %a2, %u, %dm scope<0, mlp_act> : (tensor<1x64x32xbf16>, tensor<1x64x32xbf16>, tensor<1x64x32xbf16>) -> (tensor<1x64x32xbf16>, tensor<1x64x32xbf16>)
      %dh1 = train.linear_grad %h, %wg, %da scope<0, mlp_fc1> {weight_grad = @gate} : (tensor<1x64x64xbf16>, tensor<32x64xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x64xbf16>
      %dh2 = train.linear_grad %h, %wu, %du scope<0, mlp_fc1> {weight_grad = @up} : (tensor<1x64x64xbf16>, tensor<32x64xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x64xbf16>
      %dh = train.add %dh1, %dh2 scope<0, mlp_fc1> : (tensor<1x64x64xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x64xbf16>
      train.embedding_grad %t, %dh scope<-1, embedding> {weight_grad = @embed} : (tensor<1x64xi32>, tensor<1x64x64xbf16>) -> ()
      train.yield %ls, %n : tensor<f32>, tensor<i32>
    }
    %mean = train.loss_mean %loss, %count : (tensor<f32>, tensor<i32>) -> tensor<f32>
    return %mean : tensor<f32>
  }
}
