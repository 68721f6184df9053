// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-galore=target=sm_90' %s -split-input-file -verify-diagnostics

// The exact projector has no CUDA kernel: a plan for a GPU target must not ask for it.
func.func @svd_on_gpu(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %w = bonsai.param "blk.q_proj.weight" trainable : tensor<8x8xf32>
  %q = bonsai.linear %h, %w : (tensor<1x4x8xf32>, tensor<8x8xf32>) -> tensor<1x4x8xf32>
  %logits = bonsai.linear %q, %emb : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-error @+1 {{the exact ("svd") GaLore projector is not available on the CUDA backend (target sm_90); use projector "randomized"}}
  bonsai.galore rank 2 update_proj_gap 6 scale 0.25 projector "svd" targets ["q_proj"]
}

// -----

// A rank that is not below min(m, n) is a recipe error (the recipe verifier's, before any
// pass runs).
func.func @rank(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %w = bonsai.param "blk.q_proj.weight" trainable : tensor<8x8xf32>
  %q = bonsai.linear %h, %w : (tensor<1x4x8xf32>, tensor<8x8xf32>) -> tensor<1x4x8xf32>
  %logits = bonsai.linear %q, %emb : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-error @+1 {{rank 8 is not smaller than min(m, n) = 8 of weight 'blk.q_proj.weight'; a projection would save nothing}}
  bonsai.galore rank 8 update_proj_gap 6 scale 0.25 projector "randomized" targets ["q_proj"]
}
