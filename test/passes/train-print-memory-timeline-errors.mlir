// RUN: split-file %s %t
// RUN: not actplace-opt %t/forward.mlir -train-print-memory-timeline 2>&1 | FileCheck %s --check-prefix=NOSTEP
// RUN: not actplace-opt %t/noloop.mlir -train-print-memory-timeline 2>&1 | FileCheck %s --check-prefix=NOLOOP
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/unknown-field.json' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/not-a-number.json' 2>&1 | FileCheck %s --check-prefix=NAN
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/zero-rate.json' 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/malformed.json' 2>&1 | FileCheck %s --check-prefix=MALFORMED
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/array.json' 2>&1 | FileCheck %s --check-prefix=ARRAY
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/missing.json' 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/bad-op-scale.json' 2>&1 | FileCheck %s --check-prefix=OPSCALE
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/zero-scale.json' 2>&1 | FileCheck %s --check-prefix=ZEROSCALE
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/zero-side-copy-scale.json' 2>&1 | FileCheck %s --check-prefix=ZEROSIDE
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/negative-slack.json' 2>&1 | FileCheck %s --check-prefix=NEGSLACK
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/negative-beside.json' 2>&1 | FileCheck %s --check-prefix=NEGBESIDE
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/beside-not-object.json' 2>&1 | FileCheck %s --check-prefix=BESIDEOBJ
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/both-slowdowns.json' 2>&1 | FileCheck %s --check-prefix=BOTH
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/provenance-array.json' 2>&1 | FileCheck %s --check-prefix=PROVOBJ
// RUN: not actplace-opt %t/step.mlir '-train-print-memory-timeline=profile=%t/provenance-number.json' 2>&1 | FileCheck %s --check-prefix=PROVSTR

// NOSTEP: error: train-print-memory-timeline: the module has no @train_step function; run -train-autodiff first to build the training step
// NOLOOP: error: train-print-memory-timeline: @train_step has no train.microbatch_loop; run -train-autodiff first to build the training step
// UNKNOWN: error: train-print-memory-timeline: device profile '{{.*}}unknown-field.json': unknown field 'peakFlop' (known fields: peakFlops, deviceMemoryBytes, memBandwidth, launchLatency, d2hBandwidth, h2dBandwidth, duplexBandwidth, computeScale, copySlowdownPerByte, copyHoldSlack, sideStreamCopyScale, allReduceBusBandwidth, allReduceLatency, allGatherBusBandwidth, allGatherLatency, reduceScatterBusBandwidth, reduceScatterLatency, opScale, h2dSlowdown, d2hSlowdown, sideCapacity, sideHostScale, sideSmPercent, generatedKernelRatio, provenance)
// NAN: error: train-print-memory-timeline: device profile '{{.*}}not-a-number.json': field 'launchLatency' must be a number
// ZERO: error: train-print-memory-timeline: device profile '{{.*}}zero-rate.json': field 'h2dBandwidth' must be positive, got 0
// MALFORMED: error: train-print-memory-timeline: device profile '{{.*}}malformed.json': invalid JSON:
// ARRAY: error: train-print-memory-timeline: device profile '{{.*}}array.json': expected a JSON object of device constants
// MISSING: error: train-print-memory-timeline: cannot read device profile '{{.*}}missing.json':
// OPSCALE: error: train-print-memory-timeline: device profile '{{.*}}bad-op-scale.json': opScale['train.linear'] must be a positive number
// ZEROSCALE: error: train-print-memory-timeline: device profile '{{.*}}zero-scale.json': field 'computeScale' must be positive, got 0
// ZEROSIDE: error: train-print-memory-timeline: device profile '{{.*}}zero-side-copy-scale.json': field 'sideStreamCopyScale' must be positive, got 0
// NEGSLACK: error: train-print-memory-timeline: device profile '{{.*}}negative-slack.json': field 'copyHoldSlack' must be non-negative, got -0.5
// NEGBESIDE: error: train-print-memory-timeline: device profile '{{.*}}negative-beside.json': h2dSlowdown['*'] must be a non-negative number
// BESIDEOBJ: error: train-print-memory-timeline: device profile '{{.*}}beside-not-object.json': field 'd2hSlowdown' must be an object of op names (or "*") to non-negative numbers
// PROVOBJ: error: train-print-memory-timeline: device profile '{{.*}}provenance-array.json': field 'provenance' must be an object of strings (what produced the profile: command, commit, date, ...)
// PROVSTR: error: train-print-memory-timeline: device profile '{{.*}}provenance-number.json': provenance['commit'] must be a string
// BOTH: error: train-print-memory-timeline: device profile '{{.*}}both-slowdowns.json': give either copySlowdownPerByte (copies slow the op that issues them) or h2dSlowdown / d2hSlowdown (copies slow the ops beside them), not both

//--- unknown-field.json
{"memBandwidth": 3.3e12, "peakFlop": 9.9e14}
//--- not-a-number.json
{"launchLatency": "fast"}
//--- zero-rate.json
{"h2dBandwidth": 0}
//--- malformed.json
{"peakFlops": 1e15,
//--- array.json
[1, 2, 3]
//--- bad-op-scale.json
{"opScale": {"train.linear": -1}}
//--- zero-side-copy-scale.json
{"sideStreamCopyScale": 0}
//--- zero-scale.json
{"computeScale": 0}
//--- negative-slack.json
{"copyHoldSlack": -0.5}
//--- negative-beside.json
{"h2dSlowdown": {"train.linear": 1e-9, "*": -1e-9}}
//--- beside-not-object.json
{"d2hSlowdown": 1e-9}
//--- both-slowdowns.json
{"copySlowdownPerByte": 1e-9, "h2dSlowdown": {"*": 1e-9}}
//--- provenance-array.json
{"provenance": ["calibrate"], "computeScale": 1.0}
//--- provenance-number.json
{"provenance": {"command": "calibrate", "commit": 1234}, "computeScale": 1.0}

//--- forward.mlir
func.func @forward(%x: tensor<1x8x16xbf16>) -> tensor<1x8x16xbf16> {
  return %x : tensor<1x8x16xbf16>
}

//--- noloop.mlir
func.func @train_step(%x: tensor<1x8x16xbf16>) -> tensor<1x8x16xbf16> {
  return %x : tensor<1x8x16xbf16>
}

//--- step.mlir
module attributes {train.micro_batches = 1 : i64} {
  train.param @embed : tensor<32x16xbf16> init<normal, 0.0, 0.02>
  func.func @train_step(%tok: tensor<1x1x8xi32>, %lab: tensor<1x1x8xi32>) -> tensor<f32> {
    %loss, %count = train.microbatch_loop %tok, %lab : (tensor<1x1x8xi32>, tensor<1x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x8xi32>, %l: tensor<1x8xi32>):
      %e = train.param_ref @embed : tensor<32x16xbf16>
      %h = train.embedding %t, %e scope<-1, embedding> : (tensor<1x8xi32>, tensor<32x16xbf16>) -> tensor<1x8x16xbf16>
      %ls, %n, %lse = train.lm_head_cross_entropy %h, %e, %l scope<-1, lm_head> : (tensor<1x8x16xbf16>, tensor<32x16xbf16>, tensor<1x8xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x8xf32>)
      train.yield %ls, %n : tensor<f32>, tensor<i32>
    }
    %mean = train.loss_mean %loss, %count : (tensor<f32>, tensor<i32>) -> tensor<f32>
    return %mean : tensor<f32>
  }
}
