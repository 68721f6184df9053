// RUN: bonsai-opt --bonsai-insert-lora --bonsai-autodiff --bonsai-optimizer \
// RUN:   --bonsai-fuse="only=dora,dora-weight" %s 2> %t.remarks | FileCheck %s
// RUN: FileCheck %s --check-prefix=REMARK < %t.remarks
// RUN: bonsai-opt --bonsai-insert-lora --bonsai-autodiff --bonsai-optimizer \
// RUN:   --bonsai-fuse="only=dora-weight" %s 2> /dev/null | FileCheck %s --check-prefix=NODORA
// RUN: bonsai-opt --bonsai-insert-lora --bonsai-autodiff --bonsai-optimizer \
// RUN:   --bonsai-fuse="disable=dora-weight,elementwise" %s 2> /dev/null | FileCheck %s --check-prefix=OFF
// Under remat "auto" the recompute set would decide where the rewrite applies, while the
// search's peak model reads what one set's plan materialises: bonsai-remat marks the function
// it searches for (its trial copies too) and the family leaves it alone.
// RUN: bonsai-opt --bonsai-insert-lora --bonsai-autodiff --bonsai-optimizer \
// RUN:   --bonsai-remat="policy=auto device-memory=1000000000" \
// RUN:   --bonsai-fuse="only=dora,dora-weight" %s 2> /dev/null | FileCheck %s --check-prefix=SEARCHED

// The dora-weight family (lib/Transforms/Fusion/DoraWeightScale.cpp) on DoRA adapters on both
// linears of an MLP: each forward s ⊙ (x·Wᵀ + u·Bᵀ) becomes x·(s ⊙ W)ᵀ + u·(s ⊙ B)ᵀ, and the
// backward still reads the output y (now the add) through dora_grad. Without family `dora` the backward reads the pre-scale sum, which
// therefore stays (no rewrite); disabled (and elementwise, which would take the mul into
// SwiGLU's kernel), the output mul stays.

// REMARK: remark: bonsai-fuse: 2 DoRA output gradient (mul, mul, reduce_to, dora_scale); 2 DoRA row scale on the weight (linear, linear, add, mul)

// CHECK-LABEL: func.func @forward
// CHECK:      %[[WU:.*]] = bonsai.param "model.layers.0.mlp.up_proj.weight"
// CHECK:      %[[LBU:.*]] = bonsai.param "model.layers.0.mlp.up_proj.lora_B.weight"
// CHECK:      %[[XA:.*]] = bonsai.mul %{{.*}}, %{{.*}} : (tensor<2x8x8xf32>, tensor<f32>)
// CHECK:      %[[S:.*]] = bonsai.dora_scale %{{.*}}, %[[WU]], %{{.*}}, %[[LBU]]
// CHECK-NEXT: %[[C:.*]] = bonsai.reshape %[[S]] : (tensor<128xf32>) -> tensor<128x1xf32>
// CHECK-NEXT: %[[W2:.*]] = bonsai.mul %[[WU]], %[[C]] : (tensor<128x64xf32>, tensor<128x1xf32>) -> tensor<128x64xf32>
// CHECK-NEXT: %[[B2:.*]] = bonsai.mul %[[LBU]], %[[C]] : (tensor<128x8xf32>, tensor<128x1xf32>) -> tensor<128x8xf32>
// CHECK-NEXT: %[[P:.*]] = bonsai.linear %{{.*}}, %[[W2]] :
// CHECK-NEXT: %[[Q:.*]] = bonsai.linear %[[XA]], %[[B2]]
// CHECK-NEXT: %[[Y:.*]] = bonsai.add %[[P]], %[[Q]] : (tensor<2x8x128xf32>, tensor<2x8x128xf32>) -> tensor<2x8x128xf32>
// CHECK-NEXT: bonsai.silu %[[Y]]
// CHECK:      bonsai.dora_scale
// CHECK-NEXT: bonsai.reshape
// CHECK:      bonsai.dora_grad
// CHECK:      bonsai.dora_grad %{{.*}}, %[[Y]], %[[S]], %{{.*}} {bonsai.phase = "backward"}
// The forward has no output rescale left: every mul by a dora_scale result is on a weight.
// CHECK-NOT:  bonsai.mul %{{.*}}, %[[S]] : (tensor<2x8x128xf32>
// CHECK:      return

// NODORA-LABEL: func.func @forward
// NODORA:       %[[S:.*]] = bonsai.dora_scale
// NODORA-NEXT:  bonsai.mul %{{.*}}, %[[S]] : (tensor<2x8x128xf32>, tensor<128xf32>)
// NODORA-NOT:   bonsai.reshape

// OFF-LABEL: func.func @forward
// OFF:       %[[S:.*]] = bonsai.dora_scale
// OFF-NEXT:  bonsai.mul %{{.*}}, %[[S]] : (tensor<2x8x128xf32>, tensor<128xf32>)
// OFF:       bonsai.dora_grad
// SEARCHED-LABEL: func.func @forward
// SEARCHED-SAME:  bonsai.remat_searched
// SEARCHED:       %[[S:.*]] = bonsai.dora_scale
// SEARCHED-NEXT:  bonsai.mul %{{.*}}, %[[S]] : (tensor<2x8x128xf32>, tensor<128xf32>)
// SEARCHED-NOT:   bonsai.reshape
// SEARCHED:       bonsai.dora_grad
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<64x64xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<64x64xf32>, tensor<2x8xi32>) -> tensor<2x8x64xf32>
  %wu = bonsai.param "model.layers.0.mlp.up_proj.weight" frozen : tensor<128x64xf32>
  %u = bonsai.linear %h, %wu : (tensor<2x8x64xf32>, tensor<128x64xf32>) -> tensor<2x8x128xf32>
  %a = bonsai.silu %u : (tensor<2x8x128xf32>) -> tensor<2x8x128xf32>
  %wd = bonsai.param "model.layers.0.mlp.down_proj.weight" frozen : tensor<64x128xf32>
  %logits = bonsai.linear %a, %wd : (tensor<2x8x128xf32>, tensor<64x128xf32>) -> tensor<2x8x64xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x8x64xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @dora {
  bonsai.lora dora rank 8 alpha 16.0 targets ["*.mlp.*"]
  bonsai.optimizer "adamw" lr 1.0e-03
}
