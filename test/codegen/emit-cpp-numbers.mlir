// RUN: actplace-translate --emit-cpp %s | FileCheck %s

// Numbers reach the generated C++ exactly (%.17g round-trips a double), and
// a float kernel argument is always a float literal of the float the
// kernel gets (%.9g round-trips a float, so the C++ and the LLVM path hand
// the kernel the same bits): an integral value gets its ".0" ("1f" would
// not compile).

// CHECK:      GdnL2NormArgs a;
// CHECK:      a.eps = 1.0f;
// CHECK:      GdnL2NormArgs a;
// CHECK:      a.eps = 9.99999997e-07f;
// CHECK:      ap_finalize_grads(r, 0.10000000000000001);

module {
  exec.step @train_step attributes {arena_bytes = 4096 : i64} {
    %s = exec.persistent "driver_scratch" scratch offset 2048 bytes 256 : !exec.buffer<tensor<256xi8>>
    %x = exec.buffer offset 0 bytes 512 : !exec.buffer<tensor<1x2x2x16xf32>>
    %y = exec.buffer offset 512 bytes 512 : !exec.buffer<tensor<1x2x2x16xf32>>
    %r = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<1x2x2xf32>>
    %c = exec.buffer offset 1280 bytes 256 : !exec.buffer<tensor<i32>>
    exec.kernel "train.l2_norm" ins(%x : !exec.buffer<tensor<1x2x2x16xf32>>) outs(%y, %r : !exec.buffer<tensor<1x2x2x16xf32>>, !exec.buffer<tensor<1x2x2xf32>>) workspace 0 args {eps = 1.0 : f64}
    exec.kernel "train.l2_norm" ins(%x : !exec.buffer<tensor<1x2x2x16xf32>>) outs(%y, %r : !exec.buffer<tensor<1x2x2x16xf32>>, !exec.buffer<tensor<1x2x2xf32>>) workspace 0 args {eps = 1.0e-6 : f64}
    exec.kernel "train.finalize_grads" ins(%c : !exec.buffer<tensor<i32>>) workspace 0 args {max_norm = 0.1 : f64}
    exec.return
  }
}
