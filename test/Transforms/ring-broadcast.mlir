// RUN: bonsai-opt --bonsai-ring %s 2>&1 | FileCheck %s

// A per-head scale [1, 16] broadcast over [batch, seq, heads, head_dim] = [1, 16, 1, 16]: its 16
// lies on the head dim, not on the sequence axis, even though the sequence is 16 tokens long, so
// the multiply is split with the tokens (the check follows the broadcast, not the sizes).
// CHECK: remark: ring: the sequence of 16 tokens split over 2 ranks
// CHECK: bonsai.mul {{.*}} -> tensor<1x8x1x16xf32>

bonsai.recipe @ring {
  bonsai.ring ranks 2
  bonsai.optimizer "sgd" lr 1.000000e-01
}

func.func @forward(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x16xf32>, tensor<1x16xi32>) -> tensor<1x16x16xf32>
  %h4 = bonsai.reshape %h : (tensor<1x16x16xf32>) -> tensor<1x16x1x16xf32>
  %scale = bonsai.param "scale" trainable : tensor<1x16xf32>
  %q = bonsai.mul %h4, %scale : (tensor<1x16x1x16xf32>, tensor<1x16xf32>) -> tensor<1x16x1x16xf32>
  %a = bonsai.attention %q, %q, %h4 {causal, scale = 2.500000e-01 : f64} : (tensor<1x16x1x16xf32>, tensor<1x16x1x16xf32>, tensor<1x16x1x16xf32>) -> tensor<1x16x1x16xf32>
  %a2 = bonsai.reshape %a : (tensor<1x16x1x16xf32>) -> tensor<1x16x16xf32>
  %head = bonsai.param "head" trainable : tensor<32x16xf32>
  %logits = bonsai.linear %a2, %head : (tensor<1x16x16xf32>, tensor<32x16xf32>) -> tensor<1x16x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x16x32xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
