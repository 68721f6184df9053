// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-shard --bonsai-remat %s -split-input-file 2>/dev/null | FileCheck %s
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-shard --bonsai-remat %s -split-input-file 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// bonsai-remat on a ZeRO-3 step (policy full). A gather of a parameter's share is always
// recomputed (all_gather's RecomputeOpInterface): the backward pass gathers the NF4 weight
// 'q' again for the dequantize it repeats, rather than keeping the forward pass's gathered
// bytes from one pass to the other. The recomputed gather of 'w' stands in for the one
// bonsai-shard placed before w's backward reader: the recomputed linear and linear_grad_input
// read the same gather, and w is gathered twice per micro-batch, not three times.

// REMARK: remark: bonsai-remat (policy 'full'): recomputes 7 tensors (3 all_gather, 1 embedding, 1 dequantize, 2 linear) {{.*}}; 1 recomputed gather replaces the backward pass's own (each parameter is still gathered once per pass)

// CHECK-LABEL: func.func @regather
// CHECK: %[[E:.*]] = bonsai.param "e"
// CHECK: %[[Q:.*]] = bonsai.param "q" frozen sharding
// CHECK-NEXT: %[[QF:.*]] = bonsai.all_gather %[[Q]] {ranks = 2 : i64}
// CHECK-NEXT: bonsai.dequantize %[[QF]] :
// CHECK: %[[W:.*]] = bonsai.param "w"
// CHECK-NEXT: bonsai.all_gather %[[W]] {ranks = 2 : i64}
// CHECK: bonsai.loss_scale
// CHECK: %[[QB:.*]] = bonsai.all_gather %[[Q]] {bonsai.phase = "backward", bonsai.recomputed, ranks = 2 : i64}
// CHECK-NEXT: %[[QD:.*]] = bonsai.dequantize %[[QB]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[A:.*]] = bonsai.linear %{{.*}}, %[[QD]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[WB:.*]] = bonsai.all_gather %[[W]] {bonsai.phase = "backward", bonsai.recomputed, ranks = 2 : i64}
// CHECK-NEXT: bonsai.linear %[[A]], %[[WB]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NOT: bonsai.all_gather %[[W]]
// CHECK: bonsai.linear_grad_input %{{.*}}, %[[WB]] {bonsai.phase = "backward"}
// CHECK-NOT: bonsai.all_gather %[[W]]
// CHECK: bonsai.linear_grad_input %{{.*}}, %[[QD]] {bonsai.phase = "backward"}
// CHECK: return
func.func @regather(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<16x64xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x64xf32>, tensor<1x4xi32>) -> tensor<1x4x64xf32>
  %q = bonsai.param "q" frozen : tensor<64x64x!bonsai.nf4<64, 256>>
  %qd = bonsai.dequantize %q : (tensor<64x64x!bonsai.nf4<64, 256>>) -> tensor<64x64xf32>
  %a = bonsai.linear %h, %qd : (tensor<1x4x64xf32>, tensor<64x64xf32>) -> tensor<1x4x64xf32>
  %w = bonsai.param "w" trainable : tensor<16x64xf32>
  %logits = bonsai.linear %a, %w : (tensor<1x4x64xf32>, tensor<16x64xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.shard "zero3" ranks 2
  bonsai.optimizer "adamw" lr 1.0e-3
  bonsai.remat "full"
}

// -----

// With reshard_after_forward false the recipe keeps each gathered parameter from the forward
// pass to the backward pass (`kept`): nothing is gathered in the backward pass, and the
// recomputed dequantize reads the forward pass's gathered NF4 bytes.

// No gather is recomputed, so none replaces one: the remark ends with the planned peak.
// REMARK: remark: bonsai-remat (policy 'full'): recomputes 4 tensors (1 embedding, 1 dequantize, 2 linear)
// REMARK-SAME: KiB{{$}}

// CHECK-LABEL: func.func @kept
// CHECK: %[[Q:.*]] = bonsai.param "q" frozen sharding
// CHECK-NEXT: %[[QF:.*]] = bonsai.all_gather %[[Q]] {kept, ranks = 2 : i64}
// CHECK: bonsai.loss_scale
// CHECK-NOT: bonsai.all_gather
// CHECK: bonsai.dequantize %[[QF]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NOT: bonsai.all_gather
// CHECK: return
func.func @kept(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<16x64xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x64xf32>, tensor<1x4xi32>) -> tensor<1x4x64xf32>
  %q = bonsai.param "q" frozen : tensor<64x64x!bonsai.nf4<64, 256>>
  %qd = bonsai.dequantize %q : (tensor<64x64x!bonsai.nf4<64, 256>>) -> tensor<64x64xf32>
  %a = bonsai.linear %h, %qd : (tensor<1x4x64xf32>, tensor<64x64xf32>) -> tensor<1x4x64xf32>
  %w = bonsai.param "w" trainable : tensor<16x64xf32>
  %logits = bonsai.linear %a, %w : (tensor<1x4x64xf32>, tensor<16x64xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.shard "zero3" ranks 2 reshard_after_forward false
  bonsai.optimizer "adamw" lr 1.0e-3
  bonsai.remat "full"
}
