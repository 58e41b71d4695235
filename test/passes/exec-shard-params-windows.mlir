// RUN: actplace-opt %s -exec-shard-params=gather-max-inflight=1 | FileCheck %s
// The ZeRO-3 window rule (ap::splitZeroWindows, shared by exec-shard-params
// and the cost model): an op whose first use of a layer group reads two of
// its parameters opens one window for the group, not one per parameter, so
// with one window gathered ahead both of layer 1's parameters are gathered
// before layer 0's first kernel, and layer 0's second window before layer
// 1's kernel.
// CHECK:      [[A:%[0-9]+]] = exec.persistent "model.layers.0.a" weight bytes 256 : !exec.buffer<tensor<32xbf16>>
// CHECK-NEXT: [[B:%[0-9]+]] = exec.persistent "model.layers.1.b" weight
// CHECK-NEXT: [[C:%[0-9]+]] = exec.persistent "model.layers.1.c" weight
// CHECK:      exec.microbatch_loop
// CHECK:      exec.all_gather [[A]] into
// CHECK:      exec.all_gather [[B]] into
// CHECK:      exec.all_gather [[C]] into
// CHECK:      exec.kernel "train.add" ins([[A0:%[0-9]+]], [[A0]] :
// CHECK:      exec.all_gather [[A]] into
// CHECK:      exec.kernel "train.add"
// CHECK:      exec.all_gather [[B]] into
// CHECK:      exec.kernel "train.add"
// CHECK-NOT:  exec.all_gather
// CHECK:      exec.kernel "train.add"
// CHECK-NOT:  exec.all_gather
// CHECK:      exec.return
exec.step @train_step attributes {data_parallel = "zero3", data_parallel_size = 2 : i64, micro_batches = 1 : i64} {
  %a = exec.persistent "model.layers.0.a" weight bytes 256 : !exec.buffer<tensor<64xbf16>>
  %b = exec.persistent "model.layers.1.b" weight bytes 256 : !exec.buffer<tensor<64xbf16>>
  %c = exec.persistent "model.layers.1.c" weight bytes 256 : !exec.buffer<tensor<64xbf16>>
  exec.microbatch_loop count 1 {
    %x = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    exec.kernel "train.add" ins(%a, %a : !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<64xbf16>>) outs(%x : !exec.buffer<tensor<64xbf16>>) workspace 0 args {}
    %y = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    exec.kernel "train.add" ins(%b, %c : !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<64xbf16>>) outs(%y : !exec.buffer<tensor<64xbf16>>) workspace 0 args {}
    %z = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    exec.kernel "train.add" ins(%a, %x : !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<64xbf16>>) outs(%z : !exec.buffer<tensor<64xbf16>>) workspace 0 args {}
    %w = exec.buffer bytes 256 : !exec.buffer<tensor<64xbf16>>
    exec.kernel "train.add" ins(%b, %y : !exec.buffer<tensor<64xbf16>>, !exec.buffer<tensor<64xbf16>>) outs(%w : !exec.buffer<tensor<64xbf16>>) workspace 0 args {}
  }
  exec.return
}
