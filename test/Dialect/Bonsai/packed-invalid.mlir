// RUN: bonsai-opt %s -split-input-file -verify-diagnostics

// Negative tests of the packed-row operands (positions, segment_ids) and of rope's llama3
// scaling attributes: one case per verifier rule.

// rope: positions are [batch, seq] of the input.
func.func @rope_positions_shape(%x: tensor<2x8x4x16xf32>, %pos: tensor<2x7xi32>) {
  // expected-error @+1 {{positions shape: expected [2, 8] ([batch, seq] of the input), got [2, 7]}}
  %y = bonsai.rope %x, %pos : (tensor<2x8x4x16xf32>, tensor<2x7xi32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

// rope: positions are integers (the ODS constraint).
func.func @rope_positions_float(%x: tensor<2x8x4x16xf32>, %pos: tensor<2x8xf32>) {
  // expected-error @+1 {{operand #1 must be}}
  %y = bonsai.rope %x, %pos : (tensor<2x8x4x16xf32>, tensor<2x8xf32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

// rope: llama3 scaling takes all four attributes; the verifier names the missing one.
func.func @rope_scaling_incomplete(%x: tensor<2x8x4x16xf32>) {
  // expected-error @+1 {{llama3 rope scaling needs all of scaling_factor, low_freq_factor, high_freq_factor and original_max_positions: original_max_positions is missing}}
  %y = bonsai.rope %x {scaling_factor = 8.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64} : (tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @rope_scaling_only_factor(%x: tensor<2x8x4x16xf32>) {
  // expected-error @+1 {{low_freq_factor is missing}}
  %y = bonsai.rope %x {scaling_factor = 8.0 : f64} : (tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

// rope: high_freq_factor above low_freq_factor (transformers divides by their difference).
func.func @rope_scaling_band(%x: tensor<2x8x4x16xf32>) {
  // expected-error @+1 {{high_freq_factor (1.000000e+00) must be greater than low_freq_factor (1.000000e+00)}}
  %y = bonsai.rope %x {scaling_factor = 8.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 1.0 : f64, original_max_positions = 8192 : i64} : (tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @rope_scaling_factor(%x: tensor<2x8x4x16xf32>) {
  // expected-error @+1 {{scaling_factor and low_freq_factor must be positive, got 0.000000e+00 and 1.000000e+00}}
  %y = bonsai.rope %x {scaling_factor = 0.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_positions = 8192 : i64} : (tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @rope_scaling_context(%x: tensor<2x8x4x16xf32>) {
  // expected-error @+1 {{original_max_positions must be positive, got 0}}
  %y = bonsai.rope %x {scaling_factor = 8.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_positions = 0 : i64} : (tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

// rope_grad: the same rules as rope.
func.func @rope_grad_positions_shape(%dy: tensor<2x8x4x16xf32>, %pos: tensor<1x8xi32>) {
  // expected-error @+1 {{positions shape: expected [2, 8] ([batch, seq] of the input), got [1, 8]}}
  %dx = bonsai.rope_grad %dy, %pos : (tensor<2x8x4x16xf32>, tensor<1x8xi32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @rope_grad_scaling_incomplete(%dy: tensor<2x8x4x16xf32>) {
  // expected-error @+1 {{high_freq_factor is missing}}
  %dx = bonsai.rope_grad %dy {scaling_factor = 8.0 : f64, low_freq_factor = 1.0 : f64, original_max_positions = 8192 : i64} : (tensor<2x8x4x16xf32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

// attention: segment_ids are [batch, seq] of the query.
func.func @attention_segments_shape(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %seg: tensor<2x8x1xi32>) {
  // expected-error @+1 {{segment_ids shape: expected [2, 8] ([batch, seq] of the input), got [2, 8, 1]}}
  %o = bonsai.attention %q, %k, %k, %seg {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x1xi32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @attention_segments_float(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %seg: tensor<2x8xf32>) {
  // expected-error @+1 {{operand #3 must be}}
  %o = bonsai.attention %q, %k, %k, %seg {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8xf32>) -> tensor<2x8x4x16xf32>
  return
}

// -----

func.func @attention_grad_segments_shape(%do: tensor<2x8x4x16xf32>, %q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %seg: tensor<2x4xi32>) {
  // expected-error @+1 {{segment_ids shape: expected [2, 8] ([batch, seq] of the input), got [2, 4]}}
  %dq, %dk, %dv = bonsai.attention_grad %do, %q, %k, %k, %q, %seg {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32>, tensor<2x4xi32>) -> (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>)
  return
}

// -----

func.func @flash_attention_segments_shape(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %seg: tensor<8x2xi32>) {
  // expected-error @+1 {{segment_ids shape: expected [2, 8] ([batch, seq] of the input), got [8, 2]}}
  %o, %lse = bonsai.flash_attention %q, %k, %k, %seg {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<8x2xi32>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8xf32>)
  return
}

// -----

func.func @flash_attention_grad_segments_shape(%do: tensor<2x8x4x16xf32>, %q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %lse: tensor<2x4x8xf32>, %seg: tensor<2x9xi32>) {
  // expected-error @+1 {{segment_ids shape: expected [2, 8] ([batch, seq] of the input), got [2, 9]}}
  %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q, %k, %k, %q, %lse, %seg {causal, scale = 2.5e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32>, tensor<2x4x8xf32>, tensor<2x9xi32>) -> (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>)
  return
}
