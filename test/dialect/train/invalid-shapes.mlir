// RUN: actplace-opt %s -split-input-file -verify-diagnostics
// The one shape rule of train ops (dialect/train/TensorShapes.h): every
// tensor an op carries, in operands, results, region arguments, type
// attributes and !train.host, has static dimensions >= 1 and at most 2^48
// bytes. The cost model and the memory timeline divide by these dimensions.

func.func @zero_operand_dim(%x: tensor<2x0x8xbf16>, %w: tensor<4x8xbf16>) {
  // expected-error @+1 {{'train.linear' op operand #0 dimension 1 is 0 in 'tensor<2x0x8xbf16>'; every dimension must be at least 1}}
  %y = train.linear %x, %w scope<0, mlp_fc1> : (tensor<2x0x8xbf16>, tensor<4x8xbf16>) -> tensor<2x0x4xbf16>
  return
}

// -----

func.func @zero_result_dim(%x: tensor<2x4x8xbf16>) {
  // expected-error @+1 {{'train.slice' op result #0 dimension 2 is 0 in 'tensor<2x4x0xbf16>'; every dimension must be at least 1}}
  %y = train.slice %x scope<0, gdn_prep> {dim = 2 : i64, offset = 8 : i64} : (tensor<2x4x8xbf16>) -> tensor<2x4x0xbf16>
  return
}

// -----

// A zero key-head count reached the verifier's Hv % Hk and divided by zero.
func.func @zero_heads(%q: tensor<1x64x0x16xbf16>, %v: tensor<1x64x2x16xbf16>, %g: tensor<1x64x2xf32>, %b: tensor<1x64x2xbf16>) {
  // expected-error @+1 {{'train.gated_delta_rule' op operand #0 dimension 2 is 0 in 'tensor<1x64x0x16xbf16>'}}
  %o = train.gated_delta_rule %q, %q, %v, %g, %b scope<0, gdn_core_attn> {scale = 0.25 : f64}
      : (tensor<1x64x0x16xbf16>, tensor<1x64x0x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>, tensor<1x64x2xbf16>)
      -> tensor<1x64x2x16xbf16>
  return
}

// -----

// expected-error @+1 {{'train.param' op attribute 'type' dimension 0 is 0 in 'tensor<0x8xbf16>'; every dimension must be at least 1}}
train.param @w : tensor<0x8xbf16> init<ones>

// -----

func.func @zero_host_dim(%h: !train.host<tensor<4x0xbf16>>) {
  // expected-error @+1 {{'train.reload' op operand #0 dimension 1 is 0 in 'tensor<4x0xbf16>'; every dimension must be at least 1}}
  %r = train.reload %h scope<0, gdn_core_attn> : (!train.host<tensor<4x0xbf16>>) -> tensor<4x0xbf16>
  return
}

// -----

func.func @zero_loop_argument(%t: tensor<2x1x8xi32>, %c: tensor<f32>, %k: tensor<i32>) -> (tensor<f32>, tensor<i32>) {
  // expected-error @+1 {{'train.microbatch_loop' op region #0 argument #0 dimension 1 is 0 in 'tensor<1x0xi32>'; every dimension must be at least 1}}
  %l, %n = train.microbatch_loop %t, %t : (tensor<2x1x8xi32>, tensor<2x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
  ^bb0(%tok: tensor<1x0xi32>, %lab: tensor<1x8xi32>):
    train.yield %c, %k : tensor<f32>, tensor<i32>
  }
  return %l, %n : tensor<f32>, tensor<i32>
}

// -----

func.func @dynamic_dim(%x: tensor<2x?xbf16>) {
  // expected-error @+1 {{'train.add' op operand #0 must be static bf16 or f32 tensor, but got 'tensor<2x?xbf16>'}}
  %y = train.add %x, %x scope<0, mlp_fc2> : (tensor<2x?xbf16>, tensor<2x?xbf16>) -> tensor<2x?xbf16>
  return
}

// -----

// 2^32 x 2^16 bf16 elements: 2^49 bytes.
func.func @too_many_bytes(%x: tensor<4294967296x65536xbf16>) {
  // expected-error @+1 {{'train.add' op operand #0 holds 'tensor<4294967296x65536xbf16>', more than 281474976710656 bytes (281474976710656 elements of 2 bytes)}}
  %y = train.add %x, %x scope<0, mlp_fc2> : (tensor<4294967296x65536xbf16>, tensor<4294967296x65536xbf16>) -> tensor<4294967296x65536xbf16>
  return
}

// -----

// The element count itself would overflow int64.
func.func @element_count_overflow(%x: tensor<4611686018427387904x4xf32>) {
  // expected-error @+1 {{'train.add' op operand #0 holds 'tensor<4611686018427387904x4xf32>', more than 281474976710656 bytes (dimension 0 is 4611686018427387904)}}
  %y = train.add %x, %x scope<0, mlp_fc2> : (tensor<4611686018427387904x4xf32>, tensor<4611686018427387904x4xf32>) -> tensor<4611686018427387904x4xf32>
  return
}

// -----

// The backward GDN op divides T by chunk_size in the cost model and the
// memory timeline: the same chunk rule as the forward op.
func.func @gdr_grad_chunk(%q: tensor<1x64x2x16xbf16>, %g: tensor<1x64x2xf32>, %b: tensor<1x64x2xbf16>, %t: tensor<1x64x2x64xbf16>) {
  // expected-error @+1 {{'train.gated_delta_rule_grad' op chunk_size is 0, expected 64 (the chunk size the GDN kernels implement)}}
  %dq, %dk, %dv, %dg, %db = train.gated_delta_rule_grad %q, %q, %q, %g, %b, %t, %q scope<0, gdn_core_attn> {chunk_size = 0 : i64, scale = 0.25 : f64}
      : (tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>, tensor<1x64x2xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x16xbf16>)
      -> (tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>, tensor<1x64x2xbf16>)
  return
}

// -----

func.func @gdr_grad_scale(%q: tensor<1x64x2x16xbf16>, %g: tensor<1x64x2xf32>, %b: tensor<1x64x2xbf16>, %t: tensor<1x64x2x64xbf16>) {
  // expected-error @+1 {{'train.gated_delta_rule_grad' op attribute 'scale' must be positive, got 0}}
  %dq, %dk, %dv, %dg, %db = train.gated_delta_rule_grad %q, %q, %q, %g, %b, %t, %q scope<0, gdn_core_attn> {chunk_size = 64 : i64, scale = 0.0 : f64}
      : (tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>, tensor<1x64x2xbf16>, tensor<1x64x2x64xbf16>, tensor<1x64x2x16xbf16>)
      -> (tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>, tensor<1x64x2xbf16>)
  return
}
