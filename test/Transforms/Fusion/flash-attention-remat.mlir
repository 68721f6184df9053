// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat --bonsai-fuse -split-input-file %s 2> %t.remarks | FileCheck %s
// RUN: FileCheck %s --check-prefix=REMARK < %t.remarks

// With policy `full`, bonsai-remat recomputes the attention in the backward pass, and the
// attention_grad reads the clone's output. The clone becomes the flash_attention (it keeps
// its bonsai.recomputed and backward phase), so the grad reads the log-sum-exp of the very
// clone whose output it reads; the forward's own attention has no grad reading it and stays
// a plain attention (nothing would read its log-sum-exp).

// REMARK: remark: bonsai-fuse: 1 attention -> flash_attention; 1 attention_grad -> flash_attention_grad
// CHECK-LABEL: func.func @attn
// CHECK: %[[FWD:.*]] = bonsai.attention %{{.*}} {causal, scale = 3.535530e-01 : f64}
// CHECK: bonsai.reshape %[[FWD]]
// CHECK: %[[O:.*]], %[[LSE:.*]] = bonsai.flash_attention %[[Q:[^,]*]], %[[K:[^,]*]], %[[V:[^ ]*]] {bonsai.phase = "backward", bonsai.recomputed, causal, scale = 3.535530e-01 : f64} : ({{.*}}) -> (tensor<2x16x2x8xf32>, tensor<2x2x16xf32>)
// CHECK: bonsai.flash_attention_grad %{{.*}}, %[[Q]], %[[K]], %[[V]], %[[O]], %[[LSE]] {bonsai.phase = "backward", causal, scale = 3.535530e-01 : f64}
// CHECK-NOT: bonsai.attention_grad
func.func @attn(%ids: tensor<2x16xi32>, %labels: tensor<2x16xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x16xf32>, tensor<2x16xi32>) -> tensor<2x16x16xf32>
  %q_w = bonsai.param "q" trainable : tensor<16x16xf32>
  %q = bonsai.linear %h, %q_w : (tensor<2x16x16xf32>, tensor<16x16xf32>) -> tensor<2x16x16xf32>
  %k_w = bonsai.param "k" trainable : tensor<16x16xf32>
  %k = bonsai.linear %h, %k_w : (tensor<2x16x16xf32>, tensor<16x16xf32>) -> tensor<2x16x16xf32>
  %v_w = bonsai.param "v" trainable : tensor<16x16xf32>
  %v = bonsai.linear %h, %v_w : (tensor<2x16x16xf32>, tensor<16x16xf32>) -> tensor<2x16x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x16x16xf32>) -> tensor<2x16x2x8xf32>
  %k4 = bonsai.reshape %k : (tensor<2x16x16xf32>) -> tensor<2x16x2x8xf32>
  %v4 = bonsai.reshape %v : (tensor<2x16x16xf32>) -> tensor<2x16x2x8xf32>
  %attn = bonsai.attention %q4, %k4, %v4 {causal, scale = 3.535530e-01 : f64} : (tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>) -> tensor<2x16x2x8xf32>
  %attn2 = bonsai.reshape %attn : (tensor<2x16x2x8xf32>) -> tensor<2x16x16xf32>
  %head_w = bonsai.param "lm_head" trainable : tensor<32x16xf32>
  %logits = bonsai.linear %attn2, %head_w : (tensor<2x16x16xf32>, tensor<32x16xf32>) -> tensor<2x16x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x16x32xf32>, tensor<2x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
  bonsai.remat "full"
}

// -----

// Policy `selective` recomputes rope but not attention: the grad reads the forward's output
// with the recomputed (bit-identical) rope clones as q and k. It is still this attention's
// gradient: the forward attention becomes the flash_attention and the grad reads its lse.

// REMARK: remark: bonsai-fuse: 1 attention -> flash_attention; 1 attention_grad -> flash_attention_grad
// CHECK-LABEL: func.func @rope_attn
// CHECK: %[[O:.*]], %[[LSE:.*]] = bonsai.flash_attention %{{.*}} {causal, scale = 3.535530e-01 : f64}
// CHECK: %[[QR:.*]] = bonsai.rope %{{.*}} {bonsai.phase = "backward", bonsai.recomputed
// CHECK: %[[KR:.*]] = bonsai.rope %{{.*}} {bonsai.phase = "backward", bonsai.recomputed
// CHECK: bonsai.flash_attention_grad %{{.*}}, %[[QR]], %[[KR]], %{{.*}}, %[[O]], %[[LSE]] {bonsai.phase = "backward"
// CHECK-NOT: bonsai.attention
func.func @rope_attn(%ids: tensor<2x16xi32>, %labels: tensor<2x16xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x16xf32>, tensor<2x16xi32>) -> tensor<2x16x16xf32>
  %q_w = bonsai.param "q" trainable : tensor<16x16xf32>
  %q = bonsai.linear %h, %q_w : (tensor<2x16x16xf32>, tensor<16x16xf32>) -> tensor<2x16x16xf32>
  %k_w = bonsai.param "k" trainable : tensor<16x16xf32>
  %k = bonsai.linear %h, %k_w : (tensor<2x16x16xf32>, tensor<16x16xf32>) -> tensor<2x16x16xf32>
  %v_w = bonsai.param "v" trainable : tensor<16x16xf32>
  %v = bonsai.linear %h, %v_w : (tensor<2x16x16xf32>, tensor<16x16xf32>) -> tensor<2x16x16xf32>
  %q4 = bonsai.reshape %q : (tensor<2x16x16xf32>) -> tensor<2x16x2x8xf32>
  %k4 = bonsai.reshape %k : (tensor<2x16x16xf32>) -> tensor<2x16x2x8xf32>
  %v4 = bonsai.reshape %v : (tensor<2x16x16xf32>) -> tensor<2x16x2x8xf32>
  %qr = bonsai.rope %q4 : (tensor<2x16x2x8xf32>) -> tensor<2x16x2x8xf32>
  %kr = bonsai.rope %k4 : (tensor<2x16x2x8xf32>) -> tensor<2x16x2x8xf32>
  %attn = bonsai.attention %qr, %kr, %v4 {causal, scale = 3.535530e-01 : f64} : (tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>, tensor<2x16x2x8xf32>) -> tensor<2x16x2x8xf32>
  %attn2 = bonsai.reshape %attn : (tensor<2x16x2x8xf32>) -> tensor<2x16x16xf32>
  %head_w = bonsai.param "lm_head" trainable : tensor<32x16xf32>
  %logits = bonsai.linear %attn2, %head_w : (tensor<2x16x16xf32>, tensor<32x16xf32>) -> tensor<2x16x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x16x32xf32>, tensor<2x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
  bonsai.remat "selective"
}
