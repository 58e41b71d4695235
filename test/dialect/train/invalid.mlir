// RUN: actplace-opt %s -split-input-file -verify-diagnostics
// Every verifier of the train dialect: element types, ranks, shape relations,
// head rules, chunk and kernel limits, views, symbols and attributes.

func.func @linear_f16(%x: tensor<2x4x8xf16>, %w: tensor<4x8xbf16>) {
  // expected-error @+1 {{'train.linear' op operand #0 must be static bf16 or f32 tensor, but got 'tensor<2x4x8xf16>'}}
  %y = train.linear %x, %w scope<0, mlp_fc1> : (tensor<2x4x8xf16>, tensor<4x8xbf16>) -> tensor<2x4x4xbf16>
  return
}

// -----

func.func @linear_fp8(%x: tensor<2x4x8xbf16>, %w: tensor<4x8xf8E4M3FN>) {
  // expected-error @+1 {{'train.linear' op operand #1 must be 2-D static bf16 or f32 tensor, but got 'tensor<4x8xf8E4M3FN>'}}
  %y = train.linear %x, %w scope<0, mlp_fc1> : (tensor<2x4x8xbf16>, tensor<4x8xf8E4M3FN>) -> tensor<2x4x4xbf16>
  return
}

// -----

func.func @linear_dynamic(%x: tensor<?x4x8xbf16>, %w: tensor<4x8xbf16>) {
  // expected-error @+1 {{operand #0 must be static bf16 or f32 tensor, but got 'tensor<?x4x8xbf16>'}}
  %y = train.linear %x, %w scope<0, mlp_fc1> : (tensor<?x4x8xbf16>, tensor<4x8xbf16>) -> tensor<2x4x4xbf16>
  return
}

// -----

func.func @linear_k(%x: tensor<2x4x8xbf16>, %w: tensor<4x6xbf16>) {
  // expected-error @+1 {{weight dimension 1 is 6, expected 8 (the input's last dimension K; weight is [O, K])}}
  %y = train.linear %x, %w scope<0, mlp_fc1> : (tensor<2x4x8xbf16>, tensor<4x6xbf16>) -> tensor<2x4x4xbf16>
  return
}

// -----

func.func @linear_out(%x: tensor<2x4x8xbf16>, %w: tensor<4x8xbf16>) {
  // expected-error @+1 {{result dimension 2 is 5, expected 4 (weight dimension 0, the output features O)}}
  %y = train.linear %x, %w scope<0, mlp_fc1> : (tensor<2x4x8xbf16>, tensor<4x8xbf16>) -> tensor<2x4x5xbf16>
  return
}

// -----

func.func @linear_mixed(%x: tensor<2x4x8xf32>, %w: tensor<4x8xbf16>) {
  // expected-error @+1 {{weight has element type 'bf16', expected 'f32' (the element type of input)}}
  %y = train.linear %x, %w scope<0, mlp_fc1> : (tensor<2x4x8xf32>, tensor<4x8xbf16>) -> tensor<2x4x4xf32>
  return
}

// -----

func.func @embedding_tokens(%t: tensor<2x4xi64>, %e: tensor<16x8xbf16>) {
  // expected-error @+1 {{operand #0 must be 2-D static i32 tensor [B, T] of token ids, but got 'tensor<2x4xi64>'}}
  %h = train.embedding %t, %e scope<-1, embedding> : (tensor<2x4xi64>, tensor<16x8xbf16>) -> tensor<2x4x8xbf16>
  return
}

// -----

func.func @embedding_width(%t: tensor<2x4xi32>, %e: tensor<16x8xbf16>) {
  // expected-error @+1 {{result dimension 2 is 6, expected 8 (table dimension 1, the hidden size)}}
  %h = train.embedding %t, %e scope<-1, embedding> : (tensor<2x4xi32>, tensor<16x8xbf16>) -> tensor<2x4x6xbf16>
  return
}

// -----

func.func @rms_weight(%x: tensor<2x4x8xbf16>, %w: tensor<4xbf16>) {
  // expected-error @+1 {{weight dimension 0 is 4, expected 8 (the input's last dimension, which is normalised)}}
  %y = train.rms_norm %x, %w scope<0, attn_norm> {eps = 1.0e-06 : f64} : (tensor<2x4x8xbf16>, tensor<4xbf16>) -> tensor<2x4x8xbf16>
  return
}

// -----

func.func @rms_eps(%x: tensor<2x4x8xbf16>, %w: tensor<8xbf16>) {
  // expected-error @+1 {{attribute 'eps' must be positive, got 0}}
  %y = train.rms_norm %x, %w scope<0, attn_norm> {eps = 0.0 : f64} : (tensor<2x4x8xbf16>, tensor<8xbf16>) -> tensor<2x4x8xbf16>
  return
}

// -----

func.func @rms_result(%x: tensor<2x4x8xbf16>, %w: tensor<8xbf16>) {
  // expected-error @+1 {{result has type 'tensor<2x4x8xf32>', expected 'tensor<2x4x8xbf16>' (the type of input)}}
  %y = train.rms_norm %x, %w scope<0, attn_norm> {eps = 1.0e-06 : f64} : (tensor<2x4x8xbf16>, tensor<8xbf16>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @gated_norm_gate(%o: tensor<1x4x2x8xbf16>, %z: tensor<1x4x2x4xbf16>, %w: tensor<8xbf16>) {
  // expected-error @+1 {{gate has type 'tensor<1x4x2x4xbf16>', expected 'tensor<1x4x2x8xbf16>' (the type of input)}}
  %y = train.gated_rms_norm %o, %z, %w scope<0, gdn_norm_out> {eps = 1.0e-06 : f64}
      : (tensor<1x4x2x8xbf16>, tensor<1x4x2x4xbf16>, tensor<8xbf16>) -> tensor<1x4x2x8xbf16>
  return
}

// -----

func.func @l2_rank(%q: tensor<4x2x8xbf16>) {
  // expected-error @+1 {{operand #0 must be 4-D static bf16 or f32 tensor [B, T, H, d], but got 'tensor<4x2x8xbf16>'}}
  %y = train.l2_norm %q scope<0, gdn_core_attn> {eps = 1.0e-06 : f64} : (tensor<4x2x8xbf16>) -> tensor<4x2x8xbf16>
  return
}

// -----

func.func @conv_channels(%x: tensor<1x8x16xbf16>, %w: tensor<12x4xbf16>) {
  // expected-error @+1 {{weight dimension 0 is 12, expected 16 (the input's channels C; weight is [C, Kc])}}
  %y = train.short_conv %x, %w scope<0, gdn_prep> : (tensor<1x8x16xbf16>, tensor<12x4xbf16>) -> tensor<1x8x16xbf16>
  return
}

// -----

func.func @conv_kernel(%x: tensor<1x8x16xbf16>, %w: tensor<16x9xbf16>) {
  // expected-error @+1 {{weight dimension 1 (the kernel size Kc) is 9, expected 1 to 8}}
  %y = train.short_conv %x, %w scope<0, gdn_prep> : (tensor<1x8x16xbf16>, tensor<16x9xbf16>) -> tensor<1x8x16xbf16>
  return
}

// -----

func.func @conv_split_channels(%x: tensor<1x8x16xbf16>, %w: tensor<16x4xbf16>) {
  // expected-error @+1 {{results have 12 channels in all, expected the input's 16}}
  %q, %k = train.short_conv %x, %w scope<0, gdn_prep> : (tensor<1x8x16xbf16>, tensor<16x4xbf16>) -> (tensor<1x8x8xbf16>, tensor<1x8x4xbf16>)
  return
}

// -----

func.func @conv_split_tokens(%x: tensor<1x8x16xbf16>, %w: tensor<16x4xbf16>) {
  // expected-error @+1 {{result #1 dimension 1 is 4, expected 8 (the input's sequence length T)}}
  %q, %k = train.short_conv %x, %w scope<0, gdn_prep> : (tensor<1x8x16xbf16>, tensor<16x4xbf16>) -> (tensor<1x8x8xbf16>, tensor<1x4x8xbf16>)
  return
}

// -----

func.func @conv_empty_group(%x: tensor<1x8x16xbf16>, %w: tensor<16x4xbf16>) {
  // expected-error @+1 {{'train.short_conv' op result #1 dimension 2 is 0 in 'tensor<1x8x0xbf16>'; every dimension must be at least 1}}
  %q, %k = train.short_conv %x, %w scope<0, gdn_prep> : (tensor<1x8x16xbf16>, tensor<16x4xbf16>) -> (tensor<1x8x16xbf16>, tensor<1x8x0xbf16>)
  return
}

// -----

func.func @conv_no_results(%x: tensor<1x8x16xbf16>, %w: tensor<16x4xbf16>) {
  // expected-error @+1 {{has no results, expected at least 1}}
  train.short_conv %x, %w scope<0, gdn_prep> : (tensor<1x8x16xbf16>, tensor<16x4xbf16>) -> ()
  return
}

// -----

func.func @gates_heads(%a: tensor<1x8x4xbf16>, %b: tensor<1x8x4xbf16>, %al: tensor<2xf32>, %dt: tensor<4xf32>) {
  // expected-error @+1 {{A_log dimension 0 is 2, expected 4 (the value heads Hv, a's dimension 2)}}
  %g, %beta = train.gdn_gates %a, %b, %al, %dt scope<0, gdn_core_attn>
      : (tensor<1x8x4xbf16>, tensor<1x8x4xbf16>, tensor<2xf32>, tensor<4xf32>) -> (tensor<1x8x4xf32>, tensor<1x8x4xbf16>)
  return
}

// -----

func.func @gates_g_dtype(%a: tensor<1x8x4xbf16>, %b: tensor<1x8x4xbf16>, %al: tensor<4xf32>, %dt: tensor<4xf32>) {
  // expected-error @+1 {{result #0 must be 3-D static f32 tensor [B, T, H], but got 'tensor<1x8x4xbf16>'}}
  %g, %beta = train.gdn_gates %a, %b, %al, %dt scope<0, gdn_core_attn>
      : (tensor<1x8x4xbf16>, tensor<1x8x4xbf16>, tensor<4xf32>, tensor<4xf32>) -> (tensor<1x8x4xbf16>, tensor<1x8x4xbf16>)
  return
}

// -----

func.func @gates_alog_bf16(%a: tensor<1x8x4xbf16>, %b: tensor<1x8x4xbf16>, %al: tensor<4xbf16>, %dt: tensor<4xf32>) {
  // expected-error @+1 {{operand #2 must be 1-D static f32 tensor, but got 'tensor<4xbf16>'}}
  %g, %beta = train.gdn_gates %a, %b, %al, %dt scope<0, gdn_core_attn>
      : (tensor<1x8x4xbf16>, tensor<1x8x4xbf16>, tensor<4xbf16>, tensor<4xf32>) -> (tensor<1x8x4xf32>, tensor<1x8x4xbf16>)
  return
}

// -----

func.func @gdr_heads(%q: tensor<1x64x4x16xbf16>, %v: tensor<1x64x6x16xbf16>, %g: tensor<1x64x6xf32>, %b: tensor<1x64x6xbf16>) {
  // expected-error @+1 {{value heads Hv = 6 (v dimension 2) must be a multiple of key heads Hk = 4 (q dimension 2)}}
  %o = train.gated_delta_rule %q, %q, %v, %g, %b scope<0, gdn_core_attn> {scale = 0.25 : f64}
      : (tensor<1x64x4x16xbf16>, tensor<1x64x4x16xbf16>, tensor<1x64x6x16xbf16>, tensor<1x64x6xf32>, tensor<1x64x6xbf16>) -> tensor<1x64x6x16xbf16>
  return
}

// -----

func.func @gdr_head_dim(%q: tensor<1x64x1x512xbf16>, %v: tensor<1x64x1x16xbf16>, %g: tensor<1x64x1xf32>, %b: tensor<1x64x1xbf16>) {
  // expected-error @+1 {{head dims dk = 512, dv = 16 exceed the supported maximum 256}}
  %o = train.gated_delta_rule %q, %q, %v, %g, %b scope<0, gdn_core_attn> {scale = 0.25 : f64}
      : (tensor<1x64x1x512xbf16>, tensor<1x64x1x512xbf16>, tensor<1x64x1x16xbf16>, tensor<1x64x1xf32>, tensor<1x64x1xbf16>) -> tensor<1x64x1x16xbf16>
  return
}

// -----

func.func @gdr_chunk(%q: tensor<1x64x2x16xbf16>, %v: tensor<1x64x2x16xbf16>, %g: tensor<1x64x2xf32>, %b: tensor<1x64x2xbf16>) {
  // expected-error @+1 {{chunk_size is 32, expected 64 (the chunk size the GDN kernels implement)}}
  %o = train.gated_delta_rule %q, %q, %v, %g, %b scope<0, gdn_core_attn> {chunk_size = 32 : i64, scale = 0.25 : f64}
      : (tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>, tensor<1x64x2xbf16>) -> tensor<1x64x2x16xbf16>
  return
}

// -----

func.func @gdr_beta(%q: tensor<1x64x2x16xbf16>, %v: tensor<1x64x2x16xbf16>, %g: tensor<1x64x2xf32>, %b: tensor<1x32x2xbf16>) {
  // expected-error @+1 {{beta dimension 1 is 32, expected 64 (v's [B, T, Hv])}}
  %o = train.gated_delta_rule %q, %q, %v, %g, %b scope<0, gdn_core_attn> {scale = 0.25 : f64}
      : (tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>, tensor<1x32x2xbf16>) -> tensor<1x64x2x16xbf16>
  return
}

// -----

func.func @gdr_k(%q: tensor<1x64x2x16xbf16>, %k: tensor<1x64x2x8xbf16>, %v: tensor<1x64x2x16xbf16>, %g: tensor<1x64x2xf32>, %b: tensor<1x64x2xbf16>) {
  // expected-error @+1 {{k has type 'tensor<1x64x2x8xbf16>', expected 'tensor<1x64x2x16xbf16>' (the type of q)}}
  %o = train.gated_delta_rule %q, %k, %v, %g, %b scope<0, gdn_core_attn> {scale = 0.25 : f64}
      : (tensor<1x64x2x16xbf16>, tensor<1x64x2x8xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>, tensor<1x64x2xbf16>) -> tensor<1x64x2x16xbf16>
  return
}

// -----

func.func @rope_odd(%x: tensor<1x8x2x16xbf16>) {
  // expected-error @+1 {{rotary_dim is 7, expected an even number in [2, 16] (the head dim)}}
  %y = train.rope %x scope<3, qkv_linear> {rotary_dim = 7 : i64, theta = 1.0e+04 : f64} : (tensor<1x8x2x16xbf16>) -> tensor<1x8x2x16xbf16>
  return
}

// -----

func.func @rope_wide(%x: tensor<1x8x2x16xbf16>) {
  // expected-error @+1 {{rotary_dim is 32, expected an even number in [2, 16] (the head dim)}}
  %y = train.rope %x scope<3, qkv_linear> {rotary_dim = 32 : i64, theta = 1.0e+04 : f64} : (tensor<1x8x2x16xbf16>) -> tensor<1x8x2x16xbf16>
  return
}

// -----

func.func @attn_gqa(%q: tensor<1x8x6x16xbf16>, %k: tensor<1x8x4x16xbf16>) {
  // expected-error @+1 {{query heads Hq = 6 must be a multiple of key/value heads Hkv = 4 (grouped-query attention)}}
  %o = train.attention %q, %k, %k scope<3, core_attn> {scale = 0.25 : f64}
      : (tensor<1x8x6x16xbf16>, tensor<1x8x4x16xbf16>, tensor<1x8x4x16xbf16>) -> tensor<1x8x6x16xbf16>
  return
}

// -----

func.func @attn_dqk(%q: tensor<1x8x4x16xbf16>, %k: tensor<1x8x2x8xbf16>, %v: tensor<1x8x2x16xbf16>) {
  // expected-error @+1 {{k dimension 3 is 8, expected 16 (q's head dim Dqk)}}
  %o = train.attention %q, %k, %v scope<3, core_attn> {scale = 0.25 : f64}
      : (tensor<1x8x4x16xbf16>, tensor<1x8x2x8xbf16>, tensor<1x8x2x16xbf16>) -> tensor<1x8x4x16xbf16>
  return
}

// -----

func.func @attn_result(%q: tensor<1x8x4x24xbf16>, %k: tensor<1x8x4x24xbf16>, %v: tensor<1x8x4x16xbf16>) {
  // expected-error @+1 {{result dimension 3 is 24, expected 16 (v's head dim Dv)}}
  %o = train.attention %q, %k, %v scope<0, core_attn> {scale = 0.25 : f64}
      : (tensor<1x8x4x24xbf16>, tensor<1x8x4x24xbf16>, tensor<1x8x4x16xbf16>) -> tensor<1x8x4x24xbf16>
  return
}

// -----

func.func @attn_head_dim(%q: tensor<1x8x1x320xbf16>) {
  // expected-error @+1 {{head dims Dqk = 320, Dv = 320 exceed the supported maximum 256}}
  %o = train.attention %q, %q, %q scope<0, core_attn> {scale = 0.25 : f64}
      : (tensor<1x8x1x320xbf16>, tensor<1x8x1x320xbf16>, tensor<1x8x1x320xbf16>) -> tensor<1x8x1x320xbf16>
  return
}

// -----

func.func @attn_seq(%q: tensor<1x8x2x16xbf16>, %k: tensor<1x4x2x16xbf16>) {
  // expected-error @+1 {{k dimension 1 is 4, expected 8 (q's sequence length T)}}
  %o = train.attention %q, %k, %k scope<0, core_attn> {scale = 0.25 : f64}
      : (tensor<1x8x2x16xbf16>, tensor<1x4x2x16xbf16>, tensor<1x4x2x16xbf16>) -> tensor<1x8x2x16xbf16>
  return
}

// -----

func.func @gate_type(%o: tensor<1x8x2x16xbf16>, %g: tensor<1x8x2x16xf32>) {
  // expected-error @+1 {{'train.output_gate' op requires the same type for all operands and results}}
  %y = train.output_gate %o, %g scope<3, attn_proj> : (tensor<1x8x2x16xbf16>, tensor<1x8x2x16xf32>) -> tensor<1x8x2x16xbf16>
  return
}

// -----

func.func @swiglu_shape(%a: tensor<1x8x16xbf16>, %b: tensor<1x8x8xbf16>) {
  // expected-error @+1 {{'train.swiglu' op requires the same type for all operands and results}}
  %y = train.swiglu %a, %b scope<0, mlp_act> : (tensor<1x8x16xbf16>, tensor<1x8x8xbf16>) -> tensor<1x8x16xbf16>
  return
}

// -----

func.func @reshape_count(%x: tensor<1x8x16xbf16>) {
  // expected-error @+1 {{result has 64 elements, expected 128 (the input's)}}
  %y = train.reshape %x scope<0, gdn_in_proj> : (tensor<1x8x16xbf16>) -> tensor<1x8x2x4xbf16>
  return
}

// -----

func.func @slice_range(%x: tensor<1x8x16xbf16>) {
  // expected-error @+1 {{slice [12, 20) of dimension 2 is outside the input's extent 16}}
  %y = train.slice %x scope<0, gdn_prep> {dim = 2 : i64, offset = 12 : i64} : (tensor<1x8x16xbf16>) -> tensor<1x8x8xbf16>
  return
}

// -----

func.func @slice_dim(%x: tensor<1x8x16xbf16>) {
  // expected-error @+1 {{dim is 3, expected 0 to 2}}
  %y = train.slice %x scope<0, gdn_prep> {dim = 3 : i64, offset = 0 : i64} : (tensor<1x8x16xbf16>) -> tensor<1x8x8xbf16>
  return
}

// -----

func.func @slice_other(%x: tensor<1x8x16xbf16>) {
  // expected-error @+1 {{result dimension 1 is 4, expected 8 (the input's extent outside the sliced dim)}}
  %y = train.slice %x scope<0, gdn_prep> {dim = 2 : i64, offset = 0 : i64} : (tensor<1x8x16xbf16>) -> tensor<1x4x8xbf16>
  return
}

// -----

func.func @concat_sum(%a: tensor<1x8x4xbf16>, %b: tensor<1x8x4xbf16>) {
  // expected-error @+1 {{result dimension 2 is 10, expected 8 (the sum of the inputs' extents)}}
  %y = train.concat %a, %b scope<0, mla_up_proj> {dim = 2 : i64} : (tensor<1x8x4xbf16>, tensor<1x8x4xbf16>) -> tensor<1x8x10xbf16>
  return
}

// -----

func.func @concat_other(%a: tensor<1x8x4xbf16>, %b: tensor<1x6x4xbf16>) {
  // expected-error @+1 {{input #1 dimension 1 is 6, expected 8 (the result's extent outside dim)}}
  %y = train.concat %a, %b scope<0, mla_up_proj> {dim = 2 : i64} : (tensor<1x8x4xbf16>, tensor<1x6x4xbf16>) -> tensor<1x8x8xbf16>
  return
}

// -----

func.func @expand_dim(%x: tensor<1x8x2x4xbf16>) {
  // expected-error @+1 {{input dimension 2 is 2, expected 1 or 4 (the result's)}}
  %y = train.expand %x scope<0, mla_up_proj> : (tensor<1x8x2x4xbf16>) -> tensor<1x8x4x4xbf16>
  return
}

// -----

func.func @ce_labels(%h: tensor<1x8x16xbf16>, %w: tensor<32x16xbf16>, %l: tensor<1x4xi32>) {
  // expected-error @+1 {{labels dimension 1 is 4, expected 8 (hidden's sequence length T)}}
  %loss, %n = train.lm_head_cross_entropy %h, %w, %l scope<-1, lm_head>
      : (tensor<1x8x16xbf16>, tensor<32x16xbf16>, tensor<1x4xi32>) -> (tensor<f32>, tensor<i32>)
  return
}

// -----

func.func @ce_chunk(%h: tensor<1x8x16xbf16>, %w: tensor<32x16xbf16>, %l: tensor<1x8xi32>) {
  // expected-error @+1 {{chunk_tokens is 0, expected at least 1}}
  %loss, %n = train.lm_head_cross_entropy %h, %w, %l scope<-1, lm_head> {chunk_tokens = 0 : i64}
      : (tensor<1x8x16xbf16>, tensor<32x16xbf16>, tensor<1x8xi32>) -> (tensor<f32>, tensor<i32>)
  return
}

// -----

func.func @ce_hidden_width(%h: tensor<1x8x16xbf16>, %w: tensor<32x8xbf16>, %l: tensor<1x8xi32>) {
  // expected-error @+1 {{weight dimension 1 is 8, expected 16 (hidden's size D; weight is [V, D])}}
  %loss, %n = train.lm_head_cross_entropy %h, %w, %l scope<-1, lm_head>
      : (tensor<1x8x16xbf16>, tensor<32x8xbf16>, tensor<1x8xi32>) -> (tensor<f32>, tensor<i32>)
  return
}

// -----

func.func @ce_with_grad_type(%h: tensor<1x8x16xbf16>, %w: tensor<32x16xbf16>, %l: tensor<1x8xi32>) {
  // expected-error @+1 {{hidden_grad}}
  %loss, %n, %dh = train.lm_head_cross_entropy_with_grad %h, %w, %l scope<-1, lm_head>
      : (tensor<1x8x16xbf16>, tensor<32x16xbf16>, tensor<1x8xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x8x8xbf16>)
  return
}

// -----

func.func @ce_with_grad_labels(%h: tensor<1x8x16xbf16>, %w: tensor<32x16xbf16>, %l: tensor<1x4xi32>) {
  // expected-error @+1 {{labels dimension 1 is 4, expected 8 (hidden's sequence length T)}}
  %loss, %n, %dh = train.lm_head_cross_entropy_with_grad %h, %w, %l scope<-1, lm_head>
      : (tensor<1x8x16xbf16>, tensor<32x16xbf16>, tensor<1x4xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x8x16xbf16>)
  return
}

// -----

module {
  func.func @missing_param() {
    // expected-error @+1 {{refers to 'nope', which is not a train.param in scope}}
    %w = train.param_ref @nope : tensor<4xbf16>
    return
  }
}

// -----

module {
  train.param @w : tensor<4xbf16> init<ones>
  func.func @param_type() {
    // expected-error @+1 {{result type 'tensor<4xf32>' does not match the declared type 'tensor<4xbf16>' of parameter 'w'}}
    %w = train.param_ref @w : tensor<4xf32>
    return
  }
}

// -----

module {
  // expected-error @+1 {{'train.param' op attribute 'type' failed to satisfy constraint: type attribute of static bf16 or f32 tensor}}
  train.param @w : tensor<4xf16> init<ones>
}

// -----

// expected-error @+1 {{'train.micro_batches' must be a positive integer, got 0 : i64}}
module attributes {train.micro_batches = 0 : i64} {
}

// -----

func.func @placement_count(%x: tensor<2x4x8xbf16>) {
  // expected-error @+1 {{'train.placement' must be an array of one UTF-8 string per result}}
  %y = train.swiglu %x, %x scope<0, mlp_act> {train.placement = ["keep", "offload"]} : (tensor<2x4x8xbf16>, tensor<2x4x8xbf16>) -> tensor<2x4x8xbf16>
  return
}

// -----

// The report writes the decisions to JSON: a byte sequence that is not UTF-8
// is refused here.
func.func @placement_not_utf8(%x: tensor<2x4x8xbf16>) {
  // expected-error @+1 {{'train.placement' must be an array of one UTF-8 string per result}}
  %y = train.swiglu %x, %x scope<0, mlp_act> {train.placement = ["\EA\EA"]} : (tensor<2x4x8xbf16>, tensor<2x4x8xbf16>) -> tensor<2x4x8xbf16>
  return
}

// -----

// expected-error @+1 {{unknown train dialect attribute 'train.bogus'}}
module attributes {train.bogus = 1 : i64} {
}

// -----

func.func @reload_used_directly(%x: tensor<4xbf16>) -> tensor<4xbf16> {
  %h = train.offload %x scope<0, gdn_core_attn> : (tensor<4xbf16>) -> !train.host<tensor<4xbf16>>
  // expected-error @+1 {{result may only be used by train.wait (the consumer must wait for the copy), found train.add}}
  %r = train.reload %h scope<0, gdn_core_attn> : (!train.host<tensor<4xbf16>>) -> tensor<4xbf16>
  %y = train.add %r, %r scope<0, gdn_core_attn> : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  return %y : tensor<4xbf16>
}

// -----

func.func @offload_type(%x: tensor<4xbf16>) {
  // expected-error @+1 {{host type '!train.host<tensor<8xbf16>>' must hold the input type 'tensor<4xbf16>'}}
  %h = train.offload %x scope<0, gdn_core_attn> : (tensor<4xbf16>) -> !train.host<tensor<8xbf16>>
  return
}

// -----

func.func @wait_without_reload(%x: tensor<4xbf16>) {
  // expected-error @+1 {{must wait on the result of a train.reload}}
  %w = train.wait %x scope<0, gdn_core_attn> : (tensor<4xbf16>) -> tensor<4xbf16>
  return
}

// -----

func.func @saved_rstd_shape(%x: tensor<2x4x8xbf16>, %w: tensor<8xbf16>) {
  // expected-error @+1 {{rstd has type 'tensor<2x8xf32>', expected the input shape without its last dimension (one value per normalised row)}}
  %y, %r = train.rms_norm %x, %w scope<0, attn_norm> {eps = 1.0e-06 : f64} : (tensor<2x4x8xbf16>, tensor<8xbf16>) -> (tensor<2x4x8xbf16>, tensor<2x8xf32>)
  return
}

// -----

func.func @gdr_saved(%q: tensor<1x64x2x16xbf16>, %v: tensor<1x64x2x16xbf16>, %g: tensor<1x64x2xf32>, %b: tensor<1x64x2xbf16>) {
  // expected-error @+1 {{saved results must be (g_cumsum: 'tensor<1x64x2xf32>', T: 'tensor<1x64x2x64xbf16>')}}
  %o, %gc, %t = train.gated_delta_rule %q, %q, %v, %g, %b scope<0, gdn_core_attn> {scale = 0.25 : f64}
      : (tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>, tensor<1x64x2xbf16>)
      -> (tensor<1x64x2x16xbf16>, tensor<1x64x2xf32>, tensor<1x64x2x32xbf16>)
  return
}

// -----

func.func @bad_recomputed(%x: tensor<4xbf16>) {
  // expected-error @+1 {{'train.recomputed' is a unit attribute of train compute ops}}
  %y = train.add %x, %x scope<0, mlp_fc2> {train.recomputed = 1 : i64} : (tensor<4xbf16>, tensor<4xbf16>) -> tensor<4xbf16>
  return
}

// -----

func.func @yield_one(%t: tensor<2x1x8xi32>, %c: tensor<f32>) -> (tensor<f32>, tensor<i32>) {
  %l, %n = train.microbatch_loop %t, %t : (tensor<2x1x8xi32>, tensor<2x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
  ^bb0(%tok: tensor<1x8xi32>, %lab: tensor<1x8xi32>):
    // expected-error @+1 {{'train.yield' op yields 1 values; expected none (a pipeline stage without the loss) or the loss sum (tensor<f32>) and the token count (tensor<i32>)}}
    train.yield %c : tensor<f32>
  }
  return %l, %n : tensor<f32>, tensor<i32>
}

// -----

func.func @yield_swapped(%t: tensor<2x1x8xi32>, %c: tensor<f32>, %k: tensor<i32>) -> (tensor<f32>, tensor<i32>) {
  %l, %n = train.microbatch_loop %t, %t : (tensor<2x1x8xi32>, tensor<2x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
  ^bb0(%tok: tensor<1x8xi32>, %lab: tensor<1x8xi32>):
    // expected-error @+1 {{'train.yield' op yields 2 values; expected none}}
    train.yield %k, %c : tensor<i32>, tensor<f32>
  }
  return %l, %n : tensor<f32>, tensor<i32>
}

// -----

func.func @send_outside_loop(%x: tensor<4xbf16>) {
  // expected-error @+1 {{'train.pipeline_send' op expects parent op 'train.microbatch_loop'}}
  train.pipeline_send %x next channel 0 : tensor<4xbf16>
  return
}

// -----

func.func @send_negative_channel(%t: tensor<2x1x8xi32>, %x: tensor<4xbf16>) -> (tensor<f32>, tensor<i32>) {
  %l, %n = train.microbatch_loop %t, %t : (tensor<2x1x8xi32>, tensor<2x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
  ^bb0(%tok: tensor<1x8xi32>, %lab: tensor<1x8xi32>):
    // expected-error @+1 {{'train.pipeline_send' op attribute 'channel' failed to satisfy constraint}}
    train.pipeline_send %x prev channel -1 : tensor<4xbf16>
    train.yield
  }
  return %l, %n : tensor<f32>, tensor<i32>
}

// -----

func.func @recv_int(%t: tensor<2x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
  %l, %n = train.microbatch_loop %t, %t : (tensor<2x1x8xi32>, tensor<2x1x8xi32>) -> (tensor<f32>, tensor<i32>) {
  ^bb0(%tok: tensor<1x8xi32>, %lab: tensor<1x8xi32>):
    // expected-error @+1 {{'train.pipeline_recv' op result #0 must be static bf16 or f32 tensor}}
    %r = train.pipeline_recv prev channel 0 : tensor<4xi32>
    train.yield
  }
  return %l, %n : tensor<f32>, tensor<i32>
}

// -----

func.func @doc_starts_separator(%t: tensor<1x16xi32>) {
  // expected-error @+1 {{separator is -1, expected a token id in [0, 2^31)}}
  %d = train.doc_starts %t scope<-1, embedding> {separator = -1 : i64} : (tensor<1x16xi32>) -> tensor<1x16xi32>
  return
}

// -----

func.func @doc_starts_shape(%t: tensor<1x16xi32>) {
  // expected-error @+1 {{'train.doc_starts' op result has type 'tensor<2x8xi32>', expected 'tensor<1x16xi32>' (the type of tokens)}}
  %d = train.doc_starts %t scope<-1, embedding> {separator = 10 : i64} : (tensor<1x16xi32>) -> tensor<2x8xi32>
  return
}

// -----

// The document starts of packed sequences are [B, T] of the op's tokens.
func.func @conv_doc_starts(%x: tensor<1x16x8xbf16>, %w: tensor<8x4xbf16>, %d: tensor<1x8xi32>) {
  // expected-error @+1 {{doc_starts dimension 1 is 8, expected 16 (the sequence length T)}}
  %y = train.short_conv %x, %w, %d scope<0, gdn_prep> : (tensor<1x16x8xbf16>, tensor<8x4xbf16>, tensor<1x8xi32>) -> tensor<1x16x8xbf16>
  return
}

// -----

func.func @rope_doc_starts(%x: tensor<2x16x2x8xbf16>, %d: tensor<1x16xi32>) {
  // expected-error @+1 {{doc_starts dimension 0 is 1, expected 2 (the batch B)}}
  %y = train.rope %x, %d scope<0, qkv_linear> {rotary_dim = 8 : i64, theta = 1.0e4 : f64} : (tensor<2x16x2x8xbf16>, tensor<1x16xi32>) -> tensor<2x16x2x8xbf16>
  return
}

// -----

func.func @rope_type(%x: tensor<1x16x2x8xbf16>) {
  // expected-error @+1 {{'train.rope' op result has type 'tensor<1x16x2x8xf32>'}}
  %y = train.rope %x scope<0, qkv_linear> {rotary_dim = 8 : i64, theta = 1.0e4 : f64} : (tensor<1x16x2x8xbf16>) -> tensor<1x16x2x8xf32>
  return
}

// -----

func.func @conv_grad_doc_starts(%x: tensor<1x16x8xbf16>, %w: tensor<8x4xbf16>, %dy: tensor<1x16x8xbf16>, %d: tensor<1x15xi32>) {
  // expected-error @+1 {{doc_starts dimension 1 is 15, expected 16 (the sequence length T)}}
  %dx = train.short_conv_grad %x, %w, %dy docs %d scope<0, gdn_prep> : (tensor<1x16x8xbf16>, tensor<8x4xbf16>, tensor<1x16x8xbf16>, tensor<1x15xi32>) -> tensor<1x16x8xbf16>
  return
}
