// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer %s -split-input-file -verify-diagnostics | FileCheck %s

// AdamW: the learning rate from the step counter and the schedule, the global gradient norm,
// one in-place update per accumulator (in the order the backward pass completes them) with
// its moments, an fp32 master copy for the bf16 parameter only, zeroed accumulators, the step
// increment, and the two metrics.

// CHECK-LABEL: func.func @adamw
// CHECK: %[[STEP:.*]] = bonsai.state optimizer "optimizer.step" : tensor<i64>
// CHECK: %[[LR:.*]] = bonsai.learning_rate %[[STEP]] {bonsai.phase = "update", lr = 1.000000e-03 : f64, min_lr_ratio = 1.000000e-01 : f64, schedule = "cosine", total_steps = 100 : i64, warmup_steps = 10 : i64}
// CHECK: %[[NORM:.*]] = bonsai.grad_norm %[[G1:.*]], %[[G0:.*]] {bonsai.phase = "update"} : (tensor<16x8xf32>, tensor<8xf32>) -> tensor<f32>
// CHECK: %[[MASTER:.*]] = bonsai.state optimizer "lm.master" copy_of "lm" : tensor<16x8xf32>
// CHECK: bonsai.adamw_update %[[G1]], %[[STEP]], %[[LR]], %[[NORM]], %{{.*}}, %{{.*}}, %{{.*}}, %[[MASTER]]
// CHECK: bonsai.zero %[[G1]]
// CHECK: %[[M0:.*]] = bonsai.state optimizer "n.exp_avg" : tensor<8xf32>
// CHECK: %[[V0:.*]] = bonsai.state optimizer "n.exp_avg_sq" : tensor<8xf32>
// CHECK-NOT: "n.master"
// CHECK: bonsai.adamw_update %[[G0]], %[[STEP]], %[[LR]], %[[NORM]], %{{.*}}, %[[M0]], %[[V0]] {beta1 = 9.000000e-01 : f64, beta2 = 0.9499{{[0-9]+}} : f64, bonsai.phase = "update", eps = 1.000000e-08 : f64, grad_clip = 1.000000e+00 : f64, weight_decay = 1.000000e-01 : f64}
// CHECK: bonsai.zero %[[G0]]
// CHECK: bonsai.step_increment %[[STEP]]
// CHECK: bonsai.metric "grad_norm" %[[NORM]]
// CHECK: bonsai.metric "lr" %[[LR]]
// CHECK-NEXT: return
func.func @adamw(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %hf = bonsai.cast %h : (tensor<1x4x8xbf16>) -> tensor<1x4x8xf32>
  %n = bonsai.rms_norm %hf, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %nb = bonsai.cast %n : (tensor<1x4x8xf32>) -> tensor<1x4x8xbf16>
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %nb, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3 {beta2 = 0.95 : f64, weight_decay = 0.1 : f64, grad_clip = 1.0 : f64, schedule = "cosine", warmup_steps = 10, total_steps = 100, min_lr_ratio = 0.1 : f64}
}

// -----

// SGD with momentum keeps one buffer per parameter.
// CHECK-LABEL: func.func @sgd
// CHECK: %[[BUF:.*]] = bonsai.state optimizer "lm.momentum_buffer" : tensor<16x8xf32>
// CHECK: bonsai.sgd_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[BUF]] {bonsai.phase = "update", grad_clip = 0.000000e+00 : f64, momentum = 9.000000e-01 : f64, weight_decay = 0.000000e+00 : f64}
// CHECK-NOT: exp_avg
func.func @sgd(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "sgd" lr 0.1 {momentum = 0.9 : f64}
}

// -----

// update_in_backward: the learning rate where the backward pass starts; each parameter's
// update (and its gradient's norm) right where its gradient is complete, reading the gradient
// itself (bf16 for the bf16 parameter); no accumulators and no zeroing; the update phase
// combines the norms for the metric and increments the step.
// CHECK-LABEL: func.func @in_backward
// CHECK: bonsai.loss_scale
// CHECK-NEXT: %[[STEP:.*]] = bonsai.state optimizer "optimizer.step" : tensor<i64>
// CHECK-NEXT: %[[LR:.*]] = bonsai.learning_rate %[[STEP]] {bonsai.phase = "backward"
// CHECK: %[[DLM:.*]] = bonsai.linear_grad_weight
// CHECK-NEXT: %[[NLM:.*]] = bonsai.grad_norm %[[DLM]] {bonsai.phase = "backward"} : (tensor<16x8xbf16>) -> tensor<f32>
// CHECK: bonsai.adamw_update %[[DLM]], %[[STEP]], %[[LR]], %[[NLM]], {{.*}}bonsai.phase = "backward"{{.*}} : tensor<16x8xbf16>,
// CHECK: bonsai.rms_norm_grad
// CHECK-NEXT: %[[NN:.*]] = bonsai.grad_norm %{{.*}} {bonsai.phase = "backward"} : (tensor<8xf32>) -> tensor<f32>
// CHECK: bonsai.adamw_update {{.*}}bonsai.phase = "backward"
// CHECK-NEXT: %[[NORM:.*]] = bonsai.grad_norm %[[NLM]], %[[NN]] {bonsai.phase = "update"}
// CHECK-NEXT: bonsai.step_increment %[[STEP]] {bonsai.phase = "update"}
// CHECK-NEXT: bonsai.metric "grad_norm" %[[NORM]]
// CHECK-NOT: bonsai.state gradient
// CHECK-NOT: bonsai.accumulate
// CHECK-NOT: bonsai.zero
func.func @in_backward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %hf = bonsai.cast %h : (tensor<1x4x8xbf16>) -> tensor<1x4x8xf32>
  %n = bonsai.rms_norm %hf, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %nb = bonsai.cast %n : (tensor<1x4x8xf32>) -> tensor<1x4x8xbf16>
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %nb, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3 {update_in_backward = true, weight_decay = 0.1 : f64}
}

// -----

// expected-error @+1 {{bonsai-optimizer needs exactly one bonsai.optimizer directive in the module's recipe, found 0}}
module {
  func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
    %emb = bonsai.param "e" trainable : tensor<16x8xf32>
    %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
    %logits = bonsai.linear %h, %emb : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
    %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
