// RUN: actplace-opt %s -split-input-file "-exec-generate-kernels=fuse-norm-grad-add=true fuse-dy-sum=true" | FileCheck %s
// RUN: actplace-opt %s -split-input-file "-exec-generate-kernels=fuse-norm-grad-add=true" | FileCheck %s --check-prefix=OFF
// RUN: actplace-opt %s -split-input-file "-exec-generate-kernels=fuse-norm-grad-add=true fuse-dy-sum=true" -exec-plan-memory | FileCheck %s --check-prefix=PLAN

// The gradient of a normalized value four projections read: three adds
// form dy = ((g0 + g1) + g2) + g3, then the RMSNorm backward, then the
// residual add of its dx. One train.rms_norm_grad_add at the add's place
// reads x, w, rstd, the four addends in summation order (the chain's
// operand order does not matter: an add's operands commute) and the other
// addend; no sum's buffer is left. The step records 1 chain, 3 adds and
// the bytes of the three sums' writes and reads (3 x 2 x 2048).

// CHECK-LABEL: exec.step @chain
// CHECK-SAME: fused_dy_sum = 1 : i64
// CHECK-SAME: fused_dy_sum_adds = 3 : i64
// CHECK-SAME: fused_dy_sum_saved_bytes = 12288 : i64
// CHECK-SAME: fused_norm_grad_add = 1 : i64
// CHECK: %[[X:.*]] = exec.buffer bytes 2048
// CHECK-NEXT: exec.buffer bytes 256
// CHECK-NEXT: %[[G0:.*]] = exec.buffer bytes 2048
// CHECK: %[[G1:.*]] = exec.buffer bytes 2048
// CHECK: %[[G2:.*]] = exec.buffer bytes 2048
// CHECK: %[[G3:.*]] = exec.buffer bytes 2048
// CHECK: %[[O:.*]] = exec.buffer bytes 2048
// CHECK-NOT: exec.buffer bytes 2048
// CHECK-NOT: "train.add"
// CHECK-NOT: "train.rms_norm_grad"
// CHECK: %[[S:.*]] = exec.buffer bytes 2048
// CHECK-NEXT: exec.kernel "train.rms_norm_grad_add" ins(%[[X]], %{{.*}}, %{{.*}}, %[[G0]], %[[G1]], %[[G2]], %[[G3]], %[[O]] : {{.*}}) outs(%[[S]], %{{.*}} : {{.*}}) workspace 512 args {scope = #train.scope<0, attn_norm>, weight_grad = @nw, zero_centered}
// CHECK-NEXT: exec.return

// OFF-LABEL: exec.step @chain
// OFF-NOT: fused_dy_sum
// OFF-COUNT-3: exec.kernel "train.add"
// OFF: exec.kernel "train.rms_norm_grad_add" ins(%{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}} :

// PLAN-LABEL: exec.step @chain
// PLAN: exec.kernel "train.rms_norm_grad_add"

module {
  exec.step @chain attributes {} {
    %w = exec.persistent "nw" weight bytes 256 : !exec.buffer<tensor<64xbf16>>
    %g = exec.persistent "nw" main_grad bytes 256 : !exec.buffer<tensor<64xf32>>
    %s = exec.persistent "driver_scratch" scratch bytes 256 : !exec.buffer<tensor<256xi8>>
    %x = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %r = exec.buffer bytes 256 : !exec.buffer<tensor<1x16xf32>>
    %g0 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %g1 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %g2 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %g3 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %o = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %s1 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.add" ins(%g0, %g1 : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%s1 : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0 args {scope = #train.scope<0, attn_norm>}
    %s2 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.add" ins(%g2, %s1 : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%s2 : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0 args {scope = #train.scope<0, attn_norm>}
    %dy = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.add" ins(%s2, %g3 : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%dy : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0 args {scope = #train.scope<0, attn_norm>}
    %dx = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.rms_norm_grad" ins(%x, %w, %r, %dy : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<1x16xf32>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%dx, %g : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xf32>>) workspace 512 args {weight_grad = @nw, zero_centered, scope = #train.scope<0, attn_norm>}
    %sum = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.add" ins(%o, %dx : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%sum : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0 args {scope = #train.scope<0, attn_norm>}
    exec.return
  }
}

// -----

// A chain of four adds (five addends): the last three adds go into the
// backward, the first one's sum stays stored and is the first addend. No
// residual add reads dx here: train.rms_norm_grad_sum, writing dx.

// CHECK-LABEL: exec.step @long
// CHECK-SAME: fused_dy_sum = 1 : i64
// CHECK-SAME: fused_dy_sum_adds = 3 : i64
// CHECK-SAME: fused_dy_sum_saved_bytes = 24576 : i64
// CHECK: exec.buffer bytes 256
// CHECK-NEXT: exec.buffer bytes 4096
// CHECK-NEXT: exec.buffer bytes 4096
// CHECK-NEXT: %[[G2:.*]] = exec.buffer
// CHECK-NEXT: %[[G3:.*]] = exec.buffer
// CHECK-NEXT: %[[G4:.*]] = exec.buffer
// CHECK-NEXT: %[[S1:.*]] = exec.buffer
// CHECK-NEXT: exec.kernel "train.add" ins(%{{.*}}, %{{.*}} : {{.*}}) outs(%[[S1]] :
// CHECK-NOT: "train.add"
// CHECK: %[[DX:.*]] = exec.buffer
// CHECK-NEXT: exec.kernel "train.rms_norm_grad_sum" ins(%{{.*}}, %{{.*}}, %{{.*}}, %[[S1]], %[[G2]], %[[G3]], %[[G4]] : {{.*}}) outs(%[[DX]] : {{.*}}) workspace 0 args {eps
// CHECK-NEXT: exec.buffer
// CHECK-NEXT: exec.kernel "train.linear" ins(%[[DX]]

module {
  exec.step @long attributes {} {
    %w = exec.persistent "nw" weight bytes 256 : !exec.buffer<tensor<64xf32>>
    %lw = exec.persistent "lw" weight bytes 16384 : !exec.buffer<tensor<64x64xf32>>
    %x = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    %r = exec.buffer bytes 256 : !exec.buffer<tensor<16xf32>>
    %g0 = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    %g1 = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    %g2 = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    %g3 = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    %g4 = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    %s1 = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    exec.kernel "train.add" ins(%g0, %g1 : !exec.buffer<tensor<16x64xf32>>, !exec.buffer<tensor<16x64xf32>>) outs(%s1 : !exec.buffer<tensor<16x64xf32>>) workspace 0
    %s2 = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    exec.kernel "train.add" ins(%s1, %g2 : !exec.buffer<tensor<16x64xf32>>, !exec.buffer<tensor<16x64xf32>>) outs(%s2 : !exec.buffer<tensor<16x64xf32>>) workspace 0
    %s3 = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    exec.kernel "train.add" ins(%s2, %g3 : !exec.buffer<tensor<16x64xf32>>, !exec.buffer<tensor<16x64xf32>>) outs(%s3 : !exec.buffer<tensor<16x64xf32>>) workspace 0
    %dy = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    exec.kernel "train.add" ins(%s3, %g4 : !exec.buffer<tensor<16x64xf32>>, !exec.buffer<tensor<16x64xf32>>) outs(%dy : !exec.buffer<tensor<16x64xf32>>) workspace 0
    %dx = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    exec.kernel "train.rms_norm_grad" ins(%x, %w, %r, %dy : !exec.buffer<tensor<16x64xf32>>, !exec.buffer<tensor<64xf32>>, !exec.buffer<tensor<16xf32>>, !exec.buffer<tensor<16x64xf32>>) outs(%dx : !exec.buffer<tensor<16x64xf32>>) workspace 0 args {eps = 1.0e-6 : f64}
    %o = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    exec.kernel "train.linear" ins(%dx, %lw : !exec.buffer<tensor<16x64xf32>>, !exec.buffer<tensor<64x64xf32>>) outs(%o : !exec.buffer<tensor<16x64xf32>>) workspace 0
    exec.return
  }
}

// -----

// Left apart: a sum another kernel reads too (it must be stored), an add on
// another stream, an add whose addend has another type, and another kernel
// between an add and the backward.

// CHECK-LABEL: exec.step @stays
// CHECK-SAME: fused_dy_sum = 0 : i64
// CHECK-NOT: train.rms_norm_grad_sum
// CHECK-COUNT-4: exec.kernel "train.rms_norm_grad"

module {
  exec.step @stays attributes {} {
    %w = exec.persistent "nw" weight bytes 256 : !exec.buffer<tensor<64xbf16>>
    %lw = exec.persistent "lw" weight bytes 8192 : !exec.buffer<tensor<64x64xbf16>>
    %x = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    %r = exec.buffer bytes 256 : !exec.buffer<tensor<16xf32>>
    %a = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    %b = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    %dy = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    exec.kernel "train.add" ins(%a, %b : !exec.buffer<tensor<16x64xbf16>>, !exec.buffer<tensor<16x64xbf16>>) outs(%dy : !exec.buffer<tensor<16x64xbf16>>) workspace 0
    %dx = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    exec.kernel "train.rms_norm_grad" ins(%x, %w, %r, %dy : !exec.buffer<tensor<16x64xbf16>>, !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<16xf32>>, !exec.buffer<tensor<16x64xbf16>>) outs(%dx : !exec.buffer<tensor<16x64xbf16>>) workspace 0
    %o = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    exec.kernel "train.linear" ins(%dy, %lw : !exec.buffer<tensor<16x64xbf16>>, !exec.buffer<tensor<64x64xbf16>>) outs(%o : !exec.buffer<tensor<16x64xbf16>>) workspace 0
    %dy2 = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    exec.kernel "train.add" ins(%a, %b : !exec.buffer<tensor<16x64xbf16>>, !exec.buffer<tensor<16x64xbf16>>) outs(%dy2 : !exec.buffer<tensor<16x64xbf16>>) workspace 0 on side
    %dx2 = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    exec.kernel "train.rms_norm_grad" ins(%x, %w, %r, %dy2 : !exec.buffer<tensor<16x64xbf16>>, !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<16xf32>>, !exec.buffer<tensor<16x64xbf16>>) outs(%dx2 : !exec.buffer<tensor<16x64xbf16>>) workspace 0
    %c = exec.buffer bytes 4096 : !exec.buffer<tensor<16x64xf32>>
    %dy3 = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    exec.kernel "train.add" ins(%a, %c : !exec.buffer<tensor<16x64xbf16>>, !exec.buffer<tensor<16x64xf32>>) outs(%dy3 : !exec.buffer<tensor<16x64xbf16>>) workspace 0
    %dx3 = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    exec.kernel "train.rms_norm_grad" ins(%x, %w, %r, %dy3 : !exec.buffer<tensor<16x64xbf16>>, !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<16xf32>>, !exec.buffer<tensor<16x64xbf16>>) outs(%dx3 : !exec.buffer<tensor<16x64xbf16>>) workspace 0
    %dy4 = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    exec.kernel "train.add" ins(%a, %b : !exec.buffer<tensor<16x64xbf16>>, !exec.buffer<tensor<16x64xbf16>>) outs(%dy4 : !exec.buffer<tensor<16x64xbf16>>) workspace 0
    exec.kernel "train.linear" ins(%a, %lw : !exec.buffer<tensor<16x64xbf16>>, !exec.buffer<tensor<64x64xbf16>>) outs(%o : !exec.buffer<tensor<16x64xbf16>>) workspace 0
    %dx4 = exec.buffer bytes 2048 : !exec.buffer<tensor<16x64xbf16>>
    exec.kernel "train.rms_norm_grad" ins(%x, %w, %r, %dy4 : !exec.buffer<tensor<16x64xbf16>>, !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<16xf32>>, !exec.buffer<tensor<16x64xbf16>>) outs(%dx4 : !exec.buffer<tensor<16x64xbf16>>) workspace 0
    exec.return
  }
}
