// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-offload %s -split-input-file -verify-diagnostics | FileCheck %s

// offload ["optimizer_state"] on AdamW: both moments of each parameter move to pinned host
// memory; each update reads device copies made right before it and writes them back right
// after it. The bf16 parameter's fp32 master copy is another class: it stays on the device.

// CHECK-LABEL: func.func @adamw
// CHECK: %[[STEP:.*]] = bonsai.state optimizer "optimizer.step" : tensor<i64>
// CHECK: %[[MASTER:.*]] = bonsai.state optimizer "lm.master" copy_of "lm" : tensor<16x8xf32>
// CHECK: %[[M1:.*]] = bonsai.state optimizer "lm.exp_avg" placement <pinned_host> : tensor<16x8xf32>
// CHECK: %[[V1:.*]] = bonsai.state optimizer "lm.exp_avg_sq" placement <pinned_host> : tensor<16x8xf32>
// CHECK: %[[DM1:.*]] = bonsai.copy_h2d %[[M1]] {bonsai.phase = "update"} : tensor<16x8xf32>
// CHECK-NEXT: %[[DV1:.*]] = bonsai.copy_h2d %[[V1]] {bonsai.phase = "update"} : tensor<16x8xf32>
// CHECK-NEXT: bonsai.adamw_update %{{.*}}, %[[STEP]], %{{.*}}, %{{.*}}, %{{.*}}, %[[DM1]], %[[DV1]], %[[MASTER]]
// CHECK-NEXT: bonsai.copy_d2h %[[DM1]], %[[M1]] {bonsai.phase = "update"} : tensor<16x8xf32>, tensor<16x8xf32>
// CHECK-NEXT: bonsai.copy_d2h %[[DV1]], %[[V1]] {bonsai.phase = "update"} : tensor<16x8xf32>, tensor<16x8xf32>
// CHECK: %[[M0:.*]] = bonsai.state optimizer "n.exp_avg" placement <pinned_host> : tensor<8xf32>
// CHECK: %[[V0:.*]] = bonsai.state optimizer "n.exp_avg_sq" placement <pinned_host> : tensor<8xf32>
// CHECK: %[[DM0:.*]] = bonsai.copy_h2d %[[M0]]
// CHECK-NEXT: %[[DV0:.*]] = bonsai.copy_h2d %[[V0]]
// CHECK-NEXT: bonsai.adamw_update %{{.*}}, %[[STEP]], %{{.*}}, %{{.*}}, %{{.*}}, %[[DM0]], %[[DV0]] {
// CHECK-NEXT: bonsai.copy_d2h %[[DM0]], %[[M0]]
// CHECK-NEXT: bonsai.copy_d2h %[[DV0]], %[[V0]]
// CHECK: bonsai.step_increment %[[STEP]]
// CHECK-NOT: placement
func.func @adamw(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  // expected-remark @+2 {{'n.exp_avg' (32 B) is kept in pinned host memory; its update copies it to the device and back}}
  // expected-remark @+1 {{'n.exp_avg_sq' (32 B) is kept in pinned host memory}}
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %hf = bonsai.cast %h : (tensor<1x4x8xbf16>) -> tensor<1x4x8xf32>
  %n = bonsai.rms_norm %hf, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %nb = bonsai.cast %n : (tensor<1x4x8xf32>) -> tensor<1x4x8xbf16>
  // expected-remark @+2 {{'lm.exp_avg' (512 B) is kept in pinned host memory}}
  // expected-remark @+1 {{'lm.exp_avg_sq' (512 B) is kept in pinned host memory}}
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %nb, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-remark @+1 {{offload: 4 state tensors of 'adamw' (1.06 KiB) in pinned host memory, each copied to the device before its update and back after it: 1.06 KiB over PCIe each way per step}}
  bonsai.offload ["optimizer_state"]
}

// -----

// master_weights alone: the bf16 parameter's fp32 master copy moves; the moments stay.

// CHECK-LABEL: func.func @masters
// CHECK: %[[MASTER:.*]] = bonsai.state optimizer "lm.master" copy_of "lm" placement <pinned_host> : tensor<16x8xf32>
// CHECK: %[[M:.*]] = bonsai.state optimizer "lm.exp_avg" : tensor<16x8xf32>
// CHECK: %[[V:.*]] = bonsai.state optimizer "lm.exp_avg_sq" : tensor<16x8xf32>
// CHECK: %[[DMASTER:.*]] = bonsai.copy_h2d %[[MASTER]]
// CHECK-NEXT: bonsai.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[M]], %[[V]], %[[DMASTER]]
// CHECK-NEXT: bonsai.copy_d2h %[[DMASTER]], %[[MASTER]]
func.func @masters(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  // expected-remark @+1 {{'lm.master' (512 B) is kept in pinned host memory}}
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-remark @+1 {{offload: 1 state tensors of 'masters' (512 B)}}
  bonsai.offload ["master_weights"]
}

// -----

// Both classes, SGD with momentum: the momentum buffer and the master copy, copied in and out
// in operand order.

// CHECK-LABEL: func.func @sgd
// CHECK: %[[MASTER:.*]] = bonsai.state optimizer "lm.master" copy_of "lm" placement <pinned_host>
// CHECK: %[[BUF:.*]] = bonsai.state optimizer "lm.momentum_buffer" placement <pinned_host>
// CHECK: %[[DBUF:.*]] = bonsai.copy_h2d %[[BUF]]
// CHECK-NEXT: %[[DMASTER:.*]] = bonsai.copy_h2d %[[MASTER]]
// CHECK-NEXT: bonsai.sgd_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[DBUF]], %[[DMASTER]]
// CHECK-NEXT: bonsai.copy_d2h %[[DBUF]], %[[BUF]]
// CHECK-NEXT: bonsai.copy_d2h %[[DMASTER]], %[[MASTER]]
func.func @sgd(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  // expected-remark @+2 {{'lm.momentum_buffer' (512 B) is kept in pinned host memory}}
  // expected-remark @+1 {{'lm.master' (512 B) is kept in pinned host memory}}
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "sgd" lr 0.1 {momentum = 0.9 : f64}
  // expected-remark @+1 {{offload: 2 state tensors of 'sgd' (1.00 KiB)}}
  bonsai.offload ["master_weights", "optimizer_state"]
}

// -----

// Updates applied in the backward pass (update_in_backward): the copies run there too, each
// around its update.

// CHECK-LABEL: func.func @in_backward
// CHECK: %[[M:.*]] = bonsai.state optimizer "lm.exp_avg" placement <pinned_host>
// CHECK: %[[V:.*]] = bonsai.state optimizer "lm.exp_avg_sq" placement <pinned_host>
// CHECK: %[[DM:.*]] = bonsai.copy_h2d %[[M]] {bonsai.phase = "backward"}
// CHECK-NEXT: %[[DV:.*]] = bonsai.copy_h2d %[[V]] {bonsai.phase = "backward"}
// CHECK-NEXT: bonsai.adamw_update {{.*}}, %[[DM]], %[[DV]] {{{.*}}bonsai.phase = "backward"
// CHECK-NEXT: bonsai.copy_d2h %[[DM]], %[[M]] {bonsai.phase = "backward"}
// CHECK-NEXT: bonsai.copy_d2h %[[DV]], %[[V]] {bonsai.phase = "backward"}
func.func @in_backward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  // expected-remark @+2 {{'lm.exp_avg' (512 B)}}
  // expected-remark @+1 {{'lm.exp_avg_sq' (512 B)}}
  %lm = bonsai.param "lm" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3 {update_in_backward = true}
  // expected-remark @+1 {{offload: 2 state tensors of 'in_backward' (1.00 KiB)}}
  bonsai.offload ["optimizer_state"]
}
