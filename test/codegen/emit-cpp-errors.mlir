// RUN: actplace-translate --emit-cpp %s -split-input-file -verify-diagnostics

// expected-error @below {{emit-cpp: no exec.step in the module (run convert-train-to-exec first)}}
module {
}

// -----

module {
  exec.step @train_step attributes {arena_bytes = 512 : i64} {
    %0 = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4xf32>>
    // expected-error @below {{emit-cpp: unsupported kernel 'test.frobnicate'}}
    exec.kernel "test.frobnicate" ins(%0 : !exec.buffer<tensor<4xf32>>) workspace 0
    exec.return
  }
}

// -----

module {
  exec.step @train_step attributes {arena_bytes = 512 : i64} {
    // expected-error @below {{emit-cpp: exec.buffer without a planned offset (run exec-plan-memory first)}}
    %0 = exec.buffer bytes 256 : !exec.buffer<tensor<4xf32>>
    %1 = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<4xf32>>
    exec.kernel "train.add" ins(%0, %0 : !exec.buffer<tensor<4xf32>>, !exec.buffer<tensor<4xf32>>) outs(%1 : !exec.buffer<tensor<4xf32>>) workspace 0
    exec.return
  }
}

// -----

module {
  exec.step @train_step attributes {arena_bytes = 1024 : i64} {
    %0 = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<2x4xf32>>
    %1 = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<1x4xf32>>
    // expected-error @below {{emit-cpp: 'train.slice' cannot run on the side stream (a runner helper on the compute stream)}}
    exec.kernel "train.slice" ins(%0 : !exec.buffer<tensor<2x4xf32>>) outs(%1 : !exec.buffer<tensor<1x4xf32>>) workspace 0 on side args {dim = 0 : i64, offset = 0 : i64}
    exec.return
  }
}

// -----

// A number the C++ literal cannot carry is refused, naming the attribute:
// not finite ...
module {
  exec.step @train_step attributes {arena_bytes = 1024 : i64} {
    %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<2x8xf32>>
    %w = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<8xf32>>
    %y = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<2x8xf32>>
    %r = exec.buffer offset 768 bytes 256 : !exec.buffer<tensor<2xf32>>
    // expected-error @below {{emit-cpp: attribute 'eps' of 'exec.kernel' (train.rms_norm) = inf is not finite}}
    exec.kernel "train.rms_norm" ins(%x, %w : !exec.buffer<tensor<2x8xf32>>, !exec.buffer<tensor<8xf32>>) outs(%y, %r : !exec.buffer<tensor<2x8xf32>>, !exec.buffer<tensor<2xf32>>) workspace 0 args {eps = 0x7FF0000000000000 : f64}
    exec.return
  }
}

// -----

module {
  exec.step @train_step attributes {arena_bytes = 1024 : i64} {
    %c = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<i32>>
    // expected-error @below {{emit-cpp: attribute 'max_norm' of 'exec.kernel' (train.finalize_grads) = nan is not finite}}
    exec.kernel "train.finalize_grads" ins(%c : !exec.buffer<tensor<i32>>) workspace 0 args {max_norm = 0x7FF8000000000000 : f64}
    exec.return
  }
}

// -----

// ... or, for a float kernel argument, beyond float's range or rounded to 0.
module {
  exec.step @train_step attributes {arena_bytes = 2048 : i64} {
    %x = exec.buffer offset 0 bytes 512 : !exec.buffer<tensor<1x2x2x16xf32>>
    %y = exec.buffer offset 512 bytes 512 : !exec.buffer<tensor<1x2x2x16xf32>>
    %r = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<1x2x2xf32>>
    // expected-error @below {{emit-cpp: attribute 'eps' of 'exec.kernel' (train.l2_norm) = 1.0000000000000001e+300 is beyond the range of float (the kernel argument is a float)}}
    exec.kernel "train.l2_norm" ins(%x : !exec.buffer<tensor<1x2x2x16xf32>>) outs(%y, %r : !exec.buffer<tensor<1x2x2x16xf32>>, !exec.buffer<tensor<1x2x2xf32>>) workspace 0 args {eps = 1.0e300 : f64}
    exec.return
  }
}

// -----

module {
  exec.step @train_step attributes {arena_bytes = 2048 : i64} {
    %x = exec.buffer offset 0 bytes 512 : !exec.buffer<tensor<1x2x2x16xf32>>
    %y = exec.buffer offset 512 bytes 512 : !exec.buffer<tensor<1x2x2x16xf32>>
    %r = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<1x2x2xf32>>
    // expected-error @below {{emit-cpp: attribute 'eps' of 'exec.kernel' (train.l2_norm) = 1e-300 rounds to 0 as a float (the kernel argument is a float)}}
    exec.kernel "train.l2_norm" ins(%x : !exec.buffer<tensor<1x2x2x16xf32>>) outs(%y, %r : !exec.buffer<tensor<1x2x2x16xf32>>, !exec.buffer<tensor<1x2x2xf32>>) workspace 0 args {eps = 1.0e-300 : f64}
    exec.return
  }
}

// -----

// A copy must follow a wait on the d2h stream (exec-schedule-streams puts
// one before every copy); emission does not invent the ordering.
module {
  exec.step @train_step attributes {arena_bytes = 512 : i64, pinned_bytes = 256 : i64} {
    %v = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4xf32>>
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<4xf32>>
    %r = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<4xf32>>
    %e = exec.event_create : !exec.event
    %e2 = exec.event_create : !exec.event
    // expected-error @below {{emit-cpp: exec.d2h with no earlier exec.wait on the d2h stream to order it after its producer (run exec-schedule-streams)}}
    exec.d2h %v to %s on d2h record %e : !exec.buffer<tensor<4xf32>> to !exec.host<tensor<4xf32>>
    exec.wait %e on h2d
    exec.h2d %s to %r on h2d record %e2 : !exec.host<tensor<4xf32>> to !exec.buffer<tensor<4xf32>>
    exec.wait %e2 on compute
    exec.kernel "train.add" ins(%r, %r : !exec.buffer<tensor<4xf32>>, !exec.buffer<tensor<4xf32>>) outs(%v : !exec.buffer<tensor<4xf32>>) workspace 0 args {scope = #train.scope<0, mlp_fc2>}
    exec.return
  }
}

// -----

// The driver scratch is a buffer of the plan (convert-train-to-exec
// declares it): a step without one cannot be emitted.
module {
  // expected-error @below {{emit-cpp: exec.step has no driver scratch buffer (exec.persistent of role scratch, which convert-train-to-exec declares)}}
  exec.step @train_step attributes {arena_bytes = 512 : i64} {
    exec.return
  }
}
