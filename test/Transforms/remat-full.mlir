// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat %s -split-input-file -verify-diagnostics | FileCheck %s
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat %s -split-input-file -verify-diagnostics | FileCheck %s --check-prefix=KEPT

// Policy `full` (from the recipe) on one Llama decoder layer: only the block inputs are kept,
// the values an rms_norm normalises (%h, %res1, %res2: NormalizationOpInterface); every other
// saved value is recomputed right before its first backward use, the values it is computed
// from first (in forward order), and views with their sources. One remark per recomputed
// tensor, one for the policy.

// KEPT-NOT: bonsai.embedding {{.*}}bonsai.recomputed
// KEPT-NOT: bonsai.add {{.*}}bonsai.recomputed

// CHECK-LABEL: func.func @block
// CHECK: %[[H:.*]] = bonsai.embedding
// CHECK: %[[LN1W:.*]] = bonsai.param "ln1"
// CHECK: %[[QW:.*]] = bonsai.param "q"
// CHECK: %[[KW:.*]] = bonsai.param "k"
// CHECK: %[[VW:.*]] = bonsai.param "v"
// CHECK: %[[RES1:.*]] = bonsai.add %[[H]], %{{.*}} : (tensor<2x32x16xf32>, tensor<2x32x16xf32>)
// CHECK: %[[LN2W:.*]] = bonsai.param "ln2"
// CHECK: %[[GATEW:.*]] = bonsai.param "gate"
// CHECK: %[[UPW:.*]] = bonsai.param "up"
// CHECK: %[[RES2:.*]] = bonsai.add %[[RES1]], %{{.*}} : (tensor<2x32x16xf32>, tensor<2x32x16xf32>)
// CHECK: %[[NORMW:.*]] = bonsai.param "norm"
// CHECK: %[[HEADW:.*]] = bonsai.param "lm_head"
// CHECK: bonsai.cross_entropy %{{.*}}, %arg1 :

// The head: the logits and the final norm, recomputed before the loss's gradient.
// CHECK: %[[SEED:.*]] = bonsai.loss_scale
// CHECK-NEXT: %[[NORM:.*]] = bonsai.rms_norm %[[RES2]], %[[NORMW]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[LOGITS:.*]] = bonsai.linear %[[NORM]], %[[HEADW]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: bonsai.cross_entropy_grad %[[SEED]], %[[LOGITS]], %arg1
// CHECK: bonsai.linear_grad_weight %{{.*}}, %[[NORM]]
// CHECK: bonsai.rms_norm_grad %{{.*}}, %[[RES2]], %[[NORMW]]

// The MLP, before the down projection's weight gradient (its first reader of %act).
// CHECK: %[[LN2:.*]] = bonsai.rms_norm %[[RES1]], %[[LN2W]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[GATE:.*]] = bonsai.linear %[[LN2]], %[[GATEW]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[UP:.*]] = bonsai.linear %[[LN2]], %[[UPW]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[ACT:.*]] = bonsai.swiglu %[[GATE]], %[[UP]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[DDOWN:.*]] = bonsai.linear_grad_weight %{{.*}}, %[[ACT]]
// CHECK-NEXT: %[[DOWNACC:.*]] = bonsai.state gradient "down"
// CHECK-NEXT: bonsai.accumulate %[[DDOWN]], %[[DOWNACC]]
// CHECK-NEXT: bonsai.swiglu_grad %{{.*}}, %[[GATE]], %[[UP]]
// CHECK: bonsai.linear_grad_weight %{{.*}}, %[[LN2]]
// CHECK: bonsai.rms_norm_grad %{{.*}}, %[[RES1]], %[[LN2W]]

// Attention: the projections, their views, rope and attention itself.
// CHECK: %[[LN1:.*]] = bonsai.rms_norm %[[H]], %[[LN1W]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[Q:.*]] = bonsai.linear %[[LN1]], %[[QW]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[K:.*]] = bonsai.linear %[[LN1]], %[[KW]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[V:.*]] = bonsai.linear %[[LN1]], %[[VW]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[Q4:.*]] = bonsai.reshape %[[Q]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[K4:.*]] = bonsai.reshape %[[K]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[V4:.*]] = bonsai.reshape %[[V]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[QR:.*]] = bonsai.rope %[[Q4]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[KR:.*]] = bonsai.rope %[[K4]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: %[[ATTN:.*]] = bonsai.attention %[[QR]], %[[KR]], %[[V4]] {bonsai.phase = "backward", bonsai.recomputed, causal
// CHECK-NEXT: %[[ATTN2:.*]] = bonsai.reshape %[[ATTN]] {bonsai.phase = "backward", bonsai.recomputed}
// CHECK-NEXT: bonsai.linear_grad_weight %{{.*}}, %[[ATTN2]]
// CHECK: bonsai.attention_grad %{{.*}}, %[[QR]], %[[KR]], %[[V4]], %[[ATTN]]
// CHECK: bonsai.linear_grad_weight %{{.*}}, %[[LN1]]
// CHECK: bonsai.rms_norm_grad %{{.*}}, %[[H]], %[[LN1W]]
// CHECK: bonsai.adamw_update

// expected-remark @below {{bonsai-remat (policy 'full'): recomputes 13 tensors (3 rms_norm, 6 linear, 2 rope, 1 attention, 1 swiglu) for 401,728 FLOPs per step, 25.10% of the step's 1,600,529; planned device peak 140.25 KiB -> 116.25 KiB}}
func.func @block(%ids: tensor<2x32xi32>, %labels: tensor<2x32xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x16xf32>, tensor<2x32xi32>) -> tensor<2x32x16xf32>
  %ln1_w = bonsai.param "ln1" trainable : tensor<16xf32>
  // expected-remark @below {{recomputed in the backward pass: 'tensor<2x32x16xf32>' (4.00 KiB), 4,096 FLOPs (0.26% of the step)}}
  %ln1 = bonsai.rms_norm %h, %ln1_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %q_w = bonsai.param "q" trainable : tensor<16x16xf32>
  // expected-remark @below {{recomputed in the backward pass: 'tensor<2x32x16xf32>' (4.00 KiB), 32,768 FLOPs (2.05% of the step)}}
  %q = bonsai.linear %ln1, %q_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %k_w = bonsai.param "k" trainable : tensor<16x16xf32>
  // expected-remark @below {{recomputed in the backward pass}}
  %k = bonsai.linear %ln1, %k_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %v_w = bonsai.param "v" trainable : tensor<16x16xf32>
  // expected-remark @below {{recomputed in the backward pass}}
  %v = bonsai.linear %ln1, %v_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x32x16xf32>) -> tensor<2x32x2x8xf32>
  %k4 = bonsai.reshape %k : (tensor<2x32x16xf32>) -> tensor<2x32x2x8xf32>
  %v4 = bonsai.reshape %v : (tensor<2x32x16xf32>) -> tensor<2x32x2x8xf32>
  // expected-remark @below {{recomputed in the backward pass: 'tensor<2x32x2x8xf32>' (4.00 KiB), 3,072 FLOPs (0.19% of the step)}}
  %qr = bonsai.rope %q4 : (tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  // expected-remark @below {{recomputed in the backward pass}}
  %kr = bonsai.rope %k4 : (tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  // expected-remark @below {{recomputed in the backward pass: 'tensor<2x32x2x8xf32>' (4.00 KiB), 78,144 FLOPs (4.88% of the step)}}
  %attn = bonsai.attention %qr, %kr, %v4 {causal, scale = 2.500000e-01 : f64} : (tensor<2x32x2x8xf32>, tensor<2x32x2x8xf32>, tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  %attn2 = bonsai.reshape %attn : (tensor<2x32x2x8xf32>) -> tensor<2x32x16xf32>
  %o_w = bonsai.param "o" trainable : tensor<16x16xf32>
  %o = bonsai.linear %attn2, %o_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %res1 = bonsai.add %h, %o : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %ln2_w = bonsai.param "ln2" trainable : tensor<16xf32>
  // expected-remark @below {{recomputed in the backward pass}}
  %ln2 = bonsai.rms_norm %res1, %ln2_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %gate_w = bonsai.param "gate" trainable : tensor<32x16xf32>
  // expected-remark @below {{recomputed in the backward pass: 'tensor<2x32x32xf32>' (8.00 KiB), 65,536 FLOPs (4.09% of the step)}}
  %gate = bonsai.linear %ln2, %gate_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %up_w = bonsai.param "up" trainable : tensor<32x16xf32>
  // expected-remark @below {{recomputed in the backward pass}}
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
  // expected-remark @below {{recomputed in the backward pass}}
  %logits = bonsai.linear %norm, %head_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x32x32xf32>, tensor<2x32xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
  bonsai.remat "full"
}

// -----

// Values computed from frozen weights and inputs only are recomputed as well; a value the
// function returns (the loss) never is. The loss reads the logits, so the logits' original
// stays alive until the loss, and the backward pass reads the clone.

// CHECK-LABEL: func.func @frozen
// CHECK: %[[N:.*]] = bonsai.rms_norm
// CHECK: %[[L:.*]] = bonsai.linear %[[N]]
// CHECK: %[[LOSS:.*]] = bonsai.cross_entropy %[[L]]
// CHECK: %[[SEED:.*]] = bonsai.loss_scale
// CHECK-NEXT: %[[N2:.*]] = bonsai.rms_norm {{.*}}bonsai.recomputed
// CHECK-NEXT: %[[L2:.*]] = bonsai.linear %[[N2]], {{.*}}bonsai.recomputed
// CHECK-NEXT: bonsai.cross_entropy_grad %[[SEED]], %[[L2]]
// CHECK: return %[[LOSS]]

// expected-remark @below {{bonsai-remat (policy 'full'): recomputes 2 tensors (1 rms_norm, 1 linear)}}
func.func @frozen(%ids: tensor<2x32xi32>, %labels: tensor<2x32xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" frozen : tensor<32x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x16xf32>, tensor<2x32xi32>) -> tensor<2x32x16xf32>
  %norm_w = bonsai.param "norm" frozen : tensor<16xf32>
  // expected-remark @below {{recomputed in the backward pass}}
  %norm = bonsai.rms_norm %h, %norm_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %head_w = bonsai.param "lm_head" trainable : tensor<32x16xf32>
  // expected-remark @below {{recomputed in the backward pass}}
  %logits = bonsai.linear %norm, %head_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x32x32xf32>, tensor<2x32xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
  bonsai.remat "full"
}
