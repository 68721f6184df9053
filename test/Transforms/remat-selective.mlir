// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat=policy=selective %s -verify-diagnostics | FileCheck %s
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat=policy=selective %s -verify-diagnostics | FileCheck %s --check-prefix=KEPT

// Policy `selective` (the pass option; it overrides the recipe's "none") on one Llama
// decoder layer: block inputs and GEMM outputs (linear and attention, whose forward cost has
// tensor-core FLOPs) are kept; the cheap, memory-heavy rest is recomputed: the three norms,
// rope (from the kept projections' views) and the SwiGLU activation (from the kept gate and
// up projections). Each clone goes right before its first backward use.

// KEPT-NOT: bonsai.linear {{.*}}bonsai.recomputed
// KEPT-NOT: bonsai.attention {{.*}}bonsai.recomputed
// KEPT-NOT: bonsai.reshape {{.*}}bonsai.recomputed
// KEPT-NOT: bonsai.add {{.*}}bonsai.recomputed
// KEPT-NOT: bonsai.embedding {{.*}}bonsai.recomputed

// CHECK-LABEL: func.func @block
// CHECK: %[[H:.*]] = bonsai.embedding
// CHECK: %[[LN1W:.*]] = bonsai.param "ln1"
// CHECK: %[[Q4:.*]] = bonsai.reshape
// CHECK-NEXT: %[[K4:.*]] = bonsai.reshape
// CHECK-NEXT: %[[V4:.*]] = bonsai.reshape
// CHECK: %[[ATTN:.*]] = bonsai.attention
// CHECK: %[[ATTN2:.*]] = bonsai.reshape %[[ATTN]]
// CHECK: %[[RES1:.*]] = bonsai.add %[[H]]
// CHECK: %[[LN2W:.*]] = bonsai.param "ln2"
// CHECK: %[[GATE:.*]] = bonsai.linear
// CHECK: %[[UP:.*]] = bonsai.linear
// CHECK: %[[RES2:.*]] = bonsai.add %[[RES1]]
// CHECK: %[[NORMW:.*]] = bonsai.param "norm"
// CHECK: %[[LOGITS:.*]] = bonsai.linear
// CHECK: bonsai.loss_scale
// CHECK-NEXT: bonsai.cross_entropy_grad %{{.*}}, %[[LOGITS]], %arg1
// CHECK-NEXT: bonsai.linear_grad_input
// CHECK-NEXT: %[[NORM:.*]] = bonsai.rms_norm %[[RES2]], %[[NORMW]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: bonsai.linear_grad_weight %{{.*}}, %[[NORM]]
// CHECK: %[[ACT:.*]] = bonsai.swiglu %[[GATE]], %[[UP]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[DDOWN:.*]] = bonsai.linear_grad_weight %{{.*}}, %[[ACT]]
// CHECK-NEXT: %[[DOWNACC:.*]] = bonsai.state gradient "down"
// CHECK-NEXT: bonsai.accumulate %[[DDOWN]], %[[DOWNACC]]
// CHECK-NEXT: bonsai.swiglu_grad %{{.*}}, %[[GATE]], %[[UP]]
// CHECK: %[[LN2:.*]] = bonsai.rms_norm %[[RES1]], %[[LN2W]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: bonsai.linear_grad_weight %{{.*}}, %[[LN2]]
// CHECK: bonsai.linear_grad_weight %{{.*}}, %[[ATTN2]]
// CHECK: %[[QR:.*]] = bonsai.rope %[[Q4]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[KR:.*]] = bonsai.rope %[[K4]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: bonsai.attention_grad %{{.*}}, %[[QR]], %[[KR]], %[[V4]], %[[ATTN]]
// CHECK: %[[LN1:.*]] = bonsai.rms_norm %[[H]], %[[LN1W]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: bonsai.linear_grad_weight %{{.*}}, %[[LN1]]

// expected-remark @below {{bonsai-remat (policy 'selective'): recomputes 6 tensors (3 rms_norm, 2 rope, 1 swiglu) for 28,672 FLOPs per step, 1.79% of the step's 1,600,529; planned device peak 140.25 KiB -> 128.25 KiB}}
func.func @block(%ids: tensor<2x32xi32>, %labels: tensor<2x32xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x16xf32>, tensor<2x32xi32>) -> tensor<2x32x16xf32>
  %ln1_w = bonsai.param "ln1" trainable : tensor<16xf32>
  // expected-remark @below {{recomputed in the backward pass}}
  %ln1 = bonsai.rms_norm %h, %ln1_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %q_w = bonsai.param "q" trainable : tensor<16x16xf32>
  %q = bonsai.linear %ln1, %q_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %k_w = bonsai.param "k" trainable : tensor<16x16xf32>
  %k = bonsai.linear %ln1, %k_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %v_w = bonsai.param "v" trainable : tensor<16x16xf32>
  %v = bonsai.linear %ln1, %v_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x32x16xf32>) -> tensor<2x32x2x8xf32>
  %k4 = bonsai.reshape %k : (tensor<2x32x16xf32>) -> tensor<2x32x2x8xf32>
  %v4 = bonsai.reshape %v : (tensor<2x32x16xf32>) -> tensor<2x32x2x8xf32>
  // expected-remark @below {{recomputed in the backward pass: 'tensor<2x32x2x8xf32>' (4.00 KiB), 3,072 FLOPs (0.19% of the step)}}
  %qr = bonsai.rope %q4 : (tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  // expected-remark @below {{recomputed in the backward pass}}
  %kr = bonsai.rope %k4 : (tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  %attn = bonsai.attention %qr, %kr, %v4 {causal, scale = 2.500000e-01 : f64} : (tensor<2x32x2x8xf32>, tensor<2x32x2x8xf32>, tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  %attn2 = bonsai.reshape %attn : (tensor<2x32x2x8xf32>) -> tensor<2x32x16xf32>
  %o_w = bonsai.param "o" trainable : tensor<16x16xf32>
  %o = bonsai.linear %attn2, %o_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %res1 = bonsai.add %h, %o : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %ln2_w = bonsai.param "ln2" trainable : tensor<16xf32>
  // expected-remark @below {{recomputed in the backward pass}}
  %ln2 = bonsai.rms_norm %res1, %ln2_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %gate_w = bonsai.param "gate" trainable : tensor<32x16xf32>
  %gate = bonsai.linear %ln2, %gate_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %up_w = bonsai.param "up" trainable : tensor<32x16xf32>
  %up = bonsai.linear %ln2, %up_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  // expected-remark @below {{recomputed in the backward pass: 'tensor<2x32x32xf32>' (8.00 KiB), 10,240 FLOPs (0.64% of the step)}}
  %act = bonsai.swiglu %gate, %up : (tensor<2x32x32xf32>, tensor<2x32x32xf32>) -> tensor<2x32x32xf32>
  %down_w = bonsai.param "down" trainable : tensor<16x32xf32>
  %down = bonsai.linear %act, %down_w : (tensor<2x32x32xf32>, tensor<16x32xf32>) -> tensor<2x32x16xf32>
  %res2 = bonsai.add %res1, %down : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %norm_w = bonsai.param "norm" trainable : tensor<16xf32>
  // expected-remark @below {{recomputed in the backward pass}}
  %norm = bonsai.rms_norm %res2, %norm_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %head_w = bonsai.param "lm_head" trainable : tensor<32x16xf32>
  %logits = bonsai.linear %norm, %head_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x32x32xf32>, tensor<2x32xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
  bonsai.remat "none"
}
