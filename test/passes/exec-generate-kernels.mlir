// RUN: actplace-opt %s -split-input-file -exec-generate-kernels | FileCheck %s
// RUN: actplace-opt %s -split-input-file "-exec-generate-kernels=fuse=false" | FileCheck %s --check-prefix=NOFUSE
// The fused calls plan without overlap: outputs never over inputs.
// RUN: actplace-opt %s -split-input-file -exec-generate-kernels -exec-plan-memory | FileCheck %s --check-prefix=PLAN

// A residual add whose output the next kernel normalizes, with only buffer
// declarations between: one train.add_rms_norm at the norm's place reading
// a, b and the norm weight, writing h, y and rstd, with the norm's args.
// The step is marked for generated kernels and records what was fused.

// CHECK-LABEL: exec.step @fuses
// CHECK-SAME: fused_add_norm = 1 : i64
// CHECK-SAME: fused_saved_bytes = 2048 : i64
// CHECK-SAME: kernels = "generated"
// CHECK: %[[A:.*]] = exec.buffer bytes 2048
// CHECK: %[[B:.*]] = exec.buffer bytes 2048
// CHECK: %[[H:.*]] = exec.buffer bytes 2048
// CHECK: %[[Y:.*]] = exec.buffer bytes 2048
// CHECK: %[[R:.*]] = exec.buffer bytes 256
// CHECK-NOT: "train.add"
// CHECK-NOT: "train.rms_norm"
// CHECK: exec.kernel "train.add_rms_norm" ins(%[[A]], %[[B]], %{{.*}} : {{.*}}) outs(%[[H]], %[[Y]], %[[R]] : {{.*}}) workspace 0 args {eps = {{.*}} : f64, scope = #train.scope<0, mlp_norm>, zero_centered}
// CHECK-NEXT: exec.buffer
// CHECK-NEXT: exec.kernel "train.linear" ins(%[[Y]]

// NOFUSE-LABEL: exec.step @fuses
// NOFUSE-SAME: kernels = "generated"
// NOFUSE: exec.kernel "train.add"
// NOFUSE: exec.kernel "train.rms_norm"

// PLAN-LABEL: exec.step @fuses
// PLAN: exec.kernel "train.add_rms_norm"

module {
  exec.step @fuses attributes {} {
    %w = exec.persistent "nw" weight bytes 256 : !exec.buffer<tensor<64xbf16>>
    %lw = exec.persistent "lw" weight bytes 8192 : !exec.buffer<tensor<64x64xbf16>>
    %s = exec.persistent "driver_scratch" scratch bytes 256 : !exec.buffer<tensor<256xi8>>
    %a = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %b = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.linear" ins(%a, %lw : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64x64xbf16>>) outs(%b : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    %h = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.add" ins(%a, %b : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%h : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0 args {scope = #train.scope<0, mlp_fc2>}
    %y = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %r = exec.buffer bytes 256 : !exec.buffer<tensor<1x16xf32>>
    exec.kernel "train.rms_norm" ins(%h, %w : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xbf16>>) outs(%y, %r : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16xf32>>) workspace 0 args {eps = 1.0e-06 : f64, zero_centered, scope = #train.scope<0, mlp_norm>}
    %o = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.linear" ins(%y, %lw : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64x64xbf16>>) outs(%o : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    exec.return
  }
}

// -----

// Left apart: an event between the two (another stream may see h there),
// the two on different streams, and f16 storage (no generated kernel).

// CHECK-LABEL: exec.step @stays
// CHECK-SAME: fused_add_norm = 0 : i64
// CHECK-COUNT-3: {{^ *}}exec.kernel "train.add" ins({{.*}}) workspace 0{{( on side)?$}}
// CHECK-NOT: train.add_rms_norm

module {
  exec.step @stays attributes {} {
    %w = exec.persistent "nw" weight bytes 256 : !exec.buffer<tensor<64xbf16>>
    %w16 = exec.persistent "nw16" weight bytes 256 : !exec.buffer<tensor<64xf16>>
    %s = exec.persistent "driver_scratch" scratch bytes 256 : !exec.buffer<tensor<256xi8>>
    %a = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %h = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %y = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %r = exec.buffer bytes 256 : !exec.buffer<tensor<1x16xf32>>
    exec.kernel "train.add" ins(%a, %a : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%h : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    %e = exec.event_create : !exec.event
    exec.record %e on compute
    exec.kernel "train.rms_norm" ins(%h, %w : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xbf16>>) outs(%y, %r : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16xf32>>) workspace 0 args {eps = 1.0e-06 : f64}
    %h2 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %y2 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %r2 = exec.buffer bytes 256 : !exec.buffer<tensor<1x16xf32>>
    exec.kernel "train.add" ins(%a, %a : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%h2 : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0 on side
    exec.kernel "train.rms_norm" ins(%h2, %w : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xbf16>>) outs(%y2, %r2 : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16xf32>>) workspace 0 args {eps = 1.0e-06 : f64}
    %a3 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xf16>>
    %h3 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xf16>>
    %y3 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xf16>>
    %r3 = exec.buffer bytes 256 : !exec.buffer<tensor<1x16xf32>>
    exec.kernel "train.add" ins(%a3, %a3 : !exec.buffer<tensor<1x16x64xf16>>, !exec.buffer<tensor<1x16x64xf16>>) outs(%h3 : !exec.buffer<tensor<1x16x64xf16>>) workspace 0
    exec.kernel "train.rms_norm" ins(%h3, %w16 : !exec.buffer<tensor<1x16x64xf16>>, !exec.buffer<tensor<64xf16>>) outs(%y3, %r3 : !exec.buffer<tensor<1x16x64xf16>>, !exec.buffer<tensor<1x16xf32>>) workspace 0 args {eps = 1.0e-06 : f64}
    exec.return
  }
}

// -----

// done_by_kernel keeps naming the same kernel after the fusion: in the loop
// body the add and the norm were ordinals 1 and 2, the second linear 3; the
// fused kernel is now 1 and the linear 2. A copy predicted done by the add
// or the norm is done by the fused kernel that does their work.

// CHECK-LABEL: exec.step @renumbers
// CHECK: exec.d2h {{.*}} {done_by_kernel = 2 : i64}
// CHECK-NEXT: exec.event_create
// CHECK-NEXT: exec.d2h {{.*}} {done_by_kernel = 1 : i64}
// CHECK-NEXT: exec.event_create
// CHECK-NEXT: exec.d2h {{.*}} {done_by_kernel = 1 : i64}
// CHECK: exec.kernel "train.add_rms_norm"
// CHECK: exec.kernel "train.linear"
// NOFUSE-LABEL: exec.step @renumbers
// NOFUSE: exec.d2h {{.*}} {done_by_kernel = 3 : i64}
// NOFUSE-NEXT: exec.event_create
// NOFUSE-NEXT: exec.d2h {{.*}} {done_by_kernel = 1 : i64}
// NOFUSE-NEXT: exec.event_create
// NOFUSE-NEXT: exec.d2h {{.*}} {done_by_kernel = 2 : i64}

module {
  exec.step @renumbers attributes {} {
    %w = exec.persistent "nw" weight bytes 256 : !exec.buffer<tensor<64xbf16>>
    %lw = exec.persistent "lw" weight bytes 8192 : !exec.buffer<tensor<64x64xbf16>>
    %s = exec.persistent "driver_scratch" scratch bytes 256 : !exec.buffer<tensor<256xi8>>
    exec.microbatch_loop count 1 {
      %a = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
      %b = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
      %p0 = exec.pool_acquire slot 0 offset 0 bytes 2048 : !exec.host<tensor<1x16x64xbf16>>
      %p1 = exec.pool_acquire slot 1 offset 0 bytes 2048 : !exec.host<tensor<1x16x64xbf16>>
      %p2 = exec.pool_acquire slot 2 offset 0 bytes 2048 : !exec.host<tensor<1x16x64xbf16>>
      exec.kernel "train.linear" ins(%a, %lw : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64x64xbf16>>) outs(%b : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
      %e0 = exec.event_create : !exec.event
      exec.d2h %a to %p0 on d2h record %e0 {done_by_kernel = 3 : i64} : !exec.buffer<tensor<1x16x64xbf16>> to !exec.host<tensor<1x16x64xbf16>>
      %e1 = exec.event_create : !exec.event
      exec.d2h %b to %p1 on d2h record %e1 {done_by_kernel = 1 : i64} : !exec.buffer<tensor<1x16x64xbf16>> to !exec.host<tensor<1x16x64xbf16>>
      %e2 = exec.event_create : !exec.event
      exec.d2h %b to %p2 on d2h record %e2 {done_by_kernel = 2 : i64} : !exec.buffer<tensor<1x16x64xbf16>> to !exec.host<tensor<1x16x64xbf16>>
      %h = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
      exec.kernel "train.add" ins(%a, %b : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%h : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0 args {scope = #train.scope<0, mlp_fc2>}
      %y = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
      %r = exec.buffer bytes 256 : !exec.buffer<tensor<1x16xf32>>
      exec.kernel "train.rms_norm" ins(%h, %w : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xbf16>>) outs(%y, %r : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16xf32>>) workspace 0 args {eps = 1.0e-06 : f64, zero_centered, scope = #train.scope<0, mlp_norm>}
      %o = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
      exec.kernel "train.linear" ins(%y, %lw : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64x64xbf16>>) outs(%o : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    }
    exec.return
  }
}
