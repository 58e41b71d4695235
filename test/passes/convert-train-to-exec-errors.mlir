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

// -----

module {
  func.func @train_step(%tok: tensor<1x1x4xi32>, %lab: tensor<1x1x4xi32>) -> tensor<f32> {
    %l, %n = train.microbatch_loop %tok, %lab : (tensor<1x1x4xi32>, tensor<1x1x4xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x4xi32>, %b: tensor<1x4xi32>):
      // expected-error @+1 {{convert-train-to-exec: unsupported op in the microbatch loop}}
      %c = arith.constant dense<0.0> : tensor<f32>
      %k = arith.constant dense<0> : tensor<i32>
      train.yield %c, %k : tensor<f32>, tensor<i32>
    }
    return %l : tensor<f32>
  }
}

// -----

module {
  func.func @train_step(%tok: tensor<1x1x4xi32>, %lab: tensor<1x1x4xi32>) -> tensor<f32> {
    // expected-error @+1 {{convert-train-to-exec: unsupported op outside the microbatch loop}}
    %c = arith.constant dense<0.0> : tensor<f32>
    %k = arith.constant dense<0> : tensor<i32>
    %l, %n = train.microbatch_loop %tok, %lab : (tensor<1x1x4xi32>, tensor<1x1x4xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x4xi32>, %b: tensor<1x4xi32>):
      train.yield %c, %k : tensor<f32>, tensor<i32>
    }
    return %l : tensor<f32>
  }
}

// -----

// A declared step has no body to lower (reading its missing body never
// returned).
module {
  // expected-error @+1 {{convert-train-to-exec: @train_step is a declaration; the step needs its body}}
  func.func private @train_step(tensor<1x1x4xi32>, tensor<1x1x4xi32>) -> (tensor<f32>, tensor<f32>)
}
