// RUN: bonsai-opt --bonsai-lower-to-plan="target=sm_90 device-memory=1048576" %s | FileCheck %s

// Inputs, parameters and op results become buffers; the reshape becomes a view; every kernel
// op becomes a launch with its parameters, defaults made explicit; the model function is
// replaced by the step.

// CHECK-NOT: func.func
// CHECK-LABEL: bonsai_plan.step @forward attributes {device_memory = 1048576 : i64, target = "sm_90", tokens_per_step = 8 : i64, vocab_size = 16 : i64}
// CHECK-NEXT: bonsai_plan.arena @weights persistent device size 0
// CHECK-NEXT: bonsai_plan.arena @activations step device size 0
// CHECK-NEXT: %[[IDS:.*]] = bonsai_plan.buffer @activations input "ids" {input_index = 0 : i64} : memref<2x4xi32>
// CHECK-NEXT: %[[LABELS:.*]] = bonsai_plan.buffer @activations input "labels" {input_index = 1 : i64} : memref<2x4xi32>
// CHECK-NEXT: %[[EMB:.*]] = bonsai_plan.buffer @weights parameter "model.embed_tokens.weight" trainable : memref<16x8xf32>
// CHECK-NEXT: %[[H:.*]] = bonsai_plan.buffer @activations activation "embedding.0" : memref<2x4x8xf32>
// CHECK-NEXT: bonsai_plan.launch "embedding" ins(%[[EMB]], %[[IDS]] : memref<16x8xf32>, memref<2x4xi32>) outs(%[[H]] : memref<2x4x8xf32>)
// CHECK-NEXT: %[[NW:.*]] = bonsai_plan.buffer @weights parameter "model.norm.weight" : memref<8xf32>
// CHECK-NEXT: %[[N:.*]] = bonsai_plan.buffer @activations activation "rms_norm.1" : memref<2x4x8xf32>
// CHECK-NEXT: bonsai_plan.launch "rms_norm" ins(%[[H]], %[[NW]] : {{.*}}) outs(%[[N]] : memref<2x4x8xf32>) {params = {epsilon = 9.9999999999999995E-7 : f64}}
// CHECK-NEXT: %[[V:.*]] = bonsai_plan.view %[[N]] : memref<2x4x8xf32> to memref<2x4x2x4xf32>
// CHECK-NEXT: %[[R:.*]] = bonsai_plan.buffer @activations activation "rope.2" : memref<2x4x2x4xf32>
// CHECK-NEXT: bonsai_plan.launch "rope" ins(%[[V]] : memref<2x4x2x4xf32>) outs(%[[R]] : memref<2x4x2x4xf32>) {params = {theta = 1.000000e+04 : f64}}
// CHECK: bonsai_plan.launch "attention" {{.*}} {params = {causal, scale = 5.000000e-01 : f64}}
// CHECK: %[[LOGITS:.*]] = bonsai_plan.buffer @activations activation "logits" : memref<2x4x16xf32>
// CHECK: %[[LOSS:.*]] = bonsai_plan.buffer @activations loss "cross_entropy.{{[0-9]+}}" : memref<f32>
// CHECK-NEXT: bonsai_plan.launch "cross_entropy" ins(%[[LOGITS]], %[[LABELS]] : memref<2x4x16xf32>, memref<2x4xi32>) outs(%[[LOSS]] : memref<f32>) {params = {ignore_index = -100 : i64}}
func.func @forward(%ids: tensor<2x4xi32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<2x4xi32>) -> tensor<2x4x8xf32>
  %nw = bonsai.param "model.norm.weight" frozen : tensor<8xf32>
  %n = bonsai.rms_norm %h, %nw : (tensor<2x4x8xf32>, tensor<8xf32>) -> tensor<2x4x8xf32>
  %q = bonsai.reshape %n : (tensor<2x4x8xf32>) -> tensor<2x4x2x4xf32>
  %r = bonsai.rope %q : (tensor<2x4x2x4xf32>) -> tensor<2x4x2x4xf32>
  %a = bonsai.attention %r, %r, %q {causal, scale = 0.5 : f64} : (tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>) -> tensor<2x4x2x4xf32>
  %a2 = bonsai.reshape %a : (tensor<2x4x2x4xf32>) -> tensor<2x4x8xf32>
  %logits = bonsai.linear %a2, %emb : (tensor<2x4x8xf32>, tensor<16x8xf32>) -> tensor<2x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
