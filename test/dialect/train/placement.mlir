// RUN: actplace-opt %s --verify-roundtrip | FileCheck %s
// RUN: actplace-opt %s -mlir-print-op-generic | actplace-opt | FileCheck %s
// Placement ops: offload after the producer, reload at the prefetch anchor,
// wait before the consumer; a recomputed clone.

// CHECK-LABEL: func.func @placed
func.func @placed(%x: tensor<1x8x2x16xbf16>, %dy: tensor<1x8x2x16xbf16>, %w: tensor<16xbf16>) -> tensor<1x8x2x16xbf16> {
  %q, %rstd = train.l2_norm %x scope<0, gdn_core_attn> {eps = 1.0e-06 : f64} : (tensor<1x8x2x16xbf16>) -> (tensor<1x8x2x16xbf16>, tensor<1x8x2xf32>)
  // CHECK: %[[H:.*]] = train.offload %{{.*}} scope<0, gdn_core_attn> : (tensor<1x8x2x16xbf16>) -> !train.host<tensor<1x8x2x16xbf16>>
  %h = train.offload %q scope<0, gdn_core_attn> : (tensor<1x8x2x16xbf16>) -> !train.host<tensor<1x8x2x16xbf16>>
  // CHECK: %[[R:.*]] = train.reload %[[H]] scope<0, gdn_core_attn> : (!train.host<tensor<1x8x2x16xbf16>>) -> tensor<1x8x2x16xbf16>
  %r = train.reload %h scope<0, gdn_core_attn> : (!train.host<tensor<1x8x2x16xbf16>>) -> tensor<1x8x2x16xbf16>
  // CHECK: train.wait %[[R]] scope<0, gdn_core_attn>
  %q2 = train.wait %r scope<0, gdn_core_attn> : (tensor<1x8x2x16xbf16>) -> tensor<1x8x2x16xbf16>
  // CHECK: train.l2_norm %{{.*}} scope<0, gdn_core_attn> {eps = {{.*}}, train.recomputed}
  %q3, %rstd3 = train.l2_norm %x scope<0, gdn_core_attn> {eps = 1.0e-06 : f64, train.recomputed} : (tensor<1x8x2x16xbf16>) -> (tensor<1x8x2x16xbf16>, tensor<1x8x2xf32>)
  %dx = train.l2_norm_grad %q2, %rstd, %dy scope<0, gdn_core_attn> : (tensor<1x8x2x16xbf16>, tensor<1x8x2xf32>, tensor<1x8x2x16xbf16>) -> tensor<1x8x2x16xbf16>
  return %dx : tensor<1x8x2x16xbf16>
}
