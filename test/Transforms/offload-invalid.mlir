// RUN: bonsai-opt --bonsai-autodiff --bonsai-optimizer --bonsai-offload %s -split-input-file -verify-diagnostics
// RUN: bonsai-opt --bonsai-offload %S/Inputs/offload-frozen.mlir -verify-diagnostics
// RUN: bonsai-opt --bonsai-offload %S/Inputs/offload-shared-state.mlir -verify-diagnostics
// RUN: bonsai-opt --bonsai-offload %S/Inputs/offload-activations-inference.mlir -verify-diagnostics
// The host step keeps the state in pinned memory too, and refuses the same way.
// RUN: bonsai-opt --bonsai-offload="classes=optimizer_state update=host" %S/Inputs/offload-shared-state.mlir -verify-diagnostics
// The pass option replaces the recipe's classes, and is checked the same way.
// RUN: not bonsai-opt --bonsai-offload=classes=weights %S/Inputs/offload-frozen.mlir 2>&1 | FileCheck %s --check-prefix=OPTION
// RUN: not bonsai-opt --bonsai-offload=classes=master_weights %S/Inputs/offload-frozen.mlir 2>&1 | FileCheck %s --check-prefix=OPTION-FROZEN
// OPTION: error: unknown state class 'weights'; expected 'optimizer_state', 'master_weights' or 'activations'
// OPTION-FROZEN: error: cannot offload 'master_weights': 'frozen' updates no parameter

// SGD without momentum (the default) keeps no state: there is nothing to offload.
func.func @sgd(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "sgd" lr 0.1
  // expected-error @+1 {{cannot offload 'optimizer_state': 'sgd' has optimizer updates that keep no per-parameter state (SGD with momentum 0 keeps none)}}
  bonsai.offload ["optimizer_state"]
}

// -----

// Parameters stored in f32 have no master copies.
func.func @f32(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-error @+1 {{cannot offload 'master_weights': 'f32' has no fp32 master weights: they are kept for trainable parameters stored in bf16 or f16 (unless bonsai.optimizer sets master_weights false), and its trainable parameters are f32 or keep none}}
  bonsai.offload ["optimizer_state", "master_weights"]
}

// -----

// A bf16 model whose recipe turns master weights off has none either.
func.func @no_masters(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xbf16>, tensor<1x4xi32>) -> tensor<1x4x8xbf16>
  %lm = bonsai.param "lm" trainable : tensor<16x8xbf16>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xbf16>, tensor<16x8xbf16>) -> tensor<1x4x16xbf16>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xbf16>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3 {master_weights = false}
  // expected-error @+1 {{cannot offload 'master_weights': 'no_masters' has no fp32 master weights}}
  bonsai.offload ["master_weights"]
}

// -----

// Classes whose offload is not built yet are refused, not ignored.
func.func @parameters(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x8xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x8xf32>, tensor<1x4xi32>) -> tensor<1x4x8xf32>
  %lm = bonsai.param "lm" trainable : tensor<16x8xf32>
  %logits = bonsai.linear %h, %lm : (tensor<1x4x8xf32>, tensor<16x8xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %logits, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}
bonsai.recipe @r {
  bonsai.optimizer "adamw" lr 1.0e-3
  // expected-error @+1 {{offloading 'gradients' is not built yet: this compiler offloads 'optimizer_state', 'master_weights' and 'activations' (docs/offload.md)}}
  bonsai.offload ["optimizer_state", "gradients"]
}
