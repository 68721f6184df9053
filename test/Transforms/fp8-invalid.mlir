// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_90 per-linear-remarks=false' %s -split-input-file -verify-diagnostics | FileCheck %s
// RUN: bonsai-opt '--bonsai-fp8=target=sm_90' %S/Inputs/fp8-no-step.mlir -verify-diagnostics -o /dev/null
// RUN: not bonsai-opt '--bonsai-fp8=target=sm_7x' %S/Inputs/fp8-no-step.mlir -o /dev/null 2>&1 | FileCheck %s --check-prefix=TARGET
// TARGET: error: bonsai-fp8: unknown target 'sm_7x'; expected sm_XX, cpu or a named GPU (docs/targets.md)

// Linears bonsai-fp8 cannot run in FP8 keep their GEMMs, each with a remark naming the reason;
// a step it cannot update is an error.

// 8 positions: M is not a multiple of 16. `targets []` also leaves the LM head alone.
// CHECK-LABEL: func.func @positions
// CHECK-NOT: fp8_
// CHECK: bonsai.step_increment
func.func @positions(%ids: tensor<1x8xi32>, %labels: tensor<1x8xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<1x8xi32>) -> tensor<1x8x16xf32>
  %w = bonsai.param "blk.up_proj.weight" trainable : tensor<32x16xf32>
  // expected-remark @+1 {{bonsai-fp8: 'blk.up_proj.weight' stays in f32: M (positions) is 8, not a multiple of 16 as FP8 tensor cores need}}
  %u = bonsai.linear %h, %w : (tensor<1x8x16xf32>, tensor<32x16xf32>) -> tensor<1x8x32xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<64x32xf32>
  %logits = bonsai.linear %u, %lm : (tensor<1x8x32xf32>, tensor<64x32xf32>) -> tensor<1x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x8x64xf32>, tensor<1x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-remark @+1 {{bonsai-fp8: 0 linears in FP8 on sm_90 (E4M3 forward, E5M2 gradients), delayed scaling with an amax history of 16, margin 0, promoted forward accumulation; state 0 bytes; 1 targeted linear stays as it was (see the remark on it)}}
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets []
}

// -----

// N = 24 (the default set: an explicit target would be refused by the directive's checks).
// CHECK-LABEL: func.func @features
// CHECK: bonsai.fp8_linear %{{.*}} -> (tensor<1x16x32xf32>
// CHECK: bonsai.linear %{{.*}} -> tensor<1x16x24xf32>
func.func @features(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<1x16xi32>) -> tensor<1x16x16xf32>
  %w = bonsai.param "blk.up_proj.weight" trainable : tensor<32x16xf32>
  %u = bonsai.linear %h, %w : (tensor<1x16x16xf32>, tensor<32x16xf32>) -> tensor<1x16x32xf32>
  %w2 = bonsai.param "blk.odd_proj.weight" trainable : tensor<24x32xf32>
  // expected-remark @+1 {{bonsai-fp8: 'blk.odd_proj.weight' stays in f32: N (output features) is 24, not a multiple of 16 as FP8 tensor cores need}}
  %o = bonsai.linear %u, %w2 : (tensor<1x16x32xf32>, tensor<24x32xf32>) -> tensor<1x16x24xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<64x24xf32>
  %logits = bonsai.linear %o, %lm : (tensor<1x16x24xf32>, tensor<64x24xf32>) -> tensor<1x16x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x16x64xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-remark @+1 {{bonsai-fp8: 1 linear in FP8 on sm_90 (E4M3 forward, E5M2 gradients), delayed scaling with an amax history of 16, margin 0, promoted forward accumulation; state 240 bytes; 1 targeted linear stays as it was (see the remark on it)}}
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets []
}

// -----

// A weight two linears read (tied): one state per linear could not hold both inputs' amaxes.
// CHECK-LABEL: func.func @tied
// CHECK-NOT: fp8_
// CHECK: bonsai.step_increment
func.func @tied(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<1x16xi32>) -> tensor<1x16x16xf32>
  %w = bonsai.param "blk.mix_proj.weight" trainable : tensor<16x16xf32>
  // expected-remark @+1 {{bonsai-fp8: 'blk.mix_proj.weight' stays in f32: its weight is read by 2 linears (tied), and the scaling state is per linear}}
  %a = bonsai.linear %h, %w : (tensor<1x16x16xf32>, tensor<16x16xf32>) -> tensor<1x16x16xf32>
  // expected-remark @+1 {{bonsai-fp8: 'blk.mix_proj.weight' stays in f32: its weight is read by 2 linears (tied), and the scaling state is per linear}}
  %b = bonsai.linear %a, %w : (tensor<1x16x16xf32>, tensor<16x16xf32>) -> tensor<1x16x16xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<64x16xf32>
  %logits = bonsai.linear %b, %lm : (tensor<1x16x16xf32>, tensor<64x16xf32>) -> tensor<1x16x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x16x64xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-remark @+1 {{bonsai-fp8: 0 linears in FP8 on sm_90 (E4M3 forward, E5M2 gradients), delayed scaling with an amax history of 16, margin 0, promoted forward accumulation; state 0 bytes; 2 targeted linears stay as they were (see the remarks on them)}}
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["mix_proj"]
}

// -----

// The input needs no gradient (a frozen embedding) and two weights of one shape read it: which
// linear_grad_weight is whose cannot be told from the GEMMs, so both stay. A third linear with
// a frozen weight has no backward GEMM at all: its forward runs in FP8 and only the forward
// statistics update its state (folded over the micro-batches into one accumulator, which the
// update phase clears after the update).
// CHECK-LABEL: func.func @ambiguous
// CHECK: %[[S:.*]] = bonsai.state optimizer "blk.frozen_proj.weight.fp8" : tensor<3x20xf32>
// CHECK-NEXT: %[[FSA:.*]] = bonsai.state gradient "blk.frozen_proj.weight.fp8.forward_stats" : tensor<2x4xf32>
// CHECK: %{{.*}}, %[[FS:.*]], %{{.*}} = bonsai.fp8_linear %{{.*}}, %{{.*}}, %[[S]]
// CHECK: bonsai.accumulate_max %[[FS]], %[[FSA]] : tensor<2x4xf32>, tensor<2x4xf32>
// CHECK-NOT: bonsai.fp8_linear_grad
// CHECK: bonsai.fp8_update_scales %{{.*}}, %[[FSA]], %[[S]] {bonsai.phase = "update", current = false, margin = 0 : i64} : tensor<i64>, tensor<2x4xf32>, tensor<3x20xf32>
// CHECK-NEXT: bonsai.zero %[[FSA]] {bonsai.phase = "update"}
// CHECK-NEXT: bonsai.step_increment
func.func @ambiguous(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<1x16xi32>) -> tensor<1x16x16xf32>
  %wf = bonsai.param "blk.frozen_proj.weight" frozen : tensor<16x16xf32>
  %f = bonsai.linear %h, %wf : (tensor<1x16x16xf32>, tensor<16x16xf32>) -> tensor<1x16x16xf32>
  %wa = bonsai.param "blk.a_proj.weight" trainable : tensor<16x16xf32>
  // expected-remark @+1 {{bonsai-fp8: 'blk.a_proj.weight' stays in f32: 2 linear_grad_weight ops of its weight's type read its input and the input needs no gradient, so its weight gradient cannot be told apart}}
  %a = bonsai.linear %f, %wa : (tensor<1x16x16xf32>, tensor<16x16xf32>) -> tensor<1x16x16xf32>
  %wb = bonsai.param "blk.b_proj.weight" trainable : tensor<16x16xf32>
  // expected-remark @+1 {{bonsai-fp8: 'blk.b_proj.weight' stays in f32: 2 linear_grad_weight ops of its weight's type read its input and the input needs no gradient, so its weight gradient cannot be told apart}}
  %b = bonsai.linear %f, %wb : (tensor<1x16x16xf32>, tensor<16x16xf32>) -> tensor<1x16x16xf32>
  %s = bonsai.add %a, %b : (tensor<1x16x16xf32>, tensor<1x16x16xf32>) -> tensor<1x16x16xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<64x16xf32>
  %logits = bonsai.linear %s, %lm : (tensor<1x16x16xf32>, tensor<64x16xf32>) -> tensor<1x16x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x16x64xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-remark @+1 {{bonsai-fp8: 1 linear in FP8 on sm_90 (E4M3 forward, E5M2 gradients), delayed scaling with an amax history of 16, margin 0, promoted forward accumulation; state 240 bytes; 2 targeted linears stay as they were (see the remarks on them)}}
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["*_proj.weight"]
}

// -----

// The input needs no gradient and two linears of one weight type read it; one weight is
// frozen, so the only linear_grad_weight reading the input is the trainable one's: each linear
// gets its own backward (the frozen one none).
// CHECK-LABEL: func.func @frozen_neighbour
// CHECK: %[[SF:.*]] = bonsai.state optimizer "blk.frozen_proj.weight.fp8"
// CHECK: %[[ST:.*]] = bonsai.state optimizer "blk.up_proj.weight.fp8"
// CHECK: bonsai.fp8_linear_grad_weight %{{.*}}, %{{.*}}, %[[ST]]
// CHECK-NOT: bonsai.fp8_linear_grad
// CHECK: bonsai.fp8_update_scales %{{.*}}, %{{.*}}, %[[SF]] {
// CHECK-NEXT: bonsai.zero
// CHECK-NEXT: bonsai.fp8_update_scales %{{.*}}, %{{.*}}, %{{.*}}, %[[ST]] {
func.func @frozen_neighbour(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<1x16xi32>) -> tensor<1x16x16xf32>
  %wf = bonsai.param "blk.frozen_proj.weight" frozen : tensor<16x16xf32>
  %f = bonsai.linear %h, %wf : (tensor<1x16x16xf32>, tensor<16x16xf32>) -> tensor<1x16x16xf32>
  %wt = bonsai.param "blk.up_proj.weight" trainable : tensor<16x16xf32>
  %t = bonsai.linear %h, %wt : (tensor<1x16x16xf32>, tensor<16x16xf32>) -> tensor<1x16x16xf32>
  %s = bonsai.add %f, %t : (tensor<1x16x16xf32>, tensor<1x16x16xf32>) -> tensor<1x16x16xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<64x16xf32>
  %logits = bonsai.linear %s, %lm : (tensor<1x16x16xf32>, tensor<64x16xf32>) -> tensor<1x16x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x16x64xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-remark @+1 {{bonsai-fp8: 2 linears in FP8 on sm_90 (E4M3 forward, E5M2 gradients), delayed scaling with an amax history of 16, margin 0, promoted forward accumulation; state 480 bytes}}
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["*_proj.weight"]
}

// -----

// A trainable weight whose output does not reach the loss (%a is unused) gets no gradient: the only
// linear_grad_weight reading the shared input is its neighbour's, which both would claim.
// CHECK-LABEL: func.func @claimed_twice
// CHECK-NOT: fp8_
// CHECK: bonsai.step_increment
func.func @claimed_twice(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<1x16xi32>) -> tensor<1x16x16xf32>
  // expected-warning @+1 {{trainable parameter 'blk.a_proj.weight' does not influence the loss; it gets no gradient}}
  %wa = bonsai.param "blk.a_proj.weight" trainable : tensor<16x16xf32>
  // expected-remark @+1 {{bonsai-fp8: 'blk.a_proj.weight' stays in f32: its backward GEMM 'bonsai.linear_grad_weight' could be another targeted linear's, so its backward cannot be told apart}}
  %a = bonsai.linear %h, %wa : (tensor<1x16x16xf32>, tensor<16x16xf32>) -> tensor<1x16x16xf32>
  %wb = bonsai.param "blk.b_proj.weight" trainable : tensor<16x16xf32>
  // expected-remark @+1 {{bonsai-fp8: 'blk.b_proj.weight' stays in f32: its backward GEMM 'bonsai.linear_grad_weight' could be another targeted linear's, so its backward cannot be told apart}}
  %b = bonsai.linear %h, %wb : (tensor<1x16x16xf32>, tensor<16x16xf32>) -> tensor<1x16x16xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<64x16xf32>
  %logits = bonsai.linear %b, %lm : (tensor<1x16x16xf32>, tensor<64x16xf32>) -> tensor<1x16x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x16x64xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-remark @+1 {{bonsai-fp8: 0 linears in FP8 on sm_90 (E4M3 forward, E5M2 gradients), delayed scaling with an amax history of 16, margin 0, promoted forward accumulation; state 0 bytes; 2 targeted linears stay as they were (see the remarks on them)}}
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["*_proj.weight"]
}
