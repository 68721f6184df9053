// RUN: bonsai-opt --bonsai-tile-sequence %s 2>&1 | FileCheck %s
// RUN: bonsai-opt --bonsai-tile-sequence=chunks=1 %s 2>&1 | FileCheck %s --check-prefix=ONE
// RUN: bonsai-opt --bonsai-tile-sequence --bonsai-autodiff --bonsai-optimizer --bonsai-remat=per-value-remarks=false %s 2>&1 | FileCheck %s --check-prefix=BACKWARD
// RUN: not bonsai-opt --bonsai-tile-sequence=chunks=3 %s 2>&1 | FileCheck %s --check-prefix=UNEVEN
// RUN: bonsai-opt --bonsai-tile-sequence=chunks=2 %S/Inputs/tile-sequence-no-mlp.mlir 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: not bonsai-opt --bonsai-tile-sequence %S/Inputs/tile-sequence-fp8.mlir 2>&1 | FileCheck %s --check-prefix=FP8

// bonsai-tile-sequence (docs/remat.md, "Tiling the sequence") on one Llama decoder layer with
// the recipe's `bonsai.remat "full" sequence_chunks 2`: the MLP (gate, up, swiglu, down, and
// the scale and adapter of down's LoRA, whose rank-2 intermediate broadcasts a scalar) runs
// on two halves of the sequence, each a slice of the norm's output, and a concat joins the
// halves before the residual add. The Q/K/V projections read the first norm's output too,
// but nothing inside their region is wider than what enters it: they stay whole, and so does
// the LM head.

// CHECK: remark: bonsai-tile-sequence: 1 MLP blocks in 2 chunks of the sequence; their widest intermediate 8.00 KiB -> 4.00 KiB per chunk
// CHECK: %[[LN1:.*]] = bonsai.rms_norm %{{.*}}, %{{.*}} : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
// CHECK: bonsai.linear %[[LN1]], %{{.*}} : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
// CHECK: %[[RES1:.*]] = bonsai.add
// CHECK: %[[LN2:.*]] = bonsai.rms_norm %[[RES1]]
// CHECK: %[[X0:.*]] = bonsai.slice %[[LN2]] {axis = 1 : i64, start = 0 : i64} : (tensor<2x32x16xf32>) -> tensor<2x16x16xf32>
// CHECK-NEXT: %[[G0:.*]] = bonsai.linear %[[X0]], %{{.*}} : (tensor<2x16x16xf32>, tensor<32x16xf32>) -> tensor<2x16x32xf32>
// CHECK-NEXT: %[[U0:.*]] = bonsai.linear %[[X0]], %{{.*}} : (tensor<2x16x16xf32>, tensor<32x16xf32>) -> tensor<2x16x32xf32>
// CHECK-NEXT: %[[A0:.*]] = bonsai.swiglu %[[G0]], %[[U0]] : (tensor<2x16x32xf32>, tensor<2x16x32xf32>) -> tensor<2x16x32xf32>
// CHECK-NEXT: %[[D0:.*]] = bonsai.linear %[[A0]], %{{.*}} : (tensor<2x16x32xf32>, tensor<16x32xf32>) -> tensor<2x16x16xf32>
// CHECK-NEXT: %[[L0:.*]] = bonsai.linear %[[A0]], %{{.*}} : (tensor<2x16x32xf32>, tensor<2x32xf32>) -> tensor<2x16x2xf32>
// CHECK-NEXT: %[[S0:.*]] = bonsai.mul %[[L0]], %{{.*}} : (tensor<2x16x2xf32>, tensor<f32>) -> tensor<2x16x2xf32>
// CHECK-NEXT: %[[B0:.*]] = bonsai.linear %[[S0]], %{{.*}} : (tensor<2x16x2xf32>, tensor<16x2xf32>) -> tensor<2x16x16xf32>
// CHECK-NEXT: %[[Y0:.*]] = bonsai.add %[[D0]], %[[B0]] : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
// CHECK-NEXT: %[[X1:.*]] = bonsai.slice %[[LN2]] {axis = 1 : i64, start = 16 : i64} : (tensor<2x32x16xf32>) -> tensor<2x16x16xf32>
// CHECK: %[[Y1:.*]] = bonsai.add %{{.*}}, %{{.*}} : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
// CHECK-NEXT: %[[Y:.*]] = bonsai.concat %[[Y0]], %[[Y1]] {axis = 1 : i64} : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x32x16xf32>
// CHECK-NEXT: bonsai.add %[[RES1]], %[[Y]] : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
// CHECK-NOT: bonsai.slice
// CHECK: bonsai.linear %{{.*}}, %{{.*}} : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
// CHECK-NEXT: bonsai.cross_entropy

// ONE-NOT: remark
// ONE-NOT: bonsai.slice

// The backward pass follows the chunks: the concat's gradient is a slice per chunk, each
// chunk's input gradient goes back through a slice_grad, and remat "full" recomputes each
// chunk's gate, up and swiglu right before that chunk's backward ops (the second chunk's
// first, as the backward pass runs in reverse).
// BACKWARD: remark: bonsai-remat (policy 'full')
// BACKWARD: bonsai.slice %{{.*}} {axis = 1 : i64, bonsai.phase = "backward", start = 16 : i64}
// BACKWARD: bonsai.swiglu {{.*}}bonsai.recomputed{{.*}} -> tensor<2x16x32xf32>
// BACKWARD: bonsai.swiglu_grad
// BACKWARD: bonsai.slice_grad {{.*}}start = 16 : i64
// BACKWARD: bonsai.swiglu {{.*}}bonsai.recomputed{{.*}} -> tensor<2x16x32xf32>
// BACKWARD: bonsai.swiglu_grad
// BACKWARD: bonsai.slice_grad {{.*}}start = 0 : i64

// UNEVEN: error: sequence_chunks 3 does not divide the sequence length 32 of the MLP's input 'tensor<2x32x16xf32>'

// FP8: error: sequence_chunks 2 with bonsai.fp8 is not supported: delayed scaling keeps one state per linear, and each MLP chunk's linears share the weight

// NONE: remark: bonsai-tile-sequence: no expanding token-wise region (an MLP) to compute in 2 chunks
// NONE-NOT: bonsai.slice

func.func @block(%ids: tensor<2x32xi32>, %labels: tensor<2x32xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x16xf32>, tensor<2x32xi32>) -> tensor<2x32x16xf32>
  %ln1_w = bonsai.param "ln1" trainable : tensor<16xf32>
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
  %qr = bonsai.rope %q4 : (tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  %kr = bonsai.rope %k4 : (tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  %attn = bonsai.attention %qr, %kr, %v4 {causal, scale = 2.500000e-01 : f64} : (tensor<2x32x2x8xf32>, tensor<2x32x2x8xf32>, tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
  %attn2 = bonsai.reshape %attn : (tensor<2x32x2x8xf32>) -> tensor<2x32x16xf32>
  %o_w = bonsai.param "o" trainable : tensor<16x16xf32>
  %o = bonsai.linear %attn2, %o_w : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %res1 = bonsai.add %h, %o : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %ln2_w = bonsai.param "ln2" trainable : tensor<16xf32>
  %ln2 = bonsai.rms_norm %res1, %ln2_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %gate_w = bonsai.param "gate" trainable : tensor<32x16xf32>
  %gate = bonsai.linear %ln2, %gate_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %up_w = bonsai.param "up" trainable : tensor<32x16xf32>
  %up = bonsai.linear %ln2, %up_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %act = bonsai.swiglu %gate, %up : (tensor<2x32x32xf32>, tensor<2x32x32xf32>) -> tensor<2x32x32xf32>
  %down_w = bonsai.param "down" trainable : tensor<16x32xf32>
  %down_base = bonsai.linear %act, %down_w : (tensor<2x32x32xf32>, tensor<16x32xf32>) -> tensor<2x32x16xf32>
  %down_a = bonsai.param "down.lora_A" trainable : tensor<2x32xf32>
  %down_b = bonsai.param "down.lora_B" trainable : tensor<16x2xf32>
  %scale = bonsai.param "down.scale" frozen : tensor<f32>
  %lora_a = bonsai.linear %act, %down_a : (tensor<2x32x32xf32>, tensor<2x32xf32>) -> tensor<2x32x2xf32>
  %lora_s = bonsai.mul %lora_a, %scale : (tensor<2x32x2xf32>, tensor<f32>) -> tensor<2x32x2xf32>
  %lora_b = bonsai.linear %lora_s, %down_b : (tensor<2x32x2xf32>, tensor<16x2xf32>) -> tensor<2x32x16xf32>
  %down = bonsai.add %down_base, %lora_b : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %res2 = bonsai.add %res1, %down : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %norm_w = bonsai.param "norm" trainable : tensor<16xf32>
  %norm = bonsai.rms_norm %res2, %norm_w : (tensor<2x32x16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %head_w = bonsai.param "lm_head" trainable : tensor<32x16xf32>
  %logits = bonsai.linear %norm, %head_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x32x32xf32>, tensor<2x32xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
  bonsai.remat "full" sequence_chunks 2
}
