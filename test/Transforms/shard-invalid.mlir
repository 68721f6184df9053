// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-shard %s -split-input-file -verify-diagnostics -o /dev/null

// A trainable parameter whose element count the ranks do not divide.
func.func @uneven(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<15x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<15x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  // expected-error @+1 {{bonsai.shard over 3 ranks: parameter 'w' has 8 elements, which do not split evenly over 3 ranks; use a rank count that divides every trainable parameter's element count}}
  %w = bonsai.param "w" trainable : tensor<8xf32>
  %n = bonsai.rms_norm %h, %w : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %logits = bonsai.linear %n, %emb : (tensor<1x4x8xf32>, tensor<15x8xf32>) -> tensor<1x4x15xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x15xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.shard "zero1" ranks 3
  bonsai.optimizer "adamw" lr 1.0e-3 {}
}

// -----

// Updates in the backward pass run before the ranks' gradients are complete.
func.func @in_backward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %w = bonsai.param "w" trainable : tensor<8xf32>
  %n = bonsai.rms_norm %h, %w : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %logits = bonsai.linear %n, %emb : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.shard "zero2" ranks 2
  // expected-error @+1 {{bonsai.shard does not compose with update_in_backward yet: the sharded update runs after every rank's gradients are reduced}}
  bonsai.optimizer "adamw" lr 1.0e-3 {update_in_backward = true}
}
