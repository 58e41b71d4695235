// RUN: actplace-translate --emit-llvm-step %s 2>/dev/null | FileCheck %s
// RUN: not actplace-translate --emit-cpp %s 2>&1 | FileCheck %s --check-prefix=CPP
// RUN: sed 's/kernels = "generated"/kernels = "fast"/' %s | not actplace-translate --emit-llvm-step 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: sed -e 's/kernels = "generated"/kernels = "library"/' -e '/"train.add_rms_norm"/d' %s | actplace-translate --emit-llvm-step 2>&1 | FileCheck %s --check-prefix=LIB
// RUN: sed 's/kernels = "generated"/kernels = "library"/' %s | not actplace-translate --emit-llvm-step 2>&1 | FileCheck %s --check-prefix=FUSED-LIB
// RUN: sed 's/kernels = "generated"/kernels = "generated", generated_ops = ["train.swiglu", "train.add_rms_norm"]/' %s | actplace-translate --emit-llvm-step 2>&1 | FileCheck %s --check-prefix=SUBSET
// RUN: sed 's/kernels = "generated"/kernels = "library", generated_ops = ["train.swiglu"]/' %s | not actplace-translate --emit-llvm-step 2>&1 | FileCheck %s --check-prefix=OPS-LIB
// RUN: sed 's/kernels = "generated"/kernels = "generated", generated_ops = [7]/' %s | not actplace-translate --emit-llvm-step 2>&1 | FileCheck %s --check-prefix=OPS-BAD

// exec.step kernels = "generated": the element-wise and row-wise calls with
// a kernelgen group (residual add, SwiGLU, RMSNorm forward, RMSNorm backward
// with its main grad, in bf16 and f32) launch generated kernels through
// ap_launch_generated, each distinct kernel once in the program's table in
// first-launch order; the linear stays a library launch. The host kernels
// and their packed entries are functions of the module. The forward norms'
// short rows take 4 rows a GPU warp (kernelName's _r4).

// CHECK-DAG: llvm.func @ap_launch_generated(!llvm.ptr, i32, !llvm.ptr, i32, !llvm.ptr, i64)
// CHECK-DAG: llvm.func @ap_launch(!llvm.ptr, i32, !llvm.ptr, i32, !llvm.ptr, i64)
// The table's strings (before the step): kernel names, parameter kinds
// ('p' pointer, 'w' workspace, 'l' int64, 'f' float), GPU entries (RMSNorm
// backward's rows, dw partial and dw kernels).
// CHECK-DAG: constant @str.{{[0-9]+}}("ap_kg_residual_add_bf16\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("pppl\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ap_kg_swiglu_fwd_bf16\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ppplllll\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ap_kg_rmsnorm_fwd_zc_r4_bf16\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ppppllllf\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ppppppwlllllll\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ap_kg_rmsnorm_bwd_zc_dw_k_bf16_rows\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ap_kg_rmsnorm_bwd_zc_dw_k_bf16_dwpart\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ap_kg_rmsnorm_bwd_zc_dw_k_bf16_dw\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ap_kg_residual_add_f32\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ap_kg_add_rmsnorm_fwd_zc_r4_bf16\00")
// CHECK-DAG: constant @str.{{[0-9]+}}("ppppppllf\00")
// CHECK-LABEL: llvm.func internal @actplace_step(
// The add: kernel 0, three pointers and n in four 8-byte slots.
// CHECK:      llvm.mlir.addressof @str.{{[0-9]+}} : !llvm.ptr
// CHECK-NEXT: [[K0:%[0-9]+]] = llvm.mlir.constant(0 : i32) : i32
// CHECK-NEXT: [[S0:%[0-9]+]] = llvm.mlir.constant(32 : i64) : i64
// CHECK-NEXT: llvm.call @ap_launch_generated(%arg0, {{%[0-9]+}}, {{%[0-9]+}}, [[K0]], {{%[0-9]+}}, [[S0]])
// The SwiGLU forward: kernel 1, 3 pointers + 5 integers.
// CHECK:      llvm.mlir.addressof @str.{{[0-9]+}} : !llvm.ptr
// CHECK-NEXT: [[K1:%[0-9]+]] = llvm.mlir.constant(1 : i32) : i32
// CHECK-NEXT: [[S1:%[0-9]+]] = llvm.mlir.constant(64 : i64) : i64
// CHECK-NEXT: llvm.call @ap_launch_generated(%arg0, {{%[0-9]+}}, {{%[0-9]+}}, [[K1]], {{%[0-9]+}}, [[S1]])
// The linear: a library kernel.
// CHECK:      llvm.call @ap_launch(
// RMSNorm forward (kernel 2: 4 pointers, 4 integers, eps) and backward
// with dw (kernel 3: 6 pointers, the workspace, 7 integers).
// CHECK:      llvm.mlir.addressof @str.{{[0-9]+}} : !llvm.ptr
// CHECK-NEXT: [[K2:%[0-9]+]] = llvm.mlir.constant(2 : i32) : i32
// CHECK-NEXT: [[S2:%[0-9]+]] = llvm.mlir.constant(72 : i64) : i64
// CHECK-NEXT: llvm.call @ap_launch_generated(%arg0, {{%[0-9]+}}, {{%[0-9]+}}, [[K2]], {{%[0-9]+}}, [[S2]])
// CHECK:      llvm.mlir.addressof @str.{{[0-9]+}} : !llvm.ptr
// CHECK-NEXT: [[K3:%[0-9]+]] = llvm.mlir.constant(3 : i32) : i32
// CHECK-NEXT: [[S3:%[0-9]+]] = llvm.mlir.constant(112 : i64) : i64
// CHECK-NEXT: llvm.call @ap_launch_generated(%arg0, {{%[0-9]+}}, {{%[0-9]+}}, [[K3]], {{%[0-9]+}}, [[S3]])
// The f32 add is kernel 4; the second bf16 add reuses kernel 0.
// CHECK:      llvm.mlir.addressof @str.{{[0-9]+}} : !llvm.ptr
// CHECK-NEXT: llvm.mlir.constant(4 : i32) : i32
// CHECK-NEXT: llvm.mlir.constant(32 : i64) : i64
// CHECK-NEXT: llvm.call @ap_launch_generated(
// CHECK:      llvm.mlir.addressof @str.{{[0-9]+}} : !llvm.ptr
// CHECK-NEXT: llvm.mlir.constant(0 : i32) : i32
// CHECK-NEXT: llvm.mlir.constant(32 : i64) : i64
// CHECK-NEXT: llvm.call @ap_launch_generated(
// The fused residual add + RMSNorm: kernel 5, 6 pointers, rows, dim, eps.
// CHECK:      llvm.mlir.addressof @str.{{[0-9]+}} : !llvm.ptr
// CHECK-NEXT: llvm.mlir.constant(5 : i32) : i32
// CHECK-NEXT: llvm.mlir.constant(72 : i64) : i64
// CHECK-NEXT: llvm.call @ap_launch_generated(
// CHECK-NOT:  llvm.call @ap_launch_generated(
// CHECK:      llvm.return

// The table: packed host entries, GPU entries; the host kernels beside it.
// CHECK-DAG: llvm.mlir.global private constant @generated()
// CHECK-DAG: llvm.mlir.addressof @ap_kg_rmsnorm_bwd_zc_dw_k_bf16_packed
// CHECK-DAG: llvm.func @ap_kg_residual_add_bf16(
// CHECK-DAG: llvm.func @ap_kg_residual_add_bf16_packed(%arg0: !llvm.ptr) {
// CHECK-DAG: llvm.func @ap_kg_residual_add_f32_packed(%arg0: !llvm.ptr) {
// CHECK-DAG: llvm.func @ap_kg_swiglu_fwd_bf16_packed(%arg0: !llvm.ptr) {
// CHECK-DAG: llvm.func @ap_kg_rmsnorm_fwd_zc_r4_bf16_packed(%arg0: !llvm.ptr) {
// CHECK-DAG: llvm.mlir.addressof @generated
// CHECK-LABEL: llvm.func @main(

// CPP: error: emit-cpp: exec.step has kernels = "generated", which this output form cannot hold

// BAD: error: convert-exec-to-llvm: exec.step has kernels = "fast" (expected "library" or "generated")

// FUSED-LIB: error: convert-exec-to-llvm: 'train.add_rms_norm' runs only as a generated kernel of bf16 or f32 (exec.step kernels = "generated")

// generated_ops (--kernels=auto's choice): only those ops launch generated
// kernels; the adds and norms outside the list keep the library's.
// SUBSET-DAG: llvm.func @ap_kg_swiglu_fwd_bf16_packed(
// SUBSET-DAG: llvm.func @ap_kg_add_rmsnorm_fwd_zc_r4_bf16_packed(
// SUBSET-NOT: llvm.func @ap_kg_residual_add
// SUBSET-NOT: llvm.func @ap_kg_rmsnorm_fwd
// SUBSET-NOT: llvm.func @ap_kg_rmsnorm_bwd
// OPS-LIB: error: convert-exec-to-llvm: exec.step has generated_ops = ["train.swiglu"] (expected an array of train op names, with kernels = "generated")
// OPS-BAD: error: convert-exec-to-llvm: exec.step has generated_ops entry 7 : i64 (expected a train op name)

// LIB-NOT: ap_launch_generated
// LIB-NOT: ap_kg_

module {
  exec.step @train_step attributes {arena_bytes = 8192 : i64, persistent_bytes = 1024 : i64, activation_bytes = 6144 : i64, workspace_bytes = 1024 : i64, kernels = "generated"} {
    %w = exec.persistent "w" weight offset 0 bytes 256 : !exec.buffer<tensor<8x4xbf16>>
    %nw = exec.persistent "nw" weight offset 256 bytes 256 : !exec.buffer<tensor<8xbf16>>
    %ng = exec.persistent "nw" main_grad offset 512 bytes 256 : !exec.buffer<tensor<8xf32>>
    %s = exec.persistent "driver_scratch" scratch offset 768 bytes 256 : !exec.buffer<tensor<256xi8>>
    %x = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<1x8x8xbf16>>
    %y = exec.buffer offset 1280 bytes 256 : !exec.buffer<tensor<1x8x8xbf16>>
    %z = exec.buffer offset 1536 bytes 256 : !exec.buffer<tensor<1x8x8xbf16>>
    %u = exec.buffer offset 1792 bytes 256 : !exec.buffer<tensor<1x8x4xbf16>>
    %r = exec.buffer offset 2048 bytes 256 : !exec.buffer<tensor<8xf32>>
    %dx = exec.buffer offset 2304 bytes 256 : !exec.buffer<tensor<1x8x8xbf16>>
    %fa = exec.buffer offset 2560 bytes 256 : !exec.buffer<tensor<8x8xf32>>
    %fb = exec.buffer offset 2816 bytes 256 : !exec.buffer<tensor<8x8xf32>>
    %fc = exec.buffer offset 3072 bytes 256 : !exec.buffer<tensor<8x8xf32>>
    exec.kernel "train.add" ins(%x, %y : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<1x8x8xbf16>>) outs(%z : !exec.buffer<tensor<1x8x8xbf16>>) workspace 0 args {scope = #train.scope<0, mlp_fc1>}
    exec.kernel "train.swiglu" ins(%x, %y : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<1x8x8xbf16>>) outs(%z : !exec.buffer<tensor<1x8x8xbf16>>) workspace 0 args {scope = #train.scope<0, mlp_act>}
    exec.kernel "train.linear" ins(%z, %w : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<8x4xbf16>>) outs(%u : !exec.buffer<tensor<1x8x4xbf16>>) workspace 512 args {scope = #train.scope<0, mlp_fc2>}
    exec.kernel "train.rms_norm" ins(%x, %nw : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<8xbf16>>) outs(%y, %r : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<8xf32>>) workspace 0 args {eps = 1.0e-06 : f64, zero_centered, scope = #train.scope<0, mlp_norm>}
    exec.kernel "train.rms_norm_grad" ins(%x, %nw, %r, %y : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<8xbf16>>, !exec.buffer<tensor<8xf32>>, !exec.buffer<tensor<1x8x8xbf16>>) outs(%dx, %ng : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<8xf32>>) workspace 0 args {zero_centered, weight_grad = @nw, scope = #train.scope<0, mlp_norm>}
    exec.kernel "train.add" ins(%fa, %fb : !exec.buffer<tensor<8x8xf32>>, !exec.buffer<tensor<8x8xf32>>) outs(%fc : !exec.buffer<tensor<8x8xf32>>) workspace 0 args {scope = #train.scope<1, mlp_fc1>}
    exec.kernel "train.add" ins(%dx, %y : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<1x8x8xbf16>>) outs(%z : !exec.buffer<tensor<1x8x8xbf16>>) workspace 0 args {scope = #train.scope<1, mlp_fc1>}
    %h5 = exec.buffer offset 3328 bytes 256 : !exec.buffer<tensor<1x8x8xbf16>>
    exec.kernel "train.add_rms_norm" ins(%x, %y, %nw : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<8xbf16>>) outs(%h5, %z, %r : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<8xf32>>) workspace 0 args {eps = 1.0e-06 : f64, zero_centered, scope = #train.scope<1, mlp_norm>}
    exec.return
  }
}
