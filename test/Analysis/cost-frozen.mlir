// RUN: bonsai-opt --bonsai-print-cost %s -o /dev/null | FileCheck %s

// Frozen weights get no weight-gradient GEMM, and NF4 weights are counted as quantized at
// 4.127 bits per element. Shapes are small so every figure can be checked by hand.

func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" frozen : tensor<16x64xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x64xf32>, tensor<1x4xi32>) -> tensor<1x4x64xf32>
  // 64 x 64 = 4096 NF4 elements: 2048 B codes + 64 B absmax + 4 B scale + 4 B offset.
  %q = bonsai.param "model.layers.0.mlp.up_proj.weight" frozen : tensor<64x64x!bonsai.nf4<64, 256>>
  %w = bonsai.dequantize %q : (tensor<64x64x!bonsai.nf4<64, 256>>) -> tensor<64x64xf32>
  %u = bonsai.linear %h, %w : (tensor<1x4x64xf32>, tensor<64x64xf32>) -> tensor<1x4x64xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<16x64xf32>
  %logits = bonsai.linear %u, %lm : (tensor<1x4x64xf32>, tensor<16x64xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK: cost report for @forward
// CHECK: trainable {{ *}}1,024  4.00 KiB
// CHECK: frozen {{ *}}1,024  4.00 KiB
// CHECK: quantized (nf4) {{ *}}4,096  2.07 KiB
// CHECK: total {{ *}}6,144
// CHECK: embedding lookups {{ *}}1,024
// CHECK: GEMM weights (N) {{ *}}5,120
// CHECK: tokens per step: 4
// Forward GEMMs: 2*4*64*64 = 32,768 and 2*4*64*16 = 8,192; dequantize 2*4096 = 8,192 vector,
// cross-entropy 4*64 = 256 vector. Backward: only lm_head's dW (8,192) and the loss gradient
// (2 * 256 vector); no dX anywhere, since nothing before lm_head is trainable.
// CHECK: forward   49,408 {{.*}}; GEMM 40,960, vector 8,448
// CHECK: backward  8,704 {{.*}}; GEMM 8,192, vector 512
// CHECK: per layer:
// CHECK: embedding {{ *}}4.00 KiB {{ *}}1.00 KiB {{ *}}0
// CHECK: layer 0 {{ *}}2.07 KiB {{ *}}17.00 KiB {{ *}}40,960
// CHECK: head {{ *}}4.00 KiB {{ *}}260 B {{ *}}8,448
