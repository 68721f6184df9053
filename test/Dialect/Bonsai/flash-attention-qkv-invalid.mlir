// RUN: bonsai-opt %s -split-input-file -verify-diagnostics

// The verifiers of bonsai.flash_attention_qkv and bonsai.flash_attention_qkv_grad: qkv is
// [batch, seq, heads + 2·kv_heads, head_dim] with kv_heads dividing heads (the output's), the
// output [batch, seq, heads, head_dim] in qkv's element type, lse f32 [batch, heads, seq], the
// scale positive, segment ids [batch, seq]; the gradient has qkv's type. One rule per case.

func.func @qkv_rank(%qkv: tensor<2x8x128xf32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{qkv rank: expected 4, got 3 ('tensor<2x8x128xf32>')}}
  %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x128xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @output_rank(%qkv: tensor<2x8x8x16xf32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{output rank: expected 4, got 3 ('tensor<2x8x64xf32>')}}
  %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x8x16xf32>) -> (tensor<2x8x64xf32>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @output_shape(%qkv: tensor<2x8x8x16xf32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{output shape [2, 8, 4, 8] does not match qkv shape [2, 8, 8, 16] in batch, sequence or head_dim}}
  %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x8x16xf32>) -> (tensor<2x8x4x8xf32>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @odd_heads(%qkv: tensor<2x8x7x16xf32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{qkv has 7 heads for 4 query heads (the output's): the other 3 must be key and value heads, as many of each (a positive even count)}}
  %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x7x16xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @no_kv_heads(%qkv: tensor<2x8x4x16xf32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{qkv has 4 heads for 4 query heads (the output's): the other 0 must be key and value heads, as many of each (a positive even count)}}
  %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @gqa(%qkv: tensor<2x8x10x16xf32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{query heads (4) must be a multiple of key/value heads (3) for grouped-query attention}}
  %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x10x16xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @output_dtype(%qkv: tensor<2x8x8x16xf32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{output element type: expected 'f32', got 'bf16'}}
  %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x8x16xf32>) -> (tensor<2x8x4x16xbf16>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @scale(%qkv: tensor<2x8x8x16xf32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{scale must be positive, got 0}}
  %o, %lse = bonsai.flash_attention_qkv %qkv {scale = 0.000000e+00 : f64} : (tensor<2x8x8x16xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @segment_ids(%qkv: tensor<2x8x8x16xf32>, %seg: tensor<2x7xi32>) -> tensor<2x4x8xf32> {
  // expected-error @below {{segment_ids shape: expected [2, 8] ([batch, seq] of the input), got [2, 7]}}
  %o, %lse = bonsai.flash_attention_qkv %qkv, %seg {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x8x16xf32>, tensor<2x7xi32>) -> (tensor<2x8x4x16xf32>, tensor<2x4x8xf32>)
  return %lse : tensor<2x4x8xf32>
}

// -----

func.func @lse_shape(%qkv: tensor<2x8x8x16xf32>) -> tensor<2x8x4xf32> {
  // expected-error @below {{lse must be an f32 tensor of shape [2, 4, 8] ([batch, heads, seq] of the query), got 'tensor<2x8x4xf32>'}}
  %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x8x16xf32>) -> (tensor<2x8x4x16xf32>, tensor<2x8x4xf32>)
  return %lse : tensor<2x8x4xf32>
}

// -----

func.func @lse_dtype(%qkv: tensor<2x8x8x16xbf16>) -> tensor<2x4x8xbf16> {
  // expected-error @below {{'bonsai.flash_attention_qkv' op result #1 must be}}
  %o, %lse = bonsai.flash_attention_qkv %qkv {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x8x16xbf16>) -> (tensor<2x8x4x16xbf16>, tensor<2x4x8xbf16>)
  return %lse : tensor<2x4x8xbf16>
}

// -----

func.func @grad_heads(%do: tensor<2x8x4x16xf32>, %qkv: tensor<2x8x9x16xf32>, %o: tensor<2x8x4x16xf32>, %lse: tensor<2x4x8xf32>) -> tensor<2x8x9x16xf32> {
  // expected-error @below {{qkv has 9 heads for 4 query heads (the output's): the other 5 must be key and value heads, as many of each (a positive even count)}}
  %g = bonsai.flash_attention_qkv_grad %do, %qkv, %o, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x9x16xf32>, tensor<2x8x4x16xf32>, tensor<2x4x8xf32>) -> tensor<2x8x9x16xf32>
  return %g : tensor<2x8x9x16xf32>
}

// -----

func.func @grad_result_grad(%do: tensor<2x8x4x16xbf16>, %qkv: tensor<2x8x8x16xf32>, %o: tensor<2x8x4x16xf32>, %lse: tensor<2x4x8xf32>) -> tensor<2x8x8x16xf32> {
  // expected-error @below {{result_grad type: expected 'tensor<2x8x4x16xf32>', got 'tensor<2x8x4x16xbf16>'}}
  %g = bonsai.flash_attention_qkv_grad %do, %qkv, %o, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xbf16>, tensor<2x8x8x16xf32>, tensor<2x8x4x16xf32>, tensor<2x4x8xf32>) -> tensor<2x8x8x16xf32>
  return %g : tensor<2x8x8x16xf32>
}

// -----

func.func @grad_type(%do: tensor<2x8x4x16xf32>, %qkv: tensor<2x8x8x16xf32>, %o: tensor<2x8x4x16xf32>, %lse: tensor<2x4x8xf32>) -> tensor<2x8x4x16xf32> {
  // expected-error @below {{qkv_grad type: expected 'tensor<2x8x8x16xf32>', got 'tensor<2x8x4x16xf32>'}}
  %g = bonsai.flash_attention_qkv_grad %do, %qkv, %o, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x8x16xf32>, tensor<2x8x4x16xf32>, tensor<2x4x8xf32>) -> tensor<2x8x4x16xf32>
  return %g : tensor<2x8x4x16xf32>
}

// -----

func.func @grad_lse(%do: tensor<2x8x4x16xf32>, %qkv: tensor<2x8x8x16xf32>, %o: tensor<2x8x4x16xf32>, %lse: tensor<2x8x4xf32>) -> tensor<2x8x8x16xf32> {
  // expected-error @below {{lse must be an f32 tensor of shape [2, 4, 8] ([batch, heads, seq] of the query), got 'tensor<2x8x4xf32>'}}
  %g = bonsai.flash_attention_qkv_grad %do, %qkv, %o, %lse {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x8x16xf32>, tensor<2x8x4x16xf32>, tensor<2x8x4xf32>) -> tensor<2x8x8x16xf32>
  return %g : tensor<2x8x8x16xf32>
}

// -----

func.func @grad_segment_ids(%do: tensor<2x8x4x16xf32>, %qkv: tensor<2x8x8x16xf32>, %o: tensor<2x8x4x16xf32>, %lse: tensor<2x4x8xf32>, %seg: tensor<1x8xi32>) -> tensor<2x8x8x16xf32> {
  // expected-error @below {{segment_ids shape: expected [2, 8] ([batch, seq] of the input), got [1, 8]}}
  %g = bonsai.flash_attention_qkv_grad %do, %qkv, %o, %lse, %seg {causal, scale = 2.500000e-01 : f64} : (tensor<2x8x4x16xf32>, tensor<2x8x8x16xf32>, tensor<2x8x4x16xf32>, tensor<2x4x8xf32>, tensor<1x8xi32>) -> tensor<2x8x8x16xf32>
  return %g : tensor<2x8x8x16xf32>
}
