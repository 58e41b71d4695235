// RUN: actplace-opt %s -split-input-file -exec-schedule-streams | FileCheck %s
// Idempotent: a second run adds nothing.
// RUN: actplace-opt %s -split-input-file -exec-schedule-streams -o %t.mlir
// RUN: actplace-opt %t.mlir -split-input-file -exec-schedule-streams -o %t.again.mlir
// RUN: diff %t.mlir %t.again.mlir

// Hazard: an offload, then a later writer reuses the device region the D2H
// reads (write after read). Also: the D2H waits for the kernel that produced
// its source (a record right after that kernel), and the body ends with
// compute waiting for the copy streams (here the same D2H event). The start
// barrier (copy streams wait for compute before the body) is implied by the
// D2H's wait for k0, so it is dropped again.

// CHECK-LABEL: exec.step @offload_then_reuse
// CHECK: exec.microbatch_loop
// CHECK-NEXT: %[[A:.*]] = exec.buffer offset 0
// CHECK-NEXT: exec.kernel "test.k0"
// CHECK-NEXT: %[[P:.*]] = exec.event_create
// CHECK-NEXT: exec.record %[[P]] on compute
// CHECK-NEXT: %[[S:.*]] = exec.pool_acquire
// CHECK-NEXT: %[[E:.*]] = exec.event_create
// CHECK-NEXT: exec.wait %[[P]] on d2h
// CHECK-NEXT: exec.d2h %[[A]] to %[[S]] on d2h record %[[E]]
// CHECK-NEXT: %[[C:.*]] = exec.buffer offset 0
// CHECK-NEXT: exec.wait %[[E]] on compute
// CHECK-NEXT: exec.kernel "test.k1" outs(%[[C]]
// CHECK-NEXT: }
exec.step @offload_then_reuse {
  exec.microbatch_loop count 1 {
    %a = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e = exec.event_create : !exec.event
    exec.d2h %a to %s on d2h record %e : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %c = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k1" outs(%c : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

// Hazard: a reload, then its use (read after write): compute waits for the
// H2D's own event. The H2D itself first waits for the D2H that filled the
// slot (hazard: a reload before its own D2H finished), using the D2H's event.

// CHECK-LABEL: exec.step @reload_then_use
// CHECK: exec.d2h %{{.*}} to %[[S:.*]] on d2h record %[[E1:[0-9]+]]
// CHECK-NEXT: %[[R:.*]] = exec.buffer offset 256
// CHECK-NEXT: %[[E2:.*]] = exec.event_create
// CHECK-NEXT: exec.wait %[[E1]] on h2d
// CHECK-NEXT: exec.h2d %[[S]] to %[[R]] on h2d record %[[E2]]
// CHECK-NEXT: exec.pool_release %[[S]] after %[[E2]]
// CHECK-NEXT: %[[D:.*]] = exec.buffer offset 512
// CHECK-NEXT: exec.wait %[[E2]] on compute
// CHECK-NEXT: exec.kernel "test.k1" ins(%[[R]] : {{.*}}) outs(%[[D]]
// Nothing left in flight at the end of the body: compute already waited.
// CHECK-NEXT: }
exec.step @reload_then_use {
  exec.microbatch_loop count 1 {
    %a = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e1 = exec.event_create : !exec.event
    exec.d2h %a to %s on d2h record %e1 : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %r = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<64xf32>>
    %e2 = exec.event_create : !exec.event
    exec.h2d %s to %r on h2d record %e2 : !exec.host<tensor<64xf32>> to !exec.buffer<tensor<64xf32>>
    exec.pool_release %s after %e2 : !exec.host<tensor<64xf32>>
    %d = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k1" ins(%r : !exec.buffer<tensor<64xf32>>) outs(%d : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

// Hazard: a reload issued before its own D2H finished. The H2D reads the
// pinned bytes the D2H writes (read after write on the pinned pool): the h2d
// stream waits for the D2H's own event, nothing else (no new record).

// CHECK-LABEL: exec.step @reload_before_own_d2h
// CHECK: exec.d2h %{{.*}} to %[[S:.*]] on d2h record %[[E1:[0-9]+]]
// CHECK-NOT: exec.record
// CHECK: exec.wait %[[E1]] on h2d
// CHECK-NEXT: exec.h2d %[[S]] to
exec.step @reload_before_own_d2h {
  %w = exec.persistent "w" weight offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
  exec.microbatch_loop count 1 {
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e1 = exec.event_create : !exec.event
    exec.d2h %w to %s on d2h record %e1 : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %r = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<64xf32>>
    %e2 = exec.event_create : !exec.event
    exec.h2d %s to %r on h2d record %e2 : !exec.host<tensor<64xf32>> to !exec.buffer<tensor<64xf32>>
    exec.pool_release %s after %e2 : !exec.host<tensor<64xf32>>
  }
  exec.return
}

// -----

// Hazard: pinned slot reuse. Slot 1 takes the pool bytes slot 0 had; its
// D2H may only overwrite them once the H2D that read slot 0 completed (write
// after read on the pinned pool): the d2h stream waits for the H2D event,
// besides the compute record for its source. (Nothing else orders the two:
// compute never waited for the reload here.)

// CHECK-LABEL: exec.step @slot_reuse
// CHECK: exec.h2d %{{.*}} on h2d record %[[H:[0-9]+]]
// CHECK: exec.pool_release
// CHECK: exec.kernel "test.k1"
// CHECK-NEXT: %[[P:.*]] = exec.event_create
// CHECK-NEXT: exec.record %[[P]] on compute
// CHECK-NEXT: %[[S1:.*]] = exec.pool_acquire slot 1 offset 0
// CHECK-NEXT: %[[E3:.*]] = exec.event_create
// CHECK-NEXT: exec.wait %[[P]] on d2h
// CHECK-NEXT: exec.wait %[[H]] on d2h
// CHECK-NEXT: exec.d2h %{{.*}} to %[[S1]] on d2h record %[[E3]]
// End of body: the last D2H waited for the H2D, one wait covers both.
// CHECK-NEXT: exec.wait %[[E3]] on compute
// CHECK-NEXT: }
exec.step @slot_reuse {
  exec.microbatch_loop count 1 {
    %a = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s0 = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e1 = exec.event_create : !exec.event
    exec.d2h %a to %s0 on d2h record %e1 : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %r = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<64xf32>>
    %e2 = exec.event_create : !exec.event
    exec.wait %e1 on h2d
    exec.h2d %s0 to %r on h2d record %e2 : !exec.host<tensor<64xf32>> to !exec.buffer<tensor<64xf32>>
    exec.pool_release %s0 after %e2 : !exec.host<tensor<64xf32>>
    %b = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k1" outs(%b : !exec.buffer<tensor<64xf32>>) workspace 0
    %s1 = exec.pool_acquire slot 1 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e3 = exec.event_create : !exec.event
    exec.d2h %b to %s1 on d2h record %e3 : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
  }
  exec.return
}

// -----

// Already ordered: the reload's use waits at its wait anchor and the H2D
// waits for its D2H; only the producer's record (and the D2H's wait for it)
// is added, the start barrier being implied by it. Waits are transitive: compute waited for the H2D,
// which waited for the D2H, so the later writer of the offloaded region
// needs no wait of its own.

// CHECK-LABEL: exec.step @already_ordered
// CHECK-COUNT-1: {{^ *}}exec.record %{{[0-9]+}} on compute{{$}}
// CHECK-NOT: exec.record
// CHECK: exec.kernel "test.k2"
// CHECK-NEXT: }
exec.step @already_ordered {
  exec.microbatch_loop count 1 {
    %a = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e1 = exec.event_create : !exec.event
    exec.d2h %a to %s on d2h record %e1 : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %r = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<64xf32>>
    %e2 = exec.event_create : !exec.event
    exec.wait %e1 on h2d
    exec.h2d %s to %r on h2d record %e2 : !exec.host<tensor<64xf32>> to !exec.buffer<tensor<64xf32>>
    exec.pool_release %s after %e2 : !exec.host<tensor<64xf32>>
    exec.wait %e2 on compute
    %d = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k2" ins(%r : !exec.buffer<tensor<64xf32>>) outs(%d : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

// max_inflight = 1: an offload that finds one D2H pending makes compute wait
// for it first (docs/architecture.md section 4, offload rule (b)).

// CHECK-LABEL: exec.step @max_inflight
// CHECK: exec.d2h %{{.*}} on d2h record %[[E1:[0-9]+]]
// CHECK: exec.wait %[[E1]] on compute
// CHECK: exec.d2h %{{.*}} on d2h record %[[E2:[0-9]+]]
// CHECK-NEXT: %{{.*}} = exec.buffer offset 512
// CHECK-NEXT: exec.kernel "test.k2"
// End of body: compute waits for the last D2H.
// CHECK-NEXT: exec.wait %[[E2]] on compute
// CHECK-NEXT: }
exec.step @max_inflight {
  exec.microbatch_loop count 1 attributes {max_inflight = 1 : i64} {
    %a = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s0 = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e1 = exec.event_create : !exec.event
    exec.d2h %a to %s0 on d2h record %e1 : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %b = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k1" outs(%b : !exec.buffer<tensor<64xf32>>) workspace 0
    %s1 = exec.pool_acquire slot 1 offset 256 bytes 256 : !exec.host<tensor<64xf32>>
    %e2 = exec.event_create : !exec.event
    exec.d2h %b to %s1 on d2h record %e2 : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %c = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k2" outs(%c : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

// The step level: the all-reduce waits for the loop's grads (one record
// after the loop), the optimizer for the last all-reduce (one wait covers
// every grad: the comm stream completes in order).

// CHECK-LABEL: exec.step @collectives
// CHECK: exec.microbatch_loop
// CHECK: }
// CHECK-NEXT: %[[L:.*]] = exec.event_create
// CHECK-NEXT: exec.record %[[L]] on compute
// CHECK-NEXT: exec.wait %[[L]] on comm
// CHECK-NEXT: exec.all_reduce %[[G0:.*]] over "dp" on comm
// CHECK-NEXT: exec.all_reduce %[[G1:.*]] over "dp" on comm
// CHECK-NEXT: %[[C:.*]] = exec.event_create
// CHECK-NEXT: exec.record %[[C]] on comm
// CHECK-NEXT: exec.wait %[[C]] on compute
// CHECK-NEXT: exec.kernel "test.finalize_grads"
// CHECK-NEXT: exec.return
exec.step @collectives {
  %g0 = exec.persistent "w0" main_grad offset 0 bytes 256 : !exec.buffer<tensor<4xf32>>
  %g1 = exec.persistent "w1" main_grad offset 256 bytes 256 : !exec.buffer<tensor<4xf32>>
  %n = exec.persistent "grad_norm" state offset 512 bytes 256 : !exec.buffer<tensor<f32>>
  exec.microbatch_loop count 2 {
    exec.kernel "test.k0" outs(%g0, %g1 : !exec.buffer<tensor<4xf32>>, !exec.buffer<tensor<4xf32>>) workspace 0
  }
  exec.all_reduce %g0 over "dp" on comm : !exec.buffer<tensor<4xf32>>
  exec.all_reduce %g1 over "dp" on comm : !exec.buffer<tensor<4xf32>>
  exec.kernel "test.finalize_grads" outs(%n, %g0, %g1 : !exec.buffer<tensor<f32>>, !exec.buffer<tensor<4xf32>>, !exec.buffer<tensor<4xf32>>) workspace 0
  exec.return
}

// -----

// Unplanned buffers (no offsets yet) are ordered by identity: the H2D into
// %r after the D2H of %a is no conflict on the device, but it reads the
// slot the D2H wrote.

// CHECK-LABEL: exec.step @unplanned
// CHECK: exec.d2h %{{.*}} on d2h record %[[E1:[0-9]+]]
// CHECK: exec.wait %[[E1]] on h2d
// CHECK-NEXT: exec.h2d %{{.*}} on h2d record %[[E2:[0-9]+]]
// CHECK-NEXT: exec.pool_release
// The H2D ordered after the D2H: one wait at the end covers both streams.
// CHECK-NEXT: exec.wait %[[E2]] on compute
// CHECK-NEXT: }
exec.step @unplanned {
  exec.microbatch_loop count 1 {
    %a = exec.buffer bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e1 = exec.event_create : !exec.event
    exec.d2h %a to %s on d2h record %e1 : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %r = exec.buffer bytes 256 : !exec.buffer<tensor<64xf32>>
    %e2 = exec.event_create : !exec.event
    exec.h2d %s to %r on h2d record %e2 : !exec.host<tensor<64xf32>> to !exec.buffer<tensor<64xf32>>
    exec.pool_release %s after %e2 : !exec.host<tensor<64xf32>>
  }
  exec.return
}
