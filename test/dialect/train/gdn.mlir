// RUN: actplace-opt %s --verify-roundtrip | FileCheck %s
// RUN: actplace-opt %s -mlir-print-op-generic | actplace-opt | FileCheck %s
// Gated DeltaNet ops with grouped value heads (Hv = 2 Hk).

// CHECK-LABEL: func.func @gdn
func.func @gdn(%mixed: tensor<1x64x128xbf16>, %convw: tensor<128x4xbf16>, %z: tensor<1x64x4x16xbf16>,
               %a: tensor<1x64x4xbf16>, %b: tensor<1x64x4xbf16>, %alog: tensor<4xf32>,
               %dtb: tensor<4xf32>, %nw: tensor<16xbf16>) -> tensor<1x64x4x16xbf16> {
  // CHECK: train.short_conv %{{.*}}, %{{.*}} scope<0, gdn_prep> : (tensor<1x64x128xbf16>, tensor<128x4xbf16>) -> tensor<1x64x128xbf16>
  %y = train.short_conv %mixed, %convw scope<0, gdn_prep> : (tensor<1x64x128xbf16>, tensor<128x4xbf16>) -> tensor<1x64x128xbf16>
  // CHECK: train.slice %{{.*}} scope<0, gdn_prep> {dim = 2 : i64, offset = 32 : i64}
  %q2 = train.slice %y scope<0, gdn_prep> {dim = 2 : i64, offset = 0 : i64} : (tensor<1x64x128xbf16>) -> tensor<1x64x32xbf16>
  %k2 = train.slice %y scope<0, gdn_prep> {dim = 2 : i64, offset = 32 : i64} : (tensor<1x64x128xbf16>) -> tensor<1x64x32xbf16>
  %v2 = train.slice %y scope<0, gdn_prep> {dim = 2 : i64, offset = 64 : i64} : (tensor<1x64x128xbf16>) -> tensor<1x64x64xbf16>
  // CHECK: train.reshape %{{.*}} scope<0, gdn_prep> : (tensor<1x64x32xbf16>) -> tensor<1x64x2x16xbf16>
  %q = train.reshape %q2 scope<0, gdn_prep> : (tensor<1x64x32xbf16>) -> tensor<1x64x2x16xbf16>
  %k = train.reshape %k2 scope<0, gdn_prep> : (tensor<1x64x32xbf16>) -> tensor<1x64x2x16xbf16>
  %v = train.reshape %v2 scope<0, gdn_prep> : (tensor<1x64x64xbf16>) -> tensor<1x64x4x16xbf16>
  // CHECK: train.l2_norm %{{.*}} scope<0, gdn_core_attn> {eps = 9.9999999999999995E-7 : f64}
  %qn = train.l2_norm %q scope<0, gdn_core_attn> {eps = 1.0e-06 : f64} : (tensor<1x64x2x16xbf16>) -> tensor<1x64x2x16xbf16>
  %kn = train.l2_norm %k scope<0, gdn_core_attn> {eps = 1.0e-06 : f64} : (tensor<1x64x2x16xbf16>) -> tensor<1x64x2x16xbf16>
  // CHECK: %[[G:.*]], %[[BETA:.*]] = train.gdn_gates {{.*}} scope<0, gdn_core_attn>
  // CHECK-SAME: -> (tensor<1x64x4xf32>, tensor<1x64x4xbf16>)
  %g, %beta = train.gdn_gates %a, %b, %alog, %dtb scope<0, gdn_core_attn>
      : (tensor<1x64x4xbf16>, tensor<1x64x4xbf16>, tensor<4xf32>, tensor<4xf32>) -> (tensor<1x64x4xf32>, tensor<1x64x4xbf16>)
  // The default chunk size (64) is elided.
  // CHECK: train.gated_delta_rule {{.*}}, %[[G]], %[[BETA]] scope<0, gdn_core_attn> {scale = 2.500000e-01 : f64}
  %o = train.gated_delta_rule %qn, %kn, %v, %g, %beta scope<0, gdn_core_attn> {scale = 0.25 : f64}
      : (tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x4x16xbf16>, tensor<1x64x4xf32>, tensor<1x64x4xbf16>)
      -> tensor<1x64x4x16xbf16>
  // CHECK: train.gated_rms_norm %{{.*}}, %{{.*}}, %{{.*}} scope<0, gdn_norm_out>
  %n = train.gated_rms_norm %o, %z, %nw scope<0, gdn_norm_out> {eps = 1.0e-06 : f64}
      : (tensor<1x64x4x16xbf16>, tensor<1x64x4x16xbf16>, tensor<16xbf16>) -> tensor<1x64x4x16xbf16>
  return %n : tensor<1x64x4x16xbf16>
}

// The split output: q, k, v as the conv's results; its grad reads one
// gradient per result.
// CHECK-LABEL: func.func @gdn_split
func.func @gdn_split(%mixed: tensor<1x64x128xbf16>, %convw: tensor<128x4xbf16>,
                     %dq: tensor<1x64x32xbf16>, %dk: tensor<1x64x32xbf16>,
                     %dv: tensor<1x64x64xbf16>) -> tensor<1x64x128xbf16> {
  // CHECK: train.short_conv %{{.*}}, %{{.*}} scope<0, gdn_prep> : (tensor<1x64x128xbf16>, tensor<128x4xbf16>) -> (tensor<1x64x32xbf16>, tensor<1x64x32xbf16>, tensor<1x64x64xbf16>)
  %q, %k, %v = train.short_conv %mixed, %convw scope<0, gdn_prep>
      : (tensor<1x64x128xbf16>, tensor<128x4xbf16>) -> (tensor<1x64x32xbf16>, tensor<1x64x32xbf16>, tensor<1x64x64xbf16>)
  // CHECK: train.short_conv_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} scope<0, gdn_prep> : (tensor<1x64x128xbf16>, tensor<128x4xbf16>, tensor<1x64x32xbf16>, tensor<1x64x32xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x128xbf16>
  %dx = train.short_conv_grad %mixed, %convw, %dq, %dk, %dv scope<0, gdn_prep>
      : (tensor<1x64x128xbf16>, tensor<128x4xbf16>, tensor<1x64x32xbf16>, tensor<1x64x32xbf16>, tensor<1x64x64xbf16>) -> tensor<1x64x128xbf16>
  return %dx : tensor<1x64x128xbf16>
}
