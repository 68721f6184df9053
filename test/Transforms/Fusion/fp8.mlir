// RUN: bonsai-opt --split-input-file --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_90 per-linear-remarks=false' --bonsai-fuse='per-site-remarks=false disable=fp8-saved-input' %s 2>/dev/null | FileCheck %s
// RUN: bonsai-opt --split-input-file --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_90 per-linear-remarks=false' --bonsai-fuse='per-site-remarks=false' %s 2>/dev/null | FileCheck %s --check-prefix=SAVED
// RUN: bonsai-opt --split-input-file --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_90 per-linear-remarks=false' --bonsai-fuse='per-site-remarks=false disable=fp8-backward' %s 2>/dev/null | FileCheck %s --check-prefix=ACC
// RUN: bonsai-opt --split-input-file --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_90 per-linear-remarks=false' --bonsai-fuse='per-site-remarks=false disable=gemm-epilogue' %s 2>/dev/null | FileCheck %s --check-prefix=NOEPI
// RUN: bonsai-opt --split-input-file --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_80' --bonsai-fuse='per-site-remarks=false' %s 2>/dev/null | FileCheck %s --check-prefix=BF16

// bonsai-fp8 runs before bonsai-fuse (docs/fp8.md). Here every linear is targeted, the LM head
// too. On sm_90 two families match FP8 GEMMs: gemm-epilogue's accumulation adds each weight
// gradient into its accumulator by its own FP8 GEMM (fp8_linear_grad_weight_accumulate), and
// fp8-backward then joins it to the input gradient of the same linear (fp8_linear_backward,
// which casts dy once); there is no linear + gelu (gemm-epilogue) and no fused LM head
// (linear-cross-entropy). The same step for sm_80 gets all three in bf16. (CHECK leaves out
// fp8-saved-input; with it, SAVED, each forward keeps its input's transposed codes and each
// fused backward reads them.)
// SAVED-LABEL: func.func @mlp
// SAVED-COUNT-3: bonsai.fp8_linear_with_input_cast
// SAVED-COUNT-3: bonsai.fp8_linear_backward_from_input_cast
// SAVED-NOT: bonsai.fp8_linear_backward %
// SAVED-LABEL: func.func @frozen_input
// CHECK-LABEL: func.func @mlp
// CHECK-NOT: bonsai.linear_gelu
// CHECK-NOT: bonsai.linear_cross_entropy
// CHECK: bonsai.fp8_linear
// CHECK: bonsai.gelu
// CHECK: bonsai.fp8_linear
// CHECK: bonsai.fp8_linear
// CHECK: bonsai.cross_entropy
// CHECK-NOT: bonsai.fp8_linear_grad_input
// CHECK-NOT: bonsai.fp8_linear_grad_weight
// CHECK: %{{[a-z0-9_]+}}, %[[DXS:[a-z0-9_]+]], %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} = bonsai.fp8_linear_backward {{.*}} : (tensor<1x16x64xf32>, tensor<64x16xf32>, tensor<1x16x16xf32>, tensor<3x20xf32>, tensor<64x16xf32>) -> (tensor<1x16x16xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<{{[0-9]+}}xf32>)
// CHECK: bonsai.fp8_linear_backward
// The statistics the scale update reads are folded over micro-batches into an accumulator once
// the input gradient has been read.
// CHECK: bonsai.accumulate_max %[[DXS]], %[[DXSACC:[0-9]+]] {bonsai.phase = "backward"}
// CHECK: bonsai.fp8_linear_backward
// CHECK-NOT: bonsai.fp8_linear_grad_input
// CHECK-NOT: bonsai.fp8_linear_grad_weight
// CHECK-NOT: bonsai.linear_gelu
// CHECK-NOT: bonsai.linear_grad_weight_accumulate
// CHECK-NOT: bonsai.linear_cross_entropy
// The LM head's backward comes first; its scales are updated last, from its input gradient's
// statistics.
// CHECK: bonsai.fp8_update_scales
// CHECK: bonsai.fp8_update_scales
// CHECK: bonsai.fp8_update_scales %{{.*}}, %{{.*}}, %[[DXSACC]], %{{.*}} {bonsai.phase = "update"

// Without fp8-backward each weight gradient is still added into its accumulator by its GEMM.
// ACC-LABEL: func.func @mlp
// ACC-NOT: bonsai.fp8_linear_backward
// ACC-NOT: bonsai.fp8_linear_grad_weight {{.*}}:
// ACC: %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}} = bonsai.fp8_linear_grad_weight_accumulate {{.*}} : (tensor<1x16x64xf32>, tensor<1x16x16xf32>, tensor<3x20xf32>, tensor<64x16xf32>) -> (tensor<2x4xf32>, tensor<{{[0-9]+}}xf32>)
// ACC: bonsai.fp8_linear_grad_weight_accumulate
// ACC: bonsai.fp8_linear_grad_weight_accumulate
// ACC-NOT: bonsai.fp8_linear_grad_weight {{.*}}:
// ACC-NOT: bonsai.fp8_linear_backward

// Without gemm-epilogue the weight gradient and its accumulation stay apart, and so
// fp8-backward (which fuses the accumulating form) finds nothing.
// NOEPI-LABEL: func.func @mlp
// NOEPI-NOT: fp8_linear_grad_weight_accumulate
// NOEPI-NOT: fp8_linear_backward
// NOEPI: %[[DW:[a-z0-9_]+]], %{{.*}} = bonsai.fp8_linear_grad_weight
// NOEPI: bonsai.accumulate %[[DW]],

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

// -----

// A linear whose input needs no gradient (a frozen embedding) has no fp8_linear_grad_input:
// its scale update reads the weight gradient's statistics, which become the accumulating op's.
// CHECK-LABEL: func.func @frozen_input
// CHECK: %[[STATS:[a-z0-9_]+]], %{{[a-z0-9_]+}} = bonsai.fp8_linear_grad_weight_accumulate
// CHECK-NOT: bonsai.fp8_linear_grad_weight {{.*}}:
// CHECK: bonsai.accumulate_max %[[STATS]], %[[STATSACC:[0-9]+]] {bonsai.phase = "backward"}
// CHECK: bonsai.fp8_update_scales %{{.*}}, %{{.*}}, %[[STATSACC]], %{{.*}} {bonsai.phase = "update", current = false, margin = 0 : i64}
func.func @frozen_input(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %emb = bonsai.param "transformer.wte.weight" frozen : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<1x16xi32>) -> tensor<1x16x16xf32>
  %wf = bonsai.param "transformer.h.0.mlp.c_fc.weight" trainable : tensor<64x16xf32>
  %f = bonsai.linear %h, %wf : (tensor<1x16x16xf32>, tensor<64x16xf32>) -> tensor<1x16x64xf32>
  %loss = bonsai.cross_entropy %f, %labels : (tensor<1x16x64xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["c_fc"]
}
