// RUN: actplace-opt %s --verify-roundtrip | FileCheck %s
// RUN: actplace-opt %s -mlir-print-op-generic | actplace-opt | FileCheck %s
// Gated GQA attention (Qwen3.5 full attention) and MLA composed from views.

// CHECK-LABEL: func.func @gated_gqa
func.func @gated_gqa(%qg: tensor<1x32x4x32xbf16>, %k: tensor<1x32x2x16xbf16>,
                     %v: tensor<1x32x2x16xbf16>) -> tensor<1x32x4x16xbf16> {
  %q = train.slice %qg scope<3, qkv_linear> {dim = 3 : i64, offset = 0 : i64} : (tensor<1x32x4x32xbf16>) -> tensor<1x32x4x16xbf16>
  %gate = train.slice %qg scope<3, qkv_linear> {dim = 3 : i64, offset = 16 : i64} : (tensor<1x32x4x32xbf16>) -> tensor<1x32x4x16xbf16>
  // CHECK: train.rope %{{.*}} scope<3, qkv_linear> {rotary_dim = 8 : i64, theta = 1.000000e+07 : f64}
  %qr = train.rope %q scope<3, qkv_linear> {rotary_dim = 8 : i64, theta = 1.0e+07 : f64} : (tensor<1x32x4x16xbf16>) -> tensor<1x32x4x16xbf16>
  %kr = train.rope %k scope<3, qkv_linear> {rotary_dim = 8 : i64, theta = 1.0e+07 : f64} : (tensor<1x32x2x16xbf16>) -> tensor<1x32x2x16xbf16>
  // CHECK: train.attention %{{.*}}, %{{.*}}, %{{.*}} scope<3, core_attn> {scale = 2.500000e-01 : f64}
  // CHECK-SAME: (tensor<1x32x4x16xbf16>, tensor<1x32x2x16xbf16>, tensor<1x32x2x16xbf16>) -> tensor<1x32x4x16xbf16>
  %o = train.attention %qr, %kr, %v scope<3, core_attn> {scale = 0.25 : f64}
      : (tensor<1x32x4x16xbf16>, tensor<1x32x2x16xbf16>, tensor<1x32x2x16xbf16>) -> tensor<1x32x4x16xbf16>
  // CHECK: train.output_gate %{{.*}}, %{{.*}} scope<3, attn_proj>
  %y = train.output_gate %o, %gate scope<3, attn_proj> : (tensor<1x32x4x16xbf16>, tensor<1x32x4x16xbf16>) -> tensor<1x32x4x16xbf16>
  return %y : tensor<1x32x4x16xbf16>
}

// CHECK-LABEL: func.func @mla
func.func @mla(%q: tensor<1x16x4x24xbf16>, %kv: tensor<1x16x4x32xbf16>, %kpe: tensor<1x16x1x8xbf16>)
    -> tensor<1x16x4x16xbf16> {
  %qn = train.slice %q scope<0, mla_up_proj> {dim = 3 : i64, offset = 0 : i64} : (tensor<1x16x4x24xbf16>) -> tensor<1x16x4x16xbf16>
  %qp = train.slice %q scope<0, mla_up_proj> {dim = 3 : i64, offset = 16 : i64} : (tensor<1x16x4x24xbf16>) -> tensor<1x16x4x8xbf16>
  %qr = train.rope %qp scope<0, mla_up_proj> {rotary_dim = 8 : i64, theta = 1.0e+04 : f64} : (tensor<1x16x4x8xbf16>) -> tensor<1x16x4x8xbf16>
  // CHECK: train.concat %{{.*}}, %{{.*}} scope<0, mla_up_proj> {dim = 3 : i64} : (tensor<1x16x4x16xbf16>, tensor<1x16x4x8xbf16>) -> tensor<1x16x4x24xbf16>
  %qf = train.concat %qn, %qr scope<0, mla_up_proj> {dim = 3 : i64} : (tensor<1x16x4x16xbf16>, tensor<1x16x4x8xbf16>) -> tensor<1x16x4x24xbf16>
  %kn = train.slice %kv scope<0, mla_up_proj> {dim = 3 : i64, offset = 0 : i64} : (tensor<1x16x4x32xbf16>) -> tensor<1x16x4x16xbf16>
  %v = train.slice %kv scope<0, mla_up_proj> {dim = 3 : i64, offset = 16 : i64} : (tensor<1x16x4x32xbf16>) -> tensor<1x16x4x16xbf16>
  %kr = train.rope %kpe scope<0, mla_up_proj> {rotary_dim = 8 : i64, theta = 1.0e+04 : f64} : (tensor<1x16x1x8xbf16>) -> tensor<1x16x1x8xbf16>
  // CHECK: train.expand %{{.*}} scope<0, mla_up_proj> : (tensor<1x16x1x8xbf16>) -> tensor<1x16x4x8xbf16>
  %ke = train.expand %kr scope<0, mla_up_proj> : (tensor<1x16x1x8xbf16>) -> tensor<1x16x4x8xbf16>
  %kf = train.concat %kn, %ke scope<0, mla_up_proj> {dim = 3 : i64} : (tensor<1x16x4x16xbf16>, tensor<1x16x4x8xbf16>) -> tensor<1x16x4x24xbf16>
  // CHECK: train.attention {{.*}} -> tensor<1x16x4x16xbf16>
  %o = train.attention %qf, %kf, %v scope<0, core_attn> {scale = 0.2041241452319315 : f64}
      : (tensor<1x16x4x24xbf16>, tensor<1x16x4x24xbf16>, tensor<1x16x4x16xbf16>) -> tensor<1x16x4x16xbf16>
  return %o : tensor<1x16x4x16xbf16>
}
