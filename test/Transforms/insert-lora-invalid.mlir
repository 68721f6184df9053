// bonsai-insert-lora's errors (from the recipe's verifier or from the pass): each names the cause.
//
// RUN: bonsai-opt %s --split-input-file --bonsai-insert-lora -verify-diagnostics -o /dev/null
// RUN: not bonsai-opt --bonsai-insert-lora="rank=4 targets=k_proj" %S/Inputs/lora-linear.mlir -o /dev/null 2>&1 | FileCheck %s --check-prefix=NOMATCH
// RUN: not bonsai-opt --bonsai-insert-lora="rank=16 targets=q_proj" %S/Inputs/lora-linear.mlir -o /dev/null 2>&1 | FileCheck %s --check-prefix=RANK
// NOMATCH: error: bonsai-insert-lora: target 'k_proj' matches no linear of the model (linear weights are named like 'm.q_proj.weight')
// RANK: error: bonsai-insert-lora: rank 16 is not below min(in, out) = 16 of weight 'm.q_proj.weight'

// A target that matches no linear names the pattern.
func.func @forward(%x: tensor<2x8x16xf32>) -> tensor<2x8x32xf32> {
  %w = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<32x16xf32>
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  return %y : tensor<2x8x32xf32>
}
bonsai.recipe @r {
  // expected-error @+1 {{target 'o_proj' matches no linear of the model (linear weights are named like 'model.layers.0.self_attn.q_proj.weight')}}
  bonsai.lora rank 4 alpha 8.0 targets ["q_proj", "o_proj"]
}

// -----

// The rank must be below min(in, out).
func.func @forward(%x: tensor<2x8x16xf32>) -> tensor<2x8x32xf32> {
  %w = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<32x16xf32>
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  return %y : tensor<2x8x32xf32>
}
bonsai.recipe @r {
  // expected-error @+1 {{rank 16 is not below min(in, out) = 16 of weight 'model.layers.0.self_attn.q_proj.weight'}}
  bonsai.lora rank 16 alpha 8.0 targets ["q_proj"]
}

// -----

// A rank of zero.
bonsai.recipe @r {
  // expected-error @+1 {{rank must be positive, got 0}}
  bonsai.lora rank 0 alpha 8.0 targets ["q_proj"]
}

// -----

// A tied LM head (its weight is also the embedding table) is refused: an adapter on the head
// would untie it from the embedding.
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %wte = bonsai.param "transformer.wte.weight" trainable : tensor<64x16xf32>
  // expected-note @+1 {{the other use}}
  %h = bonsai.embedding %wte, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %logits = bonsai.linear %h, %wte : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-error @+1 {{weight 'transformer.wte.weight' has another use (a tied or shared weight); an adapter on one use would untie them: leave it out of the targets}}
  bonsai.lora rank 4 alpha 8.0 targets ["*wte*"]
}

// -----

// DoRA on a linear with a bias.
func.func @forward(%x: tensor<2x8x16xf32>) -> tensor<2x8x32xf32> {
  %w = bonsai.param "h.0.mlp.c_fc.weight" trainable : tensor<32x16xf32>
  %b = bonsai.param "h.0.mlp.c_fc.bias" trainable : tensor<32xf32>
  %y = bonsai.linear %x, %w, %b : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<2x8x32xf32>
  return %y : tensor<2x8x32xf32>
}
bonsai.recipe @r {
  // expected-error @+1 {{DoRA on weight 'h.0.mlp.c_fc.weight', whose linear has a bias, is not supported: the magnitude would scale the bias too}}
  bonsai.lora dora rank 4 alpha 8.0 targets ["c_fc"]
}

// -----

// DoRA on a transposed weight (GPT-2's Conv1D layout): the magnitude's row norms would be
// taken over the wrong axis.
func.func @forward(%x: tensor<2x8x16xf32>) -> tensor<2x8x32xf32> {
  %w = bonsai.param "h.0.mlp.c_fc.weight" trainable : tensor<16x32xf32>
  %t = bonsai.transpose %w {permutation = array<i64: 1, 0>} : (tensor<16x32xf32>) -> tensor<32x16xf32>
  %y = bonsai.linear %x, %t : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  return %y : tensor<2x8x32xf32>
}
bonsai.recipe @r {
  // expected-error @+1 {{DoRA needs weight 'h.0.mlp.c_fc.weight' in [out, in] layout (the magnitude is initialized to its row norms), but the linear reads it through a transpose or reshape}}
  bonsai.lora dora rank 4 alpha 8.0 targets ["c_fc"]
}

// -----

// LoRA on a transposed weight (GPT-2's Conv1D layout): the plan's adapters, the runtime and
// PEFT's export take the base in [out, in].
func.func @forward(%x: tensor<2x8x16xf32>) -> tensor<2x8x32xf32> {
  %w = bonsai.param "h.0.attn.c_attn.weight" trainable : tensor<16x32xf32>
  %t = bonsai.transpose %w {permutation = array<i64: 1, 0>} : (tensor<16x32xf32>) -> tensor<32x16xf32>
  %y = bonsai.linear %x, %t : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  return %y : tensor<2x8x32xf32>
}
bonsai.recipe @r {
  // expected-error @+1 {{LoRA on weight 'h.0.attn.c_attn.weight', which the linear reads through a transpose or reshape (GPT-2's Conv1D [in, out] layout), is not supported: adapters need the weight stored in [out, in] layout}}
  bonsai.lora rank 4 alpha 8.0 targets ["c_attn"]
}

// -----

// An adapter name the model already declares.
func.func @forward(%x: tensor<2x8x16xf32>) -> tensor<2x8x32xf32> {
  %w = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<32x16xf32>
  %a = bonsai.param "model.layers.0.self_attn.q_proj.lora_A.weight" trainable : tensor<4x16xf32>
  %xa = bonsai.linear %x, %a : (tensor<2x8x16xf32>, tensor<4x16xf32>) -> tensor<2x8x4xf32>
  // expected-error @+1 {{bonsai-insert-lora: the model already declares a parameter named 'model.layers.0.self_attn.q_proj.lora_A.weight'}}
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  return %y : tensor<2x8x32xf32>
}
bonsai.recipe @r {
  bonsai.lora rank 4 alpha 8.0 targets ["q_proj"]
}
