// Only caught by the whole-function check of --bonsai-verify-model.
func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "w" trainable : tensor<16x64xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x64xf32>, tensor<1x4xi32>) -> tensor<1x4x64xf32>
  %lm = bonsai.param "w" trainable : tensor<16x64xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x64xf32>, tensor<16x64xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
