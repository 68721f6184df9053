// bonsai-insert-lora: LoRA and DoRA adapters from the recipe's bonsai.lora or from the options.
//
// RUN: rm -rf %t && split-file %s %t
// RUN: bonsai-opt --bonsai-insert-lora %t/lora.mlir | FileCheck %s --check-prefix=LORA
// RUN: bonsai-opt --bonsai-insert-lora %t/dora.mlir | FileCheck %s --check-prefix=DORA
// RUN: bonsai-opt --bonsai-insert-lora="rank=2 alpha=4.0 targets=*.q_proj.weight" %t/options.mlir | FileCheck %s --check-prefix=OPTIONS
// RUN: bonsai-opt --bonsai-insert-lora %t/options.mlir | FileCheck %s --check-prefix=NONE
// RUN: bonsai-opt --bonsai-insert-lora --bonsai-autodiff %t/dora.mlir | FileCheck %s --check-prefix=GRAD

//--- lora.mlir
// LORA-LABEL: func.func @forward
// LORA-SAME: bonsai.adapter_targets = ["q_proj"]
// LORA-SAME: bonsai.adapters = [{alpha = 1.600000e+01 : f64, base = "model.layers.0.self_attn.q_proj.weight", lora_a = "model.layers.0.self_attn.q_proj.lora_A.weight", lora_b = "model.layers.0.self_attn.q_proj.lora_B.weight", module = "model.layers.0.self_attn.q_proj", rank = 4 : i64}]
// LORA:      %[[S:.*]] = bonsai.fill {value = 4.000000e+00 : f64} : () -> tensor<bf16>
// Every base parameter is frozen, the adapters are trainable with their initializers.
// LORA:      %[[EMB:.*]] = bonsai.param "model.embed_tokens.weight" frozen
// LORA:      %[[W:.*]] = bonsai.param "model.layers.0.self_attn.q_proj.weight" frozen : tensor<32x16xbf16>
// LORA-NEXT: %[[A:.*]] = bonsai.param "model.layers.0.self_attn.q_proj.lora_A.weight" trainable {bonsai.init = "kaiming_uniform"} : tensor<4x16xbf16>
// LORA-NEXT: %[[B:.*]] = bonsai.param "model.layers.0.self_attn.q_proj.lora_B.weight" trainable {bonsai.init = "zeros"} : tensor<32x4xbf16>
// LORA-NEXT: %[[Y:.*]] = bonsai.linear %[[X:.*]], %[[W]] : (tensor<2x8x16xbf16>, tensor<32x16xbf16>) -> tensor<2x8x32xbf16>
// LORA-NEXT: %[[XA:.*]] = bonsai.linear %[[X]], %[[A]] : (tensor<2x8x16xbf16>, tensor<4x16xbf16>) -> tensor<2x8x4xbf16>
// LORA-NEXT: %[[XS:.*]] = bonsai.mul %[[XA]], %[[S]] : (tensor<2x8x4xbf16>, tensor<bf16>) -> tensor<2x8x4xbf16>
// LORA-NEXT: %[[D:.*]] = bonsai.linear %[[XS]], %[[B]] : (tensor<2x8x4xbf16>, tensor<32x4xbf16>) -> tensor<2x8x32xbf16>
// LORA-NEXT: %[[SUM:.*]] = bonsai.add %[[Y]], %[[D]]
// The up_proj is not targeted: no adapter, but frozen.
// LORA:      bonsai.param "model.layers.0.mlp.up_proj.weight" frozen
// LORA-NOT:  up_proj.lora_A
// LORA:      bonsai.linear %[[SUM]]
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<64x16xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x16xbf16>
  %wq = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<32x16xbf16>
  %q = bonsai.linear %h, %wq : (tensor<2x8x16xbf16>, tensor<32x16xbf16>) -> tensor<2x8x32xbf16>
  %wu = bonsai.param "model.layers.0.mlp.up_proj.weight" trainable : tensor<64x32xbf16>
  %logits = bonsai.linear %q, %wu : (tensor<2x8x32xbf16>, tensor<64x32xbf16>) -> tensor<2x8x64xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xbf16>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @lora {
  bonsai.lora rank 4 alpha 16.0 targets ["q_proj"]
}

//--- dora.mlir
// DORA-LABEL: func.func @forward
// DORA-SAME: magnitude = "model.layers.0.mlp.up_proj.lora_magnitude_vector", module = "model.layers.0.mlp.up_proj", rank = 8 : i64}]
// DORA:      %[[S:.*]] = bonsai.fill {value = 5.000000e-01 : f64} : () -> tensor<f32>
// DORA:      %[[W:.*]] = bonsai.param "model.layers.0.mlp.up_proj.weight" frozen : tensor<64x32xf32>
// DORA-NEXT: %[[A:.*]] = bonsai.param "model.layers.0.mlp.up_proj.lora_A.weight" trainable {bonsai.init = "kaiming_uniform"} : tensor<8x32xf32>
// DORA-NEXT: %[[B:.*]] = bonsai.param "model.layers.0.mlp.up_proj.lora_B.weight" trainable {bonsai.init = "zeros"} : tensor<64x8xf32>
// DORA-NEXT: %[[M:.*]] = bonsai.param "model.layers.0.mlp.up_proj.lora_magnitude_vector" trainable {bonsai.init = "row_norm", bonsai.init_source = "model.layers.0.mlp.up_proj.weight"} : tensor<64xf32>
// DORA-NEXT: %[[Y:.*]] = bonsai.linear %[[X:.*]], %[[W]]
// DORA-NEXT: %[[XA:.*]] = bonsai.linear %[[X]], %[[A]]
// DORA-NEXT: %[[XS:.*]] = bonsai.mul %[[XA]], %[[S]]
// DORA-NEXT: %[[D:.*]] = bonsai.linear %[[XS]], %[[B]]
// DORA-NEXT: %[[SUM:.*]] = bonsai.add %[[Y]], %[[D]]
// DORA-NEXT: %[[RS:.*]] = bonsai.dora_scale %[[M]], %[[W]], %[[A]], %[[B]] {scale = 5.000000e-01 : f64} : (tensor<64xf32>, tensor<64x32xf32>, tensor<8x32xf32>, tensor<64x8xf32>) -> tensor<64xf32>
// DORA-NEXT: %[[OUT:.*]] = bonsai.mul %[[SUM]], %[[RS]] : (tensor<2x8x64xf32>, tensor<64xf32>) -> tensor<2x8x64xf32>
// DORA-NEXT: bonsai.cross_entropy %[[OUT]]
//
// The norm is detached: the magnitude's gradient is dora_scale of the incoming gradient, and
// no gradient reaches the weight through it.
// GRAD:      %[[RS:.*]] = bonsai.dora_scale %[[M:.*]], %[[W:.*]], %[[A:.*]], %[[B:.*]] {scale
// GRAD:      bonsai.dora_scale %{{.*}}, %[[W]], %[[A]], %[[B]] {bonsai.phase = "backward", scale = 5.000000e-01 : f64}
// GRAD-NOT:  linear_grad_weight %{{.*}} -> tensor<64x32xf32>
// GRAD:      bonsai.state gradient "model.layers.0.mlp.up_proj.lora_magnitude_vector"
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<64x32xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x32xf32>, tensor<2x8xi32>) -> tensor<2x8x32xf32>
  %wu = bonsai.param "model.layers.0.mlp.up_proj.weight" trainable : tensor<64x32xf32>
  %logits = bonsai.linear %h, %wu : (tensor<2x8x32xf32>, tensor<64x32xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @dora {
  bonsai.lora dora rank 8 alpha 4.0 targets ["*.mlp.*"]
}

//--- options.mlir
// Without a recipe, the options say what to insert; without either, nothing changes.
// OPTIONS: bonsai.fill {value = 2.000000e+00 : f64}
// OPTIONS: bonsai.param "model.layers.0.self_attn.q_proj.lora_A.weight" trainable {bonsai.init = "kaiming_uniform"} : tensor<2x16xf32>
// NONE-NOT: lora_A
// NONE: bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %wq = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<64x16xf32>
  %logits = bonsai.linear %h, %wq : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
