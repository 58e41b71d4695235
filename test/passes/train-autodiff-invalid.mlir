// RUN: actplace-opt %s -split-input-file -train-autodiff -verify-diagnostics -o /dev/null
// Graphs train-autodiff cannot differentiate.

// expected-error @+1 {{train-autodiff expects a func.func @forward}}
module {
  func.func @other() {
    return
  }
}

// -----

module {
  // expected-error @+1 {{@forward must take (tokens, labels) of one microbatch [B, T] and return (loss_sum, token_count)}}
  func.func @forward(%x: tensor<4xbf16>) -> tensor<4xbf16> {
    return %x : tensor<4xbf16>
  }
}

// -----

// A split conv whose second result reaches nothing: its backward has no
// gradient for that group.
module attributes {train.micro_batches = 1 : i64} {
  train.param @E : tensor<32x8xbf16> init<normal, 0.0, 0.02>
  train.param @H : tensor<32x4xbf16> init<normal, 0.0, 0.02>
  train.param @cw : tensor<8x4xbf16> init<normal, 0.0, 0.02>
  func.func @forward(%tok: tensor<1x4xi32>, %lab: tensor<1x4xi32>) -> (tensor<f32>, tensor<i32>) {
    %E = train.param_ref @E : tensor<32x8xbf16>
    %h = train.embedding %tok, %E scope<-1, embedding> : (tensor<1x4xi32>, tensor<32x8xbf16>) -> tensor<1x4x8xbf16>
    %cw = train.param_ref @cw : tensor<8x4xbf16>
    // expected-error @+1 {{result #1 has no gradient; the conv backward needs one for every result}}
    %a, %b = train.short_conv %h, %cw scope<0, gdn_prep> : (tensor<1x4x8xbf16>, tensor<8x4xbf16>) -> (tensor<1x4x4xbf16>, tensor<1x4x4xbf16>)
    %H = train.param_ref @H : tensor<32x4xbf16>
    %l, %c = train.lm_head_cross_entropy %a, %H, %lab scope<-1, lm_head> : (tensor<1x4x4xbf16>, tensor<32x4xbf16>, tensor<1x4xi32>) -> (tensor<f32>, tensor<i32>)
    return %l, %c : tensor<f32>, tensor<i32>
  }
}

// -----

// A declared @forward has no graph to differentiate (reading its missing
// body crashed the pass).
module {
  // expected-error @+1 {{@forward is a declaration: train-autodiff needs its body (the forward graph)}}
  func.func private @forward(tensor<1x4xi32>, tensor<1x4xi32>) -> (tensor<f32>, tensor<i32>)
}
