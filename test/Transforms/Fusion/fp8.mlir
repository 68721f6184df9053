// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_90 per-linear-remarks=false' --bonsai-fuse='per-site-remarks=false' %s 2>/dev/null | FileCheck %s
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_80' --bonsai-fuse='per-site-remarks=false' %s 2>/dev/null | FileCheck %s --check-prefix=BF16

// Fusion families leave FP8 GEMMs alone: bonsai-fp8 runs first (docs/fp8.md), and no family
// matches its ops. Here every linear is targeted, the LM head too: on sm_90 there is no
// linear + gelu (gemm-epilogue), no weight gradient accumulated by its GEMM (gemm-epilogue),
// no fused LM head (linear-cross-entropy); the same step for sm_80 gets all three.
// CHECK-LABEL: func.func @mlp
// CHECK-NOT: bonsai.linear_gelu
// CHECK-NOT: bonsai.linear_grad_weight_accumulate
// CHECK-NOT: bonsai.linear_cross_entropy
// CHECK: bonsai.fp8_linear
// CHECK: bonsai.gelu
// CHECK: bonsai.fp8_linear
// CHECK: bonsai.fp8_linear
// CHECK: bonsai.cross_entropy
// CHECK: bonsai.fp8_linear_grad_weight
// CHECK: bonsai.accumulate
// CHECK-NOT: bonsai.linear_gelu
// CHECK-NOT: bonsai.linear_grad_weight_accumulate
// CHECK-NOT: bonsai.linear_cross_entropy
// CHECK: bonsai.fp8_update_scales
// CHECK: bonsai.fp8_update_scales
// CHECK: bonsai.fp8_update_scales

// BF16-LABEL: func.func @mlp
// BF16: bonsai.linear_gelu
// BF16: bonsai.linear_cross_entropy
// BF16: bonsai.linear_grad_weight_accumulate
// BF16-NOT: fp8_
func.func @mlp(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %emb = bonsai.param "transformer.wte.weight" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<1x16xi32>) -> tensor<1x16x16xf32>
  %wf = bonsai.param "transformer.h.0.mlp.c_fc.weight" trainable : tensor<64x16xf32>
  %f = bonsai.linear %h, %wf : (tensor<1x16x16xf32>, tensor<64x16xf32>) -> tensor<1x16x64xf32>
  %g = bonsai.gelu %f {approximation = #bonsai.gelu_approximation<tanh>} : (tensor<1x16x64xf32>) -> tensor<1x16x64xf32>
  %wp = bonsai.param "transformer.h.0.mlp.c_proj.weight" trainable : tensor<16x64xf32>
  %p = bonsai.linear %g, %wp : (tensor<1x16x64xf32>, tensor<16x64xf32>) -> tensor<1x16x16xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<64x16xf32>
  %logits = bonsai.linear %p, %lm : (tensor<1x16x16xf32>, tensor<64x16xf32>) -> tensor<1x16x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x16x64xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["c_fc", "c_proj", "lm_head"]
}
