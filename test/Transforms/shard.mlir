// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-galore --bonsai-shard %s -split-input-file -verify-diagnostics | FileCheck %s

// zero1: the optimizer state and the fp32 master are one rank's flat shares; in the update
// phase each whole gradient accumulator is reduce-scattered (before the norm, which then reads
// the shares and is combined over the ranks), the rank's share of the parameter is copied
// out, updated with its shares of the state, and gathered back into the whole parameter.
// Parameters and accumulators stay whole; the frozen embedding is not touched.

// CHECK-LABEL: func.func @zero1
// CHECK-SAME: attributes {bonsai.ranks = 2 : i64, bonsai.shard_strategy = "zero1"}
// CHECK: %[[E:.*]] = bonsai.param "e" frozen : tensor<16x8xbf16>
// CHECK: %[[LM:.*]] = bonsai.param "lm" trainable : tensor<16x8xbf16>
// CHECK: %[[GLM:.*]] = bonsai.state gradient "lm" {bonsai.phase = "backward"} : tensor<16x8xf32>
// CHECK: bonsai.accumulate %{{.*}}, %[[GLM]] {bonsai.phase = "backward"} : tensor<16x8xbf16>, tensor<16x8xf32>
// CHECK: %[[RLM:.*]] = bonsai.reduce_scatter %[[GLM]] {bonsai.phase = "update", ranks = 2 : i64} : (tensor<16x8xf32>) -> tensor<64xf32>
// CHECK: %[[RN:.*]] = bonsai.reduce_scatter %{{.*}} {bonsai.phase = "update", ranks = 2 : i64} : (tensor<8xf32>) -> tensor<4xf32>
// CHECK: %[[LOCAL:.*]] = bonsai.grad_norm %[[RLM]], %[[RN]] {bonsai.phase = "update"}
// CHECK: %[[NORM:.*]] = bonsai.all_reduce %[[LOCAL]] {bonsai.phase = "update", ranks = 2 : i64, reduction = "l2"} : (tensor<f32>) -> tensor<f32>
// CHECK: %[[MASTER:.*]] = bonsai.state optimizer "lm.master" copy_of "lm" sharding <ranks = 2, shape = [16, 8]> : tensor<64xf32>
// CHECK: %[[M:.*]] = bonsai.state optimizer "lm.exp_avg" sharding <ranks = 2, shape = [16, 8]> : tensor<64xf32>
// CHECK: %[[V:.*]] = bonsai.state optimizer "lm.exp_avg_sq" sharding <ranks = 2, shape = [16, 8]> : tensor<64xf32>
// CHECK: %[[SLM:.*]] = bonsai.shard_slice %[[LM]] {bonsai.phase = "update", ranks = 2 : i64} : (tensor<16x8xbf16>) -> tensor<64xbf16>
// CHECK: bonsai.adamw_update %[[RLM]], %{{.*}}, %{{.*}}, %[[NORM]], %[[SLM]], %[[M]], %[[V]], %[[MASTER]]
// CHECK: bonsai.all_gather_into %[[SLM]], %[[LM]] {bonsai.phase = "update", ranks = 2 : i64} : (tensor<64xbf16>, tensor<16x8xbf16>) -> ()
// CHECK: bonsai.zero %[[GLM]] {bonsai.phase = "update"} : tensor<16x8xf32>
// CHECK: bonsai.metric "grad_norm" %[[NORM]]
func.func @zero1(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %hf = bonsai.cast %h : (tensor<1x4x8xbf16>) -> tensor<1x4x8xf32>
  %n = bonsai.rms_norm %hf, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %nb = bonsai.cast %n : (tensor<1x4x8xf32>) -> tensor<1x4x8xbf16>
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %nb, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-remark @+1 {{shard: zero1 over 2 ranks: 5 tensors of 'zero1' sharded (800 B per rank instead of 1.56 KiB); per step: all-gather 288 B, reduce-scatter 544 B (whole tensors; each rank sends and receives 1/2 of them)}}
  bonsai.shard "zero1" ranks 2
  bonsai.optimizer "adamw" lr 1.0e-3 {grad_clip = 1.0 : f64}
}

// -----

// zero2: the accumulators are shares too: each weight gradient is reduce-scattered where the
// backward pass produces it (in its own dtype) and the share accumulated; the update reads the
// accumulator directly.

// CHECK-LABEL: func.func @zero2
// CHECK: %[[LM:.*]] = bonsai.param "lm" trainable : tensor<16x8xbf16>
// CHECK: %[[DW:.*]] = bonsai.linear_grad_weight
// CHECK: %[[GLM:.*]] = bonsai.state gradient "lm" sharding <ranks = 2, shape = [16, 8]> {bonsai.phase = "backward"} : tensor<64xf32>
// CHECK: %[[R:.*]] = bonsai.reduce_scatter %[[DW]] {bonsai.phase = "backward", ranks = 2 : i64} : (tensor<16x8xbf16>) -> tensor<64xbf16>
// CHECK: bonsai.accumulate %[[R]], %[[GLM]] {bonsai.phase = "backward"} : tensor<64xbf16>, tensor<64xf32>
// CHECK: bonsai.grad_norm %[[GLM]], %{{.*}} {bonsai.phase = "update"} : (tensor<64xf32>, tensor<4xf32>) -> tensor<f32>
// CHECK: %[[SLM:.*]] = bonsai.shard_slice %[[LM]]
// CHECK: bonsai.adamw_update %[[GLM]], %{{.*}}, %{{.*}}, %{{.*}}, %[[SLM]],
// CHECK: bonsai.all_gather_into %[[SLM]], %[[LM]]
// CHECK: bonsai.zero %[[GLM]] {bonsai.phase = "update"} : tensor<64xf32>
func.func @zero2(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %hf = bonsai.cast %h : (tensor<1x4x8xbf16>) -> tensor<1x4x8xf32>
  %n = bonsai.rms_norm %hf, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %nb = bonsai.cast %n : (tensor<1x4x8xf32>) -> tensor<1x4x8xbf16>
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %nb, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-remark @+1 {{shard: zero2 over 2 ranks: 7 tensors of 'zero2' sharded (1.05 KiB per rank instead of 2.09 KiB); per micro-batch: reduce-scatter 288 B; per step: all-gather 288 B (whole tensors; each rank sends and receives 1/2 of them)}}
  bonsai.shard "zero2" ranks 2
  bonsai.optimizer "adamw" lr 1.0e-3 {grad_clip = 1.0 : f64}
}

// -----

// zero3: the parameters are shares too, frozen ones included; each is gathered whole right
// before its first use in the forward pass and again before its first use in the backward
// pass, and the update writes the share in place.

// CHECK-LABEL: func.func @zero3
// CHECK: %[[E:.*]] = bonsai.param "e" frozen sharding <ranks = 2, shape = [16, 8]> : tensor<64xbf16>
// CHECK-NEXT: %[[EW:.*]] = bonsai.all_gather %[[E]] {ranks = 2 : i64} : (tensor<64xbf16>) -> tensor<16x8xbf16>
// CHECK-NEXT: bonsai.embedding %[[EW]]
// CHECK: %[[LM:.*]] = bonsai.param "lm" trainable sharding <ranks = 2, shape = [16, 8]> : tensor<64xbf16>
// CHECK-NEXT: %[[LMF:.*]] = bonsai.all_gather %[[LM]] {ranks = 2 : i64} : (tensor<64xbf16>) -> tensor<16x8xbf16>
// CHECK-NEXT: bonsai.linear %{{.*}}, %[[LMF]]
// CHECK: bonsai.cross_entropy_grad
// CHECK-NEXT: %[[LMB:.*]] = bonsai.all_gather %[[LM]] {bonsai.phase = "backward", ranks = 2 : i64} : (tensor<64xbf16>) -> tensor<16x8xbf16>
// CHECK-NEXT: bonsai.linear_grad_input %{{.*}}, %[[LMB]]
// CHECK: bonsai.reduce_scatter
// CHECK: %[[NORM:.*]] = bonsai.all_reduce
// CHECK: bonsai.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %[[NORM]], %[[LM]],
// CHECK-NOT: bonsai.all_gather_into
// CHECK-NOT: bonsai.shard_slice
// CHECK: return
func.func @zero3(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %hf = bonsai.cast %h : (tensor<1x4x8xbf16>) -> tensor<1x4x8xf32>
  %n = bonsai.rms_norm %hf, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %nb = bonsai.cast %n : (tensor<1x4x8xf32>) -> tensor<1x4x8xbf16>
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %nb, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-remark @+1 {{shard: zero3 over 2 ranks: 10 tensors of 'zero3' sharded (1.31 KiB per rank instead of 2.62 KiB); per micro-batch: all-gather 832 B, reduce-scatter 288 B (whole tensors; each rank sends and receives 1/2 of them)}}
  bonsai.shard "zero3" ranks 2
  bonsai.optimizer "adamw" lr 1.0e-3 {grad_clip = 1.0 : f64}
}

// -----

// zero3 with reshard_after_forward false: a parameter the forward pass reads is gathered once,
// before its first forward use, and its backward uses read the same gathered value (one
// all-gather per micro-batch instead of two; the gathered weights live from the forward to the
// backward pass). The frozen embedding has no backward use: gathered once either way. The
// gathers are `kept`: bonsai-remat does not gather them again for what it recomputes.

// CHECK-LABEL: func.func @zero3_kept
// CHECK: %[[LM:.*]] = bonsai.param "lm" trainable sharding <ranks = 2, shape = [16, 8]> : tensor<64xbf16>
// CHECK-NEXT: %[[LMF:.*]] = bonsai.all_gather %[[LM]] {kept, ranks = 2 : i64} : (tensor<64xbf16>) -> tensor<16x8xbf16>
// CHECK-NEXT: bonsai.linear %{{.*}}, %[[LMF]]
// CHECK: bonsai.cross_entropy_grad
// CHECK-NOT: bonsai.all_gather
// CHECK: bonsai.linear_grad_input %{{.*}}, %[[LMF]]
// CHECK-NOT: bonsai.all_gather %
// CHECK: return
func.func @zero3_kept(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %hf = bonsai.cast %h : (tensor<1x4x8xbf16>) -> tensor<1x4x8xf32>
  %n = bonsai.rms_norm %hf, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %nb = bonsai.cast %n : (tensor<1x4x8xf32>) -> tensor<1x4x8xbf16>
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %nb, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-remark @+1 {{shard: zero3 over 2 ranks: 10 tensors of 'zero3_kept' sharded (1.31 KiB per rank instead of 2.62 KiB), 2 parameters (288 B) gathered once per micro-batch and kept from the forward to the backward pass (reshard_after_forward false); per micro-batch: all-gather 544 B, reduce-scatter 288 B (whole tensors; each rank sends and receives 1/2 of them)}}
  bonsai.shard "zero3" ranks 2 reshard_after_forward false
  bonsai.optimizer "adamw" lr 1.0e-3 {grad_clip = 1.0 : f64}
}

// -----

// reshard_after_forward "auto" is bonsai-compile's choice (it compiles the step both ways); the
// pass alone frees the gathered weights after the forward pass and says so.

// CHECK-LABEL: func.func @zero3_auto
// CHECK-COUNT-2: bonsai.all_gather %{{.*}} {ranks = 2 : i64} : (tensor<64xbf16>) -> tensor<16x8xbf16>
func.func @zero3_auto(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  %nw = bonsai.param "n" trainable : tensor<8xf32>
  %hf = bonsai.cast %h : (tensor<1x4x8xbf16>) -> tensor<1x4x8xf32>
  %n = bonsai.rms_norm %hf, %nw : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %nb = bonsai.cast %n : (tensor<1x4x8xf32>) -> tensor<1x4x8xbf16>
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %nb, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-remark @+1 {{shard: zero3 over 2 ranks: 10 tensors of 'zero3_auto' sharded (1.31 KiB per rank instead of 2.62 KiB), each parameter gathered again for the backward pass (reshard_after_forward "auto" is bonsai-compile's choice, which compiles the step both ways; this pass alone frees)}}
  bonsai.shard "zero3" ranks 2 reshard_after_forward "auto"
  bonsai.optimizer "adamw" lr 1.0e-3 {grad_clip = 1.0 : f64}
}

// -----

// One rank: the same rewrite, whose collectives are copies (the runtime's single-rank path).

// CHECK-LABEL: func.func @one_rank
// CHECK: bonsai.param "w" trainable sharding <ranks = 1, shape = [8]> : tensor<8xf32>
func.func @one_rank(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %w = bonsai.param "w" trainable : tensor<8xf32>
  %n = bonsai.rms_norm %h, %w : (tensor<1x4x8xf32>, tensor<8xf32>) -> tensor<1x4x8xf32>
  %logits = bonsai.linear %n, %emb : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-remark @+1 {{shard: zero3 over 1 rank: 3 tensors of 'one_rank' sharded (576 B per rank instead of 576 B); per micro-batch: all-gather 1.06 KiB, reduce-scatter 32 B (whole tensors; each rank sends and receives 0/1 of them)}}
  bonsai.shard "zero3" ranks 1
  bonsai.optimizer "sgd" lr 1.0e-2 {}
}

// -----

// GaLore's update projects whole matrices, so its weight stays whole on every rank (under
// zero3 too): its accumulator is reduce-scattered for the norm and gathered back whole for the
// refresh and the projection; the other parameters are sharded as usual.

// CHECK-LABEL: func.func @galore
// CHECK: %[[W:.*]] = bonsai.param "w" trainable : tensor<16x8xf32>
// CHECK: %[[G:.*]] = bonsai.state gradient "w" {bonsai.phase = "backward"} : tensor<16x8xf32>
// CHECK: %[[R:.*]] = bonsai.reduce_scatter %[[G]] {bonsai.phase = "update", ranks = 2 : i64} : (tensor<16x8xf32>) -> tensor<64xf32>
// CHECK-NEXT: %[[WHOLE:.*]] = bonsai.all_gather %[[R]] {bonsai.phase = "update", ranks = 2 : i64} : (tensor<64xf32>) -> tensor<16x8xf32>
// CHECK-NEXT: bonsai.grad_norm %[[R]], %{{.*}} {bonsai.phase = "update"}
// CHECK: bonsai.galore_refresh %[[WHOLE]],
// CHECK: bonsai.galore_project %[[WHOLE]],
// CHECK: bonsai.galore_adamw_update {{.*}}, %[[W]],
// CHECK: bonsai.zero %[[G]]
func.func @galore(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" trainable : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  // expected-remark @+1 {{GaLore on 'w' (16x8, projected on the right, offset 0)}}
  %w = bonsai.param "w" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %h, %w : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-remark @+1 {{shard: zero3 over 2 ranks: 4 tensors of 'galore' sharded (1.00 KiB per rank instead of 2.00 KiB), 1 trainable parameter kept whole on every rank (not elementwise updates; gradients reduced whole); per micro-batch: all-gather 512 B, reduce-scatter 512 B; per step: all-gather 512 B, reduce-scatter 512 B}}
  bonsai.shard "zero3" ranks 2
  bonsai.optimizer "adamw" lr 1.0e-3 {}
  // expected-remark @+1 {{GaLore (rank 4, svd projector refreshed every 10 steps, staggered): 1 weight}}
  bonsai.galore rank 4 update_proj_gap 10 scale 0.25 projector "svd" targets ["w"]
}

// -----

// zero3 with NF4 weights (QLoRA's base): a frozen NF4 parameter is shared out by its storage
// bytes (the 4-bit codes and the block constants alike) as ui8, and gathered whole before its
// dequantize. 'q' (64x64, 2120 bytes) splits over 8 ranks, 265 bytes each; 'k' (12x64, 404
// bytes) does not and stays whole on every rank. (No gradient flows back through 'q' here, so
// it is gathered in the forward pass only.)

// CHECK-LABEL: func.func @zero3_nf4
// CHECK: %[[Q:.*]] = bonsai.param "q" frozen sharding <ranks = 8, shape = [64, 64], storage = !bonsai.nf4<64, 256>> : tensor<265xui8>
// CHECK-NEXT: %[[QF:.*]] = bonsai.all_gather %[[Q]] {ranks = 8 : i64} : (tensor<265xui8>) -> tensor<64x64x!bonsai.nf4<64, 256>>
// CHECK-NEXT: bonsai.dequantize %[[QF]]
// CHECK: %[[K:.*]] = bonsai.param "k" frozen : tensor<12x64x!bonsai.nf4<64, 256>>
// CHECK-NEXT: bonsai.dequantize %[[K]]
// CHECK-NOT: bonsai.all_gather %[[Q]]
// CHECK: return
func.func @zero3_nf4(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x64xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x64xf32>, tensor<1x4xi32>) -> tensor<1x4x64xf32>
  %q = bonsai.param "q" frozen : tensor<64x64x!bonsai.nf4<64, 256>>
  %qd = bonsai.dequantize %q : (tensor<64x64x!bonsai.nf4<64, 256>>) -> tensor<64x64xf32>
  %a = bonsai.linear %h, %qd : (tensor<1x4x64xf32>, tensor<64x64xf32>) -> tensor<1x4x64xf32>
  %w = bonsai.param "w" trainable : tensor<64xf32>
  %n = bonsai.rms_norm %a, %w : (tensor<1x4x64xf32>, tensor<64xf32>) -> tensor<1x4x64xf32>
  %k = bonsai.param "k" frozen : tensor<12x64x!bonsai.nf4<64, 256>>
  %kd = bonsai.dequantize %k : (tensor<12x64x!bonsai.nf4<64, 256>>) -> tensor<12x64xf32>
  %logits = bonsai.linear %n, %kd : (tensor<1x4x64xf32>, tensor<12x64xf32>) -> tensor<1x4x12xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x12xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  // expected-remark @+1 {{shard: zero3 over 8 ranks: 6 tensors of 'zero3_nf4' sharded (905 B per rank instead of 7.07 KiB), 1 of them an NF4 weight shared out by its storage bytes, 1 frozen parameter (404 B) kept whole on every rank (it does not split evenly); per micro-batch: all-gather 6.57 KiB, reduce-scatter 256 B (whole tensors; each rank sends and receives 7/8 of them)}}
  bonsai.shard "zero3" ranks 8
  bonsai.optimizer "adamw" lr 1.0e-3 {grad_clip = 1.0 : f64}
}
