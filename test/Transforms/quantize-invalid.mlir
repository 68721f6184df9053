// RUN: bonsai-opt --bonsai-quantize --split-input-file --verify-diagnostics %s

// NF4 weights are frozen. The recipe verifier accepts a trainable target that a bonsai.lora
// directive adapts (bonsai-insert-lora freezes it); run without that pass, bonsai-quantize
// finds the weight still trainable and names it.

func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "model.embed_tokens.weight" trainable : tensor<64x64xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<64x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  // expected-error @+1 {{weight 'model.layers.0.self_attn.q_proj.weight' is trainable, but NF4 weights are frozen: add a bonsai.lora directive that targets it (it freezes the base weight) or declare it frozen}}
  %w = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<64x64xf32>
  %a = bonsai.linear %h, %w : (tensor<2x8x64xf32>, tensor<64x64xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %a, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @qlora {
  // expected-note @+1 {{quantized by this directive}}
  bonsai.quantize "nf4" block 64 double_quant 256 targets ["q_proj"]
  bonsai.lora rank 4 alpha 8.000000e+00 targets ["q_proj"]
}

// -----

// The recipe verifier rejects a trainable target without an adapter before any pass runs.

func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "model.embed_tokens.weight" trainable : tensor<64x64xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<64x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %w = bonsai.param "model.layers.0.mlp.down_proj.weight" trainable : tensor<64x64xf32>
  %a = bonsai.linear %h, %w : (tensor<2x8x64xf32>, tensor<64x64xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %a, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @q {
  // expected-error @+1 {{weight 'model.layers.0.mlp.down_proj.weight' is trainable, but NF4 weights are frozen: give it a LoRA adapter or declare it frozen}}
  bonsai.quantize "nf4" block 64 double_quant 256 targets ["down_proj"]
}

// -----

// Every element of a quantized weight belongs to a whole block.

func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "model.embed_tokens.weight" trainable : tensor<48x64xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<48x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %w = bonsai.param "model.layers.0.mlp.down_proj.weight" frozen : tensor<48x40xf32>
  %x = bonsai.slice %h {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x64xf32>) -> tensor<2x8x40xf32>
  %a = bonsai.linear %x, %w : (tensor<2x8x40xf32>, tensor<48x40xf32>) -> tensor<2x8x48xf32>
  %loss = bonsai.cross_entropy %a, %labels : (tensor<2x8x48xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @q {
  // expected-error @+1 {{weight 'model.layers.0.mlp.down_proj.weight' has 1920 elements, not a multiple of the block size 256}}
  bonsai.quantize "nf4" block 256 double_quant 256 targets ["down_proj"]
}
