// RUN: actplace-opt %s -split-input-file -verify-diagnostics
// The shape rule exec ops share with train ops (dialect/train/TensorShapes.h)
// on the tensors buffers and slots hold, and the limits on planned extents
// that keep the memory plan's sums inside int64.

exec.step @s {
  // expected-error @+1 {{'exec.buffer' op result #0 dimension 0 is 0 in 'tensor<0x4xf32>'; every dimension must be at least 1}}
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<0x4xf32>>
  exec.return
}

// -----

// A dynamic dimension reached tensorBytes' element count.
exec.step @s {
  // expected-error @+1 {{'exec.persistent' op result #0 dimension 1 is dynamic in 'tensor<4x?xf32>'; tensors need static dimensions}}
  %g = exec.persistent "w" main_grad bytes 256 : !exec.buffer<tensor<4x?xf32>>
  exec.return
}

// -----

// An element without a bit width reached tensorBytes.
exec.step @s {
  // expected-error @+1 {{'exec.pool_acquire' op result #0 has element type 'index'; expected an integer or float element type}}
  %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<4xindex>>
  exec.return
}

// -----

exec.step @s {
  // expected-error @+1 {{'exec.buffer' op result #0 holds 'tensor<70368744177664x3xbf16>', more than 281474976710656 bytes (211106232532992 elements of 2 bytes)}}
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<70368744177664x3xbf16>>
  exec.return
}

// -----

// exec-plan-memory summed such sizes into a negative arena.
exec.step @s {
  // expected-error @+1 {{'exec.persistent' op bytes 9223372036854775552 exceeds 281474976710656 (the most one tensor may hold)}}
  %w = exec.persistent "w" weight bytes 9223372036854775552 : !exec.buffer<tensor<4xf32>>
  exec.return
}

// -----

exec.step @s {
  // expected-error @+1 {{'exec.pool_acquire' op offset 9223372036854775552 exceeds 72057594037927936 (the largest arena or pool offset)}}
  %s = exec.pool_acquire slot 0 offset 9223372036854775552 bytes 256 : !exec.host<tensor<4xf32>>
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<4xf32>>
  // expected-error @+1 {{'exec.kernel' op workspace 9223372036854775807 exceeds 281474976710656 (the most one kernel's scratch may take)}}
  exec.kernel "test.add" outs(%b : !exec.buffer<tensor<4xf32>>) workspace 9223372036854775807
  exec.return
}
