func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<16x64xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x64xf32>, tensor<1x4xi32>) -> tensor<1x4x64xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<16x64xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x64xf32>, tensor<16x64xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.galore rank 32 update_proj_gap 200 scale 0.25 projector "svd" targets ["lm_head"]
}
