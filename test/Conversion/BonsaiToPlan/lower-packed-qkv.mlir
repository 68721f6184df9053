// RUN: bonsai-opt --bonsai-lower-to-plan -split-input-file %s | FileCheck %s

// The packed attention ops (packed-qkv, docs/fusion.md) become the kernels of their names with
// causal and scale as parameters (AttentionAttrs, no ring_ranks); the segment ids are the
// plan input "segment_ids" whether the forward (operand 1) or only the gradient (operand 4)
// reads them.

// CHECK-LABEL: bonsai_plan.step @forward
// CHECK: %[[SEG:.*]] = bonsai_plan.buffer @activations input "segment_ids" {input_index = 2 : i64} : memref<1x4xi32>
// CHECK: %[[X:.*]] = bonsai_plan.buffer @activations activation "add.0" : memref<1x4x3x8xf32>
// CHECK: %[[O:.*]] = bonsai_plan.buffer @activations activation "flash_attention_qkv.1" : memref<1x4x1x8xf32>
// CHECK-NEXT: %[[LSE:.*]] = bonsai_plan.buffer @activations activation "flash_attention_qkv.2" : memref<1x1x4xf32>
// CHECK-NEXT: bonsai_plan.launch "flash_attention_qkv" ins(%[[X]], %[[SEG]] : memref<1x4x3x8xf32>, memref<1x4xi32>) outs(%[[O]], %[[LSE]] : memref<1x4x1x8xf32>, memref<1x1x4xf32>) {params = {causal, scale = 5.000000e-01 : f64}}
// CHECK: bonsai_plan.launch "flash_attention_qkv_grad" ins(%{{.*}}, %[[X]], %[[O]], %[[LSE]], %[[SEG]] : {{.*}}) outs(%{{.*}} : memref<1x4x3x8xf32>) {params = {causal, scale = 5.000000e-01 : f64}, phase = 1 : i32}
func.func @forward(%qkv: tensor<1x4x3x8xf32>, %do: tensor<1x4x1x8xf32>, %seg: tensor<1x4xi32>) -> tensor<1x4x3x8xf32> {
  %w = bonsai.param "w" trainable : tensor<1x4x3x8xf32>
  %x = bonsai.add %qkv, %w : (tensor<1x4x3x8xf32>, tensor<1x4x3x8xf32>) -> tensor<1x4x3x8xf32>
  %o, %lse = bonsai.flash_attention_qkv %x, %seg {causal, scale = 5.000000e-01 : f64} : (tensor<1x4x3x8xf32>, tensor<1x4xi32>) -> (tensor<1x4x1x8xf32>, tensor<1x1x4xf32>)
  %g = bonsai.flash_attention_qkv_grad %do, %x, %o, %lse, %seg {bonsai.phase = "backward", causal, scale = 5.000000e-01 : f64} : (tensor<1x4x1x8xf32>, tensor<1x4x3x8xf32>, tensor<1x4x1x8xf32>, tensor<1x1x4xf32>, tensor<1x4xi32>) -> tensor<1x4x3x8xf32>
  return %g : tensor<1x4x3x8xf32>
}

// -----

// CHECK-LABEL: bonsai_plan.step @grad_only
// CHECK: %[[SEG:.*]] = bonsai_plan.buffer @activations input "segment_ids" {input_index = 4 : i64} : memref<1x4xi32>
// CHECK: bonsai_plan.launch "flash_attention_qkv_grad" ins({{.*}}, %[[SEG]] : {{.*}}) outs(%{{.*}} : memref<1x4x3x8xf32>) {params = {scale = 5.000000e-01 : f64}, phase = 1 : i32}
func.func @grad_only(%qkv: tensor<1x4x3x8xf32>, %do: tensor<1x4x1x8xf32>, %o: tensor<1x4x1x8xf32>, %lse: tensor<1x1x4xf32>, %seg: tensor<1x4xi32>) -> tensor<1x4x3x8xf32> {
  %w = bonsai.param "w" trainable : tensor<1x4x3x8xf32>
  %x = bonsai.add %qkv, %w : (tensor<1x4x3x8xf32>, tensor<1x4x3x8xf32>) -> tensor<1x4x3x8xf32>
  %g = bonsai.flash_attention_qkv_grad %do, %x, %o, %lse, %seg {bonsai.phase = "backward", scale = 5.000000e-01 : f64} : (tensor<1x4x1x8xf32>, tensor<1x4x3x8xf32>, tensor<1x4x1x8xf32>, tensor<1x1x4xf32>, tensor<1x4xi32>) -> tensor<1x4x3x8xf32>
  return %g : tensor<1x4x3x8xf32>
}
