// A recipe without an optimizer has no backward pass, so it keeps no activations for one:
// offloading them is an error, not a silent no-op.
func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm" frozen : tensor<16x8xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-error @+1 {{cannot offload 'activations': 'forward' has no backward pass (the recipe has no bonsai.optimizer), so it keeps no activations for one}}
  bonsai.offload ["activations"]
}
