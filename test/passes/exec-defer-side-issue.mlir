// RUN: actplace-opt %s -split-input-file -exec-defer-side-issue | FileCheck %s
// Idempotent: a second run moves nothing.
// RUN: actplace-opt %s -split-input-file -exec-defer-side-issue -o %t.mlir
// RUN: actplace-opt %t.mlir -split-input-file -exec-defer-side-issue -o %t.again.mlir
// RUN: diff %t.mlir %t.again.mlir

// A side run (wait, kernel, record) before its host moves to right after
// the host kernel, past a buffer definition, a record of an unrelated event
// and a copy on another stream; the definitions stay where they were.
// done_by_kernel keeps naming the same kernel: the host was ordinal 2
// (after train.k0 and the side kernel) and is ordinal 1 after the move.

// CHECK-LABEL: exec.step @moves_after_host
// CHECK: exec.kernel "test.k0"
// CHECK-NEXT: %[[P:.*]] = exec.event_create
// CHECK-NEXT: exec.record %[[P]] on compute
// CHECK-NEXT: %[[Y:.*]] = exec.buffer offset 512
// CHECK-NEXT: %[[Q:.*]] = exec.event_create
// CHECK-NEXT: %[[H:.*]] = exec.buffer offset 1024
// CHECK-NEXT: exec.event_create
// CHECK-NEXT: exec.record %{{.*}} on compute
// CHECK-NEXT: exec.event_create
// CHECK-NEXT: exec.h2d
// CHECK-NEXT: exec.kernel "test.host"
// CHECK-NEXT: exec.wait %[[P]] on side {exec.issued_after_host}
// CHECK-NEXT: exec.kernel "test.linear" {{.*}} on side {exec.issued_after_host}
// CHECK-NEXT: exec.record %[[Q]] on side {exec.issued_after_host}
// CHECK-NEXT: exec.wait %[[Q]] on compute
// CHECK-NEXT: exec.event_create
// CHECK-NEXT: exec.d2h {{.*}} {done_by_kernel = 1 : i64}
// CHECK-NEXT: exec.kernel "test.k2"
exec.step @moves_after_host {
  exec.microbatch_loop count 1 {
    %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %s2 = exec.pool_acquire slot 1 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    exec.kernel "test.k0" outs(%x : !exec.buffer<tensor<64xf32>>) workspace 0
    %p = exec.event_create : !exec.event
    exec.record %p on compute
    exec.wait %p on side
    %y = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.linear" ins(%x : !exec.buffer<tensor<64xf32>>) outs(%y : !exec.buffer<tensor<64xf32>>) workspace 0 on side
    %q = exec.event_create : !exec.event
    exec.record %q on side
    %h = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<64xf32>>
    %u = exec.event_create : !exec.event
    exec.record %u on compute
    %r = exec.event_create : !exec.event
    exec.h2d %s to %h on h2d record %r : !exec.host<tensor<64xf32>> to !exec.buffer<tensor<64xf32>>
    exec.kernel "test.host" outs(%h : !exec.buffer<tensor<64xf32>>) workspace 0
    exec.wait %q on compute
    %e = exec.event_create : !exec.event
    exec.d2h %x to %s2 on d2h record %e {done_by_kernel = 2 : i64} : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    exec.kernel "test.k2" ins(%y : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

// Blocked: compute waits for the run's record before the next compute
// kernel, so the run stays where it is (moving it would make that wait
// refer to no record yet).

// CHECK-LABEL: exec.step @blocked_by_wait_for_run
// CHECK: exec.kernel "test.linear" {{.*}} on side
// CHECK-NOT: issued_after_host
// CHECK: exec.wait %{{.*}} on compute
// CHECK-NEXT: exec.kernel "test.host"
exec.step @blocked_by_wait_for_run {
  exec.microbatch_loop count 1 {
    %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    %y = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.linear" ins(%x : !exec.buffer<tensor<64xf32>>) outs(%y : !exec.buffer<tensor<64xf32>>) workspace 0 on side
    %q = exec.event_create : !exec.event
    exec.record %q on side
    exec.wait %q on compute
    exec.kernel "test.host" ins(%y : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

// Blocked: the event the run waits for is recorded again before the next
// compute kernel; moving the wait past that record would make it wait for
// the later point.

// CHECK-LABEL: exec.step @blocked_by_rerecord
// CHECK: exec.wait %[[P:.*]] on side
// CHECK-NEXT: exec.kernel "test.linear" {{.*}} on side
// CHECK-NOT: issued_after_host
// CHECK: exec.record %[[P]] on compute
// CHECK-NEXT: exec.kernel "test.host"
exec.step @blocked_by_rerecord {
  exec.microbatch_loop count 1 {
    %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    %y = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<64xf32>>
    %p = exec.event_create : !exec.event
    exec.record %p on compute
    exec.wait %p on side
    exec.kernel "test.linear" ins(%x : !exec.buffer<tensor<64xf32>>) outs(%y : !exec.buffer<tensor<64xf32>>) workspace 0 on side
    exec.record %p on compute
    exec.kernel "test.host" ins(%x : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

// No compute kernel after the run in its block (a copy on another stream,
// then the end of the body): nothing moves.

// CHECK-LABEL: exec.step @no_host_after
// CHECK: exec.kernel "test.linear" {{.*}} on side
// CHECK-NEXT: exec.event_create
// CHECK-NEXT: exec.d2h
// CHECK-NOT: issued_after_host
// CHECK: exec.return
exec.step @no_host_after {
  exec.microbatch_loop count 1 {
    %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    %y = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<64xf32>>
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    exec.kernel "test.linear" ins(%x : !exec.buffer<tensor<64xf32>>) outs(%y : !exec.buffer<tensor<64xf32>>) workspace 0 on side
    %e = exec.event_create : !exec.event
    exec.d2h %x to %s on d2h record %e : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
  }
  exec.return
}

// -----

// With a host marked train.side_host (train-recompute-stream's anchor)
// ahead, a run moves past the compute kernels before it (here a norm that
// feeds a later run), and the later run joins it: both, in order, after the
// host. Each wait still comes after the record it waits for.

// CHECK-LABEL: exec.step @moves_to_marked_host
// CHECK: exec.kernel "test.k0"
// CHECK: exec.record %[[P:.*]] on compute
// CHECK-NEXT: %[[Y:.*]] = exec.buffer offset 512
// CHECK-NEXT: %[[N:.*]] = exec.buffer offset 1024
// CHECK-NEXT: exec.kernel "test.rms_norm"
// CHECK-NEXT: %[[R:.*]] = exec.event_create
// CHECK-NEXT: exec.record %[[R]] on compute
// CHECK-NEXT: %[[Z:.*]] = exec.buffer offset 1536
// CHECK-NEXT: %[[Q:.*]] = exec.event_create
// CHECK-NEXT: exec.kernel "test.gated_delta_rule_grad" {{.*}}train.side_host
// CHECK-NEXT: exec.wait %[[P]] on side {exec.issued_after_host}
// CHECK-NEXT: exec.kernel "test.linear" {{.*}}outs(%[[Y]] {{.*}} on side {exec.issued_after_host}
// CHECK-NEXT: exec.wait %[[R]] on side {exec.issued_after_host}
// CHECK-NEXT: exec.kernel "test.linear" {{.*}}outs(%[[Z]] {{.*}} on side {exec.issued_after_host}
// CHECK-NEXT: exec.record %[[Q]] on side {exec.issued_after_host}
// CHECK-NEXT: exec.wait %[[Q]] on compute
// CHECK-NEXT: exec.kernel "test.k2"
exec.step @moves_to_marked_host {
  exec.microbatch_loop count 1 {
    %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%x : !exec.buffer<tensor<64xf32>>) workspace 0
    %p = exec.event_create : !exec.event
    exec.record %p on compute
    exec.wait %p on side
    %y = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.linear" ins(%x : !exec.buffer<tensor<64xf32>>) outs(%y : !exec.buffer<tensor<64xf32>>) workspace 0 on side
    %n = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.rms_norm" ins(%x : !exec.buffer<tensor<64xf32>>) outs(%n : !exec.buffer<tensor<64xf32>>) workspace 0
    %r = exec.event_create : !exec.event
    exec.record %r on compute
    exec.wait %r on side
    %z = exec.buffer offset 1536 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.linear" ins(%n : !exec.buffer<tensor<64xf32>>) outs(%z : !exec.buffer<tensor<64xf32>>) workspace 0 on side
    %q = exec.event_create : !exec.event
    exec.record %q on side
    exec.kernel "test.gated_delta_rule_grad" ins(%x : !exec.buffer<tensor<64xf32>>) workspace 0 args {train.side_host}
    exec.wait %q on compute
    exec.kernel "test.k2" ins(%y, %z : !exec.buffer<tensor<64xf32>>, !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

// The host is marked, but compute waits for the run's record before it: the
// run moves past the next compute kernel only, as without a marked host.

// CHECK-LABEL: exec.step @marked_host_blocked
// CHECK: exec.kernel "test.rms_norm"
// CHECK-NEXT: exec.wait %{{.*}} on side {exec.issued_after_host}
// CHECK-NEXT: exec.kernel "test.linear" {{.*}} on side {exec.issued_after_host}
// CHECK-NEXT: exec.record %[[Q:.*]] on side {exec.issued_after_host}
// CHECK-NEXT: exec.wait %[[Q]] on compute
// CHECK-NEXT: exec.kernel "test.gated_delta_rule_grad"
exec.step @marked_host_blocked {
  exec.microbatch_loop count 1 {
    %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%x : !exec.buffer<tensor<64xf32>>) workspace 0
    %p = exec.event_create : !exec.event
    exec.record %p on compute
    exec.wait %p on side
    %y = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.linear" ins(%x : !exec.buffer<tensor<64xf32>>) outs(%y : !exec.buffer<tensor<64xf32>>) workspace 0 on side
    %q = exec.event_create : !exec.event
    exec.record %q on side
    %n = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.rms_norm" ins(%x : !exec.buffer<tensor<64xf32>>) outs(%n : !exec.buffer<tensor<64xf32>>) workspace 0
    exec.wait %q on compute
    exec.kernel "test.gated_delta_rule_grad" ins(%y : !exec.buffer<tensor<64xf32>>) workspace 0 args {train.side_host}
  }
  exec.return
}
