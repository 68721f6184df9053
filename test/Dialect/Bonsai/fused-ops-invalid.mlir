// RUN: bonsai-opt %s -split-input-file -verify-diagnostics

func.func @counts(%step: tensor<i64>, %lr: tensor<f32>, %norm: tensor<f32>, %g0: tensor<8xf32>, %w0: tensor<8xf32>, %m0: tensor<8xf32>) {
  // expected-error @+1 {{has 1 gradients but 2 exp_avg}}
  bonsai.multi_tensor_adamw_update %step, %lr, %norm gradients(%g0 : tensor<8xf32>) params(%w0 : tensor<8xf32>) exp_avg(%m0, %m0 : tensor<8xf32>, tensor<8xf32>) exp_avg_sq(%m0 : tensor<8xf32>) {beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64, grad_clip = 1.0 : f64} : tensor<i64>, tensor<f32>, tensor<f32>
  return
}

// -----

func.func @empty(%lr: tensor<f32>, %norm: tensor<f32>) {
  // expected-error @+1 {{needs at least one parameter to update}}
  "bonsai.multi_tensor_sgd_update"(%lr, %norm) <{operandSegmentSizes = array<i32: 1, 1, 0, 0, 0, 0>, momentum = 0.0 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64}> : (tensor<f32>, tensor<f32>) -> ()
  return
}

// -----

func.func @shape(%lr: tensor<f32>, %norm: tensor<f32>, %g0: tensor<8xf32>, %w0: tensor<4xf32>, %b0: tensor<4xf32>) {
  // expected-error @+1 {{gradient #0 'tensor<8xf32>' does not match param #0 'tensor<4xf32>'}}
  bonsai.multi_tensor_sgd_update %lr, %norm gradients(%g0 : tensor<8xf32>) params(%w0 : tensor<4xf32>) momentum_buffer(%b0 : tensor<4xf32>) {momentum = 0.0 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<f32>, tensor<f32>
  return
}

// -----

func.func @mixed(%lr: tensor<f32>, %norm: tensor<f32>, %g0: tensor<8xf32>, %w0: tensor<8xf32>, %w1: tensor<8xbf16>, %b0: tensor<8xf32>) {
  // expected-error @+1 {{param #1 element type 'bf16' differs from param #0's 'f32'}}
  bonsai.multi_tensor_sgd_update %lr, %norm gradients(%g0, %g0 : tensor<8xf32>, tensor<8xf32>) params(%w0, %w1 : tensor<8xf32>, tensor<8xbf16>) momentum_buffer(%b0, %b0 : tensor<8xf32>, tensor<8xf32>) {momentum = 0.0 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<f32>, tensor<f32>
  return
}

// -----

func.func @state(%lr: tensor<f32>, %norm: tensor<f32>, %g0: tensor<8xf32>, %w0: tensor<8xbf16>, %b0: tensor<8xbf16>) {
  // expected-error @+1 {{momentum_buffer #0 must be an f32 tensor of the parameter's shape [8], got 'tensor<8xbf16>'}}
  bonsai.multi_tensor_sgd_update %lr, %norm gradients(%g0 : tensor<8xf32>) params(%w0 : tensor<8xbf16>) momentum_buffer(%b0 : tensor<8xbf16>) {momentum = 0.0 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<f32>, tensor<f32>
  return
}

// -----

func.func @masters(%lr: tensor<f32>, %norm: tensor<f32>, %g0: tensor<8xf32>, %w0: tensor<8xbf16>, %b0: tensor<8xf32>) {
  // expected-error @+1 {{has 2 gradients but 1 masters (expected none or one per parameter)}}
  bonsai.multi_tensor_sgd_update %lr, %norm gradients(%g0, %g0 : tensor<8xf32>, tensor<8xf32>) params(%w0, %w0 : tensor<8xbf16>, tensor<8xbf16>) momentum_buffer(%b0, %b0 : tensor<8xf32>, tensor<8xf32>) master(%b0 : tensor<8xf32>) {momentum = 0.0 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<f32>, tensor<f32>
  return
}

// -----

func.func @betas(%step: tensor<i64>, %lr: tensor<f32>, %norm: tensor<f32>, %g0: tensor<8xf32>, %w0: tensor<8xf32>, %m0: tensor<8xf32>) {
  // expected-error @+1 {{beta2 must be in [0, 1), got 1}}
  bonsai.multi_tensor_adamw_update %step, %lr, %norm gradients(%g0 : tensor<8xf32>) params(%w0 : tensor<8xf32>) exp_avg(%m0 : tensor<8xf32>) exp_avg_sq(%m0 : tensor<8xf32>) {beta1 = 0.9 : f64, beta2 = 1.0 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64, grad_clip = 1.0 : f64} : tensor<i64>, tensor<f32>, tensor<f32>
  return
}

// -----

func.func @gelu_weight(%x: tensor<4x16xf32>, %w: tensor<32x8xf32>) {
  // expected-error @+1 {{weight shape: expected [out, 16] (Hugging Face [out, in] layout for input features 16), got [32, 8]}}
  %y, %pre = bonsai.linear_gelu %x, %w : (tensor<4x16xf32>, tensor<32x8xf32>) -> (tensor<4x32xf32>, tensor<4x32xf32>)
  return
}

// -----

func.func @gelu_results(%x: tensor<4x16xf32>, %w: tensor<32x16xf32>) {
  // expected-error @+1 {{pre_activation type: expected 'tensor<4x32xf32>', got 'tensor<4x32xbf16>'}}
  %y, %pre = bonsai.linear_gelu %x, %w : (tensor<4x16xf32>, tensor<32x16xf32>) -> (tensor<4x32xf32>, tensor<4x32xbf16>)
  return
}

// -----

func.func @gelu_bias(%x: tensor<4x16xf32>, %w: tensor<32x16xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{bias shape: expected [32], got [16]}}
  %y, %pre = bonsai.linear_gelu %x, %w, %b : (tensor<4x16xf32>, tensor<32x16xf32>, tensor<16xf32>) -> (tensor<4x32xf32>, tensor<4x32xf32>)
  return
}

// -----

func.func @add_weight(%x: tensor<4x16xf32>, %w: tensor<32x8xf32>, %r: tensor<4x32xf32>) {
  // expected-error @+1 {{weight shape: expected [out, 16] (Hugging Face [out, in] layout for input features 16), got [32, 8]}}
  %y = bonsai.linear_add %x, %w, %r : (tensor<4x16xf32>, tensor<32x8xf32>, tensor<4x32xf32>) -> tensor<4x32xf32>
  return
}

// -----

func.func @add_addend(%x: tensor<4x16xf32>, %w: tensor<32x16xf32>, %r: tensor<32xf32>) {
  // expected-error @+1 {{addend type: expected 'tensor<4x32xf32>', got 'tensor<32xf32>'}}
  %y = bonsai.linear_add %x, %w, %r : (tensor<4x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<4x32xf32>
  return
}

// -----

func.func @add_result(%x: tensor<4x16xbf16>, %w: tensor<32x16xbf16>, %r: tensor<4x32xbf16>) {
  // expected-error @+1 {{result type: expected 'tensor<4x32xbf16>', got 'tensor<4x32xf32>'}}
  %y = bonsai.linear_add %x, %w, %r : (tensor<4x16xbf16>, tensor<32x16xbf16>, tensor<4x32xbf16>) -> tensor<4x32xf32>
  return
}

// -----

func.func @accumulate_shape(%dy: tensor<4x32xf32>, %x: tensor<4x16xf32>, %acc: tensor<16x32xf32>) {
  // expected-error @+1 {{accumulator shape: expected [32, 16], got [16, 32]}}
  bonsai.linear_grad_weight_accumulate %dy, %x, %acc : tensor<4x32xf32>, tensor<4x16xf32>, tensor<16x32xf32>
  return
}

// -----

func.func @accumulate_rows(%dy: tensor<4x32xf32>, %x: tensor<2x16xf32>, %acc: tensor<32x16xf32>) {
  // expected-error @+1 {{result_grad [4, 32] and input [2, 16] differ in their leading dimensions}}
  bonsai.linear_grad_weight_accumulate %dy, %x, %acc : tensor<4x32xf32>, tensor<2x16xf32>, tensor<32x16xf32>
  return
}

// -----

func.func @accumulate_fp8(%dy: tensor<4x32xf8E4M3FN>, %x: tensor<4x16xf32>, %acc: tensor<32x16xf32>) {
  // expected-error @+1 {{result_grad element type must be f32, f16 or bf16, got 'f8E4M3FN'}}
  bonsai.linear_grad_weight_accumulate %dy, %x, %acc : tensor<4x32xf8E4M3FN>, tensor<4x16xf32>, tensor<32x16xf32>
  return
}
