// RUN: actplace-opt %s -split-input-file -verify-diagnostics

exec.step @s {
  // expected-error @+1 {{'exec.buffer' op offset must be a multiple of 256, got 100}}
  %b = exec.buffer offset 100 bytes 256 : !exec.buffer<tensor<4xf32>>
  exec.return
}

// -----

exec.step @s {
  // expected-error @+1 {{'exec.buffer' op bytes must be a multiple of 256, got 300}}
  %b = exec.buffer bytes 300 : !exec.buffer<tensor<4xf32>>
  exec.return
}

// -----

exec.step @s {
  // expected-error @+1 {{'exec.buffer' op bytes 256 < 512 bytes of 'tensor<128xf32>'}}
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<128xf32>>
  exec.return
}

// -----

exec.step @s {
  // expected-error @+1 {{'exec.persistent' op a main_grad buffer must be f32 (or bf16 under zero3), got 'tensor<4xf16>'}}
  %g = exec.persistent "w" main_grad bytes 256 : !exec.buffer<tensor<4xf16>>
  exec.return
}

// -----

exec.step @s attributes {data_parallel = "replicate", data_parallel_size = 2 : i64} {
  // expected-error @+1 {{'exec.persistent' op a bf16 main_grad buffer needs a step with data_parallel = "zero3" (kernels accumulate into f32 main grads), got 'tensor<4xbf16>'}}
  %g = exec.persistent "w" main_grad bytes 256 : !exec.buffer<tensor<4xbf16>>
  exec.return
}

// -----

exec.step @s attributes {data_parallel = "zero3", data_parallel_size = 2 : i64} {
  %g = exec.persistent "w" main_grad bytes 256 : !exec.buffer<tensor<4xbf16>>
  exec.microbatch_loop count 1 {
    %f = exec.buffer bytes 256 : !exec.buffer<tensor<8xf32>>
    // expected-error @+1 {{'exec.reduce_scatter' op shard 'tensor<4xbf16>' and full buffer 'tensor<8xf32>' differ in element type (only an accumulating scatter adds f32 into a bf16 shard)}}
    exec.reduce_scatter %f into %g over "dp" on comm : !exec.buffer<tensor<8xf32>> to !exec.buffer<tensor<4xbf16>>
  }
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.view' op element count changes from 16 to 12}}
  %v = exec.view %b : !exec.buffer<tensor<4x4xbf16>> to !exec.buffer<tensor<3x4xbf16>>
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.view' op prefix of 20 elements is longer than its source of 16}}
  %v = exec.view %b prefix : !exec.buffer<tensor<4x4xbf16>> to !exec.buffer<tensor<20xbf16>>
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<16xf32>>
  // expected-error @+1 {{'exec.zero' op runs on the compute or comm stream, not d2h}}
  exec.zero %b on d2h : !exec.buffer<tensor<16xf32>>
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.view' op element type changes from 'bf16' to 'f16'}}
  %v = exec.view %b : !exec.buffer<tensor<4x4xbf16>> to !exec.buffer<tensor<16xf16>>
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<4x4xf32>>
  %e = exec.event_create : !exec.event
  // expected-error @+1 {{'exec.d2h' op device buffer holds 'tensor<4x4xbf16>' but the host slot holds 'tensor<4x4xf32>'}}
  exec.d2h %b to %s on d2h record %e : !exec.buffer<tensor<4x4xbf16>> to !exec.host<tensor<4x4xf32>>
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<4x4xbf16>>
  %e = exec.event_create : !exec.event
  // expected-error @+1 {{'exec.d2h' op runs on the d2h (or compute) stream, not h2d}}
  exec.d2h %b to %s on h2d record %e : !exec.buffer<tensor<4x4xbf16>> to !exec.host<tensor<4x4xbf16>>
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %s = exec.pool_acquire slot 0 offset 0 bytes 256 : !exec.host<tensor<4x4xbf16>>
  %e = exec.event_create : !exec.event
  // expected-error @+1 {{'exec.h2d' op runs on the h2d (or compute) stream, not comm}}
  exec.h2d %s to %b on comm record %e : !exec.host<tensor<4x4xbf16>> to !exec.buffer<tensor<4x4xbf16>>
  exec.return
}

// -----

exec.step @s {
  // expected-error @+1 {{'exec.pool_acquire' op offset must be a multiple of 256, got 8}}
  %s = exec.pool_acquire slot 0 offset 8 bytes 256 : !exec.host<tensor<4x4xbf16>>
  exec.return
}

// -----

exec.step @s {
  %g = exec.persistent "w" weight bytes 256 : !exec.buffer<tensor<4xbf16>>
  // expected-error @+1 {{'exec.all_reduce' op sums f32 (main grads, loss) or i32 (token counts) buffers, or bf16 ones over "tp"; got 'tensor<4xbf16>'}}
  exec.all_reduce %g over "dp" on comm : !exec.buffer<tensor<4xbf16>>
  exec.return
}

// -----

exec.step @s {
  %g = exec.persistent "w" main_grad bytes 256 : !exec.buffer<tensor<4xf32>>
  // expected-error @+1 {{'exec.all_reduce' op runs on the comm (or compute) stream, not d2h}}
  exec.all_reduce %g over "dp" on d2h : !exec.buffer<tensor<4xf32>>
  exec.return
}

// -----

exec.step @s {
  %g = exec.persistent "w" main_grad bytes 256 : !exec.buffer<tensor<4xf32>>
  // expected-error @+1 {{'exec.all_reduce' op runs on the comm (or compute) stream, not side}}
  exec.all_reduce %g over "dp" on side : !exec.buffer<tensor<4xf32>>
  exec.return
}

// -----

exec.step @s {
  %g = exec.persistent "w" main_grad bytes 256 : !exec.buffer<tensor<4xf32>>
  exec.microbatch_loop count 2 {
    // expected-error @+1 {{'exec.all_reduce' op inside exec.microbatch_loop must be marked last_microbatch (main grads accumulate over microbatches and are summed once)}}
    exec.all_reduce %g over "dp" on comm : !exec.buffer<tensor<4xf32>>
  }
  exec.return
}

// -----

exec.step @s {
  %g = exec.persistent "w" main_grad bytes 256 : !exec.buffer<tensor<4xf32>>
  exec.microbatch_loop count 2 {
    // expected-error @+1 {{'exec.all_reduce' op over "tp" sums one microbatch's values and runs every microbatch; it cannot be last_microbatch}}
    exec.all_reduce %g over "tp" on compute last_microbatch : !exec.buffer<tensor<4xf32>>
  }
  exec.return
}

// -----

exec.step @s {
  %g = exec.persistent "w" main_grad bytes 256 : !exec.buffer<tensor<4xf32>>
  // expected-error @+1 {{'exec.all_reduce' op is marked last_microbatch outside exec.microbatch_loop}}
  exec.all_reduce %g over "dp" on comm last_microbatch : !exec.buffer<tensor<4xf32>>
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<4xf32>>
  // expected-error @+1 {{'exec.kernel' op callee must name a train op ("train.<op>") or a test kernel ("test.<name>"), got "linear"}}
  exec.kernel "linear" outs(%b : !exec.buffer<tensor<4xf32>>) workspace 0
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<4xf32>>
  // expected-error @+1 {{'exec.kernel' op buffer is both an input and an output; an accumulated buffer is an output only}}
  exec.kernel "train.add" ins(%b : !exec.buffer<tensor<4xf32>>) outs(%b : !exec.buffer<tensor<4xf32>>) workspace 0
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<1x4xf32>>
  // expected-error @+1 {{'exec.load_input' op dest must hold a 2-D i32 tensor [B, T], got 'tensor<1x4xf32>'}}
  exec.load_input "tokens" to %b : !exec.buffer<tensor<1x4xf32>>
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<1x4xi32>>
  // expected-error @+1 {{'exec.load_input' op name must be "tokens" or "labels", got "text"}}
  exec.load_input "text" to %b : !exec.buffer<tensor<1x4xi32>>
  exec.return
}

// -----

// expected-error @+1 {{'exec.step' op expects at most one exec.microbatch_loop, found 2}}
exec.step @s {
  exec.microbatch_loop count 1 {
  }
  exec.microbatch_loop count 1 {
  }
  exec.return
}

// -----

exec.step @s {
  // expected-error @+1 {{'exec.microbatch_loop' op attribute 'count' failed to satisfy constraint}}
  exec.microbatch_loop count 0 {
  }
  exec.return
}

// -----

// expected-error @+1 {{'exec.persistent' op expects parent op 'exec.step'}}
%w = exec.persistent "w" weight bytes 256 : !exec.buffer<tensor<4xbf16>>

// -----

// Kernel signatures (dialect/exec/KernelSignatures.cpp): the callee, the
// buffer counts and the args a kernel needs are checked at the op.
exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<4xf32>>
  // expected-error-re @+1 {{'exec.kernel' op no kernel implements "train.frobnicate"; known callees: train.embedding, {{.*}}, train.loss_mean}}
  exec.kernel "train.frobnicate" outs(%b : !exec.buffer<tensor<4xf32>>) workspace 0
  exec.return
}

// -----

exec.step @s {
  %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %y = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.kernel' op "train.linear" takes 2 input buffers, got 1}}
  exec.kernel "train.linear" ins(%x : !exec.buffer<tensor<4x4xbf16>>) outs(%y : !exec.buffer<tensor<4x4xbf16>>) workspace 0
  exec.return
}

// -----

exec.step @s {
  %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %y = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.kernel' op "train.concat" takes at least 1 input buffers, got 0}}
  exec.kernel "train.concat" outs(%y : !exec.buffer<tensor<4x4xbf16>>) workspace 0 args {dim = 1 : i64}
  exec.return
}

// -----

exec.step @s {
  %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %w = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %y = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.kernel' op "train.rms_norm" writes 2 result buffers before its 0 main grads, got 1}}
  exec.kernel "train.rms_norm" ins(%x, %w : !exec.buffer<tensor<4x4xbf16>>, !exec.buffer<tensor<4x4xbf16>>) outs(%y : !exec.buffer<tensor<4x4xbf16>>) workspace 0 args {eps = 1.0e-6 : f64}
  exec.return
}

// -----

// The fused residual add + RMSNorm (exec-generate-kernels) reads a, b and
// the weight.
exec.step @s {
  %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %w = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<4xbf16>>
  %y = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %r = exec.buffer offset 768 bytes 256 : !exec.buffer<tensor<4xf32>>
  %h = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.kernel' op "train.add_rms_norm" takes 3 input buffers, got 2}}
  exec.kernel "train.add_rms_norm" ins(%x, %w : !exec.buffer<tensor<4x4xbf16>>, !exec.buffer<tensor<4xbf16>>) outs(%h, %y, %r : !exec.buffer<tensor<4x4xbf16>>, !exec.buffer<tensor<4x4xbf16>>, !exec.buffer<tensor<4xf32>>) workspace 0 args {eps = 1.0e-6 : f64}
  exec.return
}

// -----

// The fused RMSNorm backward + residual add (exec-generate-kernels) reads
// x, w, rstd, dy (or its 2 to 4 addends) and the other addend.
exec.step @s {
  %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %w = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<4xbf16>>
  %r = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<4xf32>>
  %dy = exec.buffer offset 768 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %s = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.kernel' op "train.rms_norm_grad_add" takes 5 to 8 input buffers, got 4}}
  exec.kernel "train.rms_norm_grad_add" ins(%x, %w, %r, %dy : !exec.buffer<tensor<4x4xbf16>>, !exec.buffer<tensor<4xbf16>>, !exec.buffer<tensor<4xf32>>, !exec.buffer<tensor<4x4xbf16>>) outs(%s : !exec.buffer<tensor<4x4xbf16>>) workspace 0
  exec.return
}

// -----

// The RMSNorm backward fused with the chain of adds forming its dy reads x,
// w, rstd and 2 to 4 addends: 8 inputs are too many.
exec.step @s {
  %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %w = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<4xbf16>>
  %r = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<4xf32>>
  %dy = exec.buffer offset 768 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %dx = exec.buffer offset 1024 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.kernel' op "train.rms_norm_grad_sum" takes 5 to 7 input buffers, got 8}}
  exec.kernel "train.rms_norm_grad_sum" ins(%x, %w, %r, %dy, %dy, %dy, %dy, %dy : !exec.buffer<tensor<4x4xbf16>>, !exec.buffer<tensor<4xbf16>>, !exec.buffer<tensor<4xf32>>, !exec.buffer<tensor<4x4xbf16>>, !exec.buffer<tensor<4x4xbf16>>, !exec.buffer<tensor<4x4xbf16>>, !exec.buffer<tensor<4x4xbf16>>, !exec.buffer<tensor<4x4xbf16>>) outs(%dx : !exec.buffer<tensor<4x4xbf16>>) workspace 0
  exec.return
}

// -----

exec.step @s {
  %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  %y = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.kernel' op "train.slice" needs args.offset (an integer)}}
  exec.kernel "train.slice" ins(%x : !exec.buffer<tensor<4x4xbf16>>) outs(%y : !exec.buffer<tensor<4x4xbf16>>) workspace 0 args {dim = 1 : i64}
  exec.return
}

// -----

exec.step @s {
  %q = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<1x4x2x8xbf16>>
  %o = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<1x4x2x8xbf16>>
  %l = exec.buffer offset 512 bytes 256 : !exec.buffer<tensor<1x2x4xf32>>
  // expected-error @+1 {{'exec.kernel' op "train.attention" args.scale must be a float}}
  exec.kernel "train.attention" ins(%q, %q, %q : !exec.buffer<tensor<1x4x2x8xbf16>>, !exec.buffer<tensor<1x4x2x8xbf16>>, !exec.buffer<tensor<1x4x2x8xbf16>>) outs(%o, %l : !exec.buffer<tensor<1x4x2x8xbf16>>, !exec.buffer<tensor<1x2x4xf32>>) workspace 0 args {scale = 1 : i64}
  exec.return
}

// -----

exec.step @s {
  %x = exec.buffer offset 0 bytes 256 : !exec.buffer<tensor<4xi32>>
  %d = exec.buffer offset 256 bytes 256 : !exec.buffer<tensor<4x4xbf16>>
  // expected-error @+1 {{'exec.kernel' op "train.embedding_grad" accumulates 1 main grads (its *_grad args) into trailing outputs, but has only 0 outputs}}
  exec.kernel "train.embedding_grad" ins(%x, %d : !exec.buffer<tensor<4xi32>>, !exec.buffer<tensor<4x4xbf16>>) workspace 0 args {weight_grad = @w}
  exec.return
}

// -----

exec.step @s {
  %s = exec.persistent "w" weight bytes 256 : !exec.buffer<tensor<32xbf16>>
  %f = exec.buffer bytes 256 : !exec.buffer<tensor<64xf32>>
  // expected-error @+1 {{'exec.all_gather' op shard 'tensor<32xbf16>' and full buffer 'tensor<64xf32>' differ in element type}}
  exec.all_gather %s into %f over "dp" on comm : !exec.buffer<tensor<32xbf16>> to !exec.buffer<tensor<64xf32>>
  exec.return
}

// -----

exec.step @s {
  %s = exec.persistent "w" weight bytes 256 : !exec.buffer<tensor<32xbf16>>
  %f = exec.buffer bytes 256 : !exec.buffer<tensor<48xbf16>>
  // expected-error @+1 {{'exec.all_gather' op full buffer of 48 elements is not a whole number of shards of 32}}
  exec.all_gather %s into %f over "dp" on comm : !exec.buffer<tensor<32xbf16>> to !exec.buffer<tensor<48xbf16>>
  exec.return
}

// -----

exec.step @s attributes {data_parallel_size = 4 : i64} {
  %s = exec.persistent "w" weight bytes 256 : !exec.buffer<tensor<32xbf16>>
  %f = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
  // expected-error @+1 {{'exec.all_gather' op full buffer of 64 elements is not 4 (the step's data_parallel_size) shards of 32}}
  exec.all_gather %s into %f over "dp" on comm : !exec.buffer<tensor<32xbf16>> to !exec.buffer<tensor<64xbf16>>
  exec.return
}

// -----

exec.step @s {
  %f = exec.buffer bytes 256 : !exec.buffer<tensor<64xf32>>
  %s = exec.persistent "w" main_grad bytes 256 : !exec.buffer<tensor<32xf32>>
  // expected-error @+1 {{'exec.reduce_scatter' op runs on the comm (or compute) stream, not h2d}}
  exec.reduce_scatter %f into %s over "dp" on h2d : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<32xf32>>
  exec.return
}

// -----

exec.step @s {
  %f = exec.buffer bytes 256 : !exec.buffer<tensor<64xi32>>
  %s = exec.buffer bytes 256 : !exec.buffer<tensor<32xi32>>
  // expected-error @+1 {{'exec.reduce_scatter' op moves bf16 or f32 buffers, got 'tensor<32xi32>'}}
  exec.reduce_scatter %f into %s over "dp" on comm : !exec.buffer<tensor<64xi32>> to !exec.buffer<tensor<32xi32>>
  exec.return
}

// -----

exec.step @s {
  exec.microbatch_loop count 2 {
    %b = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    // expected-error @+1 {{'exec.send' op runs on the comm stream, not compute}}
    exec.send %b to next channel 0 on compute : !exec.buffer<tensor<64xbf16>>
  }
  exec.return
}

// -----

exec.step @s {
  %b = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
  // expected-error @+1 {{'exec.recv' op belongs in exec.microbatch_loop (a microbatch's boundary value)}}
  exec.recv %b from prev channel 0 on comm : !exec.buffer<tensor<64xbf16>>
  exec.return
}

// -----

exec.step @s attributes {micro_batches = 2 : i64} {
  exec.microbatch_loop count 2 {
    // expected-error @+1 {{'exec.microbatch' op marks an unrolled schedule, whose exec.microbatch_loop runs once; this one runs 2 times}}
    exec.microbatch 0 forward
  }
  exec.return
}

// -----

exec.step @s attributes {micro_batches = 2 : i64} {
  exec.microbatch_loop count 1 {
    // expected-error @+1 {{'exec.microbatch' op microbatch 2 of a step with 2 microbatches}}
    exec.microbatch 2 backward
  }
  exec.return
}

// -----

exec.step @s {
  exec.microbatch_loop count 1 {
    %t = exec.buffer bytes 256 : !exec.buffer<tensor<2x8xi32>>
    // expected-error @+1 {{'exec.load_input' op tp_shard loads a [1, N/T] token shard, got 'tensor<2x8xi32>'}}
    exec.load_input "tokens" to %t tp_shard : !exec.buffer<tensor<2x8xi32>>
  }
  exec.return
}

// -----

exec.step @s attributes {tensor_parallel = 2 : i64} {
  exec.microbatch_loop count 1 {
    %s = exec.buffer bytes 256 : !exec.buffer<tensor<1x8x4xbf16>>
    %f = exec.buffer bytes 256 : !exec.buffer<tensor<3x8x4xbf16>>
    // expected-error @+1 {{'exec.all_gather' op full buffer of 96 elements is not 2 (the step's tensor_parallel) shards of 32}}
    exec.all_gather %s into %f over "tp" on compute : !exec.buffer<tensor<1x8x4xbf16>> to !exec.buffer<tensor<3x8x4xbf16>>
  }
  exec.return
}
