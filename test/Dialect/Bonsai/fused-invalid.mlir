// RUN: bonsai-opt %s -split-input-file -verify-diagnostics

// Negative tests of the fused ops' verifiers (BonsaiFusedOps.cpp): one case per rule.

func.func @lce_weight_width(%x: tensor<2x8x16xf32>, %w: tensor<32x8xf32>, %l: tensor<2x8xi32>, %s: tensor<f32>) {
  // expected-error @+1 {{weight [32, 8] is not [vocab, 16] for input [2, 8, 16]}}
  %a, %b, %c = bonsai.linear_cross_entropy %x, %w, %l, %s {chunk_rows = 16 : i64, ignore_index = -100 : i64} : (tensor<2x8x16xf32>, tensor<32x8xf32>, tensor<2x8xi32>, tensor<f32>) -> (tensor<f32>, tensor<2x8x16xf32>, tensor<256xf32>)
  return
}

// -----

func.func @lce_weight_dtype(%x: tensor<2x8x16xf32>, %w: tensor<32x16xbf16>, %l: tensor<2x8xi32>, %s: tensor<f32>) {
  // expected-error @+1 {{weight element type}}
  %a, %b, %c = bonsai.linear_cross_entropy %x, %w, %l, %s {chunk_rows = 16 : i64, ignore_index = -100 : i64} : (tensor<2x8x16xf32>, tensor<32x16xbf16>, tensor<2x8xi32>, tensor<f32>) -> (tensor<f32>, tensor<2x8x16xf32>, tensor<256xf32>)
  return
}

// -----

func.func @lce_labels(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %l: tensor<2x4xi32>, %s: tensor<f32>) {
  // expected-error @+1 {{labels}}
  %a, %b, %c = bonsai.linear_cross_entropy %x, %w, %l, %s {chunk_rows = 16 : i64, ignore_index = -100 : i64} : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<2x4xi32>, tensor<f32>) -> (tensor<f32>, tensor<2x8x16xf32>, tensor<256xf32>)
  return
}

// -----

func.func @lce_input_grad(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %l: tensor<2x8xi32>, %s: tensor<f32>) {
  // expected-error @+1 {{input_grad type: expected 'tensor<2x8x16xf32>', got 'tensor<2x8x16xbf16>'}}
  %a, %b, %c = bonsai.linear_cross_entropy %x, %w, %l, %s {chunk_rows = 16 : i64, ignore_index = -100 : i64} : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<2x8xi32>, tensor<f32>) -> (tensor<f32>, tensor<2x8x16xbf16>, tensor<256xf32>)
  return
}

// -----

func.func @lce_weight_grad(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %l: tensor<2x8xi32>, %s: tensor<f32>) {
  // expected-error @+1 {{weight_grad type: expected 'tensor<32x16xf32>', got 'tensor<16x32xf32>'}}
  %a, %b, %c, %d = bonsai.linear_cross_entropy %x, %w, %l, %s {chunk_rows = 16 : i64, ignore_index = -100 : i64} : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<2x8xi32>, tensor<f32>) -> (tensor<f32>, tensor<2x8x16xf32>, tensor<256xf32>, tensor<16x32xf32>)
  return
}

// -----

func.func @lce_chunk(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %l: tensor<2x8xi32>, %s: tensor<f32>) {
  // expected-error @+1 {{chunk_rows must be positive, got 0}}
  %a, %b, %c = bonsai.linear_cross_entropy %x, %w, %l, %s {chunk_rows = 0 : i64, ignore_index = -100 : i64} : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<2x8xi32>, tensor<f32>) -> (tensor<f32>, tensor<2x8x16xf32>, tensor<256xf32>)
  return
}

// -----

func.func @lce_workspace(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %l: tensor<2x8xi32>, %s: tensor<f32>) {
  // expected-error @+1 {{workspace must be tensor<640xf32> for 16 rows of 32 logits in chunks of 16, got 'tensor<256xf32>'}}
  %a, %b, %c = bonsai.linear_cross_entropy %x, %w, %l, %s {chunk_rows = 16 : i64, ignore_index = -100 : i64} : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<2x8xi32>, tensor<f32>) -> (tensor<f32>, tensor<2x8x16xf32>, tensor<256xf32>)
  return
}

// -----

func.func @add_norm_rhs(%a: tensor<2x16xf32>, %b: tensor<2x8xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{rhs type: expected 'tensor<2x16xf32>', got 'tensor<2x8xf32>'}}
  %s, %y = bonsai.add_rms_norm %a, %b, %w {epsilon = 1.0e-05 : f64} : (tensor<2x16xf32>, tensor<2x8xf32>, tensor<16xf32>) -> (tensor<2x16xf32>, tensor<2x16xf32>)
  return
}

// -----

func.func @add_norm_weight(%a: tensor<2x16xf32>, %w: tensor<8xf32>, %bias: tensor<16xf32>) {
  // expected-error @+1 {{weight shape}}
  %s, %y = bonsai.add_layer_norm %a, %a, %w, %bias {epsilon = 1.0e-05 : f64} : (tensor<2x16xf32>, tensor<2x16xf32>, tensor<8xf32>, tensor<16xf32>) -> (tensor<2x16xf32>, tensor<2x16xf32>)
  return
}

// -----

func.func @add_norm_epsilon(%a: tensor<2x16xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{epsilon must be positive, got 0}}
  %s, %y = bonsai.add_rms_norm %a, %a, %w {epsilon = 0.0 : f64} : (tensor<2x16xf32>, tensor<2x16xf32>, tensor<16xf32>) -> (tensor<2x16xf32>, tensor<2x16xf32>)
  return
}

// -----

func.func @grad_add_addend(%dy: tensor<2x16xf32>, %a: tensor<2x8xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{addend type: expected 'tensor<2x16xf32>', got 'tensor<2x8xf32>'}}
  %dx, %dw = bonsai.rms_norm_grad_add %dy, %dy, %w, %a {epsilon = 1.0e-05 : f64} : (tensor<2x16xf32>, tensor<2x16xf32>, tensor<16xf32>, tensor<2x8xf32>) -> (tensor<2x16xf32>, tensor<16xf32>)
  return
}

// -----

func.func @grad_add_bias_grad(%dy: tensor<2x16xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{parameter gradient type: expected 'tensor<16xf32>', got 'tensor<8xf32>'}}
  %dx, %dw, %db = bonsai.layer_norm_grad_add %dy, %dy, %w, %dy {epsilon = 1.0e-05 : f64} : (tensor<2x16xf32>, tensor<2x16xf32>, tensor<16xf32>, tensor<2x16xf32>) -> (tensor<2x16xf32>, tensor<16xf32>, tensor<8xf32>)
  return
}
