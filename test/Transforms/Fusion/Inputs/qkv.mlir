// One GPT-2 style attention block whose q, k and v are slices of one projection (c_attn), and
// a head: the input of test/Transforms/Fusion/slice-gradients.mlir.
func.func @qkv(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %qkv_w = bonsai.param "c_attn" trainable : tensor<48x16xf32>
  %qkv = bonsai.linear %h, %qkv_w : (tensor<2x8x16xf32>, tensor<48x16xf32>) -> tensor<2x8x48xf32>
  %q = bonsai.slice %qkv {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %k = bonsai.slice %qkv {axis = 2 : i64, start = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %k4 = bonsai.reshape %k : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %v = bonsai.slice %qkv {axis = 2 : i64, start = 32 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  %v4 = bonsai.reshape %v : (tensor<2x8x16xf32>) -> tensor<2x8x2x8xf32>
  %attn = bonsai.attention %q4, %k4, %v4 {causal, scale = 3.535534e-01 : f64} : (tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x2x8xf32>
  %attn2 = bonsai.reshape %attn : (tensor<2x8x2x8xf32>) -> tensor<2x8x16xf32>
  %res = bonsai.add %h, %attn2 : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %head_w = bonsai.param "lm_head" trainable : tensor<32x16xf32>
  %logits = bonsai.linear %res, %head_w : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x32xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
