// RUN: bonsai-opt %s -split-input-file -verify-diagnostics

// The verifiers of bonsai.flash_attention and bonsai.flash_attention_grad: the log-sum-exp
// is f32 [batch, heads, seq] of the query, and the operands follow bonsai.attention's rules.

func.func @lse_shape(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>) -> tensor<2x8x4xf32> {
  // expected-error @below {{lse must be an f32 tensor of shape [2, 4, 8] ([batch, heads, seq] of the query), got 'tensor<2x8x4xf32>'}}
  %o, %lse = bonsai.flash_attention %q, %k, %k {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x8x4xf32>)
  return %lse : tensor<2x8x4xf32>
}

// -----

func.func @lse_dtype(%q: tensor<2x8x4x16xbf16>, %k: tensor<2x8x2x16xbf16>) -> tensor<2x4x8xbf16> {
  // expected-error @below {{'bonsai.flash_attention' op result #1 must be}}
  %o, %lse = bonsai.flash_attention %q, %k, %k {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xbf16>, tensor<2x8x2x16xbf16>, tensor<2x8x2x16xbf16>) -> (tensor<2x8x4x16xbf16>, tensor<2x4x8xbf16>)
  return %lse : tensor<2x4x8xbf16>
}

// -----

func.func @gqa(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x3x16xf32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{query heads (4) must be a multiple of key/value heads (3) for grouped-query attention}}
  %o, %lse = bonsai.flash_attention %q, %k, %k {scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x3x16xf32>, tensor<2x8x3x16xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @output_type(%q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>) -> tensor<2x8x4x16xbf16> {
  // expected-error @below {{output type: expected 'tensor<2x8x4x16xf32>', got 'tensor<2x8x4x16xbf16>'}}
  %o, %lse = bonsai.flash_attention %q, %k, %k {scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>) -> (tensor<2x8x4x16xbf16>, tensor<2x4x8xf32>)
  return %o : tensor<2x8x4x16xbf16>
}

// -----

func.func @scale(%q: tensor<2x8x4x16xf32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{scale must be positive, got 0}}
  %o, %lse = bonsai.flash_attention %q, %q, %q {scale = 0.000000e+00 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @grad_lse(%do: tensor<2x8x4x16xf32>, %q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %lse: tensor<2x8x4xf32>) -> tensor<2x8x4x16xf32> {
  // expected-error @below {{lse must be an f32 tensor of shape [2, 4, 8] ([batch, heads, seq] of the query), got 'tensor<2x8x4xf32>'}}
  %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q, %k, %k, %q, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>)
  return %dq : tensor<2x8x4x16xf32>
}

// -----

func.func @grad_key_grad(%do: tensor<2x8x4x16xf32>, %q: tensor<2x8x4x16xf32>, %k: tensor<2x8x2x16xf32>, %lse: tensor<2x4x8xf32>) -> tensor<2x8x4x16xf32> {
  // expected-error @below {{key_grad type: expected 'tensor<2x8x2x16xf32>', got 'tensor<2x8x4x16xf32>'}}
  %dq, %dk, %dv = bonsai.flash_attention_grad %do, %q, %k, %k, %q, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x2x16xf32>, tensor<2x8x4x16xf32>, tensor<2x4x8xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x2x16xf32>)
  return %dq : tensor<2x8x4x16xf32>
}
