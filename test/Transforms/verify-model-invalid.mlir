// RUN: bonsai-opt %s -split-input-file -verify-diagnostics --bonsai-verify-model

// Negative tests of the `bonsai-verify-model` pass (lib/Transforms/VerifyModel.cpp): the checks
// that span a whole model function.

// A parameter name declared twice (tied weights are one bonsai.param with two uses).
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  // expected-error @+1 {{parameter 'model.embed_tokens.weight' is declared twice; a parameter used twice (tied weights) is one bonsai.param with two uses}}
  %lm = bonsai.param "model.embed_tokens.weight" trainable : tensor<32x16xf32>
  %l = bonsai.linear %h, %lm : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %loss = bonsai.cross_entropy %l, %labels : (tensor<2x8x32xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// An argument that is a float tensor (model inputs are token ids and labels).
// expected-error @+1 {{argument 0 of model @forward has type 'tensor<2x8x16xf32>'; model inputs are statically shaped integer tensors (token ids, labels)}}
func.func @forward(%x: tensor<2x8x16xf32>, %labels: tensor<2x8xi32>) -> tensor<f32> {
  %w = bonsai.param "lm_head.weight" trainable : tensor<32x16xf32>
  %l = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %loss = bonsai.cross_entropy %l, %labels : (tensor<2x8x32xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// An argument that is a dynamically shaped integer tensor.
// expected-error @+1 {{argument 1 of model @forward has type 'tensor<?x8xi32>'; model inputs are statically shaped integer tensors}}
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<?x8xi32>) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %l = bonsai.linear %h, %emb : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %loss = bonsai.cross_entropy %l, %ids : (tensor<2x8x32xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// An argument that is not a tensor.
// expected-error @+1 {{argument 1 of model @forward has type 'i64'; model inputs are statically shaped integer tensors}}
func.func @forward(%ids: tensor<2x8xi32>, %step: i64) -> tensor<f32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %l = bonsai.linear %h, %emb : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %loss = bonsai.cross_entropy %l, %ids : (tensor<2x8x32xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// A model that returns no loss.
// expected-error @+1 {{model @forward must return exactly one tensor<f32> loss, returns nothing}}
func.func @forward(%ids: tensor<2x8xi32>) {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  return
}

// -----

// A model that returns the loss and something else.
// expected-error @+1 {{model @forward must return exactly one tensor<f32> loss, returns 'tensor<f32>', 'tensor<2x8x32xf32>'}}
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> (tensor<f32>, tensor<2x8x32xf32>) {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %l = bonsai.linear %h, %emb : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %loss = bonsai.cross_entropy %l, %labels : (tensor<2x8x32xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %loss, %l : tensor<f32>, tensor<2x8x32xf32>
}

// -----

// A model that returns one value that is not a 0-d tensor (the logits).
// expected-error @+1 {{model @forward must return exactly one tensor<f32> loss}}
func.func @forward(%ids: tensor<2x8xi32>) -> tensor<2x8x32xf32> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<32x16xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  %l = bonsai.linear %h, %emb : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  return %l : tensor<2x8x32xf32>
}

// -----

// A model that returns a 0-d tensor that is not f32.
// expected-error @+1 {{model @forward must return exactly one tensor<f32> loss}}
func.func @forward(%ids: tensor<2x8xi32>, %labels: tensor<2x8xi32>) -> tensor<bf16> {
  %emb = bonsai.param "model.embed_tokens.weight" trainable : tensor<32x16xbf16>
  %h = bonsai.embedding %emb, %ids : (tensor<32x16xbf16>, tensor<2x8xi32>) -> tensor<2x8x16xbf16>
  %l = bonsai.linear %h, %emb : (tensor<2x8x16xbf16>, tensor<32x16xbf16>) -> tensor<2x8x32xbf16>
  %s = bonsai.reshape %l : (tensor<2x8x32xbf16>) -> tensor<512xbf16>
  %t = bonsai.slice %s {axis = 0 : i64, start = 0 : i64} : (tensor<512xbf16>) -> tensor<1xbf16>
  %r = bonsai.reshape %t : (tensor<1xbf16>) -> tensor<bf16>
  return %r : tensor<bf16>
}

// -----

// Every problem of a model is reported, not only the first; a function that declares no
// parameter is not a model and is not checked.
func.func @helper(%x: tensor<2x8x16xf32>) -> tensor<2x8x16xf32> {
  return %x : tensor<2x8x16xf32>
}
// expected-error @+2 {{argument 0 of model @forward has type 'tensor<2x8xf32>'}}
// expected-error @+1 {{model @forward must return exactly one tensor<f32> loss, returns nothing}}
func.func @forward(%x: tensor<2x8xf32>) {
  %w = bonsai.param "w" trainable : tensor<16x8xf32>
  // expected-error @+1 {{parameter 'w' is declared twice}}
  %v = bonsai.param "w" trainable : tensor<16x8xf32>
  return
}
