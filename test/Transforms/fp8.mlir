// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_90' %s 2>&1 | FileCheck %s --check-prefixes=SM90,REMARK90
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_89' %s 2>&1 | FileCheck %s --check-prefix=REMARK89
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_80' %s 2>&1 | FileCheck %s --check-prefixes=SM80,REMARK80
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=a10g' %s 2>&1 | FileCheck %s --check-prefix=REMARK86
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-fp8 %s 2>&1 | FileCheck %s --check-prefix=REMARKCPU
// RUN: sed 's/"delayed" amax_history 16 margin 0/"current" amax_history 4 margin 2/' %s | bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_90' 2>&1 | FileCheck %s --check-prefix=CURRENT
// RUN: sed 's/margin 0 targets/margin 0 forward_accumulation "fast" targets/' %s | bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_90' 2>&1 | FileCheck %s --check-prefix=FAST
// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer '--bonsai-fp8=target=sm_90' '--bonsai-remat=policy=full per-value-remarks=false' %s 2>&1 | FileCheck %s --check-prefix=REMAT

// Under remat policy `full` the FP8 GEMMs are recomputed like the linears they replace: the
// scale update reads the forward's statistics (folded into their accumulator), the backward a
// recomputed copy's result.
// REMAT: %[[RU:.*]], %[[RUS:.*]], %{{.*}} = bonsai.fp8_linear %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {current = false, margin = 0 : i64}
// REMAT: bonsai.accumulate_max %[[RUS]], %[[RUSA:[0-9]+]] :
// REMAT: %[[RU2:.*]], %{{.*}}, %{{.*}} = bonsai.fp8_linear %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {bonsai.phase = "backward", bonsai.recomputed, current = false, margin = 0 : i64}
// REMAT: bonsai.fp8_linear_grad_weight %{{.*}}, %[[RU2]],
// REMAT: bonsai.fp8_update_scales %{{.*}}, %[[RUSA]],

// One recipe, two targets. `targets []` is FP8's default set: every linear but the LM head
// (its result is the cross-entropy's logits) and the tied embedding's; here q_proj (bf16,
// behind casts), up_proj (with a bias) and down_proj.

// On sm_90 each gets its state (f32 [3, 4 + 16]) next to its weight, its three GEMMs become
// FP8 GEMMs reading that state, and the update phase updates the scales from the forward
// stats and grad_input's before the step counter moves on.
// REMARK90: remark: bonsai-fp8: 'model.layers.0.self_attn.q_proj.weight' in FP8, state 'model.layers.0.self_attn.q_proj.weight.fp8'
// REMARK90: remark: bonsai-fp8: 'model.layers.0.mlp.up_proj.weight' in FP8
// REMARK90: remark: bonsai-fp8: 'model.layers.0.mlp.down_proj.weight' in FP8
// REMARK90: remark: bonsai-fp8: 3 linears in FP8 on sm_90 (E4M3 forward, E5M2 gradients), delayed scaling with an amax history of 16, margin 0, promoted forward accumulation; state 720 bytes
// REMARK89: remark: bonsai-fp8: 3 linears in FP8 on sm_89

// SM90-LABEL: func.func @fp8
// SM90: %[[WQ:.*]] = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<16x16xbf16>
// SM90-NEXT: %[[SQ:.*]] = bonsai.state optimizer "model.layers.0.self_attn.q_proj.weight.fp8" : tensor<3x20xf32>
// The accumulators of its statistics over micro-batches (gradient role: zero between steps).
// SM90-NEXT: %[[QSA:.*]] = bonsai.state gradient "model.layers.0.self_attn.q_proj.weight.fp8.forward_stats" : tensor<2x4xf32>
// SM90-NEXT: %[[QDSA:.*]] = bonsai.state gradient "model.layers.0.self_attn.q_proj.weight.fp8.backward_stats" : tensor<2x4xf32>
// SM90: %[[XQ:.*]] = bonsai.cast
// SM90-NEXT: %[[Q:.*]], %[[QS:.*]], %{{.*}} = bonsai.fp8_linear %[[XQ]], %[[WQ]], %[[SQ]] {current = false, margin = 0 : i64} : (tensor<1x16x16xbf16>, tensor<16x16xbf16>, tensor<3x20xf32>) -> (tensor<1x16x16xbf16>, tensor<2x4xf32>, tensor<192xf32>)
// SM90: %[[WU:.*]] = bonsai.param "model.layers.0.mlp.up_proj.weight" trainable : tensor<32x16xf32>
// SM90-NEXT: %[[SU:.*]] = bonsai.state optimizer "model.layers.0.mlp.up_proj.weight.fp8" : tensor<3x20xf32>
// SM90-NEXT: %[[USA:.*]] = bonsai.state gradient
// SM90-NEXT: %[[UDSA:.*]] = bonsai.state gradient
// SM90: %[[BU:.*]] = bonsai.param "model.layers.0.mlp.up_proj.bias"
// SM90-NEXT: %[[U:.*]], %[[US:.*]], %{{.*}} = bonsai.fp8_linear %{{.*}}, %[[WU]], %[[SU]], %[[BU]] {current = false, margin = 0 : i64}
// SM90: %[[SD:.*]] = bonsai.state optimizer "model.layers.0.mlp.down_proj.weight.fp8" : tensor<3x20xf32>
// SM90-NEXT: %[[DSA:.*]] = bonsai.state gradient
// SM90-NEXT: %[[DDSA:.*]] = bonsai.state gradient
// SM90-NEXT: %{{.*}}, %[[DS:.*]], %{{.*}} = bonsai.fp8_linear %[[U]], %{{.*}}, %[[SD]]
// Each micro-batch's statistics are folded in once the GEMM's result has been read.
// SM90: bonsai.accumulate_max %[[US]], %[[USA]] : tensor<2x4xf32>, tensor<2x4xf32>
// The LM head stays a linear.
// SM90: %[[LOGITS:.*]] = bonsai.linear
// SM90-NEXT: bonsai.accumulate_max %[[DS]], %[[DSA]] : tensor<2x4xf32>, tensor<2x4xf32>
// SM90-NEXT: bonsai.cross_entropy %[[LOGITS]]
// SM90: %[[DYD:.*]], %[[DDS:.*]], %{{.*}} = bonsai.fp8_linear_grad_input %{{.*}}, %{{.*}}, %[[SD]] {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<1x16x16xf32>, tensor<16x32xf32>, tensor<3x20xf32>) -> (tensor<1x16x32xf32>, tensor<2x4xf32>, tensor<256xf32>)
// SM90-NEXT: bonsai.fp8_linear_grad_weight %{{.*}}, %[[U]], %[[SD]] {bonsai.phase = "backward", current = false, margin = 0 : i64} : (tensor<1x16x16xf32>, tensor<1x16x32xf32>, tensor<3x20xf32>) -> (tensor<16x32xf32>, tensor<2x4xf32>, tensor<256xf32>)
// SM90: %{{.*}}, %[[UDS:.*]], %{{.*}} = bonsai.fp8_linear_grad_input %[[DYD]], %[[WU]], %[[SU]]
// SM90-NEXT: bonsai.fp8_linear_grad_weight %[[DYD]], %{{.*}}, %[[SU]]
// The bias gradient is unchanged.
// SM90-NEXT: bonsai.reduce_to %[[DYD]]
// SM90-NEXT: bonsai.accumulate_max %[[DDS]], %[[DDSA]] {bonsai.phase = "backward"}
// SM90: %{{.*}}, %[[QDS:.*]], %{{.*}} = bonsai.fp8_linear_grad_input %{{.*}}, %[[WQ]], %[[SQ]]
// SM90-NEXT: %[[DWQ:.*]], %{{.*}}, %{{.*}} = bonsai.fp8_linear_grad_weight %{{.*}}, %[[XQ]], %[[SQ]] {{.*}} -> (tensor<16x16xbf16>, tensor<2x4xf32>, tensor<192xf32>)
// SM90: bonsai.accumulate %[[DWQ]]
// SM90: %[[STEP:.*]] = bonsai.state optimizer "optimizer.step" : tensor<i64>
// SM90: bonsai.fp8_update_scales %[[STEP]], %[[QSA]], %[[QDSA]], %[[SQ]] {bonsai.phase = "update", current = false, margin = 0 : i64} : tensor<i64>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x20xf32>
// SM90-NEXT: bonsai.zero %[[QDSA]] {bonsai.phase = "update"} : tensor<2x4xf32>
// SM90-NEXT: bonsai.zero %[[QSA]] {bonsai.phase = "update"} : tensor<2x4xf32>
// SM90-NEXT: bonsai.fp8_update_scales %[[STEP]], %[[USA]], %[[UDSA]], %[[SU]]
// SM90-NEXT: bonsai.zero
// SM90-NEXT: bonsai.zero
// SM90-NEXT: bonsai.fp8_update_scales %[[STEP]], %[[DSA]], %[[DDSA]], %[[SD]]
// SM90-NEXT: bonsai.zero
// SM90-NEXT: bonsai.zero
// SM90-NEXT: bonsai.step_increment %[[STEP]]
// SM90-NOT: bonsai.linear_grad_
// SM90-NOT: bonsai.fp8_

// On sm_80 (and sm_86, and the CPU) the same recipe changes nothing.
// REMARK80: remark: bonsai.fp8: sm_80 has no FP8 tensor cores (they need sm_89 or newer); the 3 targeted linears stay in their precision
// REMARK86: remark: bonsai.fp8: sm_86 has no FP8 tensor cores (they need sm_89 or newer); the 3 targeted linears stay in their precision
// REMARKCPU: remark: bonsai.fp8: the CPU target has no FP8 tensor cores (they need sm_89 or newer); the 3 targeted linears stay in their precision
// SM80-LABEL: func.func @fp8
// SM80-NOT: fp8
// SM80: bonsai.linear %{{.*}} : (tensor<1x16x16xbf16>, tensor<16x16xbf16>) -> tensor<1x16x16xbf16>
// SM80: bonsai.linear_grad_input
// SM80: bonsai.linear_grad_weight
// SM80: bonsai.step_increment
// SM80-NOT: fp8_
// SM80: bonsai.fp8 "delayed"

// `current` scaling: every op scales from its own tensor, and the state holds a history of 4.
// CURRENT: remark: bonsai-fp8: 3 linears in FP8 on sm_90 (E4M3 forward, E5M2 gradients), current scaling with an amax history of 4, margin 2, promoted forward accumulation; state 288 bytes
// CURRENT: bonsai.state optimizer "model.layers.0.self_attn.q_proj.weight.fp8" : tensor<3x8xf32>
// CURRENT: bonsai.fp8_linear {{.*}} {current = true, margin = 2 : i64}
// CURRENT: bonsai.fp8_linear_grad_input {{.*}}current = true, margin = 2 : i64}
// CURRENT: bonsai.fp8_linear_grad_weight {{.*}}current = true, margin = 2 : i64}
// CURRENT: bonsai.fp8_update_scales {{.*}}current = true, margin = 2 : i64}

// Only the forward GEMM may keep its sum in the tensor cores' accumulator, and only when the
// recipe asks (`forward_accumulation "fast"`; the default, `promoted`, leaves the attribute
// out): the gradients' GEMMs never do.
// FAST: remark: bonsai-fp8: 3 linears in FP8 on sm_90 (E4M3 forward, E5M2 gradients), delayed scaling with an amax history of 16, margin 0, fast forward accumulation; state 720 bytes
// FAST-COUNT-3: bonsai.fp8_linear {{.*}} {current = false, fast_accumulation = true, margin = 0 : i64}
// FAST-NOT: fast_accumulation
func.func @fp8(%ids: tensor<1x16xi32>, %labels: tensor<1x16xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<64x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x16xf32>, tensor<1x16xi32>) -> tensor<1x16x16xf32>
  %wq = bonsai.param "model.layers.0.self_attn.q_proj.weight" trainable : tensor<16x16xbf16>
  %hb = bonsai.cast %h : (tensor<1x16x16xf32>) -> tensor<1x16x16xbf16>
  %q = bonsai.linear %hb, %wq : (tensor<1x16x16xbf16>, tensor<16x16xbf16>) -> tensor<1x16x16xbf16>
  %qf = bonsai.cast %q : (tensor<1x16x16xbf16>) -> tensor<1x16x16xf32>
  %wu = bonsai.param "model.layers.0.mlp.up_proj.weight" trainable : tensor<32x16xf32>
  %bu = bonsai.param "model.layers.0.mlp.up_proj.bias" trainable : tensor<32xf32>
  %u = bonsai.linear %qf, %wu, %bu : (tensor<1x16x16xf32>, tensor<32x16xf32>, tensor<32xf32>) -> tensor<1x16x32xf32>
  %wd = bonsai.param "model.layers.0.mlp.down_proj.weight" trainable : tensor<16x32xf32>
  %d = bonsai.linear %u, %wd : (tensor<1x16x32xf32>, tensor<16x32xf32>) -> tensor<1x16x16xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<64x16xf32>
  %logits = bonsai.linear %d, %lm : (tensor<1x16x16xf32>, tensor<64x16xf32>) -> tensor<1x16x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x16x64xf32>, tensor<1x16xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets []
}
