// RUN: bonsai-opt %s | bonsai-opt | FileCheck %s
// RUN: bonsai-opt %s --mlir-print-op-generic | bonsai-opt | FileCheck %s

// Every recipe directive survives print, parse, print, and a full recipe verifies against the
// model it names.

func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" frozen : tensor<32x64xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<32x64xbf16>, tensor<2x8xi32>) -> tensor<2x8x64xbf16>
  %wq = bonsai.param "model.layers.0.self_attn.q_proj.weight" frozen : tensor<64x64xbf16>
  %q = bonsai.linear %h, %wq : (tensor<2x8x64xbf16>, tensor<64x64xbf16>) -> tensor<2x8x64xbf16>
  %wu = bonsai.param "model.layers.0.mlp.up_proj.weight" trainable : tensor<128x64xbf16>
  %u = bonsai.linear %q, %wu : (tensor<2x8x64xbf16>, tensor<128x64xbf16>) -> tensor<2x8x128xbf16>
  %wd = bonsai.param "model.layers.0.mlp.down_proj.weight" trainable : tensor<64x128xbf16>
  %d = bonsai.linear %u, %wd : (tensor<2x8x128xbf16>, tensor<64x128xbf16>) -> tensor<2x8x64xbf16>
  %q4 = bonsai.reshape %d : (tensor<2x8x64xbf16>) -> tensor<2x8x4x16xbf16>
  %a = bonsai.attention %q4, %q4, %q4 {causal, scale = 0.25 : f64} : (tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>, tensor<2x8x4x16xbf16>) -> tensor<2x8x4x16xbf16>
  %a2 = bonsai.reshape %a : (tensor<2x8x4x16xbf16>) -> tensor<2x8x64xbf16>
  %lm = bonsai.param "lm_head.weight" frozen : tensor<32x64xbf16>
  %logits = bonsai.linear %a2, %lm : (tensor<2x8x64xbf16>, tensor<32x64xbf16>) -> tensor<2x8x32xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x32xbf16>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// CHECK-LABEL: bonsai.recipe @everything for @forward {
// CHECK-NEXT:    bonsai.target "sm_90" device_memory 24576 MiB host_memory 65536 MiB
// CHECK-NEXT:    bonsai.quantize "nf4" block 64 double_quant 256 targets ["q_proj"]
// CHECK-NEXT:    bonsai.lora dora rank 8 alpha 1.600000e+01 targets ["q_proj"]
// CHECK-NEXT:    bonsai.optimizer "adamw" lr 1.000000e-03 {grad_clip = 1.000000e+00 : f64, schedule = "cosine", total_steps = 100 : i64, warmup_steps = 10 : i64}
// CHECK-NEXT:    bonsai.galore rank 16 update_proj_gap 200 scale 2.500000e-01 projector "svd" targets ["*.mlp.*"]
// CHECK-NEXT:    bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["up_proj", "down_proj"]
// CHECK-NEXT:    bonsai.shard "zero3" ranks 2
// CHECK-NEXT:    bonsai.offload ["optimizer_state", "gradients"]
// CHECK-NEXT:    bonsai.ring ranks 2
// CHECK-NEXT:    bonsai.remat "auto" sequence_chunks 4
// CHECK-NEXT:  }
bonsai.recipe @everything for @forward {
  bonsai.target "sm_90" device_memory 24576 MiB host_memory 65536 MiB
  bonsai.quantize "nf4" block 64 double_quant 256 targets ["q_proj"]
  bonsai.lora dora rank 8 alpha 16.0 targets ["q_proj"]
  bonsai.optimizer "adamw" lr 1.0e-3 {schedule = "cosine", total_steps = 100, warmup_steps = 10, grad_clip = 1.0 : f64}
  bonsai.galore rank 16 update_proj_gap 200 scale 0.25 projector "svd" targets ["*.mlp.*"]
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["up_proj", "down_proj"]
  bonsai.shard "zero3" ranks 2
  bonsai.offload ["optimizer_state", "gradients"]
  bonsai.ring ranks 2
  bonsai.remat "auto" sequence_chunks 4
}

// CHECK-LABEL: bonsai.recipe @minimal {
// CHECK-NEXT:    bonsai.target "sm_80"
// CHECK-NEXT:    bonsai.optimizer "sgd" lr 1.000000e-01 {momentum = 9.000000e-01 : f64}
// CHECK-NEXT:    bonsai.remat "none"
bonsai.recipe @minimal {
  bonsai.target "sm_80"
  bonsai.optimizer "sgd" lr 0.1 {momentum = 0.9 : f64}
  bonsai.remat "none"
}

// FP8's forward accumulation: `promoted` is the default and is not printed; `fast` is.
// CHECK-LABEL: bonsai.recipe @fp8_promoted
// CHECK-NEXT:    bonsai.fp8 "current" amax_history 1 margin 0 targets []
// CHECK-LABEL: bonsai.recipe @fp8_fast
// CHECK-NEXT:    bonsai.fp8 "delayed" amax_history 16 margin 0 forward_accumulation "fast" targets []
bonsai.recipe @fp8_promoted {
  bonsai.fp8 "current" amax_history 1 margin 0 forward_accumulation "promoted" targets []
}
bonsai.recipe @fp8_fast {
  bonsai.fp8 "delayed" amax_history 16 margin 0 forward_accumulation "fast" targets []
}

// Hopper's arch-specific target and the CPU reference backend are valid targets.
// CHECK-LABEL: bonsai.recipe @hopper_a
// CHECK-NEXT:    bonsai.target "sm_90a"
bonsai.recipe @hopper_a {
  bonsai.target "sm_90a"
}
// CHECK-LABEL: bonsai.recipe @cpu
// CHECK-NEXT:    bonsai.target "cpu"
bonsai.recipe @cpu {
  bonsai.target "cpu"
}

// bonsai.shard's reshard_after_forward: left out (the default, true), true, false or "auto"
// (bonsai-compile's choice), each printed as written.
// CHECK-LABEL: bonsai.recipe @reshard_default
// CHECK-NEXT:    bonsai.shard "zero3" ranks 4{{$}}
// CHECK-LABEL: bonsai.recipe @reshard_freed
// CHECK-NEXT:    bonsai.shard "zero3" ranks 4 reshard_after_forward true
// CHECK-LABEL: bonsai.recipe @reshard_kept
// CHECK-NEXT:    bonsai.shard "zero3" ranks 4 reshard_after_forward false
// CHECK-LABEL: bonsai.recipe @reshard_auto
// CHECK-NEXT:    bonsai.shard "zero3" ranks 4 reshard_after_forward "auto"
bonsai.recipe @reshard_default {
  bonsai.shard "zero3" ranks 4
}
bonsai.recipe @reshard_freed {
  bonsai.shard "zero3" ranks 4 reshard_after_forward true
}
bonsai.recipe @reshard_kept {
  bonsai.shard "zero3" ranks 4 reshard_after_forward false
}
bonsai.recipe @reshard_auto {
  bonsai.shard "zero3" ranks 4 reshard_after_forward "auto"
}
