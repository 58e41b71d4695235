// RUN: actplace-opt %s -split-input-file -exec-schedule-streams=remarks -verify-diagnostics -o /dev/null

// Every wait the pass keeps says why it is there, at the op it orders.

exec.step @reload {
  exec.microbatch_loop count 1 {
    %a = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e1 = exec.event_create : !exec.event
    // expected-remark @+1 {{exec-schedule-streams: d2h waits for compute: reads bytes that compute work wrote}}
    exec.d2h %a to %s on d2h record %e1 : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %r = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<64xf32>>
    %e2 = exec.event_create : !exec.event
    // expected-remark @+1 {{exec-schedule-streams: h2d waits for d2h: reads bytes that d2h work wrote}}
    exec.h2d %s to %r on h2d record %e2 : !exec.host<tensor<64xf32>> to !exec.buffer<tensor<64xf32>>
    exec.pool_release %s after %e2 : !exec.host<tensor<64xf32>>
    %c = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    // The write into %a's bytes also needs the D2H done, which the H2D's
    // wait already implies: one wait, for the H2D.
    // expected-remark @+1 {{exec-schedule-streams: compute waits for h2d: reads bytes that h2d work wrote}}
    exec.kernel "test.k1" ins(%r : !exec.buffer<tensor<64xf32>>) outs(%c : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

// expected-remark @+1 {{exec-schedule-streams: compute waits for d2h: nothing of the microbatch stays in flight into the next}}
exec.step @max_inflight {
  exec.microbatch_loop count 1 attributes {max_inflight = 1 : i64} {
    %a = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e = exec.event_create : !exec.event
    // expected-remark @+1 {{exec-schedule-streams: d2h waits for compute: reads bytes that compute work wrote}}
    exec.d2h %a to %s on d2h record %e : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %b = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k1" outs(%b : !exec.buffer<tensor<64xf32>>) workspace 0
    %s1 = exec.pool_acquire slot 1 offset 256 bytes 256 : !exec.host<tensor<64xf32>>
    %e1 = exec.event_create : !exec.event
    // expected-remark @+2 {{exec-schedule-streams: compute waits for d2h: max_inflight D2H copies are pending, the oldest must end}}
    // expected-remark @+1 {{exec-schedule-streams: d2h waits for compute: reads bytes that compute work wrote}}
    exec.d2h %b to %s1 on d2h record %e1 : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %c = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k2" outs(%c : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

exec.step @offload_then_reuse {
  exec.microbatch_loop count 1 {
    %a = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e = exec.event_create : !exec.event
    // expected-remark @+1 {{exec-schedule-streams: d2h waits for compute: reads bytes that compute work wrote}}
    exec.d2h %a to %s on d2h record %e : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %c = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    // expected-remark @+1 {{exec-schedule-streams: compute waits for d2h: overwrites bytes that d2h work still reads}}
    exec.kernel "test.k1" outs(%c : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}

// -----

// expected-remark @+1 {{exec-schedule-streams: compute waits for d2h: nothing of the microbatch stays in flight into the next}}
exec.step @end_barrier {
  exec.microbatch_loop count 2 {
    %a = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e = exec.event_create : !exec.event
    // expected-remark @+1 {{exec-schedule-streams: d2h waits for compute: reads bytes that compute work wrote}}
    exec.d2h %a to %s on d2h record %e : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
  }
  exec.return
}
