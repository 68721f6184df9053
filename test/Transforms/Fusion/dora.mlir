// RUN: bonsai-opt --bonsai-insert-lora --bonsai-autodiff --bonsai-optimizer \
// RUN:   --bonsai-fuse="only=dora" %s 2> %t.remarks | FileCheck %s
// RUN: FileCheck %s --check-prefix=REMARK < %t.remarks
// RUN: bonsai-opt --bonsai-insert-lora --bonsai-quantize --bonsai-autodiff --bonsai-optimizer \
// RUN:   --bonsai-remat="policy=none per-value-remarks=false" --bonsai-fuse="only=dora" %s \
// RUN:   2> /dev/null | FileCheck %s --check-prefix=NF4
// RUN: bonsai-opt --bonsai-insert-lora --bonsai-autodiff --bonsai-optimizer \
// RUN:   --bonsai-fuse="disable=dora" %s 2> /dev/null | FileCheck %s --check-prefix=OFF

// The dora family (lib/Transforms/Fusion/Dora.cpp) on DoRA adapters on both linears of an MLP:
// each adapted output y = x ⊙ scale has its backward muls, reduce_to and magnitude dora_scale
// replaced by one dora_grad reading the forward's y, so the pre-scale x (the adapter sum) is
// read by nothing after the forward mul. With the NF4 base the backward's dora_scale reads a
// recomputed dequantization of the weight, which counts as the forward's weight (the
// dequantization stays for linear_grad_input). Disabled, the chain stays.

// REMARK: remark: bonsai-fuse: 2 DoRA output gradient (mul, mul, reduce_to, dora_scale)

// CHECK-LABEL: func.func @forward
// CHECK:      %[[UPM:.*]] = bonsai.param "model.layers.0.mlp.up_proj.lora_magnitude_vector"
// CHECK:      %[[UPSUM:.*]] = bonsai.add
// CHECK-NEXT: %[[UPS:.*]] = bonsai.dora_scale %[[UPM]]
// CHECK-NEXT: %[[UP:.*]] = bonsai.mul %[[UPSUM]], %[[UPS]] : (tensor<2x8x128xf32>, tensor<128xf32>)
// CHECK-NOT:  %[[UPSUM]]{{[,: )]}}
// CHECK:      %[[DOWNM:.*]] = bonsai.param "model.layers.0.mlp.down_proj.lora_magnitude_vector"
// CHECK-NOT:  %[[UPSUM]]{{[,: )]}}
// CHECK:      %[[DOWNSUM:.*]] = bonsai.add
// CHECK-NEXT: %[[DOWNS:.*]] = bonsai.dora_scale %[[DOWNM]]
// CHECK-NEXT: %[[DOWN:.*]] = bonsai.mul %[[DOWNSUM]], %[[DOWNS]]
// The pre-scale sums are read by their forward muls alone; no reduce_to is left.
// CHECK-NOT:  %[[UPSUM]]{{[,: )]}}
// CHECK-NOT:  %[[DOWNSUM]]{{[,: )]}}
// CHECK-NOT:  bonsai.reduce_to
// CHECK:      %{{.*}}, %{{.*}} = bonsai.dora_grad %{{.*}}, %[[DOWN]], %[[DOWNS]], %[[DOWNM]] {bonsai.phase = "backward"} : (tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<64xf32>, tensor<64xf32>) -> (tensor<2x8x64xf32>, tensor<64xf32>)
// CHECK-NOT:  %[[UPSUM]]{{[,: )]}}
// CHECK-NOT:  %[[DOWNSUM]]{{[,: )]}}
// CHECK-NOT:  bonsai.reduce_to
// CHECK:      %{{.*}}, %{{.*}} = bonsai.dora_grad %{{.*}}, %[[UP]], %[[UPS]], %[[UPM]] {bonsai.phase = "backward"}
// CHECK-NOT:  %[[UPSUM]]{{[,: )]}}
// CHECK-NOT:  %[[DOWNSUM]]{{[,: )]}}
// CHECK-NOT:  bonsai.reduce_to
// CHECK-NOT:  bonsai.dora_scale {{.*}}bonsai.phase = "backward"
// CHECK:      return

// NF4-LABEL: func.func @forward
// NF4:       %[[UP:.*]] = bonsai.mul %{{.*}}, %[[UPS:.*]] : (tensor<2x8x128xf32>, tensor<128xf32>)
// NF4:       bonsai.dora_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {bonsai.phase = "backward"} : (tensor<2x8x64xf32>
// NF4:       bonsai.dequantize {{.*}}bonsai.recomputed
// NF4:       bonsai.dora_grad %{{.*}}, %[[UP]], %[[UPS]], %{{.*}} {bonsai.phase = "backward"}
// NF4-NOT:   bonsai.reduce_to

// OFF-LABEL: func.func @forward
// OFF-NOT:   bonsai.dora_grad
// OFF:       bonsai.reduce_to
// OFF:       bonsai.dora_scale {{.*}}bonsai.phase = "backward"
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<64x64xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %wu = bonsai.param "model.layers.0.mlp.up_proj.weight" trainable : tensor<128x64xf32>
  %u = bonsai.linear %h, %wu : (tensor<2x8x64xf32>, tensor<128x64xf32>) -> tensor<2x8x128xf32>
  %a = bonsai.silu %u : (tensor<2x8x128xf32>) -> tensor<2x8x128xf32>
  %wd = bonsai.param "model.layers.0.mlp.down_proj.weight" trainable : tensor<64x128xf32>
  %logits = bonsai.linear %a, %wd : (tensor<2x8x128xf32>, tensor<64x128xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @dora {
  bonsai.quantize "nf4" block 64 double_quant 32 targets ["up_proj", "down_proj"]
  bonsai.lora dora rank 8 alpha 16.0 targets ["*.mlp.*"]
  bonsai.optimizer "adamw" lr 1.0e-03
}
