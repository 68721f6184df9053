// How close auto's search comes to the optimum. search=compare plans every distinct recompute
// set of a small graph (the exhaustive search) and takes its frontier: the sets whose planned
// peak is below that of every cheaper set (each the optimum, the fewest FLOPs, for a budget of
// its peak). It then runs auto's search as it runs (on these graphs: every set judged by the
// peak model, the cheapest it says fit planned), with auto's fallbacks to the fixed policies,
// and auto's greedy alone (what it runs on larger graphs), with each frontier peak as the
// budget. The lines below state every optimum and both searches' FLOPs for it. Any budget has
// the optimum of the highest frontier peak within it, so these are all the distinct cases, and
// the hardest: the optimum meets each exactly.
//
// Two graphs: a two-block pre-norm MLP network (layer_norm, gelu) and one Llama decoder
// layer (rms_norm, attention with rope and reshapes, SwiGLU MLP). docs/remat.md discusses
// where the greedy search misses.
//
// RUN: rm -rf %t && split-file %s %t
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat=search=compare %t/mlp.mlir -o /dev/null 2>&1 | FileCheck %s --check-prefix=MLP
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-remat=search=compare %t/layer.mlir -o /dev/null 2>&1 | FileCheck %s --check-prefix=LAYER

// MLP: remark: budget 192768 bytes: optimum 0 FLOPs, auto 0 FLOPs, greedy alone 0 FLOPs
// MLP: remark: budget 188672 bytes: optimum 0 FLOPs, auto 0 FLOPs, greedy alone 0 FLOPs
// MLP: remark: budget 184576 bytes: optimum 7,168 FLOPs, auto 7,168 FLOPs, greedy alone 7,168 FLOPs
// MLP: remark: budget 180480 bytes: optimum 14,336 FLOPs, auto 14,336 FLOPs, greedy alone 14,336 FLOPs
// MLP: remark: budget 176384 bytes: optimum 16,384 FLOPs, auto 16,384 FLOPs, greedy alone 16,384 FLOPs
// MLP: remark: budget 172288 bytes: optimum 16,384 FLOPs, auto 16,384 FLOPs, greedy alone 16,384 FLOPs
// MLP: remark: budget 168192 bytes: optimum 23,552 FLOPs, auto 23,552 FLOPs, greedy alone 23,552 FLOPs
// MLP: remark: budget 164096 bytes: optimum 30,720 FLOPs, auto 30,720 FLOPs, greedy alone 30,720 FLOPs
// MLP: remark: budget 160000 bytes: optimum 147,456 FLOPs, auto 147,456 FLOPs, greedy alone 147,456 FLOPs
// MLP: remark: budget 155904 bytes: optimum 147,456 FLOPs, auto 147,456 FLOPs, greedy alone 147,456 FLOPs
// MLP: remark: budget 151808 bytes: optimum 154,624 FLOPs, auto 154,624 FLOPs, greedy alone 154,624 FLOPs
// MLP: remark: bonsai-remat (search 'compare'): auto is optimal at 11 of 11 budgets on the exhaustive frontier (13 candidate tensors, 4608 distinct recompute sets planned); worst auto/optimum FLOPs 1.000; the greedy alone is optimal at 11, worst 1.000

// LAYER: remark: budget 143616 bytes: optimum 0 FLOPs, auto 0 FLOPs, greedy alone 0 FLOPs
// LAYER: remark: budget 139520 bytes: optimum 0 FLOPs, auto 0 FLOPs, greedy alone 0 FLOPs
// LAYER: remark: budget 135424 bytes: optimum 4,096 FLOPs, auto 4,096 FLOPs, greedy alone 4,096 FLOPs
// LAYER: remark: budget 131328 bytes: optimum 8,192 FLOPs, auto 8,192 FLOPs, greedy alone 8,192 FLOPs
// LAYER: remark: budget 129280 bytes: optimum 13,312 FLOPs, auto 13,312 FLOPs, greedy alone 18,432 FLOPs (1.385x)
// LAYER: remark: budget 127232 bytes: optimum 18,432 FLOPs, auto 18,432 FLOPs, greedy alone 18,432 FLOPs
// LAYER: remark: budget 125184 bytes: optimum 46,080 FLOPs, auto 46,080 FLOPs, greedy alone 51,200 FLOPs (1.111x)
// LAYER: remark: budget 123136 bytes: optimum 51,200 FLOPs, auto 51,200 FLOPs, greedy alone 51,200 FLOPs
// LAYER: remark: budget 121088 bytes: optimum 81,920 FLOPs, auto 81,920 FLOPs, greedy alone 84,992 FLOPs (1.038x)
// LAYER: remark: budget 119040 bytes: optimum 84,992 FLOPs, auto 84,992 FLOPs, greedy alone 84,992 FLOPs
// LAYER: remark: budget 116992 bytes: optimum 117,760 FLOPs, auto 117,760 FLOPs, greedy alone 120,832 FLOPs (1.026x)
// LAYER: remark: budget 114944 bytes: optimum 120,832 FLOPs, auto 120,832 FLOPs, greedy alone 120,832 FLOPs
// LAYER: remark: budget 110848 bytes: optimum 156,672 FLOPs, auto 156,672 FLOPs, greedy alone 160,768 FLOPs (1.026x)
// LAYER: remark: bonsai-remat (search 'compare'): auto is optimal at 13 of 13 budgets on the exhaustive frontier (18 candidate tensors, 82944 distinct recompute sets planned); worst auto/optimum FLOPs 1.000; the greedy alone is optimal at 8, worst 1.385

//--- mlp.mlir
func.func @mlp(%ids: tensor<2x32xi32>, %labels: tensor<2x32xi32>) -> tensor<f32> {
  %embed = bonsai.param "embed" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x16xf32>, tensor<2x32xi32>) -> tensor<2x32x16xf32>
  %n1_w = bonsai.param "n1" trainable : tensor<16xf32>
  %n1 = bonsai.layer_norm %h, %n1_w, %n1_w : (tensor<2x32x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %fc1_w = bonsai.param "fc1" trainable : tensor<64x16xf32>
  %fc1 = bonsai.linear %n1, %fc1_w : (tensor<2x32x16xf32>, tensor<64x16xf32>) -> tensor<2x32x64xf32>
  %g1 = bonsai.gelu %fc1 : (tensor<2x32x64xf32>) -> tensor<2x32x64xf32>
  %pr1_w = bonsai.param "proj1" trainable : tensor<16x64xf32>
  %pr1 = bonsai.linear %g1, %pr1_w : (tensor<2x32x64xf32>, tensor<16x64xf32>) -> tensor<2x32x16xf32>
  %r1 = bonsai.add %h, %pr1 : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %n2_w = bonsai.param "n2" trainable : tensor<16xf32>
  %n2 = bonsai.layer_norm %r1, %n2_w, %n2_w : (tensor<2x32x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %fc2_w = bonsai.param "fc2" trainable : tensor<64x16xf32>
  %fc2 = bonsai.linear %n2, %fc2_w : (tensor<2x32x16xf32>, tensor<64x16xf32>) -> tensor<2x32x64xf32>
  %g2 = bonsai.gelu %fc2 : (tensor<2x32x64xf32>) -> tensor<2x32x64xf32>
  %pr2_w = bonsai.param "proj2" trainable : tensor<16x64xf32>
  %pr2 = bonsai.linear %g2, %pr2_w : (tensor<2x32x64xf32>, tensor<16x64xf32>) -> tensor<2x32x16xf32>
  %r2 = bonsai.add %r1, %pr2 : (tensor<2x32x16xf32>, tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %nf_w = bonsai.param "nf" trainable : tensor<16xf32>
  %nf = bonsai.layer_norm %r2, %nf_w, %nf_w : (tensor<2x32x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x32x16xf32>
  %head_w = bonsai.param "lm_head" trainable : tensor<32x16xf32>
  %logits = bonsai.linear %nf, %head_w : (tensor<2x32x16xf32>, tensor<32x16xf32>) -> tensor<2x32x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x32x32xf32>, tensor<2x32xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.000000e-03
}

//--- layer.mlir
func.func @layer(%ids: tensor<2x32xi32>, %labels: tensor<2x32xi32>) -> tensor<f32> {
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
  %attn = bonsai.attention %qr, %kr, %v4 {causal, scale = 3.535534e-01 : f64} : (tensor<2x32x2x8xf32>, tensor<2x32x2x8xf32>, tensor<2x32x2x8xf32>) -> tensor<2x32x2x8xf32>
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
