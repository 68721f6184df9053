// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat \
// RUN:   --bonsai-fuse="only=residual-norm" -split-input-file %s 2> %t.remarks \
// RUN:   | FileCheck %s
// RUN: FileCheck %s --check-prefix=REMARK < %t.remarks

// The residual-norm family (lib/Transforms/Fusion/ResidualNorm.cpp) on a Llama decoder layer
// (Inputs/block.mlir): both residual adds join the rms_norm that reads their sum, and the two
// norm gradients that are addends of the residual stream's gradient take the add in; the first
// rms_norm (of the embedding, no add) and the final norm's gradient (nothing added to it yet)
// stay as they are. The sums remain the residual stream: the next add and the backward pass
// read the fused ops' first results.

// REMARK: remark: bonsai-fuse: 2 norm gradient + residual gradient add; 2 residual add + norm
// CHECK-LABEL: func.func @block
// CHECK: %[[H:.*]] = bonsai.embedding
// CHECK: bonsai.rms_norm %[[H]], %{{.*}} :
// CHECK: bonsai.attention
// CHECK: %[[O:.*]] = bonsai.linear %{{.*}}, %{{.*}} : (tensor<2x32x16xf32>, tensor<16x16xf32>)
// CHECK: %[[LN2W:.*]] = bonsai.param "ln2"
// CHECK-NEXT: %[[RES1:.*]], %[[LN2:.*]] = bonsai.add_rms_norm %[[H]], %[[O]], %[[LN2W]] {epsilon = 9.9999999999999995E-7 : f64}
// CHECK: bonsai.linear %[[LN2]]
// CHECK: %[[DOWN:.*]] = bonsai.linear %{{.*}}, %{{.*}} : (tensor<2x32x32xf32>, tensor<16x32xf32>)
// CHECK: %[[NORMW:.*]] = bonsai.param "norm"
// CHECK-NEXT: %[[RES2:.*]], %[[NORM:.*]] = bonsai.add_rms_norm %[[RES1]], %[[DOWN]], %[[NORMW]]
// CHECK: %[[G2:.*]], %{{.*}} = bonsai.rms_norm_grad %{{.*}}, %[[RES2]], %[[NORMW]] {bonsai.phase = "backward"}
// CHECK: %[[MLP:.*]] = bonsai.add %{{.*}}, %{{.*}} {bonsai.phase = "backward"}
// CHECK: %[[G1:.*]], %{{.*}} = bonsai.rms_norm_grad_add %[[MLP]], %[[RES1]], %[[LN2W]], %[[G2]] {bonsai.phase = "backward", epsilon = 9.9999999999999995E-7 : f64}
// CHECK: %[[G0:.*]], %{{.*}} = bonsai.rms_norm_grad_add %{{.*}}, %[[H]], %{{.*}}, %[[G1]] {bonsai.phase = "backward"
// CHECK: bonsai.embedding_grad %[[G0]]
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
  %down = bonsai.linear %act, %down_w : (tensor<2x32x32xf32>, tensor<16x32xf32>) -> tensor<2x32x16xf32>
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
}

// -----

// With remat `full` the block inputs (the sums) are kept and the norms recomputed from them in
// the backward pass: the clones read the fused ops' sums and stay plain rms_norms (an add in the
// forward phase does not fuse with a recomputed norm).

// REMARK: remark: bonsai-remat (policy 'full')
// REMARK: remark: bonsai-fuse: 2 norm gradient + residual gradient add; 2 residual add + norm
// CHECK-LABEL: func.func @block_remat
// CHECK: %[[RES1:.*]], %{{.*}} = bonsai.add_rms_norm
// CHECK: %[[RES2:.*]], %{{.*}} = bonsai.add_rms_norm %[[RES1]]
// CHECK: bonsai.rms_norm %[[RES2]], %{{.*}} {bonsai.phase = "backward", bonsai.recomputed}
// CHECK: bonsai.rms_norm %[[RES1]], %{{.*}} {bonsai.phase = "backward", bonsai.recomputed}
// CHECK: bonsai.rms_norm_grad_add %{{.*}}, %[[RES1]]
// CHECK-NOT: bonsai.add_rms_norm {{.*}}recomputed
func.func @block_remat(%ids: tensor<2x32xi32>, %labels: tensor<2x32xi32>) -> tensor<f32> {
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
  %down = bonsai.linear %act, %down_w : (tensor<2x32x32xf32>, tensor<16x32xf32>) -> tensor<2x32x16xf32>
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
  bonsai.remat "full"
}

// -----

// GPT-2's layer norms fuse the same way (with the bias); the token + position embedding add
// broadcasts the positions [T, D] over the batch and stays unfused.

// REMARK: remark: bonsai-fuse: 1 norm gradient + residual gradient add; 1 residual add + norm
// CHECK-LABEL: func.func @gpt2
// CHECK: %[[X:.*]] = bonsai.add %{{.*}}, %{{.*}} : (tensor<2x8x16xf32>, tensor<8x16xf32>)
// CHECK: bonsai.layer_norm %[[X]]
// CHECK: %[[S:.*]], %[[N:.*]] = bonsai.add_layer_norm %[[X]], %{{.*}}, %{{.*}}, %{{.*}} {epsilon = 1.000000e-05 : f64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>)
// CHECK: bonsai.layer_norm_grad %{{.*}}, %[[S]]
// CHECK: bonsai.layer_norm_grad_add %{{.*}}, %[[X]], %{{.*}}, %{{.*}} {bonsai.phase = "backward", epsilon = 1.000000e-05 : f64}
func.func @gpt2(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %wte = bonsai.param "wte" trainable : tensor<64x16xf32>
  %wpe = bonsai.param "wpe" trainable : tensor<8x16xf32>
  %tok = bonsai.embedding %wte, %ids : (tensor<64x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %x = bonsai.add %tok, %wpe : (tensor<2x8x16xf32>, tensor<8x16xf32>) -> tensor<2x8x16xf32>
  %ln1_w = bonsai.param "ln_1.weight" trainable : tensor<16xf32>
  %ln1_b = bonsai.param "ln_1.bias" trainable : tensor<16xf32>
  %ln1 = bonsai.layer_norm %x, %ln1_w, %ln1_b : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %fc_w = bonsai.param "fc" trainable : tensor<16x16xf32>
  %fc = bonsai.linear %ln1, %fc_w : (tensor<2x8x16xf32>, tensor<16x16xf32>) -> tensor<2x8x16xf32>
  %act = bonsai.gelu %fc {approximation = #bonsai.gelu_approximation<tanh>} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %ln2_w = bonsai.param "ln_f.weight" trainable : tensor<16xf32>
  %ln2_b = bonsai.param "ln_f.bias" trainable : tensor<16xf32>
  %res = bonsai.add %x, %act : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  %ln2 = bonsai.layer_norm %res, %ln2_w, %ln2_b : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  %logits = bonsai.linear %ln2, %wte : (tensor<2x8x16xf32>, tensor<64x16xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
}
