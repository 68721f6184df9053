// RUN: bonsai-opt --bonsai-quantize --split-input-file %s | FileCheck %s
// RUN: bonsai-opt --bonsai-quantize --bonsai-autodiff --bonsai-optimizer \
// RUN:   --bonsai-remat="policy=none per-value-remarks=false" --split-input-file %s \
// RUN:   2> %t.remarks | FileCheck %s --check-prefix=TRAIN
// RUN: FileCheck %s --check-prefix=REMARK < %t.remarks
// RUN: bonsai-opt --bonsai-compile-pipeline="train=true remat=none" --split-input-file %s \
// RUN:   2> /dev/null | FileCheck %s --check-prefix=PLAN
// RUN: bonsai-opt --bonsai-quantize --bonsai-print-cost=per-layer=false --split-input-file %s \
// RUN:   -o /dev/null | FileCheck %s --check-prefix=COST

// The targeted frozen weights become NF4 parameters under the same names, each dequantized
// (to its own compute type) right before its first use; untargeted and trainable weights are
// left alone. Training: the backward pass dequantizes again (a bonsai.recomputed clone before
// linear_grad_input) instead of keeping the forward's dequantized weight, even under policy
// none. The plan's NF4 buffers take the layout's bytes: 64x64 elements are 2048 bytes of
// codes, 64 absmax bytes, 2 scales of a 32-block double quantization and the offset.

// CHECK-LABEL: func.func @forward
// CHECK: bonsai.param "model.embed_tokens.weight" trainable : tensor<32x64xf32>
// CHECK: %[[Q:.*]] = bonsai.param "model.layers.0.self_attn.q_proj.weight" frozen : tensor<64x64x!bonsai.nf4<64, 32>>
// CHECK-NEXT: %[[DQ:.*]] = bonsai.dequantize %[[Q]] : (tensor<64x64x!bonsai.nf4<64, 32>>) -> tensor<64x64xf32>
// CHECK-NEXT: bonsai.linear %{{.*}}, %[[DQ]] :
// CHECK: %[[U:.*]] = bonsai.param "model.layers.0.mlp.up_proj.weight" frozen : tensor<128x64x!bonsai.nf4<64, 32>>
// CHECK-NEXT: bonsai.cast
// CHECK-NEXT: %[[DU:.*]] = bonsai.dequantize %[[U]] : (tensor<128x64x!bonsai.nf4<64, 32>>) -> tensor<128x64xbf16>
// CHECK-NEXT: bonsai.linear %{{.*}}, %[[DU]] :
// CHECK: bonsai.param "model.layers.0.mlp.down_proj.weight" frozen : tensor<64x128xf32>
// CHECK: bonsai.param "lm_head.weight" trainable : tensor<32x64xf32>
// CHECK-NOT: bonsai.dequantize

// REMARK: remark: bonsai-remat (policy 'none'): recomputes 2 tensors (2 dequantize)
// TRAIN-LABEL: func.func @forward
// TRAIN: %[[Q:.*]] = bonsai.param "model.layers.0.self_attn.q_proj.weight" frozen
// TRAIN: %[[U:.*]] = bonsai.param "model.layers.0.mlp.up_proj.weight" frozen
// TRAIN: %[[DU:.*]] = bonsai.dequantize %[[U]] :
// TRAIN-NOT: {bonsai.phase
// TRAIN: bonsai.linear %{{.*}}, %[[DU]] :
// TRAIN: %[[DU2:.*]] = bonsai.dequantize %[[U]] {bonsai.phase = "backward", bonsai.recomputed}
// TRAIN-NEXT: bonsai.linear_grad_input %{{.*}}, %[[DU2]] {bonsai.phase = "backward"}
// TRAIN: %[[DQ2:.*]] = bonsai.dequantize %[[Q]] {bonsai.phase = "backward", bonsai.recomputed}
// TRAIN-NEXT: bonsai.linear_grad_input %{{.*}}, %[[DQ2]] {bonsai.phase = "backward"}

// PLAN: bonsai_plan.buffer @weights[{{[0-9]+}}] parameter "model.layers.0.self_attn.q_proj.weight" : memref<64x64x!bonsai.nf4<64, 32>>
// PLAN: bonsai_plan.launch "dequantize" ins(%{{.*}} : memref<64x64x!bonsai.nf4<64, 32>>) outs(%{{.*}} : memref<64x64xf32>)
// PLAN: bonsai_plan.launch "dequantize" ins(%{{.*}} : memref<64x64x!bonsai.nf4<64, 32>>) outs(%{{.*}} : memref<64x64xf32>) {phase = 1 : i32}
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "model.embed_tokens.weight" trainable : tensor<32x64xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<32x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %wq = bonsai.param "model.layers.0.self_attn.q_proj.weight" frozen : tensor<64x64xf32>
  %q = bonsai.linear %h, %wq : (tensor<2x8x64xf32>, tensor<64x64xf32>) -> tensor<2x8x64xf32>
  %wu = bonsai.param "model.layers.0.mlp.up_proj.weight" frozen : tensor<128x64xbf16>
  %qb = bonsai.cast %q : (tensor<2x8x64xf32>) -> tensor<2x8x64xbf16>
  %u = bonsai.linear %qb, %wu : (tensor<2x8x64xbf16>, tensor<128x64xbf16>) -> tensor<2x8x128xbf16>
  %uf = bonsai.cast %u : (tensor<2x8x128xbf16>) -> tensor<2x8x128xf32>
  %wd = bonsai.param "model.layers.0.mlp.down_proj.weight" frozen : tensor<64x128xf32>
  %d = bonsai.linear %uf, %wd : (tensor<2x8x128xf32>, tensor<64x128xf32>) -> tensor<2x8x64xf32>
  %lm = bonsai.param "lm_head.weight" trainable : tensor<32x64xf32>
  %logits = bonsai.linear %d, %lm : (tensor<2x8x64xf32>, tensor<32x64xf32>) -> tensor<2x8x32xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x32xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @q {
  bonsai.quantize "nf4" block 64 double_quant 32 targets ["q_proj", "up_proj"]
  bonsai.optimizer "adamw" lr 1.000000e-03
}

// -----

// A weight shared by two linears is quantized once and dequantized once, before its first
// use; a glob target matches the whole weight name.

// REMARK: remark: bonsai-remat (policy 'none'): recomputes 1 tensor (1 dequantize)

// CHECK-LABEL: func.func @shared
// CHECK: %[[W:.*]] = bonsai.param "model.layers.0.mlp.up_proj.weight" frozen : tensor<64x64x!bonsai.nf4<16, 256>>
// CHECK-NEXT: %[[D:.*]] = bonsai.dequantize %[[W]]
// CHECK-NEXT: %[[A:.*]] = bonsai.linear %{{.*}}, %[[D]]
// CHECK-NEXT: bonsai.linear %[[A]], %[[D]]
// CHECK-NOT: bonsai.dequantize
func.func @shared(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "model.embed_tokens.weight" trainable : tensor<64x64xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<64x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %w = bonsai.param "model.layers.0.mlp.up_proj.weight" frozen : tensor<64x64xf32>
  %a = bonsai.linear %h, %w : (tensor<2x8x64xf32>, tensor<64x64xf32>) -> tensor<2x8x64xf32>
  %b = bonsai.linear %a, %w : (tensor<2x8x64xf32>, tensor<64x64xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %b, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @q {
  bonsai.quantize "nf4" block 16 double_quant 256 targets ["model.layers.*.mlp.*"]
  bonsai.optimizer "adamw" lr 1.000000e-03
}

// -----

// Without a bonsai.quantize directive the pass changes nothing.

// CHECK-LABEL: func.func @plain
// CHECK: bonsai.param "model.layers.0.self_attn.q_proj.weight" frozen : tensor<64x64xf32>
// CHECK-NOT: bonsai.dequantize
func.func @plain(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "model.embed_tokens.weight" trainable : tensor<64x64xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<64x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %w = bonsai.param "model.layers.0.self_attn.q_proj.weight" frozen : tensor<64x64xf32>
  %a = bonsai.linear %h, %w : (tensor<2x8x64xf32>, tensor<64x64xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %a, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @none {
  bonsai.optimizer "adamw" lr 1.000000e-03
}

// -----

// The storage of an NF4 tensor is the runtime's layout (NF4Type::getStorageBytes): 3 x 64
// elements in blocks of 64 are 96 bytes of codes and 3 absmax bytes, padded to 100 so that the
// f32 scale (1 group) and offset are aligned: 108 bytes.

// REMARK: remark: bonsai-remat (policy 'none'): recomputes 1 tensor (1 dequantize)
// REMARK-NOT: remark

// CHECK-LABEL: func.func @padded
// CHECK: bonsai.param "model.layers.0.mlp.down_proj.weight" frozen : tensor<3x64x!bonsai.nf4<64, 256>>
// COST-LABEL: cost report for @padded
// COST: quantized (nf4) {{ *}}192  108 B
func.func @padded(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %embed = bonsai.param "model.embed_tokens.weight" trainable : tensor<3x64xf32>
  %h = bonsai.embedding %embed, %ids : (tensor<3x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %w = bonsai.param "model.layers.0.mlp.down_proj.weight" frozen : tensor<3x64xf32>
  %a = bonsai.linear %h, %w : (tensor<2x8x64xf32>, tensor<3x64xf32>) -> tensor<2x8x3xf32>
  %loss = bonsai.cross_entropy %a, %labels : (tensor<2x8x3xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @q {
  bonsai.quantize "nf4" block 64 double_quant 256 targets ["down_proj"]
  bonsai.optimizer "adamw" lr 1.000000e-03
}
