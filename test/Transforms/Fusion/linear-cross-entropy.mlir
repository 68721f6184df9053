// RUN: bonsai-opt --bonsai-quantize --bonsai-autodiff --bonsai-optimizer --bonsai-remat \
// RUN:   --bonsai-fuse="only=linear-cross-entropy" -split-input-file %s 2> %t.remarks | FileCheck %s
// RUN: FileCheck %s --check-prefix=REMARK < %t.remarks

// The linear-cross-entropy family (lib/Transforms/Fusion/LinearCrossEntropy.cpp): the LM head,
// its loss and their gradients become one bonsai.linear_cross_entropy in the forward phase (no
// bonsai.phase in its attributes), reading the loss scale (moved above it); nothing of the
// unfused chain is left.

// REMARK: remark: fused linear + cross-entropy + gradients
// CHECK-LABEL: func.func @head
// CHECK: %[[EMBED:.*]] = bonsai.param "embed"
// CHECK: %[[H:.*]] = bonsai.embedding %[[EMBED]], %arg0
// CHECK: %[[W:.*]] = bonsai.param "lm_head"
// CHECK-NEXT: %[[SEED:.*]] = bonsai.loss_scale
// CHECK-NEXT: %[[LOSS:.*]], %[[DX:.*]], %{{.*}}, %[[DW:.*]] = bonsai.linear_cross_entropy %[[H]], %[[W]], %arg1, %[[SEED]] {chunk_rows = 16 : i64, ignore_index = -100 : i64} : (tensor<2x8x16xf32>, tensor<64x16xf32>, tensor<2x8xi32>, tensor<f32>) -> (tensor<f32>, tensor<2x8x16xf32>, tensor<1152xf32>, tensor<64x16xf32>)
// CHECK: bonsai.accumulate %[[DW]]
// CHECK: bonsai.embedding_grad %[[DX]], %arg0 {bonsai.phase = "backward"}
// CHECK-NOT: bonsai.linear
// CHECK-NOT: bonsai.cross_entropy
// CHECK: return %[[LOSS]]
func.func @head(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %head_w = bonsai.param "lm_head" trainable : tensor<64x16xf32>
  %logits = bonsai.linear %h, %head_w : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
}

// -----

// A frozen head (LoRA recipes): no weight gradient; bf16 logits and ignore_index carry over.

// REMARK: remark: fused linear + cross-entropy + input gradient (frozen head)
// CHECK-LABEL: func.func @frozen
// CHECK: %[[LOSS:.*]], %[[DX:.*]], %{{.*}} = bonsai.linear_cross_entropy %{{.*}} {chunk_rows = 16 : i64, ignore_index = 0 : i64} : (tensor<2x8x16xbf16>, tensor<64x16xbf16>, tensor<2x8xi32>, tensor<f32>) -> (tensor<f32>, tensor<2x8x16xbf16>, tensor<640xf32>)
// CHECK: bonsai.embedding_grad %[[DX]]
// CHECK-NOT: linear_grad
func.func @frozen(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<64x16xbf16>
  %h = bonsai.embedding %embed, %ids : (tensor<64x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x16xbf16>
  %head_w = bonsai.param "lm_head" frozen : tensor<64x16xbf16>
  %logits = bonsai.linear %h, %head_w : (tensor<2x8x16xbf16>, tensor<64x16xbf16>) -> tensor<2x8x64xbf16>
  %loss = bonsai.cross_entropy %logits, %labels {ignore_index = 0 : i64} : (tensor<2x8x64xbf16>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
}

// -----

// Tied embeddings (GPT-2) under remat `full`: the weight is the embedding table, and dW joins
// the embedding's gradient as linear_grad_weight's result did. Remat's recomputed clones of
// the final norm and of the logits were read only by the fused chain and are gone.

// REMARK: remark: bonsai-remat (policy 'full'): recomputes 2 tensors (1 layer_norm, 1 linear)
// REMARK: remark: fused linear + cross-entropy + gradients
// CHECK-LABEL: func.func @tied
// CHECK: %[[WTE:.*]] = bonsai.param "wte"
// CHECK: %[[N:.*]] = bonsai.layer_norm
// CHECK-NEXT: %[[SEED:.*]] = bonsai.loss_scale
// CHECK-NEXT: %[[LOSS:.*]], %[[DX:.*]], %{{.*}}, %[[DW:.*]] = bonsai.linear_cross_entropy %[[N]], %[[WTE]], %arg1, %[[SEED]]
// CHECK-NOT: bonsai.recomputed
// CHECK: bonsai.layer_norm_grad %[[DX]]
// CHECK: %[[DE:.*]] = bonsai.embedding_grad
// CHECK-NEXT: bonsai.add %[[DW]], %[[DE]] {bonsai.phase = "backward"}
func.func @tied(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %wte = bonsai.param "wte" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %wte, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %ln_w = bonsai.param "ln_f.weight" trainable : tensor<16xf32>
  %ln_b = bonsai.param "ln_f.bias" trainable : tensor<16xf32>
  %n = bonsai.layer_norm %h, %ln_w, %ln_b : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %logits = bonsai.linear %n, %wte : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
  bonsai.remat "full"
}

// -----

// An NF4 head: the fused op reads the forward's dequantized weight; the dequantization that
// bonsai-remat recomputes for the backward pass had no other reader and is gone.

// REMARK: remark: fused linear + cross-entropy + input gradient (frozen head)
// CHECK-LABEL: func.func @nf4
// CHECK: %[[Q:.*]] = bonsai.param "lm_head.weight" frozen : tensor<64x64x!bonsai.nf4<64, 256>>
// CHECK-NEXT: %[[W:.*]] = bonsai.dequantize %[[Q]] :
// CHECK-NEXT: %[[SEED:.*]] = bonsai.loss_scale
// CHECK-NEXT: bonsai.linear_cross_entropy %{{.*}}, %[[W]], %arg1, %[[SEED]]
// CHECK-NOT: bonsai.dequantize
func.func @nf4(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<64x64xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<64x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %head_w = bonsai.param "lm_head.weight" frozen : tensor<64x64xf32>
  %logits = bonsai.linear %h, %head_w : (tensor<2x8x64xf32>, tensor<64x64xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.quantize "nf4" block 64 double_quant 256 targets ["lm_head"]
  bonsai.optimizer "adamw" lr 1.000000e-03
}

// -----

// Not fused: the logits have two losses (and so two gradients), and the loss is computed with.

// CHECK-LABEL: func.func @two_losses
// CHECK-NOT: linear_cross_entropy
// CHECK: bonsai.cross_entropy
// CHECK: bonsai.cross_entropy_grad
func.func @two_losses(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>, %other: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %head_w = bonsai.param "lm_head" trainable : tensor<64x16xf32>
  %logits = bonsai.linear %h, %head_w : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %l1 = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  %l2 = bonsai.cross_entropy %logits, %other : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  %loss = bonsai.add %l1, %l2 : (tensor<f32>, tensor<f32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
}

// -----

// Not fused: the head has a bias (no model here has one; the fused kernel has none).

// CHECK-LABEL: func.func @bias
// CHECK-NOT: linear_cross_entropy
// CHECK: bonsai.linear %{{.*}}, %{{.*}}, %{{.*}} :
// CHECK: bonsai.cross_entropy_grad
func.func @bias(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %head_w = bonsai.param "lm_head.weight" trainable : tensor<64x16xf32>
  %head_b = bonsai.param "lm_head.bias" trainable : tensor<64xf32>
  %logits = bonsai.linear %h, %head_w, %head_b : (tensor<2x8x16xf32>, tensor<64x16xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
}
