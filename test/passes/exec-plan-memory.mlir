// RUN: actplace-opt %s -exec-plan-memory=print-plan -split-input-file | FileCheck %s

// Arena layout: persistent buffers first (in program order), then the
// activations, then one workspace as large as the largest kernel's.
//   %a [k0 .. d2h]   offloaded: its region is reusable only after the D2H.
//   %b [k1 .. k2]
//   %c [k2 .. k3]    reuses %a's region: the plan adds the wait on the D2H
//                    event before its writer.
//   %r [h2d .. k3]   the reload: %a's bytes back, live with %c.
//   %d [k3 .. k3]

// CHECK: exec-plan-memory: arena 3840 bytes = persistent 512 + activations 2304 + workspace 1024; pinned 1024 bytes; 5 transient buffers, 1 reuse waits
// CHECK-NEXT: buffer 0 offset 512 bytes 1024 live 1 4 tensor<256xf32> offloaded
// CHECK-NEXT: buffer 1 offset 1536 bytes 512 live 6 8 tensor<128xf32>
// CHECK-NEXT: buffer 2 offset 512 bytes 1024 live 8 15 tensor<256xf32>
// CHECK-NEXT: buffer 3 offset 1536 bytes 1024 live 11 15 tensor<256xf32>
// CHECK-NEXT: buffer 4 offset 2560 bytes 256 live 15 15 tensor<4xf32>

// CHECK-LABEL: exec.step @train_step attributes {activation_bytes = 2304 : i64, arena_bytes = 3840 : i64, persistent_bytes = 512 : i64, pinned_bytes = 1024 : i64, workspace_bytes = 1024 : i64}
exec.step @train_step {
  // CHECK: exec.persistent "w" weight offset 0 bytes 256
  %w = exec.persistent "w" weight bytes 256 : !exec.buffer<tensor<4xf32>>
  // CHECK: exec.persistent "loss" state offset 256 bytes 256
  %l = exec.persistent "loss" state bytes 256 : !exec.buffer<tensor<f32>>
  exec.microbatch_loop count 1 {
    // CHECK: %[[A:.*]] = exec.buffer offset 512 bytes 1024
    %a = exec.buffer bytes 1024 : !exec.buffer<tensor<256xf32>>
    exec.kernel "test.k0" ins(%w : !exec.buffer<tensor<4xf32>>) outs(%a : !exec.buffer<tensor<256xf32>>) workspace 1000
    %s = exec.pool_acquire slot 0 offset 0 bytes 1024 : !exec.host<tensor<256xf32>>
    %e = exec.event_create : !exec.event
    // CHECK: exec.d2h %[[A]] to %{{.*}} on d2h record %[[E:[0-9]+]]
    exec.d2h %a to %s on d2h record %e : !exec.buffer<tensor<256xf32>> to !exec.host<tensor<256xf32>>
    // CHECK: exec.buffer offset 1536 bytes 512
    %b = exec.buffer bytes 512 : !exec.buffer<tensor<128xf32>>
    // CHECK-NEXT: exec.kernel "test.k1"
    exec.kernel "test.k1" ins(%w : !exec.buffer<tensor<4xf32>>) outs(%b : !exec.buffer<tensor<128xf32>>) workspace 0
    // CHECK-NEXT: %[[C:.*]] = exec.buffer offset 512 bytes 1024
    %c = exec.buffer bytes 1024 : !exec.buffer<tensor<256xf32>>
    // CHECK-NEXT: exec.wait %[[E]] on compute
    // CHECK-NEXT: exec.kernel "test.k2"
    exec.kernel "test.k2" ins(%b : !exec.buffer<tensor<128xf32>>) outs(%c : !exec.buffer<tensor<256xf32>>) workspace 0
    // CHECK-NEXT: exec.buffer offset 1536 bytes 1024
    %r = exec.buffer bytes 1024 : !exec.buffer<tensor<256xf32>>
    %e2 = exec.event_create : !exec.event
    exec.h2d %s to %r on h2d record %e2 : !exec.host<tensor<256xf32>> to !exec.buffer<tensor<256xf32>>
    exec.pool_release %s after %e2 : !exec.host<tensor<256xf32>>
    exec.wait %e2 on compute
    // CHECK: exec.buffer offset 2560 bytes 256
    %d = exec.buffer bytes 256 : !exec.buffer<tensor<4xf32>>
    exec.kernel "test.k3" ins(%r, %c : !exec.buffer<tensor<256xf32>>, !exec.buffer<tensor<256xf32>>) outs(%d : !exec.buffer<tensor<4xf32>>) workspace 0
  }
  exec.return %l : !exec.buffer<tensor<f32>>
}

// -----

// A view extends the lifetime of its root: %x stays live until %v's last
// use (position 6), so %y (live at 4) may not take its place. Largest
// first: %z at 0, then %x above it, %y free to share %z's bytes.
// CHECK: exec-plan-memory: arena 768 bytes = persistent 0 + activations 768 + workspace 0; pinned 0 bytes; 3 transient buffers, 0 reuse waits
// CHECK-NEXT: buffer 0 offset 512 bytes 256 live 1 6 tensor<2x8xf32>
// CHECK-NEXT: buffer 1 offset 0 bytes 256 live 4 4 tensor<16xf32>
// CHECK-NEXT: buffer 2 offset 0 bytes 512 live 6 6 tensor<128xf32>
exec.step @views {
  exec.microbatch_loop count 1 {
    %x = exec.buffer bytes 256 : !exec.buffer<tensor<2x8xf32>>
    exec.kernel "test.k0" outs(%x : !exec.buffer<tensor<2x8xf32>>) workspace 0
    %v = exec.view %x : !exec.buffer<tensor<2x8xf32>> to !exec.buffer<tensor<16xf32>>
    %y = exec.buffer bytes 256 : !exec.buffer<tensor<16xf32>>
    exec.kernel "test.k1" outs(%y : !exec.buffer<tensor<16xf32>>) workspace 0
    %z = exec.buffer bytes 512 : !exec.buffer<tensor<128xf32>>
    exec.kernel "test.k2" ins(%v : !exec.buffer<tensor<16xf32>>) outs(%z : !exec.buffer<tensor<128xf32>>) workspace 0
  }
  exec.return
}

// -----

// done_by_kernel = 2: the D2H of %a is predicted to end before kernel #2
// (k2, position 8) starts, so %a's bytes stay reserved until position 7:
// %b (live 6..8, placed first as the largest) may not share them although
// %a's last use is at 4; %c (written by k2) takes them, with a wait on the
// D2H that is not expected to stall.
// CHECK: exec-plan-memory: arena 768 bytes = persistent 0 + activations 768 + workspace 0; pinned 256 bytes; 3 transient buffers, 1 reuse waits
// CHECK-NEXT: buffer 0 offset 512 bytes 256 live 1 7 tensor<64xf32> offloaded
// CHECK-NEXT: buffer 1 offset 0 bytes 512 live 6 8 tensor<128xf32>
// CHECK-NEXT: buffer 2 offset 512 bytes 256 live 8 8 tensor<64xf32>
// CHECK-LABEL: exec.step @hold
// CHECK: %[[E:.*]] = exec.event_create
// CHECK: exec.wait %[[E]] on compute
// CHECK-NEXT: exec.kernel "test.k2"
exec.step @hold {
  exec.microbatch_loop count 1 {
    %a = exec.buffer bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k0" outs(%a : !exec.buffer<tensor<64xf32>>) workspace 0
    %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<64xf32>>
    %e = exec.event_create : !exec.event
    exec.d2h %a to %s on d2h record %e {done_by_kernel = 2 : i64} : !exec.buffer<tensor<64xf32>> to !exec.host<tensor<64xf32>>
    %b = exec.buffer bytes 512 : !exec.buffer<tensor<128xf32>>
    exec.kernel "test.k1" outs(%b : !exec.buffer<tensor<128xf32>>) workspace 0
    %c = exec.buffer bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.kernel "test.k2" ins(%b : !exec.buffer<tensor<128xf32>>) outs(%c : !exec.buffer<tensor<64xf32>>) workspace 0
  }
  exec.return
}
