// RUN: bonsai-opt %s | bonsai-opt | FileCheck %s

// The fused ops (BonsaiFusedOps.td) round-trip; the workspace of linear_cross_entropy has the
// size getWorkspaceElements gives, in f32 elements: f32, 256 rows of 256 logits (65536), the
// losses (256) and the counter (64): 65856; bf16, a chunk of 8 rows of a vocabulary of 100
// padded to 104 (416, aligned to 448), 20 losses (64), W's padded copy (104 x 16 bf16: 832),
// the fp32 accumulator of dW (104 x 16: 1664) and the counter (64): 3072.

// CHECK-LABEL: func.func @fused
// CHECK: bonsai.linear_cross_entropy %{{.*}} {chunk_rows = 256 : i64, ignore_index = -100 : i64} : (tensor<4x64x64xf32>, tensor<256x64xf32>, tensor<4x64xi32>, tensor<f32>) -> (tensor<f32>, tensor<4x64x64xf32>, tensor<65856xf32>, tensor<256x64xf32>)
// CHECK: bonsai.linear_cross_entropy %{{.*}} {chunk_rows = 8 : i64, ignore_index = 0 : i64} : (tensor<2x10x16xbf16>, tensor<100x16xbf16>, tensor<2x10xi64>, tensor<f32>) -> (tensor<f32>, tensor<2x10x16xbf16>, tensor<3072xf32>, tensor<100x16xbf16>)
// CHECK: bonsai.add_rms_norm
// CHECK: bonsai.add_layer_norm
// CHECK: bonsai.rms_norm_grad_add
// CHECK: bonsai.linear_add %{{.*}} : (tensor<4x64x64xf32>, tensor<256x64xf32>, tensor<4x64x256xf32>) -> tensor<4x64x256xf32>
// CHECK: bonsai.layer_norm_grad_add
func.func @fused(%x: tensor<4x64x64xf32>, %w: tensor<256x64xf32>, %labels: tensor<4x64xi32>, %seed: tensor<f32>,
                 %xb: tensor<2x10x16xbf16>, %wb: tensor<100x16xbf16>, %lb: tensor<2x10xi64>,
                 %n: tensor<64xf32>, %r: tensor<4x64x256xf32>) {
  %loss, %dx, %ws, %dw = bonsai.linear_cross_entropy %x, %w, %labels, %seed {chunk_rows = 256 : i64, ignore_index = -100 : i64} : (tensor<4x64x64xf32>, tensor<256x64xf32>, tensor<4x64xi32>, tensor<f32>) -> (tensor<f32>, tensor<4x64x64xf32>, tensor<65856xf32>, tensor<256x64xf32>)
  %loss2, %dx2, %ws2, %dw2 = bonsai.linear_cross_entropy %xb, %wb, %lb, %seed {chunk_rows = 8 : i64, ignore_index = 0 : i64} : (tensor<2x10x16xbf16>, tensor<100x16xbf16>, tensor<2x10xi64>, tensor<f32>) -> (tensor<f32>, tensor<2x10x16xbf16>, tensor<3072xf32>, tensor<100x16xbf16>)
  %s, %y = bonsai.add_rms_norm %x, %dx, %n {epsilon = 1.0e-05 : f64} : (tensor<4x64x64xf32>, tensor<4x64x64xf32>, tensor<64xf32>) -> (tensor<4x64x64xf32>, tensor<4x64x64xf32>)
  %s2, %y2 = bonsai.add_layer_norm %x, %dx, %n, %n {epsilon = 1.0e-05 : f64} : (tensor<4x64x64xf32>, tensor<4x64x64xf32>, tensor<64xf32>, tensor<64xf32>) -> (tensor<4x64x64xf32>, tensor<4x64x64xf32>)
  %g, %gw = bonsai.rms_norm_grad_add %y, %s, %n, %dx {epsilon = 1.0e-05 : f64} : (tensor<4x64x64xf32>, tensor<4x64x64xf32>, tensor<64xf32>, tensor<4x64x64xf32>) -> (tensor<4x64x64xf32>, tensor<64xf32>)
  %la = bonsai.linear_add %x, %w, %r : (tensor<4x64x64xf32>, tensor<256x64xf32>, tensor<4x64x256xf32>) -> tensor<4x64x256xf32>
  %h, %hw, %hb = bonsai.layer_norm_grad_add %y, %s, %n, %dx {epsilon = 1.0e-05 : f64} : (tensor<4x64x64xf32>, tensor<4x64x64xf32>, tensor<64xf32>, tensor<4x64x64xf32>) -> (tensor<4x64x64xf32>, tensor<64xf32>, tensor<64xf32>)
  return
}
