// RUN: bonsai-opt --bonsai-verify-model %s | FileCheck %s

// A well-formed model passes the whole-function checks unchanged, including a tied weight
// (one bonsai.param with two uses).

// CHECK-LABEL: func.func @forward
// CHECK-COUNT-2: bonsai.param
// CHECK-NOT: bonsai.param
func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %wte = bonsai.param "transformer.wte.weight" trainable : tensor<16x64xf32>
  %h = bonsai.embedding %wte, %ids : (tensor<16x64xf32>, tensor<1x4xi32>) -> tensor<1x4x64xf32>
  %w = bonsai.param "transformer.ln_f.weight" trainable : tensor<64xf32>
  %n = bonsai.rms_norm %h, %w : (tensor<1x4x64xf32>, tensor<64xf32>) -> tensor<1x4x64xf32>
  %logits = bonsai.linear %n, %wte : (tensor<1x4x64xf32>, tensor<16x64xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// Functions without parameters are not models and are left alone.
// CHECK-LABEL: func.func @helper
func.func @helper(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
