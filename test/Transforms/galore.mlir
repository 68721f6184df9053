// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-galore %s -split-input-file -verify-diagnostics | FileCheck %s
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-galore %s -split-input-file -verify-diagnostics | FileCheck %s --check-prefix=GONE

// The targets match three linears: q_proj (8x8, square: projected on the left), up_proj
// (12x8, tall: on the right) and down_proj (8x12, wide: on the left). Their full-size moments
// are gone; each gets moments of the projection's shape (2x8, 12x2, 2x12 at rank 2) and a
// projector (8x2); the bf16 weight keeps its fp32 master and projects on bf16 operands. The embedding, the norm and the
// untargeted lm_head keep plain AdamW with moments of their own shape. Slots follow the model's
// order (q 0, up 1, down 2) and spread the offsets over T = 6: 0, 2, 4.

// CHECK-LABEL: func.func @galore
// CHECK: %[[STEP:.*]] = bonsai.state optimizer "optimizer.step" : tensor<i64>
// CHECK: bonsai.state optimizer "lm_head.weight.exp_avg" : tensor<16x8xf32>
// CHECK: bonsai.state optimizer "model.norm.weight.exp_avg" : tensor<8xf32>
// CHECK: %[[STATUS:.*]] = bonsai.state optimizer "galore.status" : tensor<3xf32>
// CHECK: %[[PD:.*]] = bonsai.state optimizer "blk.down_proj.weight.galore_projector" : tensor<8x2xf32>
// CHECK: %[[MD:.*]] = bonsai.state optimizer "blk.down_proj.weight.exp_avg" : tensor<2x12xf32>
// CHECK: %[[VD:.*]] = bonsai.state optimizer "blk.down_proj.weight.exp_avg_sq" : tensor<2x12xf32>
// CHECK: bonsai.galore_refresh %[[GD:.*]], %[[STEP]], %[[PD]], %[[STATUS]] {bonsai.phase = "update", left = true, offset = 4 : i64, power_iterations = 1 : i64, projector_kind = "randomized", rank = 2 : i64, seed = 0 : i64, slot = 2 : i64, update_proj_gap = 6 : i64} : (tensor<8x12xf32>, tensor<i64>, tensor<8x2xf32>, tensor<3xf32>) -> tensor<{{[0-9]+}}xf32>
// CHECK: %[[RD:.*]] = bonsai.galore_project %[[GD]], %[[PD]] {bf16_operands = false, bonsai.phase = "update", left = true} : (tensor<8x12xf32>, tensor<8x2xf32>) -> tensor<2x12xf32>
// CHECK: bonsai.galore_adamw_update %[[RD]], %[[STEP]], %{{.*}}, %{{.*}}, %[[PD]], %{{.*}}, %[[MD]], %[[VD]] {{{.*}}left = true, scale = 2.500000e-01 : f64{{.*}}}
// CHECK: %[[PU:.*]] = bonsai.state optimizer "blk.up_proj.weight.galore_projector" : tensor<8x2xf32>
// CHECK: bonsai.state optimizer "blk.up_proj.weight.exp_avg" : tensor<12x2xf32>
// CHECK: bonsai.galore_refresh {{.*}}left = false, offset = 2 : i64{{.*}}slot = 1 : i64
// CHECK: bonsai.galore_project {{.*}} -> tensor<12x2xf32>
// CHECK: %[[PQ:.*]] = bonsai.state optimizer "blk.q_proj.weight.galore_projector" : tensor<8x2xf32>
// CHECK: bonsai.state optimizer "blk.q_proj.weight.exp_avg" : tensor<2x8xf32>
// CHECK: bonsai.galore_refresh {{.*}}left = true, offset = 0 : i64{{.*}}slot = 0 : i64
// CHECK: bonsai.galore_project {{.*}}{bf16_operands = true, bonsai.phase = "update", left = true} : (tensor<8x8xf32>, tensor<8x2xf32>) -> tensor<2x8xf32>
// CHECK: bonsai.galore_adamw_update {{.*}} : tensor<2x8xf32>, tensor<i64>, tensor<f32>, tensor<f32>, tensor<8x2xf32>, tensor<8x8xbf16>, tensor<2x8xf32>, tensor<2x8xf32>, tensor<8x8xf32>
// CHECK: bonsai.state optimizer "model.embed_tokens.weight.exp_avg_sq" : tensor<16x8xf32>
// CHECK-NEXT: bonsai.adamw_update
// CHECK: bonsai.step_increment %[[STEP]]

// The full-size moments of the GaLore weights are gone, and so are their AdamW updates.
// GONE-LABEL: func.func @galore
// GONE-NOT: "blk.{{.*}}_proj.weight.exp_avg{{(_sq)?}}" : tensor<{{8x12|12x8|8x8}}xf32>
// GONE-NOT: bonsai.adamw_update {{.*}}tensor<{{8x12|12x8|8x8}}xbf16>
// GONE-NOT: bonsai.adamw_update {{.*}}tensor<{{8x12|12x8|8x8}}xf32>
// GONE: bonsai.step_increment
func.func @galore(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  // expected-remark @+1 {{GaLore on 'blk.q_proj.weight' (8x8, projected on the left, offset 0): moments 2x8, projector 8x2, 48 floats instead of 128}}
  %wq = bonsai.param "blk.q_proj.weight" trainable : tensor<8x8xbf16>
  %hb = bonsai.cast %h : (tensor<1x4x8xf32>) -> tensor<1x4x8xbf16>
  %q = bonsai.linear %hb, %wq : (tensor<1x4x8xbf16>, tensor<8x8xbf16>) -> tensor<1x4x8xbf16>
  %qf = bonsai.cast %q : (tensor<1x4x8xbf16>) -> tensor<1x4x8xf32>
  // expected-remark @+1 {{GaLore on 'blk.up_proj.weight' (12x8, projected on the right, offset 2): moments 12x2, projector 8x2, 64 floats instead of 192}}
  %wu = bonsai.param "blk.up_proj.weight" trainable : tensor<12x8xf32>
  %u = bonsai.linear %qf, %wu : (tensor<1x4x8xf32>, tensor<12x8xf32>) -> tensor<1x4x12xf32>
  // expected-remark @+1 {{GaLore on 'blk.down_proj.weight' (8x12, projected on the left, offset 4): moments 2x12, projector 8x2, 64 floats instead of 192}}
  %wd = bonsai.param "blk.down_proj.weight" trainable : tensor<8x12xf32>
  %d = bonsai.linear %u, %wd : (tensor<1x4x12xf32>, tensor<8x12xf32>) -> tensor<1x4x8xf32>
  %nw = bonsai.param "model.norm.weight" trainable : tensor<8xf32>
  %n = bonsai.rms_norm %d, %nw {epsilon = 1.0e-5 : f64} : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %n, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-remark @+1 {{GaLore (rank 2, randomized projector refreshed every 6 steps, staggered): 3 weights, optimizer state 716 B instead of 2.00 KiB (0.350x); 3 parameters keep AdamW}}
  bonsai.galore rank 2 update_proj_gap 6 scale 0.25 projector "randomized" targets ["q_proj", "*_proj.weight"]
}

// -----

// Without a bonsai.galore directive the pass changes nothing.
// CHECK-LABEL: func.func @plain
// CHECK: bonsai.adamw_update
// CHECK-NOT: galore
func.func @plain(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
}
