// Input of fp8-invalid.mlir: a forward pass alone (no bonsai-optimizer), so no update phase.
func.func @forward_only(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<1x16xi32>) -> tensor<1x16x16xf32>
  %w = bonsai.param "blk.up_proj.weight" trainable : tensor<32x16xf32>
  %u = bonsai.linear %h, %w : (tensor<1x16x16xf32>, tensor<32x16xf32>) -> tensor<1x16x32xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<64x32xf32>
  %logits = bonsai.linear %u, %lm : (tensor<1x16x32xf32>, tensor<64x32xf32>) -> tensor<1x16x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x16x64xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-error @+1 {{bonsai-fp8 updates its scales once per step, in the update phase, but 'forward_only' has no step counter: run bonsai-autodiff and bonsai-optimizer first (a training step; the recipe needs a bonsai.optimizer)}}
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["up_proj"]
}
