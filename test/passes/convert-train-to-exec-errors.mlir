// RUN: actplace-opt %s -split-input-file -convert-train-to-exec -verify-diagnostics

// expected-error @+1 {{convert-train-to-exec: no function @train_step (run train-autodiff first)}}
module {
  func.func @forward() {
    return
  }
}

// -----

module {
  // expected-error @+1 {{convert-train-to-exec: @train_step has no train.microbatch_loop}}
  func.func @train_step() {
    return
  }
}
