// RUN: actplace-opt %s -exec-plan-memory -exec-schedule-streams | FileCheck %s
// exec-schedule-streams orders the shard collectives like any other op on
// the comm stream: a gather reads its shard and writes the full buffer, so
// the compute kernel reading the full buffer waits for the comm record
// after the gather; a reduce-scatter reads the full buffer, so the comm
// stream waits for the compute record after its producer, and the loop
// ends with compute waiting for comm.
// CHECK:      exec.microbatch_loop
// CHECK:      exec.all_gather %{{[0-9]+}} into %[[FULL:[0-9]+]] over "dp" on comm
// CHECK-NEXT: %[[G:[0-9]+]] = exec.event_create
// CHECK-NEXT: exec.record %[[G]] on comm
// CHECK:      exec.wait %[[G]] on compute
// CHECK-NEXT: exec.kernel "train.add" ins(%[[FULL]], %[[FULL]]
// CHECK:      exec.kernel "train.add"
// CHECK-NEXT: %[[P:[0-9]+]] = exec.event_create
// CHECK-NEXT: exec.record %[[P]] on compute
// CHECK:      exec.wait %[[P]] on comm
// CHECK-NEXT: exec.reduce_scatter
// CHECK-NEXT: %[[S:[0-9]+]] = exec.event_create
// CHECK-NEXT: exec.record %[[S]] on comm
// CHECK-NEXT: exec.wait %[[S]] on compute
// CHECK-NEXT: }
exec.step @train_step attributes {data_parallel_size = 2 : i64} {
  %w = exec.persistent "w" weight bytes 256 : !exec.buffer<tensor<32xbf16>>
  %g = exec.persistent "w2" weight bytes 256 : !exec.buffer<tensor<32xbf16>>
  exec.microbatch_loop count 2 {
    %full = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    exec.all_gather %w into %full over "dp" on comm : !exec.buffer<tensor<32xbf16>> to !exec.buffer<tensor<64xbf16>>
    %y = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    exec.kernel "train.add" ins(%full, %full : !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<64xbf16>>) outs(%y : !exec.buffer<tensor<64xbf16>>) workspace 0 args {}
    %y2 = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    exec.kernel "train.add" ins(%y, %y : !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<64xbf16>>) outs(%y2 : !exec.buffer<tensor<64xbf16>>) workspace 0 args {}
    %gfull = exec.view %y2 : !exec.buffer<tensor<64xbf16>> to !exec.buffer<tensor<64xbf16>>
    exec.reduce_scatter %gfull into %g over "dp" on comm : !exec.buffer<tensor<64xbf16>> to !exec.buffer<tensor<32xbf16>>
  }
  exec.return
}
