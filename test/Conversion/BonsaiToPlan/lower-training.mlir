// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-lower-to-plan="micro-batches=4" %s | FileCheck %s

// A training step: gradient accumulators and optimizer state in their own persistent arenas,
// the loss scale and the metrics as their own roles, in-place operands as launch outputs,
// every launch in its phase, the logits named for generation.

// CHECK-LABEL: bonsai_plan.step @forward attributes {micro_batches = 4 : i64, target = "cpu", tokens_per_step = 4 : i64, vocab_size = 16 : i64}
// CHECK-DAG: bonsai_plan.arena @optimizer persistent device size 0
// CHECK-DAG: bonsai_plan.arena @gradients persistent device size 0
// CHECK-DAG: bonsai_plan.arena @weights persistent device size 0
// CHECK-DAG: bonsai_plan.arena @activations step device size 0
// CHECK: %[[W:.*]] = bonsai_plan.buffer @weights parameter "lm_head.weight" trainable : memref<16x8xf32>
// CHECK: %[[LOGITS:.*]] = bonsai_plan.buffer @activations activation "logits" : memref<1x4x16xf32>
// CHECK: bonsai_plan.launch "linear" {{.*}} outs(%[[LOGITS]] : memref<1x4x16xf32>){{$}}
// CHECK: %[[SCALE:.*]] = bonsai_plan.buffer @activations loss_scale "loss_scale" : memref<f32>
// CHECK: bonsai_plan.launch "cross_entropy_grad" ins(%[[SCALE]], %[[LOGITS]], %{{.*}} : memref<f32>, memref<1x4x16xf32>, memref<1x4xi32>) outs(%{{.*}} : memref<1x4x16xf32>) {params = {ignore_index = -100 : i64}, phase = 1 : i32}
// CHECK: %[[G:.*]] = bonsai_plan.buffer @gradients gradient "lm_head.weight" : memref<16x8xf32>
// CHECK: bonsai_plan.launch "accumulate" ins(%{{.*}} : memref<16x8xf32>) outs(%[[G]] : memref<16x8xf32>) {phase = 1 : i32}
// CHECK: %[[STEP:.*]] = bonsai_plan.buffer @optimizer optimizer_state "optimizer.step" : memref<i64>
// CHECK: %[[LR:.*]] = bonsai_plan.buffer @activations metric "lr" : memref<f32>
// CHECK: bonsai_plan.launch "learning_rate" ins(%[[STEP]] : memref<i64>) outs(%[[LR]] : memref<f32>) {{.*}}phase = 2 : i32}
// CHECK: %[[NORM:.*]] = bonsai_plan.buffer @activations metric "grad_norm" : memref<f32>
// CHECK: %[[M:.*]] = bonsai_plan.buffer @optimizer optimizer_state "lm_head.weight.exp_avg" : memref<16x8xf32>
// CHECK: %[[V:.*]] = bonsai_plan.buffer @optimizer optimizer_state "lm_head.weight.exp_avg_sq" : memref<16x8xf32>
// CHECK: bonsai_plan.launch "adamw_update" ins(%[[G]], %[[STEP]], %[[LR]], %[[NORM]] : memref<16x8xf32>, memref<i64>, memref<f32>, memref<f32>) outs(%[[W]], %[[M]], %[[V]] : memref<16x8xf32>, memref<16x8xf32>, memref<16x8xf32>) {{.*}}phase = 2 : i32}
// CHECK: bonsai_plan.launch "zero" ins() outs(%[[G]] : memref<16x8xf32>) {phase = 2 : i32}
// CHECK: bonsai_plan.launch "step_increment" ins() outs(%[[STEP]] : memref<i64>) {phase = 2 : i32}
func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
}
