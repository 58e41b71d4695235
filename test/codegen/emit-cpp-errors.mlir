// RUN: actplace-translate --emit-cpp %s -split-input-file -verify-diagnostics

// expected-error @below {{emit-cpp: no exec.step in the module (run convert-train-to-exec first)}}
module {
}

// -----

module {
  exec.step @train_step attributes {arena_bytes = 512 : i64} {
    %0 = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4xf32>>
    // expected-error @below {{emit-cpp: unsupported kernel 'train.frobnicate'}}
    exec.kernel "train.frobnicate" ins(%0 : !exec.buffer<tensor<4xf32>>) workspace 0
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
