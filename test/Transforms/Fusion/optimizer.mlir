// RUN: bonsai-opt --bonsai-fuse="only=optimizer" -split-input-file %s | FileCheck %s
// RUN: bonsai-opt --bonsai-fuse="only=gemm-epilogue" -split-input-file %s | FileCheck %s --check-prefix=OFF

// Three update-phase AdamW updates with the same scalars and hyper-parameters become one
// multi-tensor update where the first one was; the moments declared between the updates move
// above it (in their order); the zeroing of each accumulator stays after it.

// CHECK-LABEL: func.func @adamw
// CHECK: %[[M0:.*]] = bonsai.state optimizer "a.exp_avg"
// CHECK: %[[V0:.*]] = bonsai.state optimizer "a.exp_avg_sq"
// CHECK: %[[M1:.*]] = bonsai.state optimizer "b.exp_avg"
// CHECK: %[[V1:.*]] = bonsai.state optimizer "b.exp_avg_sq"
// CHECK: %[[M2:.*]] = bonsai.state optimizer "c.exp_avg"
// CHECK: %[[V2:.*]] = bonsai.state optimizer "c.exp_avg_sq"
// CHECK-NEXT: bonsai.multi_tensor_adamw_update %[[STEP:.*]], %[[LR:.*]], %[[NORM:.*]] gradients(%[[GA:.*]], %[[GB:.*]], %[[GC:.*]] : tensor<8xf32>, tensor<4x4xf32>, tensor<2xf32>) params(%[[A:.*]], %[[B:.*]], %[[C:.*]] : tensor<8xf32>, tensor<4x4xf32>, tensor<2xf32>) exp_avg(%[[M0]], %[[M1]], %[[M2]] : {{.*}}) exp_avg_sq(%[[V0]], %[[V1]], %[[V2]] : {{.*}}) {beta1 = 9.000000e-01 : f64, beta2 = 0.99899999999999999 : f64, bonsai.phase = "update", eps = 1.000000e-08 : f64, grad_clip = 1.000000e+00 : f64, weight_decay = 0.000000e+00 : f64} : tensor<i64>, tensor<f32>, tensor<f32>
// CHECK-NOT: bonsai.adamw_update
// CHECK: bonsai.zero %[[GA]]
// CHECK: bonsai.zero %[[GB]]
// CHECK: bonsai.zero %[[GC]]
// CHECK: bonsai.step_increment %[[STEP]]
// OFF-LABEL: func.func @adamw
// OFF-COUNT-3: bonsai.adamw_update
// OFF-NOT: multi_tensor
func.func @adamw(%a: tensor<8xf32>, %b: tensor<4x4xf32>, %c: tensor<2xf32>) {
  %ga = bonsai.state gradient "a" : tensor<8xf32>
  %gb = bonsai.state gradient "b" : tensor<4x4xf32>
  %gc = bonsai.state gradient "c" : tensor<2xf32>
  %step = bonsai.state optimizer "optimizer.step" : tensor<i64>
  %lr = bonsai.learning_rate %step {bonsai.phase = "update", lr = 1.0e-3 : f64, schedule = "constant", warmup_steps = 0 : i64, total_steps = 0 : i64, min_lr_ratio = 0.0 : f64} : (tensor<i64>) -> tensor<f32>
  %norm = bonsai.grad_norm %ga, %gb, %gc {bonsai.phase = "update"} : (tensor<8xf32>, tensor<4x4xf32>, tensor<2xf32>) -> tensor<f32>
  %m0 = bonsai.state optimizer "a.exp_avg" : tensor<8xf32>
  %v0 = bonsai.state optimizer "a.exp_avg_sq" : tensor<8xf32>
  bonsai.adamw_update %ga, %step, %lr, %norm, %a, %m0, %v0 {bonsai.phase = "update", beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64, grad_clip = 1.0 : f64} : tensor<8xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  bonsai.zero %ga {bonsai.phase = "update"} : tensor<8xf32>
  %m1 = bonsai.state optimizer "b.exp_avg" : tensor<4x4xf32>
  %v1 = bonsai.state optimizer "b.exp_avg_sq" : tensor<4x4xf32>
  bonsai.adamw_update %gb, %step, %lr, %norm, %b, %m1, %v1 {bonsai.phase = "update", beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64, grad_clip = 1.0 : f64} : tensor<4x4xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>
  bonsai.zero %gb {bonsai.phase = "update"} : tensor<4x4xf32>
  %m2 = bonsai.state optimizer "c.exp_avg" : tensor<2xf32>
  %v2 = bonsai.state optimizer "c.exp_avg_sq" : tensor<2xf32>
  bonsai.adamw_update %gc, %step, %lr, %norm, %c, %m2, %v2 {bonsai.phase = "update", beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64, grad_clip = 1.0 : f64} : tensor<2xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
  bonsai.zero %gc {bonsai.phase = "update"} : tensor<2xf32>
  bonsai.step_increment %step {bonsai.phase = "update"} : tensor<i64>
  return
}

// -----

// Groups follow the hyper-parameters and the storage: the two bf16 parameters with fp32 master
// copies form one group, the f32 parameter updated with another weight decay stays alone (a
// group of one is left as it is), and so does the update whose parameter is read between the
// group's first update and it.

// CHECK-LABEL: func.func @groups(
// CHECK-SAME: %[[W0:[^:]*]]: tensor<8xbf16>, %[[W1:[^:]*]]: tensor<8xf32>, %[[W2:[^:]*]]: tensor<8xbf16>, %[[W3:[^:]*]]: tensor<8xbf16>
// CHECK: %[[MA0:.*]] = bonsai.state optimizer "w0.master"
// CHECK: %[[MA2:.*]] = bonsai.state optimizer "w2.master"
// CHECK-NEXT: bonsai.multi_tensor_adamw_update %{{.*}}, %{{.*}}, %{{.*}} gradients(%{{.*}}, %{{.*}} : tensor<8xf32>, tensor<8xf32>) params(%[[W0]], %[[W2]] : tensor<8xbf16>, tensor<8xbf16>) exp_avg({{.*}}) exp_avg_sq({{.*}}) master(%[[MA0]], %[[MA2]] : tensor<8xf32>, tensor<8xf32>) {{.*}}weight_decay = 1.000000e-01
// CHECK: bonsai.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[W1]], %{{.*}}, %{{.*}} {{.*}}weight_decay = 0.000000e+00
// CHECK: bonsai.cast %[[W3]] :
// CHECK: bonsai.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[W3]], %{{.*}}, %{{.*}}, %{{.*}} {{.*}}weight_decay = 1.000000e-01
// CHECK-NOT: multi_tensor
func.func @groups(%w0: tensor<8xbf16>, %w1: tensor<8xf32>, %w2: tensor<8xbf16>, %w3: tensor<8xbf16>, %step: tensor<i64>, %lr: tensor<f32>, %norm: tensor<f32>) -> tensor<8xf32> {
  %g0 = bonsai.state gradient "w0" : tensor<8xf32>
  %g1 = bonsai.state gradient "w1" : tensor<8xf32>
  %g2 = bonsai.state gradient "w2" : tensor<8xf32>
  %g3 = bonsai.state gradient "w3" : tensor<8xf32>
  %m0 = bonsai.state optimizer "w0.exp_avg" : tensor<8xf32>
  %v0 = bonsai.state optimizer "w0.exp_avg_sq" : tensor<8xf32>
  %ma0 = bonsai.state optimizer "w0.master" copy_of "w0" : tensor<8xf32>
  bonsai.adamw_update %g0, %step, %lr, %norm, %w0, %m0, %v0, %ma0 {bonsai.phase = "update", beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8xbf16>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  %m1 = bonsai.state optimizer "w1.exp_avg" : tensor<8xf32>
  %v1 = bonsai.state optimizer "w1.exp_avg_sq" : tensor<8xf32>
  bonsai.adamw_update %g1, %step, %lr, %norm, %w1, %m1, %v1 {bonsai.phase = "update", beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  %read = bonsai.cast %w3 : (tensor<8xbf16>) -> tensor<8xf32>
  %m2 = bonsai.state optimizer "w2.exp_avg" : tensor<8xf32>
  %v2 = bonsai.state optimizer "w2.exp_avg_sq" : tensor<8xf32>
  %ma2 = bonsai.state optimizer "w2.master" copy_of "w2" : tensor<8xf32>
  bonsai.adamw_update %g2, %step, %lr, %norm, %w2, %m2, %v2, %ma2 {bonsai.phase = "update", beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8xbf16>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  %m3 = bonsai.state optimizer "w3.exp_avg" : tensor<8xf32>
  %v3 = bonsai.state optimizer "w3.exp_avg_sq" : tensor<8xf32>
  %ma3 = bonsai.state optimizer "w3.master" copy_of "w3" : tensor<8xf32>
  bonsai.adamw_update %g3, %step, %lr, %norm, %w3, %m3, %v3, %ma3 {bonsai.phase = "update", beta1 = 0.9 : f64, beta2 = 0.999 : f64, eps = 1.0e-8 : f64, weight_decay = 0.1 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8xbf16>, tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  return %read : tensor<8xf32>
}

// -----

// Updates applied in the backward pass (update_in_backward) stay per parameter: each runs as
// soon as its gradient is complete. So do updates with different scalar operands.

// CHECK-LABEL: func.func @per_tensor
// CHECK-COUNT-4: bonsai.sgd_update
// CHECK-NOT: multi_tensor
func.func @per_tensor(%w0: tensor<8xf32>, %w1: tensor<8xf32>, %g0: tensor<8xf32>, %g1: tensor<8xf32>, %lr: tensor<f32>, %lr2: tensor<f32>, %norm: tensor<f32>, %b0: tensor<8xf32>, %b1: tensor<8xf32>) {
  bonsai.sgd_update %g0, %lr, %norm, %w0, %b0 {bonsai.phase = "backward", momentum = 0.9 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<f32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>
  bonsai.sgd_update %g1, %lr, %norm, %w1, %b1 {bonsai.phase = "backward", momentum = 0.9 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<f32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>
  bonsai.sgd_update %g0, %lr, %norm, %w0, %b0 {bonsai.phase = "update", momentum = 0.9 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<f32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>
  bonsai.sgd_update %g1, %lr2, %norm, %w1, %b1 {bonsai.phase = "update", momentum = 0.9 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<f32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>
  return
}

// -----

// SGD groups like AdamW.

// CHECK-LABEL: func.func @sgd
// CHECK: bonsai.multi_tensor_sgd_update %{{.*}}, %{{.*}} gradients(%{{.*}}, %{{.*}} : tensor<8xf32>, tensor<2x2xf32>) params(%{{.*}}, %{{.*}} : tensor<8xf32>, tensor<2x2xf32>) momentum_buffer(%{{.*}}, %{{.*}} : tensor<8xf32>, tensor<2x2xf32>) {bonsai.phase = "update", grad_clip = 0.000000e+00 : f64, momentum = 9.000000e-01 : f64, weight_decay = 0.000000e+00 : f64} : tensor<f32>, tensor<f32>
// CHECK-NOT: bonsai.sgd_update
func.func @sgd(%w0: tensor<8xf32>, %w1: tensor<2x2xf32>, %g0: tensor<8xf32>, %g1: tensor<2x2xf32>, %lr: tensor<f32>, %norm: tensor<f32>, %b0: tensor<8xf32>, %b1: tensor<2x2xf32>) {
  bonsai.sgd_update %g0, %lr, %norm, %w0, %b0 {bonsai.phase = "update", momentum = 0.9 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<8xf32>, tensor<f32>, tensor<f32>, tensor<8xf32>, tensor<8xf32>
  bonsai.sgd_update %g1, %lr, %norm, %w1, %b1 {bonsai.phase = "update", momentum = 0.9 : f64, weight_decay = 0.0 : f64, grad_clip = 0.0 : f64} : tensor<2x2xf32>, tensor<f32>, tensor<f32>, tensor<2x2xf32>, tensor<2x2xf32>
  return
}
