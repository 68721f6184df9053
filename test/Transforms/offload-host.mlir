// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-offload %s -split-input-file -verify-diagnostics | FileCheck %s
// The pass options instead of the recipe's directive:
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=classes=optimizer_state update=host per-tensor-remarks=false' %S/Inputs/offload-host-option.mlir 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=classes=optimizer_state update=cpu' %S/Inputs/offload-host-option.mlir 2>&1 | FileCheck %s --check-prefix=BAD-PLACEMENT
// RUN: not bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-offload=classes=master_weights update=host' %S/Inputs/offload-host-option.mlir 2>&1 | FileCheck %s --check-prefix=NO-STATE

// OPTION: remark: offload: 1 updates of 'f' run on the host over 2 state tensors (1.00 KiB) in pinned host memory: 520 B over PCIe to the host and 512 B to the device per step
// OPTION: %[[COPY:.*]] = bonsai.state optimizer "lm.host_copy" copy_of "lm" placement <pinned_host> : tensor<16x8xf32>
// OPTION: bonsai.sgd_update %{{.*}}, %{{.*}}, %{{.*}}, %[[COPY]], %{{.*}} {
// OPTION-NEXT: bonsai.copy_to_device %[[COPY]], %{{.*}} {bonsai.phase = "update"}
// BAD-PLACEMENT: error: unknown update placement 'cpu'; expected 'device', 'host' or 'auto'
// NO-STATE: error: update "host" runs the optimizer updates on the CPU over their state in pinned host memory: offload 'optimizer_state' too

// update "host" (docs/offload.md, "The host step"): the update reads and writes its state
// where it is kept, in pinned host memory, and a pinned host copy of its parameter (a state
// that starts as the parameter); what it only reads (the gradient, the step counter, the
// learning rate, the norm) is copied to the host right before it, and the parameter's copy
// into the parameter right after it.

// CHECK-LABEL: func.func @adamw
// CHECK: %[[LM:.*]] = bonsai.param "lm" trainable : tensor<16x8xbf16>
// CHECK: %[[ACC:.*]] = bonsai.state gradient "lm" {{.*}}: tensor<16x8xf32>
// CHECK: %[[STEP:.*]] = bonsai.state optimizer "optimizer.step" : tensor<i64>
// CHECK: %[[LR:.*]] = bonsai.learning_rate %[[STEP]]
// CHECK: %[[NORM:.*]] = bonsai.grad_norm %[[ACC]]
// CHECK: %[[MASTER:.*]] = bonsai.state optimizer "lm.master" copy_of "lm" placement <pinned_host> : tensor<16x8xf32>
// CHECK: %[[M:.*]] = bonsai.state optimizer "lm.exp_avg" placement <pinned_host> : tensor<16x8xf32>
// CHECK: %[[V:.*]] = bonsai.state optimizer "lm.exp_avg_sq" placement <pinned_host> : tensor<16x8xf32>
// CHECK: %[[COPY:.*]] = bonsai.state optimizer "lm.host_copy" copy_of "lm" placement <pinned_host> : tensor<16x8xbf16>
// CHECK-NEXT: %[[G:.*]] = bonsai.copy_to_host %[[ACC]] {bonsai.phase = "update"} : tensor<16x8xf32>
// CHECK-NEXT: %[[S:.*]] = bonsai.copy_to_host %[[STEP]] {bonsai.phase = "update"} : tensor<i64>
// CHECK-NEXT: %[[L:.*]] = bonsai.copy_to_host %[[LR]] {bonsai.phase = "update"} : tensor<f32>
// CHECK-NEXT: %[[N:.*]] = bonsai.copy_to_host %[[NORM]] {bonsai.phase = "update"} : tensor<f32>
// CHECK-NEXT: bonsai.adamw_update %[[G]], %[[S]], %[[L]], %[[N]], %[[COPY]], %[[M]], %[[V]], %[[MASTER]]
// CHECK-NEXT: bonsai.copy_to_device %[[COPY]], %[[LM]] {bonsai.phase = "update"} : tensor<16x8xbf16>, tensor<16x8xbf16>
// CHECK-NEXT: bonsai.zero %[[ACC]]
// CHECK-NEXT: bonsai.step_increment %[[STEP]]
func.func @adamw(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  // expected-remark @+3 {{'lm.exp_avg' (512 B) is kept in pinned host memory, where its update runs on the host}}
  // expected-remark @+2 {{'lm.exp_avg_sq' (512 B) is kept in pinned host memory}}
  // expected-remark @+1 {{'lm.master' (512 B) is kept in pinned host memory}}
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-remark @+1 {{offload: 1 updates of 'adamw' run on the host over 4 state tensors (1.75 KiB) in pinned host memory: 528 B over PCIe to the host and 256 B to the device per step}}
  bonsai.offload ["optimizer_state", "master_weights"] update "host"
}

// -----

// Every operand the update writes must be on the host: a model with fp32 master weights
// offloads them too.
func.func @masters(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-error @+1 {{update "host" runs each update over its state in pinned host memory, and 'masters' keeps fp32 master weights: offload 'master_weights' too}}
  bonsai.offload ["optimizer_state"] update "host"
}

// -----

bonsai.recipe @r {
  // expected-error @+1 {{update "host" runs the optimizer updates on the CPU over their state in pinned host memory: list "optimizer_state"}}
  bonsai.offload ["master_weights"] update "host"
}

// -----

bonsai.recipe @r {
  // expected-error @+1 {{unknown update 'gpu'; expected one of: 'device', 'host', 'auto'}}
  bonsai.offload ["optimizer_state"] update "gpu"
}
