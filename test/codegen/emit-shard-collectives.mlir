// The shard collectives of a data-parallel step (exec.all_gather,
// exec.reduce_scatter) lower to the runtime's ap_all_gather and
// ap_reduce_scatter with their arena offsets, the shard's bytes, dtype,
// stream and (a scatter) AP_REDUCE_ACCUMULATE, exec.zero to ap_zero, in both
// sinks: the LLVM path binaries are built from and the
// readable C++.
// RUN: actplace-translate --emit-llvm-ir %s | FileCheck %s --check-prefix=IR
// RUN: actplace-translate --emit-cpp %s | FileCheck %s --check-prefix=CPP
// IR-DAG: declare void @ap_all_gather(ptr, i64, i64, i64, i32, i32, i32)
// IR-DAG: declare void @ap_reduce_scatter(ptr, i64, i64, i64, i32, i32, i32)
// IR-DAG: declare void @ap_zero(ptr, i64, i64, i32)
// IR:      call void @ap_all_gather(ptr %0, i64 0, i64 2048, i64 64, i32 0, i32 3, i32 0)
// IR-NEXT: call void @ap_reduce_scatter(ptr %0, i64 2304, i64 256, i64 128, i32 1, i32 3, i32 0)
// IR-NEXT: call void @ap_zero(ptr %0, i64 2304, i64 256, i32 0)
// IR-NEXT: call void @ap_reduce_scatter(ptr %0, i64 2304, i64 256, i64 128, i32 1, i32 3, i32 2)
// CPP:      ap_all_gather(r, 0ull, 2048ull, 64ull, AP_DTYPE_BF16, AP_STREAM_COMM, 0);
// CPP-NEXT: ap_reduce_scatter(r, 2304ull, 256ull, 128ull, AP_DTYPE_F32, AP_STREAM_COMM, 0);
// CPP-NEXT: ap_zero(r, 2304ull, 256ull, AP_STREAM_COMPUTE);
// CPP-NEXT: ap_reduce_scatter(r, 2304ull, 256ull, 128ull, AP_DTYPE_F32, AP_STREAM_COMM, AP_REDUCE_ACCUMULATE);
// CPP:      p.data_parallel_size = 2;
exec.step @train_step attributes {arena_bytes = 8192 : i64, persistent_bytes = 1536 : i64, micro_batches = 1 : i64, data_parallel_size = 2 : i64} {
  %w = exec.persistent "w" weight offset 0 bytes 256 : !exec.buffer<tensor<32xbf16>>
  %g = exec.persistent "w" main_grad offset 256 bytes 256 : !exec.buffer<tensor<32xf32>>
  %sc = exec.persistent "driver_scratch" scratch offset 512 bytes 1024 : !exec.buffer<tensor<1024xi8>>
  exec.microbatch_loop count 1 {
    %full = exec.buffer offset 2048 bytes 256 : !exec.buffer<tensor<64xbf16>>
    exec.all_gather %w into %full over "dp" on comm : !exec.buffer<tensor<32xbf16>> to !exec.buffer<tensor<64xbf16>>
    %gfull = exec.buffer offset 2304 bytes 256 : !exec.buffer<tensor<64xf32>>
    exec.reduce_scatter %gfull into %g over "dp" on comm : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<32xf32>>
    exec.zero %gfull on compute : !exec.buffer<tensor<64xf32>>
    exec.reduce_scatter %gfull into %g over "dp" on comm accumulate : !exec.buffer<tensor<64xf32>> to !exec.buffer<tensor<32xf32>>
  }
  exec.return
}
