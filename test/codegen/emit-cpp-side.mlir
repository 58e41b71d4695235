// RUN: actplace-translate --emit-cpp %s | FileCheck %s

// A recompute issued early on the side stream: it waits for compute's event,
// runs through the runner's launchOn(Stream::Side, ...) (side workspace and
// SM target), and compute waits for the side's event before reading it. The
// plan's side workspace reaches the program table.

// CHECK: // Buffer plan (exec-plan-memory): arena [persistent | activations | workspace | side workspace].
// CHECK: constexpr uint64_t kWorkspaceBytes = 1024ull;
// CHECK-NEXT: constexpr uint64_t kSideWorkspaceBytes = 512ull;
// CHECK-NEXT: constexpr uint64_t kArenaBytes = 4096ull;

// CHECK-LABEL: void trainStep(StepRunner &r) {
// CHECK:      r.dev.record(r.ev[[[E0:[0-9]+]]], Stream::Compute);
// CHECK-NEXT: r.dev.wait(Stream::Side, r.ev[[[E0]]]);
// CHECK:      LinearForwardArgs a;
// CHECK:      r.launchOn(Stream::Side, "L0.mlp_fc1/linear(recompute)", [a](const KernelContext &c) { return linearForward(c, a); });
// CHECK:      r.dev.record(r.ev[[[E1:[0-9]+]]], Stream::Side);
// CHECK-NEXT: r.dev.wait(Stream::Compute, r.ev[[[E1]]]);
// CHECK:      r.launch("L0.mlp_fc1/add", [a](const KernelContext &c) { return residualAddForward(c, a); });

// CHECK-LABEL: ap::rt::Program makeProgram() {
// CHECK:      p.workspaceBytes = kWorkspaceBytes;
// CHECK-NEXT: p.sideWorkspaceBytes = kSideWorkspaceBytes;
// CHECK-NEXT: p.sideKernels = true;
// CHECK-NEXT: p.arenaBytes = kArenaBytes;

module {
  exec.step @train_step attributes {arena_bytes = 4096 : i64, persistent_bytes = 512 : i64, activation_bytes = 2048 : i64, workspace_bytes = 1024 : i64, side_workspace_bytes = 512 : i64} {
    %w = exec.persistent "w" weight offset 0 bytes 256 : !exec.buffer<tensor<8x4xbf16>>
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
