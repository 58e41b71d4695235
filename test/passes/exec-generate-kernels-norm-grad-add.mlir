// RUN: actplace-opt %s -split-input-file "-exec-generate-kernels=fuse-norm-grad-add=true" | FileCheck %s
// RUN: actplace-opt %s -split-input-file -exec-generate-kernels | FileCheck %s --check-prefix=OFF
// RUN: actplace-opt %s -split-input-file "-exec-generate-kernels=fuse-norm-grad-add=true" -exec-plan-memory | FileCheck %s --check-prefix=PLAN

// An RMSNorm backward whose dx only the next kernel, a residual add, reads:
// one train.rms_norm_grad_add at the add's place reading the norm's inputs
// and the other addend, writing the sum and the weight grad, with the
// norm's args and workspace; dx's buffer is gone. The step records the
// pairs and the bytes of dx not written and not read back.

// CHECK-LABEL: exec.step @fuses
// CHECK-SAME: fused_norm_grad_add = 1 : i64
// CHECK-SAME: fused_norm_grad_saved_bytes = 4096 : i64
// CHECK-SAME: kernels = "generated"
// CHECK: %[[G:.*]] = exec.persistent "nw" main_grad
// CHECK: %[[X:.*]] = exec.buffer bytes 2048
// CHECK: %[[DY:.*]] = exec.buffer bytes 2048
// CHECK: %[[R:.*]] = exec.buffer bytes 256
// CHECK: %[[O:.*]] = exec.buffer bytes 2048
// CHECK-NOT: exec.buffer bytes 2048
// CHECK-NOT: "train.rms_norm_grad"
// CHECK-NOT: "train.add"
// CHECK: %[[S:.*]] = exec.buffer bytes 2048
// CHECK-NEXT: exec.kernel "train.rms_norm_grad_add" ins(%[[X]], %{{.*}}, %[[R]], %[[DY]], %[[O]] : {{.*}}) outs(%[[S]], %[[G]] : {{.*}}) workspace 512 args {scope = #train.scope<0, mlp_norm>, weight_grad = @nw, zero_centered}
// CHECK-NEXT: exec.buffer
// CHECK-NEXT: exec.kernel "train.linear" ins(%[[S]]

// OFF-LABEL: exec.step @fuses
// OFF-NOT: fused_norm_grad_add
// OFF: exec.kernel "train.rms_norm_grad"
// OFF: exec.kernel "train.add"

// PLAN-LABEL: exec.step @fuses
// PLAN: exec.kernel "train.rms_norm_grad_add"

module {
  exec.step @fuses attributes {} {
    %w = exec.persistent "nw" weight bytes 256 : !exec.buffer<tensor<64xbf16>>
    %g = exec.persistent "nw" main_grad bytes 256 : !exec.buffer<tensor<64xf32>>
    %lw = exec.persistent "lw" weight bytes 8192 : !exec.buffer<tensor<64x64xbf16>>
    %s = exec.persistent "driver_scratch" scratch bytes 256 : !exec.buffer<tensor<256xi8>>
    %x = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %dy = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %r = exec.buffer bytes 256 : !exec.buffer<tensor<1x16xf32>>
    %o = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.linear" ins(%x, %lw : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64x64xbf16>>) outs(%o : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    %dx = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.rms_norm_grad" ins(%x, %w, %r, %dy : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<1x16xf32>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%dx, %g : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xf32>>) workspace 512 args {weight_grad = @nw, zero_centered, scope = #train.scope<0, mlp_norm>}
    %sum = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.add" ins(%o, %dx : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%sum : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0 args {scope = #train.scope<0, attn_proj>}
    %o2 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.linear" ins(%sum, %lw : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64x64xbf16>>) outs(%o2 : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    exec.return
  }
}

// -----

// Left apart: dx read by another kernel too (it must be stored), the two on
// different streams, and a norm that also rebuilds its forward output.

// CHECK-LABEL: exec.step @stays
// CHECK-SAME: fused_norm_grad_add = 0 : i64
// CHECK-NOT: train.rms_norm_grad_add
// CHECK-COUNT-2: exec.kernel "train.rms_norm_grad"
// CHECK: exec.kernel "train.rms_norm_grad_rebuild"

module {
  exec.step @stays attributes {} {
    %w = exec.persistent "nw" weight bytes 256 : !exec.buffer<tensor<64xbf16>>
    %lw = exec.persistent "lw" weight bytes 8192 : !exec.buffer<tensor<64x64xbf16>>
    %s = exec.persistent "driver_scratch" scratch bytes 256 : !exec.buffer<tensor<256xi8>>
    %x = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %dy = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %r = exec.buffer bytes 256 : !exec.buffer<tensor<1x16xf32>>
    %dx = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.rms_norm_grad" ins(%x, %w, %r, %dy : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<1x16xf32>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%dx : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    %sum = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.add" ins(%x, %dx : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%sum : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    %o = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.linear" ins(%dx, %lw : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64x64xbf16>>) outs(%o : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    %dx2 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.rms_norm_grad" ins(%x, %w, %r, %dy : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<1x16xf32>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%dx2 : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    %sum2 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.add" ins(%x, %dx2 : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%sum2 : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0 on side
    %dx3 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    %y3 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.rms_norm_grad_rebuild" ins(%x, %w, %r, %dy : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<1x16xf32>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%dx3, %y3 : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    %sum3 = exec.buffer bytes 2048 : !exec.buffer<tensor<1x16x64xbf16>>
    exec.kernel "train.add" ins(%x, %dx3 : !exec.buffer<tensor<1x16x64xbf16>>, !exec.buffer<tensor<1x16x64xbf16>>) outs(%sum3 : !exec.buffer<tensor<1x16x64xbf16>>) workspace 0
    exec.return
  }
}
