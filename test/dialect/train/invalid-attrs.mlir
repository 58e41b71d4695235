// RUN: actplace-opt %s -split-input-file -verify-diagnostics
// Scope and init attribute errors.

func.func @unknown_leaf(%a: tensor<2x4xbf16>) {
  // expected-error @+1 {{unknown module 'gdn_attn' in scope; expected one of attn_norm, gdn_in_proj}}
  %y = train.add %a, %a scope<0, gdn_attn> : (tensor<2x4xbf16>, tensor<2x4xbf16>) -> tensor<2x4xbf16>
  return
}

// -----

func.func @model_leaf_layer(%a: tensor<2x4xbf16>) {
  // expected-error @+1 {{model-level module 'lm_head' must have layer -1, got 2}}
  %y = train.add %a, %a scope<2, lm_head> : (tensor<2x4xbf16>, tensor<2x4xbf16>) -> tensor<2x4xbf16>
  return
}

// -----

func.func @layer_leaf_negative(%a: tensor<2x4xbf16>) {
  // expected-error @+1 {{module 'mlp_fc1' belongs to a decoder layer: expected a layer index >= 0, got -1}}
  %y = train.add %a, %a scope<-1, mlp_fc1> : (tensor<2x4xbf16>, tensor<2x4xbf16>) -> tensor<2x4xbf16>
  return
}

// -----

func.func @alias_is_not_a_leaf(%a: tensor<2x4xbf16>) {
  // Aliases select leaves in options; an op carries exactly one leaf.
  // expected-error @+1 {{unknown module 'mlp' in scope}}
  %y = train.add %a, %a scope<0, mlp> : (tensor<2x4xbf16>, tensor<2x4xbf16>) -> tensor<2x4xbf16>
  return
}

// -----

func.func @missing_scope(%a: tensor<2x4xbf16>) {
  // expected-error @+1 {{requires attribute 'scope'}}
  %y = "train.add"(%a, %a) : (tensor<2x4xbf16>, tensor<2x4xbf16>) -> tensor<2x4xbf16>
  return
}

// -----

module {
  // expected-error @+1 {{unknown init kind 'xavier'; expected zeros, ones, normal, uniform or log_uniform}}
  train.param @w : tensor<4xbf16> init<xavier>
}

// -----

module {
  // expected-error @+1 {{normal init needs a positive standard deviation, got 0}}
  train.param @w : tensor<4xbf16> init<normal, 0.0, 0.0>
}

// -----

module {
  // expected-error @+1 {{log_uniform init needs 0 < low < high, got [0.000000e+00, 1.600000e+01)}}
  train.param @w : tensor<4xf32> init<log_uniform, 0.0, 16.0>
}

// -----

module {
  // expected-error @+1 {{uniform init needs low < high, got [1.000000e+00, 1.000000e+00)}}
  train.param @w : tensor<4xf32> init<uniform, 1.0, 1.0>
}
