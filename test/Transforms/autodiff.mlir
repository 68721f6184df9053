// RUN: bonsai-opt --bonsai-autodiff %s -split-input-file -verify-diagnostics | FileCheck %s

// A frozen embedding and norm, a trainable linear: the backward pass computes only what the
// trainable weight needs. No gradient for the frozen embedding or norm weight, and no input
// gradient for the first linear (nothing before it trains).

// CHECK-LABEL: func.func @frozen_prefix
// CHECK: %[[SEED:.*]] = bonsai.loss_scale {bonsai.phase = "backward"} : tensor<f32>
// CHECK: %[[DL:.*]] = bonsai.cross_entropy_grad %[[SEED]], %{{.*}}, %{{.*}} {bonsai.phase = "backward"}
// CHECK: bonsai.linear_grad_weight %[[DL]], %{{.*}} {bonsai.phase = "backward"} : (tensor<1x4x16xf32>, tensor<1x4x8xf32>) -> tensor<16x8xf32>
// CHECK-NOT: bonsai.linear_grad_input
// CHECK-NOT: bonsai.embedding_grad
// CHECK-NOT: bonsai.rms_norm_grad
// CHECK: %[[ACC:.*]] = bonsai.state gradient "lm_head.weight" {bonsai.phase = "backward"} : tensor<16x8xf32>
// CHECK: bonsai.accumulate %{{.*}}, %[[ACC]] {bonsai.phase = "backward"}
// CHECK-NOT: bonsai.state gradient
// CHECK: return
func.func @frozen_prefix(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %nw = bonsai.param "model.norm.weight" frozen : tensor<8xf32>
  %n = bonsai.rms_norm %h, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %n, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// A tied weight (GPT-2's wte as embedding table and lm_head) sums the gradients of both uses;
// a bias's gradient is reduced over the leading dimensions; a residual add passes its gradient
// to both operands, which then sum where they meet.

// CHECK-LABEL: func.func @tied
// CHECK: %[[DL:.*]] = bonsai.cross_entropy_grad
// CHECK: %[[DX:.*]] = bonsai.linear_grad_input %[[DL]], %[[WTE:[^ ]*]]
// CHECK: %[[DW:.*]] = bonsai.linear_grad_weight %[[DL]]
// Each gradient goes into its accumulator as soon as it is complete: the bias's right after
// its only use is differentiated, the tied weight's only after its first use (the embedding).
// CHECK: %[[DB:.*]] = bonsai.reduce_to %{{.*}} {bonsai.phase = "backward"} : (tensor<1x4x8xf32>) -> tensor<8xf32>
// CHECK-NEXT: bonsai.add
// CHECK-NEXT: %[[BACC:.*]] = bonsai.state gradient "bias"
// CHECK-NEXT: bonsai.accumulate %[[DB]], %[[BACC]]
// CHECK: %[[DT:.*]] = bonsai.embedding_grad %{{.*}}, %{{.*}}
// CHECK: %[[SUM:.*]] = bonsai.add %[[DW]], %[[DT]] {bonsai.phase = "backward"} : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
// CHECK-NEXT: %[[ACC:.*]] = bonsai.state gradient "transformer.wte.weight"
// CHECK-NEXT: bonsai.accumulate %[[SUM]], %[[ACC]]
func.func @tied(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %wte = bonsai.param "transformer.wte.weight" trainable : tensor<16x8xf32>
  %h = bonsai.embedding %wte, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %b = bonsai.param "bias" trainable : tensor<8xf32>
  %hb = bonsai.add %h, %b : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %r = bonsai.add %hb, %h : (tensor<1x4x8xf32>, tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  %logits = bonsai.linear %r, %wte : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// Attention, rope, swiglu, norms and reshapes differentiate into their backward units.
// CHECK-LABEL: func.func @block
// CHECK-DAG: bonsai.swiglu_grad
// CHECK-DAG: bonsai.attention_grad %{{.*}} {bonsai.phase = "backward", causal, scale = 5.000000e-01 : f64}
// CHECK-DAG: bonsai.rope_grad
// CHECK-DAG: bonsai.rms_norm_grad
// CHECK-DAG: bonsai.reshape %{{.*}} {bonsai.phase = "backward"} : (tensor<1x4x2x4xf32>) -> tensor<1x4x8xf32>
func.func @block(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %n = bonsai.rms_norm %h, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %q = bonsai.reshape %n : (tensor<1x4x8xf32>) -> tensor<1x4x2x4xf32>
  %qr = bonsai.rope %q : (tensor<1x4x2x4xf32>) -> tensor<1x4x2x4xf32>
  %a = bonsai.attention %qr, %qr, %q {causal, scale = 0.5 : f64} : (tensor<1x4x2x4xf32>, tensor<1x4x2x4xf32>, tensor<1x4x2x4xf32>) -> tensor<1x4x2x4xf32>
  %a2 = bonsai.reshape %a : (tensor<1x4x2x4xf32>) -> tensor<1x4x8xf32>
  %s = bonsai.swiglu %a2, %n : (tensor<1x4x8xf32>, tensor<1x4x8xf32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %s, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// expected-error @+1 {{the loss depends on no trainable parameter: nothing to differentiate}}
func.func @nothing_trains(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %logits = bonsai.linear %h, %emb : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// An op without a gradient rule on the path from a trainable parameter to the loss.
func.func @no_rule(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %w = bonsai.param "w" trainable : tensor<8xf32>
  // expected-error @+1 {{'bonsai.grad_norm' cannot be differentiated: it has no gradient rule}}
  %n = bonsai.grad_norm %w : (tensor<8xf32>) -> tensor<f32>
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %hn = bonsai.mul %h, %n : (tensor<1x4x8xf32>, tensor<f32>) -> tensor<1x4x8xf32>
  %logits = bonsai.linear %hn, %emb : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
