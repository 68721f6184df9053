// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-fuse="only=gemm-epilogue,optimizer" -split-input-file %s | FileCheck %s
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-fuse="only=gemm-epilogue,optimizer" --bonsai-lower-to-plan -split-input-file %s | FileCheck %s --check-prefix=LOWER

// A whole step: the frozen embedding has neither gradient nor update; the trainable norm and
// head weights share one multi-tensor AdamW. The head's weight gradient accumulates in its
// GEMM.

// CHECK-LABEL: func.func @step
// CHECK: bonsai.linear_grad_weight_accumulate %{{.*}}, %{{.*}}, %{{.*}} {bonsai.phase = "backward"} : tensor<1x4x16xf32>, tensor<1x4x8xf32>, tensor<16x8xf32>
// CHECK-NOT: bonsai.accumulate %{{.*}} : tensor<16x8xf32>
// CHECK: bonsai.multi_tensor_adamw_update {{.*}} params(%{{.*}}, %{{.*}} : tensor<16x8xf32>, tensor<8xf32>)
// CHECK-NOT: bonsai.adamw_update
// CHECK-NOT: "e.exp_avg"
// Lowered, the in-place operands are the launches' outputs: the accumulator of the GEMM; the
// parameters, then the first and the second moments of the multi-tensor update, whose inputs
// are the shared scalars and then the gradients; its parameters are the hyper-parameters.
// LOWER: bonsai_plan.launch "linear_grad_weight_accumulate" ins(%{{.*}}, %{{.*}} : memref<1x4x16xf32>, memref<1x4x8xf32>) outs(%[[ACC:.*]] : memref<16x8xf32>) {phase = 1 : i32}
// LOWER: bonsai_plan.launch "multi_tensor_adamw_update" ins(%{{.*}}, %{{.*}}, %{{.*}}, %[[ACC]], %{{.*}} : memref<i64>, memref<f32>, memref<f32>, memref<16x8xf32>, memref<8xf32>) outs(%{{.*}} : memref<16x8xf32>, memref<8xf32>, memref<16x8xf32>, memref<8xf32>, memref<16x8xf32>, memref<8xf32>) {params = {beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, eps = 1.000000e-08 : f64, grad_clip = 0.000000e+00 : f64, weight_decay = 0.000000e+00 : f64}, phase = 2 : i32}
func.func @step(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %n = bonsai.rms_norm %h, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %n, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
}

// -----

// update_in_backward: each update runs in the backward pass as soon as its gradient is
// complete, reading it directly: there is no accumulator to accumulate into, and the updates
// stay per parameter.

// CHECK-LABEL: func.func @in_backward
// CHECK-NOT: linear_grad_weight_accumulate
// CHECK: bonsai.linear_grad_weight
// CHECK-COUNT-2: bonsai.adamw_update {{.*}}bonsai.phase = "backward"
// CHECK-NOT: multi_tensor
func.func @in_backward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %n = bonsai.rms_norm %h, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %n, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3 {update_in_backward = true}
}
