// RUN: actplace-opt %s | FileCheck %s
// RUN: actplace-opt %s | actplace-opt | FileCheck %s
// RUN: actplace-opt %s --mlir-print-op-generic | actplace-opt | FileCheck %s

// One op of every kind, printed back in the custom form.

// CHECK-LABEL: exec.step @train_step attributes {arena_bytes = 4096 : i64}
exec.step @train_step attributes {arena_bytes = 4096 : i64} {
  // CHECK: %[[W:.*]] = exec.persistent "w" weight offset 0 bytes 256 : !exec.buffer<tensor<4x8xbf16>>
  %w = exec.persistent "w" weight offset 0 bytes 256 : !exec.buffer<tensor<4x8xbf16>>
  // CHECK: %[[G:.*]] = exec.persistent "w" main_grad offset 256 bytes 256 : !exec.buffer<tensor<4x8xf32>>
  %g = exec.persistent "w" main_grad offset 256 bytes 256 : !exec.buffer<tensor<4x8xf32>>
  // CHECK: %[[L:.*]] = exec.persistent "loss_sum" state bytes 256 : !exec.buffer<tensor<f32>>
  %l = exec.persistent "loss_sum" state bytes 256 : !exec.buffer<tensor<f32>>
  // CHECK: exec.microbatch_loop count 2 attributes {max_inflight = 1 : i64} {
  exec.microbatch_loop count 2 attributes {max_inflight = 1 : i64} {
    // CHECK: %[[T:.*]] = exec.buffer bytes 256 : !exec.buffer<tensor<1x8xi32>>
    %t = exec.buffer bytes 256 : !exec.buffer<tensor<1x8xi32>>
    // CHECK: exec.load_input "tokens" to %[[T]] : !exec.buffer<tensor<1x8xi32>>
    exec.load_input "tokens" to %t : !exec.buffer<tensor<1x8xi32>>
    // CHECK: exec.load_input "labels" to %{{.*}} tp_shard : !exec.buffer<tensor<1x8xi32>>
    %ls = exec.buffer bytes 256 : !exec.buffer<tensor<1x8xi32>>
    exec.load_input "labels" to %ls tp_shard : !exec.buffer<tensor<1x8xi32>>
    // CHECK: %[[X:.*]] = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<1x8x4xbf16>>
    %x = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<1x8x4xbf16>>
    // CHECK: exec.kernel "train.embedding" ins(%[[T]], %[[W]] : !exec.buffer<tensor<1x8xi32>>, !exec.buffer<tensor<4x8xbf16>>) outs(%[[X]] : !exec.buffer<tensor<1x8x4xbf16>>) workspace 0 args {scope = #train.scope<-1, embedding>}
    exec.kernel "train.embedding" ins(%t, %w : !exec.buffer<tensor<1x8xi32>>, !exec.buffer<tensor<4x8xbf16>>) outs(%x : !exec.buffer<tensor<1x8x4xbf16>>) workspace 0 args {scope = #train.scope<-1, embedding>}
    // CHECK: %[[V:.*]] = exec.view %[[X]] : !exec.buffer<tensor<1x8x4xbf16>> to !exec.buffer<tensor<1x8x2x2xbf16>>
    %v = exec.view %x : !exec.buffer<tensor<1x8x4xbf16>> to !exec.buffer<tensor<1x8x2x2xbf16>>
    // CHECK: %[[S:.*]] = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<1x8x2x2xbf16>>
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<1x8x2x2xbf16>>
    // CHECK: %[[E0:.*]] = exec.event_create : !exec.event
    %e0 = exec.event_create : !exec.event
    // CHECK: exec.record %[[E0]] on compute
    exec.record %e0 on compute
    // CHECK: exec.wait %[[E0]] on d2h
    exec.wait %e0 on d2h
    // CHECK: exec.d2h %[[V]] to %[[S]] on d2h record %[[E1:.*]] : !exec.buffer<tensor<1x8x2x2xbf16>> to !exec.host<tensor<1x8x2x2xbf16>>
    %e1 = exec.event_create : !exec.event
    exec.d2h %v to %s on d2h record %e1 : !exec.buffer<tensor<1x8x2x2xbf16>> to !exec.host<tensor<1x8x2x2xbf16>>
    %e2 = exec.event_create : !exec.event
    exec.wait %e1 on h2d
    %r = exec.buffer offset 768 bytes 256 : !exec.buffer<tensor<1x8x2x2xbf16>>
    // CHECK: exec.h2d %[[S]] to %{{.*}} on h2d record %[[E2:.*]] : !exec.host<tensor<1x8x2x2xbf16>> to !exec.buffer<tensor<1x8x2x2xbf16>>
    exec.h2d %s to %r on h2d record %e2 : !exec.host<tensor<1x8x2x2xbf16>> to !exec.buffer<tensor<1x8x2x2xbf16>>
    // CHECK: exec.pool_release %[[S]] after %[[E2]] : !exec.host<tensor<1x8x2x2xbf16>>
    exec.pool_release %s after %e2 : !exec.host<tensor<1x8x2x2xbf16>>
    exec.wait %e2 on compute
    // A tensor-parallel sum of one microbatch's bf16 values, every microbatch.
    // CHECK: exec.all_reduce %{{.*}} over "tp" on compute : !exec.buffer<tensor<1x8x4xbf16>>
    // CHECK: exec.kernel "train.embedding_grad" ins(%{{.*}}, %{{.*}} : {{.*}}) outs(%[[G]] : !exec.buffer<tensor<4x8xf32>>) workspace 1024 args {weight_grad = @w}
    %rv = exec.view %r : !exec.buffer<tensor<1x8x2x2xbf16>> to !exec.buffer<tensor<1x8x4xbf16>>
    exec.all_reduce %rv over "tp" on compute : !exec.buffer<tensor<1x8x4xbf16>>
    exec.kernel "train.embedding_grad" ins(%t, %rv : !exec.buffer<tensor<1x8xi32>>, !exec.buffer<tensor<1x8x4xbf16>>) outs(%g : !exec.buffer<tensor<4x8xf32>>) workspace 1024 args {weight_grad = @w}
    // CHECK: exec.all_reduce %[[G]] over "dp" on comm last_microbatch : !exec.buffer<tensor<4x8xf32>>
    exec.all_reduce %g over "dp" on comm last_microbatch : !exec.buffer<tensor<4x8xf32>>
    // CHECK: %[[FULL:.*]] = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    %full = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    // CHECK: exec.all_gather %[[W]] into %[[FULL]] over "dp" on comm : !exec.buffer<tensor<4x8xbf16>> to !exec.buffer<tensor<64xbf16>>
    exec.all_gather %w into %full over "dp" on comm : !exec.buffer<tensor<4x8xbf16>> to !exec.buffer<tensor<64xbf16>>
    // CHECK: %[[GF:.*]] = exec.buffer bytes 256 : !exec.buffer<tensor<64xf32>>
    %gfull = exec.buffer bytes 256 : !exec.buffer<tensor<64xf32>>
    // CHECK: exec.reduce_scatter %[[GF]] into %[[G]] over "dp" on compute : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<4x8xf32>>
    exec.reduce_scatter %gfull into %g over "dp" on compute : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<4x8xf32>>
    // CHECK: exec.zero %[[GF]] on compute : !exec.buffer<tensor<64xf32>>
    exec.zero %gfull on compute : !exec.buffer<tensor<64xf32>>
    // CHECK: exec.view %[[GF]] prefix : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<5x8xf32>>
    %gp = exec.view %gfull prefix : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<5x8xf32>>
    // CHECK: exec.reduce_scatter %[[GF]] into %[[G]] over "dp" on comm accumulate : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<4x8xf32>>
    exec.reduce_scatter %gfull into %g over "dp" on comm accumulate : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<4x8xf32>>
  }
  // CHECK: exec.all_reduce %[[G]] over "dp" on comm : !exec.buffer<tensor<4x8xf32>>
  exec.all_reduce %g over "dp" on comm : !exec.buffer<tensor<4x8xf32>>
  // CHECK: exec.return %[[L]] : !exec.buffer<tensor<f32>>
  exec.return %l : !exec.buffer<tensor<f32>>
}

// A pipeline stage's unrolled schedule: microbatch markers, boundary
// transfers.
// CHECK-LABEL: exec.step @stage attributes {micro_batches = 2 : i64}
exec.step @stage attributes {micro_batches = 2 : i64} {
  // CHECK: exec.microbatch_loop count 1
  exec.microbatch_loop count 1 {
    // CHECK: exec.microbatch 1 forward
    exec.microbatch 1 forward
    %h = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    // CHECK: exec.send %{{.*}} to next channel 0 on comm : !exec.buffer<tensor<64xbf16>>
    exec.send %h to next channel 0 on comm : !exec.buffer<tensor<64xbf16>>
    // CHECK: exec.microbatch 0 backward
    exec.microbatch 0 backward
    // CHECK: exec.recv %{{.*}} from prev channel 3 on comm : !exec.buffer<tensor<64xbf16>>
    exec.recv %h from prev channel 3 on comm : !exec.buffer<tensor<64xbf16>>
  }
  exec.return
}
