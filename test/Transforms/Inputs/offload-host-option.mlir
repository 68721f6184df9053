// The input of offload-host.mlir's pass-option runs: an f32 model trained by SGD with momentum.
func.func @f(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "sgd" lr 1.0e-2 {momentum = 9.0e-01 : f64}
}
