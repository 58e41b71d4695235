// RUN: split-file %s %t
// RUN: actplace-opt %t/step.mlir -train-print-memory-timeline=per-op=true -o /dev/null | FileCheck %s --check-prefix=H200
// RUN: actplace-opt %t/step.mlir '-train-print-memory-timeline=per-op=true profile=%t/slow-memory.json' -o /dev/null | FileCheck %s --check-prefix=SLOWMEM
// RUN: actplace-opt %t/step.mlir '-train-print-memory-timeline=per-op=true profile=%t/slow-link.json' -o /dev/null | FileCheck %s --check-prefix=LINK
// RUN: actplace-opt %t/step.mlir '-train-print-memory-timeline=per-op=true profile=%t/calibrated.json' -o /dev/null | FileCheck %s --check-prefix=CALIB
// RUN: actplace-opt %t/step.mlir '-train-print-memory-timeline=per-op=true profile=%t/op-scale.json' -o /dev/null | FileCheck %s --check-prefix=OPSCALE
// RUN: actplace-opt %t/step.mlir '-train-print-memory-timeline=per-op=true profile=%t/slow-link-slack.json' -o /dev/null | FileCheck %s --check-prefix=SLACK
// RUN: actplace-opt %t/step.mlir '-train-print-memory-timeline=per-op=true profile=%t/lm-head-scale.json' -o /dev/null | FileCheck %s --check-prefix=LMHEAD
// RUN: actplace-opt %t/step.mlir '-train-print-memory-timeline=per-op=true profile=%t/slow-link-beside.json' -o /dev/null | FileCheck %s --check-prefix=BESIDE
// RUN: sed 's/%lab :/%lab {train.max_inflight = 1 : i64} :/' %t/step.mlir \
// RUN:   | actplace-opt '-train-print-memory-timeline=per-op=true profile=%t/slow-link.json' -o /dev/null | FileCheck %s --check-prefix=INFLIGHT

// The profile option replaces cost-model constants; absent fields keep the
// H200 defaults.
// H200: profile: peakFlops=7.900E+14 memBandwidth=4.000E+12 launchLatency=4.000E-06 d2hBandwidth=5.500E+10 h2dBandwidth=5.500E+10 duplexBandwidth=1.010E+11
// fc1 linear: 4 us launch + 16384 bytes / 4e12 B/s (memory-bound).
// H200: #3 train.linear L0.mlp_fc1 {{.*}} flops=262144 bytes=16384 dur=4.004 start=4.004{{$}}

// memBandwidth = 1e9 B/s: the same linear takes 4 + 16384 / 1e9 s
// = 4 + 16.384 us; the embedding before it 4 + 16640 / 1e9 s = 20.640 us.
// SLOWMEM: profile: peakFlops=7.900E+14 memBandwidth=1.000E+09 launchLatency=4.000E-06 d2hBandwidth=5.500E+10
// SLOWMEM: #3 train.linear L0.mlp_fc1 {{.*}} flops=262144 bytes=16384 dur=20.384 start=20.640{{$}}

// A calibrated profile (bench/qwen_train_bench.py calibrate): every kernel
// costs computeScale times its rate-based time, and an offload or reload
// charges the compute stream copySlowdownPerByte seconds per byte it moves:
// fc1 2.5 x 4.004 = 10.010 us; the offload of %a (4096 B) 4.096 us, after
// the embedding (2.5 x 4.004160) and fc1 (2.5 x 4.004096): 20.021 us.
// CALIB: profile: {{.*}} computeScale=2.500E+00 copySlowdownPerByte=1.000E-09
// CALIB: #3 train.linear L0.mlp_fc1 {{.*}} flops=262144 bytes=16384 dur=10.010 start=10.010{{$}}
// CALIB: #4 train.offload L0.mlp_fc1 {{.*}} dur=4.096 start=20.021{{$}}

// opScale names ops whose measured speed differs from the rest: linear at
// 1.5 x 4.004 = 6.006 us while the embedding keeps computeScale 2.5
// (10.010 us).
// OPSCALE: #3 train.linear L0.mlp_fc1 {{.*}} dur=6.006 start=10.010{{$}}

// The three LM-head ops run the same kernels: a profile timed on the fused
// loss (a scale for lm_head_cross_entropy_with_grad only) scales the
// two-op form here too, 3 x 4.008 and 3 x 4.027 us; other ops keep
// computeScale 1 (fc1 4.004 us).
// LMHEAD: #3 train.linear L0.mlp_fc1 {{.*}} dur=4.004 start=4.004{{$}}
// LMHEAD: #10 train.lm_head_cross_entropy model.lm_head {{.*}} dur=12.025 start=
// LMHEAD-NEXT: #11 train.lm_head_cross_entropy_grad model.lm_head {{.*}} dur=12.080 start=

// slow-link: every kernel takes exactly 1 us (launch latency; FLOP and
// memory rates too high to matter) and the link moves 1e9 B/s one way,
// 1e9 B/s in total both ways (0.5e9 each while both copy).
//   D2H %a (4096 B) issued at 2 us, alone: 2 .. 6.096.
//   D2H %h (8192 B) issued at 3 us, queued behind %a: starts 6.096.
//   H2D %a issued at 3 us, waits for its own D2H: starts 6.096. Both
//   directions share the link from 6.096: H2D %a moves 4096 B at 0.5e9 B/s
//   and ends at 14.288; by then D2H %h has moved 4096 B and finishes the
//   other 4096 B alone at 1e9 B/s: ends 18.384.
//   The wait on %a (reached at 3 us) stalls 11.288 us.
//   H2D %h issued at 17.288 (after 3 more kernels) waits for D2H %h (18.384),
//   runs alone: ends 26.576; its wait stalls 26.576 - 17.288 = 9.288 us.
//   Body: 8 kernels of 1 us + 20.576 us of stalls = 28.576 us.
// LINK: body time: 28.576 us (busy 8.000 us, exposed 20.576 us)
// LINK-NEXT: copies: d2h 2 x 12288 bytes in 16.384 us, h2d 2 x 12288 bytes in 16.384 us, last copy ends at 26.576 us
// LINK-NEXT: exposed L0.mlp_fc1 11.288 us
// LINK-NEXT: exposed model.embedding 9.288 us
// %h's device buffer is held until its D2H ends, so at the reload of %h
// (#13, 17.288 us < 18.384 us) both %h and its reloaded copy are live:
// tokens 256 + %h 8192 + loss/count 8 + %da 4096 + reloaded %h 8192 = 20744.
// LINK: #9 train.wait L0.mlp_fc1 {{.*}} start=14.288 stall=11.288{{$}}
// LINK: #13 train.reload model.embedding total={{[0-9]+}} act=20744 ws=0 host=8192 {{.*}} start=17.288{{$}}
// LINK-NEXT: #14 train.wait model.embedding total={{[0-9]+}} act=12552 ws=0 host=0 {{.*}} start=26.576 stall=9.288{{$}}
// LINK: copy d2h L0.mlp_fc1 #4 bytes=4096 issue=2.000 start=2.000 end=6.096
// LINK-NEXT: copy d2h model.embedding #7 bytes=8192 issue=3.000 start=6.096 end=18.384
// LINK-NEXT: copy h2d L0.mlp_fc1 #8 bytes=4096 issue=3.000 start=6.096 end=14.288
// LINK-NEXT: copy h2d model.embedding #13 bytes=8192 issue=17.288 start=18.384 end=26.576

// copyHoldSlack 1 (slow-link otherwise): a D2H's source bytes stay reserved
// twice as long after its issue as the copy is predicted to take. %h's D2H
// (issue 3, end 18.384) holds them until 3 + 2 x 15.384 = 33.768 us, past the
// body's end, so from #14 on the activations are 8192 bytes above LINK's.
// %a's (issue 2, end 6.096) are free by 10.192 us, before #9: as in LINK.
// SLACK: profile: {{.*}} copyHoldSlack=1.000E+00
// SLACK: #9 train.wait L0.mlp_fc1 total={{[0-9]+}} act=20992 {{.*}} start=14.288 stall=11.288{{$}}
// SLACK: #14 train.wait model.embedding total={{[0-9]+}} act=20744 {{.*}} start=26.576 stall=9.288{{$}}
// SLACK: #17 train.yield - total={{[0-9]+}} act=8200 {{.*}}

// With train.max_inflight = 1 on the loop, the offload of %h (reached at
// 3 us) finds the D2H of %a pending and stalls compute until it ends at
// 6.096 us (3.096 us exposed). The copies then run as above from 6.096 on;
// the wait on %a (reached at 6.096) stalls 8.192 us, the wait on %h 9.288 us
// as before. Same body time, the exposed time moves between scopes.
// INFLIGHT: body time: 28.576 us (busy 8.000 us, exposed 20.576 us)
// INFLIGHT: exposed L0.mlp_fc1 8.192 us
// INFLIGHT-NEXT: exposed model.embedding 12.384 us
// INFLIGHT: #7 train.offload model.embedding {{.*}} start=6.096 stall=3.096{{$}}
// INFLIGHT: #9 train.wait L0.mlp_fc1 {{.*}} start=14.288 stall=8.192{{$}}
// INFLIGHT: copy d2h L0.mlp_fc1 #4 bytes=4096 issue=2.000 start=2.000 end=6.096
// INFLIGHT-NEXT: copy d2h model.embedding #7 bytes=8192 issue=6.096 start=6.096 end=18.384
// INFLIGHT-NEXT: copy h2d L0.mlp_fc1 #8 bytes=4096 issue=6.096 start=6.096 end=14.288

// d2hSlowdown {"train.linear": 1e-9} (slow-link otherwise): a copy slows
// the ops that run beside it, each by its own rate per byte moved during
// its run, and the offload itself costs nothing. fc1 (#3, 1 .. 2 us) runs
// before any copy: 1 us. fc2 (#6) runs from 2 us beside the D2H of %a
// (1e9 B/s): 1000 bytes move during its 1 us, +1 us: 2 us. The offload of
// %h and the reload of %a are issued at 4 us instead of 3; the copies
// themselves run as in LINK (the D2H of %a still ends at 6.096 us), so the
// wait on %a stalls 10.288 us instead of 11.288 and the body takes as long
// as in LINK. The linear_grads (no rate) and the embedding (no rate; "*"
// not given) run beside copies unslowed.
// BESIDE: profile: d2h slowdown beside train.linear = 1.000E-09 s/B
// BESIDE-NOT: profile: h2d slowdown
// BESIDE: body time: 28.576 us (busy 9.000 us, exposed 19.576 us)
// BESIDE: #3 train.linear L0.mlp_fc1 {{.*}} dur=1.000 start=1.000{{$}}
// BESIDE: #4 train.offload L0.mlp_fc1 {{.*}} dur=0.000 start=2.000{{$}}
// BESIDE: #6 train.linear L0.mlp_fc2 {{.*}} dur=2.000 start=2.000{{$}}
// BESIDE: #9 train.wait L0.mlp_fc1 {{.*}} start=14.288 stall=10.288{{$}}
// BESIDE: copy d2h L0.mlp_fc1 #4 bytes=4096 issue=2.000 start=2.000 end=6.096
// BESIDE-NEXT: copy d2h model.embedding #7 bytes=8192 issue=4.000 start=6.096 end=18.384

//--- slow-link-beside.json
{
  "peakFlops": 1e30,
  "memBandwidth": 1e30,
  "launchLatency": 1e-6,
  "d2hBandwidth": 1e9,
  "h2dBandwidth": 1e9,
  "duplexBandwidth": 1e9,
  "d2hSlowdown": {"train.linear": 1e-9}
}

//--- slow-memory.json
{"memBandwidth": 1e9}

//--- calibrated.json
{"computeScale": 2.5, "copySlowdownPerByte": 1e-9}

//--- op-scale.json
{"computeScale": 2.5, "opScale": {"train.linear": 1.5}}

//--- lm-head-scale.json
{"opScale": {"train.lm_head_cross_entropy_with_grad": 3.0}}

//--- slow-link.json
{
  "peakFlops": 1e30,
  "memBandwidth": 1e30,
  "launchLatency": 1e-6,
  "d2hBandwidth": 1e9,
  "h2dBandwidth": 1e9,
  "duplexBandwidth": 1e9
}

//--- slow-link-slack.json
{
  "peakFlops": 1e30,
  "memBandwidth": 1e30,
  "launchLatency": 1e-6,
  "d2hBandwidth": 1e9,
  "h2dBandwidth": 1e9,
  "duplexBandwidth": 1e9,
  "copyHoldSlack": 1
}

//--- step.mlir
module attributes {train.micro_batches = 1 : i64} {
  train.param @embed : tensor<64x64xbf16> init<normal, 0.0, 0.02>
  train.param @fc1 : tensor<32x64xbf16> init<normal, 0.0, 0.02>
  train.param @fc2 : tensor<64x32xbf16> init<normal, 0.0, 0.02>
  func.func @train_step(%tok: tensor<1x1x64xi32>, %lab: tensor<1x1x64xi32>) -> tensor<f32> {
    %loss, %count = train.microbatch_loop %tok, %lab : (tensor<1x1x64xi32>, tensor<1x1x64xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x64xi32>, %l: tensor<1x64xi32>):
      %e = train.param_ref @embed : tensor<64x64xbf16>
      %h = train.embedding %t, %e scope<-1, embedding> : (tensor<1x64xi32>, tensor<64x64xbf16>) -> tensor<1x64x64xbf16>
      %w1 = train.param_ref @fc1 : tensor<32x64xbf16>
      %a = train.linear %h, %w1 scope<0, mlp_fc1> : (tensor<1x64x64xbf16>, tensor<32x64xbf16>) -> tensor<1x64x32xbf16>
      %ha = train.offload %a scope<0, mlp_fc1> : (tensor<1x64x32xbf16>) -> !train.host<tensor<1x64x32xbf16>>
      %w2 = train.param_ref @fc2 : tensor<64x32xbf16>
      %b = train.linear %a, %w2 scope<0, mlp_fc2> : (tensor<1x64x32xbf16>, tensor<64x32xbf16>) -> tensor<1x64x64xbf16>
      %hh = train.offload %h scope<-1, embedding> : (tensor<1x64x64xbf16>) -> !train.host<tensor<1x64x64xbf16>>
      %ra = train.reload %ha scope<0, mlp_fc1> : (!train.host<tensor<1x64x32xbf16>>) -> tensor<1x64x32xbf16>
      %a2 = train.wait %ra scope<0, mlp_fc1> : (tensor<1x64x32xbf16>) -> tensor<1x64x32xbf16>
      %ls, %n, %lse = train.lm_head_cross_entropy %b, %e, %l scope<-1, lm_head> : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x64xf32>)
      %db = train.lm_head_cross_entropy_grad %b, %e, %l, %lse scope<-1, lm_head> {weight_grad = @embed} : (tensor<1x64x64xbf16>, tensor<64x64xbf16>, tensor<1x64xi32>, tensor<1x64xf32>) -> tensor<1x64x64xbf16>
      %da = train.linear_grad %a2, %w2, %db scope<0, mlp_fc2> {weight_grad = @fc2} : (tensor<1x64x32xbf16>, tensor<64x32xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x32xbf16>
      %rh = train.reload %hh scope<-1, embedding> : (!train.host<tensor<1x64x64xbf16>>) -> tensor<1x64x64xbf16>
      %h2 = train.wait %rh scope<-1, embedding> : (tensor<1x64x64xbf16>) -> tensor<1x64x64xbf16>
      %dh = train.linear_grad %h2, %w1, %da scope<0, mlp_fc1> {weight_grad = @fc1} : (tensor<1x64x64xbf16>, tensor<32x64xbf16>, tensor<1x64x32xbf16>) -> tensor<1x64x64xbf16>
      train.embedding_grad %t, %dh scope<-1, embedding> {weight_grad = @embed} : (tensor<1x64xi32>, tensor<1x64x64xbf16>) -> ()
      train.yield %ls, %n : tensor<f32>, tensor<i32>
    }
    %mean = train.loss_mean %loss, %count : (tensor<f32>, tensor<i32>) -> tensor<f32>
    return %mean : tensor<f32>
  }
}
