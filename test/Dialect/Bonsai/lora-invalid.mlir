// RUN: bonsai-opt %s -split-input-file -verify-diagnostics

// Negative tests of bonsai.dora_scale's verifier (docs/lora.md): one case per rule.

func.func @weight_rank(%m: tensor<64xf32>, %w: tensor<64xf32>, %a: tensor<8x32xf32>, %b: tensor<64x8xf32>) {
  // expected-error @+1 {{weight rank: expected 2, got 1}}
  %s = bonsai.dora_scale %m, %w, %a, %b {scale = 2.0 : f64} : (tensor<64xf32>, tensor<64xf32>, tensor<8x32xf32>, tensor<64x8xf32>) -> tensor<64xf32>
  return
}

// -----

func.func @a_columns(%m: tensor<64xf32>, %w: tensor<64x32xf32>, %a: tensor<8x16xf32>, %b: tensor<64x8xf32>) {
  // expected-error @+1 {{lora_a shape: expected [8, 32], got [8, 16]}}
  %s = bonsai.dora_scale %m, %w, %a, %b {scale = 2.0 : f64} : (tensor<64xf32>, tensor<64x32xf32>, tensor<8x16xf32>, tensor<64x8xf32>) -> tensor<64xf32>
  return
}

// -----

func.func @b_shape(%m: tensor<64xf32>, %w: tensor<64x32xf32>, %a: tensor<8x32xf32>, %b: tensor<64x4xf32>) {
  // expected-error @+1 {{lora_b shape: expected [64, 8], got [64, 4]}}
  %s = bonsai.dora_scale %m, %w, %a, %b {scale = 2.0 : f64} : (tensor<64xf32>, tensor<64x32xf32>, tensor<8x32xf32>, tensor<64x4xf32>) -> tensor<64xf32>
  return
}

// -----

func.func @magnitude_shape(%m: tensor<32xf32>, %w: tensor<64x32xf32>, %a: tensor<8x32xf32>, %b: tensor<64x8xf32>) {
  // expected-error @+1 {{magnitude shape: expected [64], got [32]}}
  %s = bonsai.dora_scale %m, %w, %a, %b {scale = 2.0 : f64} : (tensor<32xf32>, tensor<64x32xf32>, tensor<8x32xf32>, tensor<64x8xf32>) -> tensor<32xf32>
  return
}

// -----

func.func @element_type(%m: tensor<64xf32>, %w: tensor<64x32xf32>, %a: tensor<8x32xbf16>, %b: tensor<64x8xf32>) {
  // expected-error @+1 {{lora_a element type: expected 'f32', got 'bf16'}}
  %s = bonsai.dora_scale %m, %w, %a, %b {scale = 2.0 : f64} : (tensor<64xf32>, tensor<64x32xf32>, tensor<8x32xbf16>, tensor<64x8xf32>) -> tensor<64xf32>
  return
}

// -----

func.func @result_type(%m: tensor<64xf32>, %w: tensor<64x32xf32>, %a: tensor<8x32xf32>, %b: tensor<64x8xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<64xf32>' (the type of magnitude), got 'tensor<64xbf16>'}}
  %s = bonsai.dora_scale %m, %w, %a, %b {scale = 2.0 : f64} : (tensor<64xf32>, tensor<64x32xf32>, tensor<8x32xf32>, tensor<64x8xf32>) -> tensor<64xbf16>
  return
}

// -----

func.func @scale(%m: tensor<64xf32>, %w: tensor<64x32xf32>, %a: tensor<8x32xf32>, %b: tensor<64x8xf32>) {
  // expected-error @+1 {{scale must be finite, got}}
  %s = bonsai.dora_scale %m, %w, %a, %b {scale = 0x7FF0000000000000 : f64} : (tensor<64xf32>, tensor<64x32xf32>, tensor<8x32xf32>, tensor<64x8xf32>) -> tensor<64xf32>
  return
}

// -----

func.func @dora_grad_output(%dy: tensor<2x8x64xf32>, %y: tensor<2x8x32xf32>, %s: tensor<64xf32>, %m: tensor<64xf32>) {
  // expected-error @+1 {{output type: expected 'tensor<2x8x64xf32>', got 'tensor<2x8x32xf32>'}}
  %dx, %dm = bonsai.dora_grad %dy, %y, %s, %m : (tensor<2x8x64xf32>, tensor<2x8x32xf32>, tensor<64xf32>, tensor<64xf32>) -> (tensor<2x8x64xf32>, tensor<64xf32>)
  return
}

// -----

func.func @dora_grad_magnitude(%dy: tensor<2x8x64xf32>, %y: tensor<2x8x64xf32>, %s: tensor<64xf32>, %m: tensor<64xbf16>) {
  // expected-error @+1 {{magnitude type: expected 'tensor<64xf32>', got 'tensor<64xbf16>'}}
  %dx, %dm = bonsai.dora_grad %dy, %y, %s, %m : (tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<64xf32>, tensor<64xbf16>) -> (tensor<2x8x64xf32>, tensor<64xbf16>)
  return
}

// -----

func.func @dora_grad_scalar(%dy: tensor<f32>, %y: tensor<f32>, %s: tensor<1xf32>, %m: tensor<1xf32>) {
  // expected-error @+1 {{result_grad must have rank at least 1}}
  %dx, %dm = bonsai.dora_grad %dy, %y, %s, %m : (tensor<f32>, tensor<f32>, tensor<1xf32>, tensor<1xf32>) -> (tensor<f32>, tensor<1xf32>)
  return
}
