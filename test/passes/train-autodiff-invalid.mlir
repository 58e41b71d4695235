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
