// RUN: bonsai-opt --bonsai-ring %s 2>&1 | FileCheck %s
// RUN: bonsai-opt --bonsai-ring --bonsai-autodiff --bonsai-optimizer --bonsai-ring-gradients %s 2>&1 | FileCheck %s --check-prefix=GRADS

// The share of 2 ranks: [1, 8] tokens of the [1, 16] rows, a positions input for RoPE, and the
// attention reading every rank's keys.
// CHECK: remark: ring: the sequence of 16 tokens split over 2 ranks (8 each, zigzag chunks of 4); 1 attention passes key/value blocks around the ring; RoPE reads each token's position from the 'positions' input
// CHECK: func.func @forward(%{{.*}}: tensor<1x8xi32>, %{{.*}}: tensor<1x8xi32>, %[[POS:arg[0-9]+]]: tensor<1x8xi32>) -> tensor<f32> attributes {bonsai.ranks = 2 : i64, bonsai.ring_ranks = 2 : i64}
// CHECK: bonsai.embedding {{.*}} -> tensor<1x8x8xf32>
// CHECK: bonsai.rope %{{.*}}, %[[POS]] : {{.*}} -> tensor<1x8x2x4xf32>
// CHECK: bonsai.attention {{.*}} {causal, ring_ranks = 2 : i64, scale = 5.000000e-01 : f64} {{.*}} -> tensor<1x8x2x4xf32>
// CHECK: bonsai.cross_entropy {{.*}} -> tensor<f32>

// The gradients summed over the ring before the norm reads them.
// GRADS: remark: ring: 4 gradient accumulators ({{.*}}) summed over the 2 ranks of the ring once per step
// GRADS: bonsai.attention_grad {{.*}}ring_ranks = 2 : i64
// GRADS: %[[SUM:[0-9]+]] = bonsai.all_reduce %{{.*}} {bonsai.phase = "update", ranks = 2 : i64}
// GRADS: bonsai.grad_norm {{.*}}%[[SUM]]

bonsai.recipe @ring {
  bonsai.ring ranks 2
  bonsai.optimizer "sgd" lr 1.000000e-01
}

func.func @forward(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<32x8xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x8xf32>, tensor<1x16xi32>) -> tensor<1x16x8xf32>
  %wq = bonsai.param "wq" trainable : tensor<8x8xf32>
  %q = bonsai.linear %h, %wq : (tensor<1x16x8xf32>, tensor<8x8xf32>) -> tensor<1x16x8xf32>
  %q4 = bonsai.reshape %q : (tensor<1x16x8xf32>) -> tensor<1x16x2x4xf32>
  %qr = bonsai.rope %q4 {theta = 1.000000e+04 : f64} : (tensor<1x16x2x4xf32>) -> tensor<1x16x2x4xf32>
  %wv = bonsai.param "wv" trainable : tensor<8x8xf32>
  %v = bonsai.linear %h, %wv : (tensor<1x16x8xf32>, tensor<8x8xf32>) -> tensor<1x16x8xf32>
  %v4 = bonsai.reshape %v : (tensor<1x16x8xf32>) -> tensor<1x16x2x4xf32>
  %a = bonsai.attention %qr, %qr, %v4 {causal, scale = 5.000000e-01 : f64} : (tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>, tensor<1x16x2x4xf32>) -> tensor<1x16x2x4xf32>
  %a2 = bonsai.reshape %a : (tensor<1x16x2x4xf32>) -> tensor<1x16x8xf32>
  %head = bonsai.param "head" trainable : tensor<32x8xf32>
  %logits = bonsai.linear %a2, %head : (tensor<1x16x8xf32>, tensor<32x8xf32>) -> tensor<1x16x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x16x32xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
