// RUN: actplace-translate --emit-cpp %s | FileCheck %s

// A recompute issued early on the side stream: it waits for compute's event,
// runs through the runner's launchOn(AP_STREAM_SIDE, ...) (side workspace and
// SM target), and compute waits for the side's event before reading it. The
// plan's side workspace and the step's side-stream SM share (from the device
// profile) reach the program table.

// CHECK: // Buffer plan (exec-plan-memory): arena [persistent | activations | workspace | side workspace].
// CHECK: constexpr uint64_t kWorkspaceBytes = 1024ull;
// CHECK-NEXT: constexpr uint64_t kSideWorkspaceBytes = 512ull;
// CHECK-NEXT: constexpr uint64_t kArenaBytes = 4096ull;

// CHECK-LABEL: void trainStep(ap_step *r) {
// CHECK:      ap_record(r, [[E0:[0-9]+]], AP_STREAM_COMPUTE);
// CHECK-NEXT: ap_wait(r, AP_STREAM_SIDE, [[E0]]);
// CHECK:      LinearForwardArgs a;
// CHECK:      ap_launch(r, AP_STREAM_SIDE, "L0.mlp_fc1/linear(recompute)", AP_KERNEL_LINEAR_FORWARD, &a, sizeof a);
// CHECK:      ap_record(r, [[E1:[0-9]+]], AP_STREAM_SIDE);
// CHECK-NEXT: ap_wait(r, AP_STREAM_COMPUTE, [[E1]]);
// CHECK:      ap_launch(r, AP_STREAM_COMPUTE, "L0.mlp_fc1/add", AP_KERNEL_RESIDUAL_ADD_FORWARD, &a, sizeof a);

// CHECK-LABEL: ap_program makeProgram() {
// CHECK:      p.workspace_bytes = kWorkspaceBytes;
// CHECK-NEXT: p.side_workspace_bytes = kSideWorkspaceBytes;
// CHECK-NEXT: p.side_kernels = 1;
// CHECK-NEXT: p.side_sm_percent = 60;
// CHECK-NEXT: p.arena_bytes = kArenaBytes;
// CHECK-NEXT: p.pinned_bytes = kPinnedBytes;
// CHECK-NEXT: p.scratch_bytes = kScratchBytes;
// CHECK-NEXT: p.scratch_offset = kScratchOffset;

module {
  exec.step @train_step attributes {arena_bytes = 4096 : i64, persistent_bytes = 512 : i64, activation_bytes = 2048 : i64, workspace_bytes = 1024 : i64, side_workspace_bytes = 512 : i64, side_sm_percent = 60 : i64} {
    %w = exec.persistent "w" weight offset 0 bytes 256 : !exec.buffer<tensor<8x4xbf16>>
    %s = exec.persistent "driver_scratch" scratch offset 256 bytes 256 : !exec.buffer<tensor<256xi8>>
    %x = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<1x8x4xbf16>>
    %y = exec.buffer offset 768 bytes 256 : !exec.buffer<tensor<1x8x8xbf16>>
    %z = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<1x8x8xbf16>>
    %e0 = exec.event_create : !exec.event
    %e1 = exec.event_create : !exec.event
    exec.record %e0 on compute
    exec.wait %e0 on side
    exec.kernel "train.linear" ins(%x, %w : !exec.buffer<tensor<1x8x4xbf16>>, !exec.buffer<tensor<8x4xbf16>>) outs(%y : !exec.buffer<tensor<1x8x8xbf16>>) workspace 512 on side args {scope = #train.scope<0, mlp_fc1>, train.recomputed}
    exec.record %e1 on side
    exec.wait %e1 on compute
    exec.kernel "train.add" ins(%y, %y : !exec.buffer<tensor<1x8x8xbf16>>, !exec.buffer<tensor<1x8x8xbf16>>) outs(%z : !exec.buffer<tensor<1x8x8xbf16>>) workspace 0 args {scope = #train.scope<0, mlp_fc1>}
    exec.return
  }
}
