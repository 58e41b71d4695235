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

// -----

// A bf16 weight the train dialect holds (1.5 x 2^47 bytes) whose f32 master
// is over the exec dialect's buffer limit (2^48 bytes): an error, not an
// exec.persistent that does not verify (a fuzz_ir finding).
module {
  // expected-error @+1 {{convert-train-to-exec: the master buffer of @w holds 'tensor<1649267441664x64xf32>', more than the 281474976710656 bytes one buffer may hold}}
  train.param @w : tensor<1649267441664x64xbf16> init<normal, 0.0, 0.02>
  func.func @train_step(%tok: tensor<1x1x64xi32>, %lab: tensor<1x1x64xi32>) -> (tensor<f32>, tensor<f32>) {
    %l, %n = train.microbatch_loop %tok, %lab : (tensor<1x1x64xi32>, tensor<1x1x64xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x64xi32>, %b: tensor<1x64xi32>):
      %w = train.param_ref @w : tensor<1649267441664x64xbf16>
      %e = train.embedding %t, %w scope<-1, embedding> : (tensor<1x64xi32>, tensor<1649267441664x64xbf16>) -> tensor<1x64x64xbf16>
      %ls, %tc, %dh = train.lm_head_cross_entropy_with_grad %e, %w, %b scope<-1, lm_head> {weight_grad = @w} : (tensor<1x64x64xbf16>, tensor<1649267441664x64xbf16>, tensor<1x64xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x64x64xbf16>)
      train.embedding_grad %t, %dh scope<-1, embedding> {weight_grad = @w} : (tensor<1x64xi32>, tensor<1x64x64xbf16>) -> ()
      train.yield %ls, %tc : tensor<f32>, tensor<i32>
    }
    %gn = train.finalize_grads %n {max_norm = 1.0 : f64} : (tensor<i32>) -> tensor<f32>
    return %l, %gn : tensor<f32>, tensor<f32>
  }
}

// -----

// The LM head's chunk of bf16 logits (256 tokens) over a 2^40-row vocabulary
// needs more scratch than one kernel may take (a fuzz_ir finding):
// 256 x 2^40 x 2 bytes, the rows' state and the GEMM workspace.
module {
  train.param @w : tensor<1099511627776x64xbf16> init<normal, 0.0, 0.02> frozen
  func.func @train_step(%tok: tensor<1x1x256xi32>, %lab: tensor<1x1x256xi32>) -> (tensor<f32>, tensor<f32>) {
    %l, %n = train.microbatch_loop %tok, %lab : (tensor<1x1x256xi32>, tensor<1x1x256xi32>) -> (tensor<f32>, tensor<i32>) {
    ^bb0(%t: tensor<1x256xi32>, %b: tensor<1x256xi32>):
      %w = train.param_ref @w : tensor<1099511627776x64xbf16>
      %e = train.embedding %t, %w scope<-1, embedding> : (tensor<1x256xi32>, tensor<1099511627776x64xbf16>) -> tensor<1x256x64xbf16>
      // expected-error @+1 {{convert-train-to-exec: the kernel of train.lm_head_cross_entropy_with_grad needs 562949986978816 bytes of scratch, more than the 281474976710656 bytes one kernel's scratch may take}}
      %ls, %tc, %dh = train.lm_head_cross_entropy_with_grad %e, %w, %b scope<-1, lm_head> : (tensor<1x256x64xbf16>, tensor<1099511627776x64xbf16>, tensor<1x256xi32>) -> (tensor<f32>, tensor<i32>, tensor<1x256x64xbf16>)
      train.yield %ls, %tc : tensor<f32>, tensor<i32>
    }
    %gn = train.finalize_grads %n {max_norm = 1.0 : f64} : (tensor<i32>) -> tensor<f32>
    return %l, %gn : tensor<f32>, tensor<f32>
  }
}
