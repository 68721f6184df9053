// RUN: bonsai-opt %s -split-input-file -verify-diagnostics

// Negative tests of the model ops, the NF4 type and the sharding attribute: one case (at least)
// per verifier rule in BonsaiOps.cpp / BonsaiDialect.cpp and per ODS type constraint.

//===----------------------------------------------------------------------===//
// !bonsai.nf4 (NF4Type::verify)
//===----------------------------------------------------------------------===//

// NF4 block size: not a power of two.
func.func @nf4_block_not_pow2() {
  // expected-error @+1 {{NF4 block size must be a power of two in [16, 4096], got 48}}
  %w = bonsai.param "w" frozen : tensor<96x!bonsai.nf4<48, 256>>
  return
}

// -----

// NF4 block size: below 16.
func.func @nf4_block_too_small() {
  // expected-error @+1 {{NF4 block size must be a power of two in [16, 4096], got 8}}
  %w = bonsai.param "w" frozen : tensor<64x!bonsai.nf4<8, 256>>
  return
}

// -----

// NF4 block size: above 4096.
func.func @nf4_block_too_large() {
  // expected-error @+1 {{NF4 block size must be a power of two in [16, 4096], got 8192}}
  %w = bonsai.param "w" frozen : tensor<8192x!bonsai.nf4<8192, 256>>
  return
}

// -----

// NF4 double-quantization block: zero.
func.func @nf4_double_quant_zero() {
  // expected-error @+1 {{NF4 double-quantization block must be positive, got 0}}
  %w = bonsai.param "w" frozen : tensor<64x!bonsai.nf4<64, 0>>
  return
}

//===----------------------------------------------------------------------===//
// #bonsai.sharding (ShardingAttr::verify)
//===----------------------------------------------------------------------===//

// -----

// Sharding: a whole-tensor dimension that is not positive.
func.func @sharding_nonpositive_dim() {
  // expected-error @+1 {{sharding: the whole tensor's dimensions must be positive, got -1}}
  %w = bonsai.param "w" frozen sharding <ranks = 2, shape = [-1, 16]> : tensor<8xf32>
  return
}

// -----

// Sharding ranks: fewer than one.
func.func @sharding_zero_ranks() {
  // expected-error @+1 {{sharding needs at least one rank, got 0}}
  %w = bonsai.param "w" frozen sharding <ranks = 0, shape = [16, 16]> : tensor<16x16xf32>
  return
}

// -----

// Placement: not one of the memory spaces (enum attribute parser).
func.func @placement_unknown() {
  // expected-error @+2 {{expected ::mlir::bonsai::MemorySpace to be one of: device, pinned_host}}
  // expected-error @+1 {{failed to parse Bonsai_PlacementAttr parameter 'value' which is to be a `::mlir::bonsai::MemorySpace`}}
  %w = bonsai.param "w" frozen placement <gpu> : tensor<16x16xf32>
  return
}

//===----------------------------------------------------------------------===//
// bonsai.param
//===----------------------------------------------------------------------===//

// -----

// param: empty name.
func.func @param_empty_name() {
  // expected-error @+1 {{parameter name must not be empty}}
  %w = bonsai.param "" frozen : tensor<16x16xf32>
  return
}

// -----

// param: trainable with an integer element type.
func.func @param_trainable_i32() {
  // expected-error @+1 {{trainable parameter 'w' must have a bf16, f16 or f32 element type, got 'i32'}}
  %w = bonsai.param "w" trainable : tensor<16x16xi32>
  return
}

// -----

// param: trainable with an FP8 element type.
func.func @param_trainable_f8() {
  // expected-error @+1 {{trainable parameter 'w' must have a bf16, f16 or f32 element type, got 'f8E4M3FN'}}
  %w = bonsai.param "w" trainable : tensor<16x16xf8E4M3FN>
  return
}

// -----

// param: trainable with an NF4 element type (NF4 weights are frozen).
func.func @param_trainable_nf4() {
  // expected-error @+1 {{trainable parameter 'w' must have a bf16, f16 or f32 element type}}
  %w = bonsai.param "w" trainable : tensor<16x16x!bonsai.nf4<64, 256>>
  return
}

// -----

// param: NF4 tensor whose element count is not a multiple of the block size.
func.func @param_nf4_partial_block() {
  // expected-error @+1 {{NF4 parameter 'w' has 48 elements, not a multiple of the block size 64}}
  %w = bonsai.param "w" frozen : tensor<48x!bonsai.nf4<64, 256>>
  return
}

// -----

// param: the type is not one rank's share of the whole tensor.
func.func @param_sharding_wrong_share() {
  // expected-error @+1 {{parameter 'w' sharded over 2 ranks must be 'tensor<128xf32>' (one rank's share), got 'tensor<16x16xf32>'}}
  %w = bonsai.param "w" frozen sharding <ranks = 2, shape = [16, 16]> : tensor<16x16xf32>
  return
}

// -----

// Sharding by storage bytes: the storage type is not a packed one.
func.func @sharding_storage_not_packed() {
  // expected-error @+1 {{sharding: storage 'bf16' is not a packed element type (only those are shared out by bytes)}}
  %w = bonsai.param "w" frozen sharding <ranks = 2, shape = [64, 64], storage = bf16> : tensor<4096xui8>
  return
}

// -----

// Sharding by storage bytes: the NF4 storage (140 bytes) does not split over 8 ranks.
func.func @sharding_storage_uneven() {
  // expected-error @+1 {{sharding: the 140 storage bytes of 256 elements of '!bonsai.nf4<64, 256>' do not split evenly over 8 ranks}}
  %w = bonsai.param "w" frozen sharding <ranks = 8, shape = [16, 16], storage = !bonsai.nf4<64, 256>> : tensor<17xui8>
  return
}

// -----

// param: a share of NF4 storage is ui8 bytes, not NF4 elements.
func.func @param_sharding_nf4_not_bytes() {
  // expected-error @+1 {{parameter 'w' sharded over 2 ranks must be 'tensor<1060xui8>' (one rank's share), got 'tensor<2048x!bonsai.nf4<64, 256>>'}}
  %w = bonsai.param "w" frozen sharding <ranks = 2, shape = [64, 64], storage = !bonsai.nf4<64, 256>> : tensor<2048x!bonsai.nf4<64, 256>>
  return
}

// -----

// param: the whole tensor does not split evenly.
func.func @param_sharding_uneven() {
  // expected-error @+1 {{sharding: 30 elements do not split evenly over 4 ranks}}
  %w = bonsai.param "w" frozen sharding <ranks = 4, shape = [10, 3]> : tensor<7xf32>
  return
}

// -----

// param (ODS): the result must be statically shaped.
func.func @param_dynamic_shape() {
  // expected-error @+1 {{result #0 must be non-empty statically shaped tensor}}
  %w = bonsai.param "w" frozen : tensor<?x16xf32>
  return
}

// -----

// param (ODS): an element type bonsai tensors do not hold (f64).
func.func @param_f64() {
  // expected-error @+1 {{result #0 must be non-empty statically shaped tensor}}
  %w = bonsai.param "w" frozen : tensor<16x16xf64>
  return
}

// -----

// param (ODS): an element type bonsai tensors do not hold (i8).
func.func @param_i8() {
  // expected-error @+1 {{result #0 must be non-empty statically shaped tensor}}
  %w = bonsai.param "w" frozen : tensor<16x16xi8>
  return
}

//===----------------------------------------------------------------------===//
// bonsai.embedding
//===----------------------------------------------------------------------===//

// -----

// embedding: the table must have rank 2.
func.func @embedding_table_rank(%t: tensor<32xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{table rank: expected 2, got 1}}
  %h = bonsai.embedding %t, %ids : (tensor<32xf32>, tensor<2x8xi32>) -> tensor<2x8x16xf32>
  return
}

// -----

// embedding: result shape is ids' shape plus the hidden size.
func.func @embedding_result_shape(%t: tensor<32x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{result shape: expected [2, 8, 16], got [2, 8, 32]}}
  %h = bonsai.embedding %t, %ids : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x32xf32>
  return
}

// -----

// embedding: result element type is the table's.
func.func @embedding_result_element(%t: tensor<32x16xf32>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{result element type: expected 'f32', got 'bf16'}}
  %h = bonsai.embedding %t, %ids : (tensor<32x16xf32>, tensor<2x8xi32>) -> tensor<2x8x16xbf16>
  return
}

// -----

// embedding (ODS): ids must be integers.
func.func @embedding_float_ids(%t: tensor<32x16xf32>, %ids: tensor<2x8xf32>) {
  // expected-error @+1 {{operand #1 must be non-empty statically shaped tensor of 32-bit signless integer or 64-bit signless integer values}}
  %h = bonsai.embedding %t, %ids : (tensor<32x16xf32>, tensor<2x8xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// embedding (ODS): the table must be a compute type (not FP8).
func.func @embedding_f8_table(%t: tensor<32x16xf8E4M3FN>, %ids: tensor<2x8xi32>) {
  // expected-error @+1 {{operand #0 must be non-empty statically shaped tensor of bfloat16 type or 16-bit float or 32-bit float values}}
  %h = bonsai.embedding %t, %ids : (tensor<32x16xf8E4M3FN>, tensor<2x8xi32>) -> tensor<2x8x16xf8E4M3FN>
  return
}

//===----------------------------------------------------------------------===//
// bonsai.linear
//===----------------------------------------------------------------------===//

// -----

// linear: the input needs a feature dimension.
func.func @linear_input_rank0(%x: tensor<f32>, %w: tensor<16x16xf32>) {
  // expected-error @+1 {{input must have rank at least 1}}
  %y = bonsai.linear %x, %w : (tensor<f32>, tensor<16x16xf32>) -> tensor<16xf32>
  return
}

// -----

// linear: the weight must have rank 2.
func.func @linear_weight_rank(%x: tensor<2x8x16xf32>, %w: tensor<2x16x16xf32>) {
  // expected-error @+1 {{weight rank: expected 2, got 3}}
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<2x16x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// linear: the weight is [out, in] (a transposed [in, out] weight is rejected).
func.func @linear_weight_layout(%x: tensor<2x8x16xf32>, %w: tensor<16x32xf32>) {
  // expected-error @+1 {{weight shape: expected [out, 16] (Hugging Face [out, in] layout for input features 16), got [16, 32]}}
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x32xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// linear: weight element type must match the input's.
func.func @linear_weight_element(%x: tensor<2x8x16xf32>, %w: tensor<32x16xbf16>) {
  // expected-error @+1 {{weight element type: expected 'f32', got 'bf16'}}
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16xbf16>) -> tensor<2x8x32xf32>
  return
}

// -----

// linear: the bias is [out].
func.func @linear_bias_shape(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{bias shape: expected [32], got [16]}}
  %y = bonsai.linear %x, %w, %b : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<16xf32>) -> tensor<2x8x32xf32>
  return
}

// -----

// linear: bias element type must match the input's.
func.func @linear_bias_element(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>, %b: tensor<32xf16>) {
  // expected-error @+1 {{bias element type: expected 'f32', got 'f16'}}
  %y = bonsai.linear %x, %w, %b : (tensor<2x8x16xf32>, tensor<32x16xf32>, tensor<32xf16>) -> tensor<2x8x32xf32>
  return
}

// -----

// linear: result shape is [..., out].
func.func @linear_result_shape(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>) {
  // expected-error @+1 {{result shape: expected [2, 8, 32], got [2, 8, 16]}}
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// linear: result element type must match the input's.
func.func @linear_result_element(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>) {
  // expected-error @+1 {{result element type: expected 'f32', got 'bf16'}}
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xbf16>
  return
}

// -----

// linear (ODS): an NF4 weight must be dequantized first.
func.func @linear_nf4_weight(%x: tensor<2x8x16xf32>, %w: tensor<32x16x!bonsai.nf4<64, 256>>) {
  // expected-error @+1 {{operand #1 must be non-empty statically shaped tensor of bfloat16 type or 16-bit float or 32-bit float or f8E4M3FN type or f8E5M2 type values}}
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16x!bonsai.nf4<64, 256>>) -> tensor<2x8x32xf32>
  return
}

// -----

// linear (ODS): the input must be statically shaped.
func.func @linear_dynamic_input(%x: tensor<?x8x16xf32>, %w: tensor<32x16xf32>) {
  // expected-error @+1 {{operand #0 must be non-empty statically shaped tensor}}
  %y = bonsai.linear %x, %w : (tensor<?x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  return
}

//===----------------------------------------------------------------------===//
// bonsai.matmul
//===----------------------------------------------------------------------===//

// -----

// matmul: lhs needs rank at least 2.
func.func @matmul_lhs_rank(%a: tensor<16xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{lhs rank: expected at least 2, got 1}}
  %c = bonsai.matmul %a, %b : (tensor<16xf32>, tensor<16xf32>) -> tensor<f32>
  return
}

// -----

// matmul: rhs has the rank of lhs.
func.func @matmul_rhs_rank(%a: tensor<2x8x16xf32>, %b: tensor<16x4xf32>) {
  // expected-error @+1 {{rhs rank: expected 3, got 2}}
  %c = bonsai.matmul %a, %b : (tensor<2x8x16xf32>, tensor<16x4xf32>) -> tensor<2x8x4xf32>
  return
}

// -----

// matmul: batch dimensions agree.
func.func @matmul_batch(%a: tensor<2x8x16xf32>, %b: tensor<3x16x4xf32>) {
  // expected-error @+1 {{batch dimensions differ: lhs [2], rhs [3]}}
  %c = bonsai.matmul %a, %b : (tensor<2x8x16xf32>, tensor<3x16x4xf32>) -> tensor<2x8x4xf32>
  return
}

// -----

// matmul: contraction dimensions agree.
func.func @matmul_contraction(%a: tensor<2x8x16xf32>, %b: tensor<2x8x4xf32>) {
  // expected-error @+1 {{contraction dimension: lhs has 16, rhs has 8}}
  %c = bonsai.matmul %a, %b : (tensor<2x8x16xf32>, tensor<2x8x4xf32>) -> tensor<2x8x4xf32>
  return
}

// -----

// matmul: rhs element type is lhs's.
func.func @matmul_rhs_element(%a: tensor<2x8x16xf32>, %b: tensor<2x16x4xbf16>) {
  // expected-error @+1 {{rhs element type: expected 'f32', got 'bf16'}}
  %c = bonsai.matmul %a, %b : (tensor<2x8x16xf32>, tensor<2x16x4xbf16>) -> tensor<2x8x4xf32>
  return
}

// -----

// matmul: result shape is [..., m, n].
func.func @matmul_result_shape(%a: tensor<2x8x16xf32>, %b: tensor<2x16x4xf32>) {
  // expected-error @+1 {{result shape: expected [2, 8, 4], got [2, 8, 16]}}
  %c = bonsai.matmul %a, %b : (tensor<2x8x16xf32>, tensor<2x16x4xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// matmul: result element type is lhs's.
func.func @matmul_result_element(%a: tensor<2x8x16xf32>, %b: tensor<2x16x4xf32>) {
  // expected-error @+1 {{result element type: expected 'f32', got 'f16'}}
  %c = bonsai.matmul %a, %b : (tensor<2x8x16xf32>, tensor<2x16x4xf32>) -> tensor<2x8x4xf16>
  return
}

//===----------------------------------------------------------------------===//
// bonsai.add, bonsai.mul
//===----------------------------------------------------------------------===//

// -----

// add: rhs element type is lhs's.
func.func @add_rhs_element(%a: tensor<2x8x16xf32>, %b: tensor<8x16xbf16>) {
  // expected-error @+1 {{rhs element type: expected 'f32', got 'bf16'}}
  %c = bonsai.add %a, %b : (tensor<2x8x16xf32>, tensor<8x16xbf16>) -> tensor<2x8x16xf32>
  return
}

// -----

// add: only rhs is broadcast, so its rank may not exceed lhs's.
func.func @add_rhs_rank(%a: tensor<8x16xf32>, %b: tensor<2x8x16xf32>) {
  // expected-error @+1 {{rhs rank 3 exceeds lhs rank 2 (only rhs is broadcast)}}
  %c = bonsai.add %a, %b : (tensor<8x16xf32>, tensor<2x8x16xf32>) -> tensor<8x16xf32>
  return
}

// -----

// add: each rhs dimension equals the trailing lhs dimension or is 1.
func.func @add_broadcast(%a: tensor<2x8x16xf32>, %b: tensor<4x16xf32>) {
  // expected-error @+1 {{rhs shape [4, 16] does not broadcast to lhs shape [2, 8, 16]: rhs dimension 0 is 4, expected 8 or 1}}
  %c = bonsai.add %a, %b : (tensor<2x8x16xf32>, tensor<4x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// add: the result has lhs's type.
func.func @add_result_type(%a: tensor<2x8x16xf32>, %b: tensor<1x16xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<2x8x16xf32>' (the type of lhs), got 'tensor<8x16xf32>'}}
  %c = bonsai.add %a, %b : (tensor<2x8x16xf32>, tensor<1x16xf32>) -> tensor<8x16xf32>
  return
}

// -----

// add (ODS): operands are compute types (not FP8).
func.func @add_f8(%a: tensor<8x16xf8E5M2>, %b: tensor<8x16xf8E5M2>) {
  // expected-error @+1 {{operand #0 must be non-empty statically shaped tensor of bfloat16 type or 16-bit float or 32-bit float values}}
  %c = bonsai.add %a, %b : (tensor<8x16xf8E5M2>, tensor<8x16xf8E5M2>) -> tensor<8x16xf8E5M2>
  return
}

// -----

// mul: shares add's broadcast rule.
func.func @mul_broadcast(%a: tensor<2x8x16xf32>, %b: tensor<8x4xf32>) {
  // expected-error @+1 {{rhs shape [8, 4] does not broadcast to lhs shape [2, 8, 16]: rhs dimension 1 is 4, expected 16 or 1}}
  %c = bonsai.mul %a, %b : (tensor<2x8x16xf32>, tensor<8x4xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// mul: shares add's element-type rule.
func.func @mul_rhs_element(%a: tensor<2x8x16xf32>, %b: tensor<16xf16>) {
  // expected-error @+1 {{rhs element type: expected 'f32', got 'f16'}}
  %c = bonsai.mul %a, %b : (tensor<2x8x16xf32>, tensor<16xf16>) -> tensor<2x8x16xf32>
  return
}

//===----------------------------------------------------------------------===//
// bonsai.rms_norm, bonsai.layer_norm
//===----------------------------------------------------------------------===//

// -----

// rms_norm: the input needs a last dimension.
func.func @rms_norm_input_rank0(%x: tensor<f32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{input must have rank at least 1}}
  %y = bonsai.rms_norm %x, %w : (tensor<f32>, tensor<16xf32>) -> tensor<f32>
  return
}

// -----

// rms_norm: the weight has the size of the last dimension.
func.func @rms_norm_weight_shape(%x: tensor<2x8x16xf32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{weight shape: expected [16], got [8]}}
  %y = bonsai.rms_norm %x, %w : (tensor<2x8x16xf32>, tensor<8xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// rms_norm: the weight has the input's element type.
func.func @rms_norm_weight_element(%x: tensor<2x8x16xf32>, %w: tensor<16xbf16>) {
  // expected-error @+1 {{weight element type: expected 'f32', got 'bf16'}}
  %y = bonsai.rms_norm %x, %w : (tensor<2x8x16xf32>, tensor<16xbf16>) -> tensor<2x8x16xf32>
  return
}

// -----

// rms_norm: epsilon must be positive.
func.func @rms_norm_epsilon(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{epsilon must be positive, got 0.000000e+00}}
  %y = bonsai.rms_norm %x, %w {epsilon = 0.0 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// rms_norm: the result has the input's type.
func.func @rms_norm_result_type(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<2x8x16xf32>' (the type of input), got 'tensor<2x8x16xbf16>'}}
  %y = bonsai.rms_norm %x, %w : (tensor<2x8x16xf32>, tensor<16xf32>) -> tensor<2x8x16xbf16>
  return
}

// -----

// layer_norm: the weight has the size of the last dimension.
func.func @layer_norm_weight_shape(%x: tensor<2x8x16xf32>, %w: tensor<8xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{weight shape: expected [16], got [8]}}
  %y = bonsai.layer_norm %x, %w, %b : (tensor<2x8x16xf32>, tensor<8xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// layer_norm: the bias has the size of the last dimension.
func.func @layer_norm_bias_shape(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>, %b: tensor<8xf32>) {
  // expected-error @+1 {{bias shape: expected [16], got [8]}}
  %y = bonsai.layer_norm %x, %w, %b : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<8xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// layer_norm: the bias has the input's element type.
func.func @layer_norm_bias_element(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>, %b: tensor<16xf16>) {
  // expected-error @+1 {{bias element type: expected 'f32', got 'f16'}}
  %y = bonsai.layer_norm %x, %w, %b : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf16>) -> tensor<2x8x16xf32>
  return
}

// -----

// layer_norm: epsilon must be positive.
func.func @layer_norm_epsilon(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{epsilon must be positive, got -1.000000e+00}}
  %y = bonsai.layer_norm %x, %w, %b {epsilon = -1.0 : f64} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// layer_norm: the result has the input's type.
func.func @layer_norm_result_type(%x: tensor<2x8x16xf32>, %w: tensor<16xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<2x8x16xf32>' (the type of input), got 'tensor<2x16xf32>'}}
  %y = bonsai.layer_norm %x, %w, %b : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x16xf32>
  return
}

//===----------------------------------------------------------------------===//
// bonsai.rope
//===----------------------------------------------------------------------===//

// -----

// rope: the input is [batch, seq, heads, head_dim].
func.func @rope_rank(%x: tensor<2x8x16xf32>) {
  // expected-error @+1 {{input rank: expected 4 ([batch, seq, heads, head_dim]), got 3}}
  %y = bonsai.rope %x : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// rope: head_dim must be even.
func.func @rope_odd_head_dim(%x: tensor<2x8x2x5xf32>) {
  // expected-error @+1 {{head_dim must be even to rotate pairs, got 5}}
  %y = bonsai.rope %x : (tensor<2x8x2x5xf32>) -> tensor<2x8x2x5xf32>
  return
}

// -----

// rope: theta must be positive.
func.func @rope_theta(%x: tensor<2x8x2x4xf32>) {
  // expected-error @+1 {{theta must be positive, got 0.000000e+00}}
  %y = bonsai.rope %x {theta = 0.0 : f64} : (tensor<2x8x2x4xf32>) -> tensor<2x8x2x4xf32>
  return
}

// -----

// rope: the result has the input's type.
func.func @rope_result_type(%x: tensor<2x8x2x4xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<2x8x2x4xf32>' (the type of input), got 'tensor<2x8x2x4xbf16>'}}
  %y = bonsai.rope %x : (tensor<2x8x2x4xf32>) -> tensor<2x8x2x4xbf16>
  return
}

//===----------------------------------------------------------------------===//
// bonsai.attention
//===----------------------------------------------------------------------===//

// -----

// attention: the query is [batch, seq, heads, head_dim].
func.func @attention_query_rank(%q: tensor<2x8x16xf32>, %k: tensor<2x8x2x4xf32>) {
  // expected-error @+1 {{query rank: expected 4 ([batch, seq, heads, head_dim]), got 3}}
  %o = bonsai.attention %q, %k, %k {scale = 0.5 : f64} : (tensor<2x8x16xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// attention: the key has rank 4.
func.func @attention_key_rank(%q: tensor<2x8x2x4xf32>, %k: tensor<2x8x8xf32>, %v: tensor<2x8x2x4xf32>) {
  // expected-error @+1 {{key rank: expected 4, got 3}}
  %o = bonsai.attention %q, %k, %v {scale = 0.5 : f64} : (tensor<2x8x2x4xf32>, tensor<2x8x8xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x2x4xf32>
  return
}

// -----

// attention: the value has rank 4.
func.func @attention_value_rank(%q: tensor<2x8x2x4xf32>, %v: tensor<2x8x8xf32>) {
  // expected-error @+1 {{value rank: expected 4, got 3}}
  %o = bonsai.attention %q, %q, %v {scale = 0.5 : f64} : (tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x8xf32>) -> tensor<2x8x2x4xf32>
  return
}

// -----

// attention: the value has the key's shape.
func.func @attention_value_shape(%q: tensor<2x8x2x4xf32>, %v: tensor<2x8x1x4xf32>) {
  // expected-error @+1 {{value shape: expected [2, 8, 2, 4], got [2, 8, 1, 4]}}
  %o = bonsai.attention %q, %q, %v {scale = 0.5 : f64} : (tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x1x4xf32>) -> tensor<2x8x2x4xf32>
  return
}

// -----

// attention: key batch and sequence are the query's.
func.func @attention_key_seq(%q: tensor<2x8x2x4xf32>, %k: tensor<2x4x2x4xf32>) {
  // expected-error @+1 {{key batch and sequence: expected [2, 8] (as query), got [2, 4]}}
  %o = bonsai.attention %q, %k, %k {scale = 0.5 : f64} : (tensor<2x8x2x4xf32>, tensor<2x4x2x4xf32>, tensor<2x4x2x4xf32>) -> tensor<2x8x2x4xf32>
  return
}

// -----

// attention: key head_dim is the query's.
func.func @attention_key_head_dim(%q: tensor<2x8x2x4xf32>, %k: tensor<2x8x2x8xf32>) {
  // expected-error @+1 {{key head_dim: expected 4 (as query), got 8}}
  %o = bonsai.attention %q, %k, %k {scale = 0.5 : f64} : (tensor<2x8x2x4xf32>, tensor<2x8x2x8xf32>, tensor<2x8x2x8xf32>) -> tensor<2x8x2x4xf32>
  return
}

// -----

// attention: query heads are a multiple of key/value heads (GQA).
func.func @attention_gqa(%q: tensor<2x8x4x4xf32>, %k: tensor<2x8x3x4xf32>) {
  // expected-error @+1 {{query heads (4) must be a multiple of key/value heads (3) for grouped-query attention}}
  %o = bonsai.attention %q, %k, %k {scale = 0.5 : f64} : (tensor<2x8x4x4xf32>, tensor<2x8x3x4xf32>, tensor<2x8x3x4xf32>) -> tensor<2x8x4x4xf32>
  return
}

// -----

// attention: key element type is the query's.
func.func @attention_key_element(%q: tensor<2x8x2x4xf32>, %k: tensor<2x8x2x4xbf16>) {
  // expected-error @+1 {{key element type: expected 'f32', got 'bf16'}}
  %o = bonsai.attention %q, %k, %k {scale = 0.5 : f64} : (tensor<2x8x2x4xf32>, tensor<2x8x2x4xbf16>, tensor<2x8x2x4xbf16>) -> tensor<2x8x2x4xf32>
  return
}

// -----

// attention: value element type is the query's.
func.func @attention_value_element(%q: tensor<2x8x2x4xf32>, %v: tensor<2x8x2x4xf16>) {
  // expected-error @+1 {{value element type: expected 'f32', got 'f16'}}
  %o = bonsai.attention %q, %q, %v {scale = 0.5 : f64} : (tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf16>) -> tensor<2x8x2x4xf32>
  return
}

// -----

// attention: scale must be positive.
func.func @attention_scale(%q: tensor<2x8x2x4xf32>) {
  // expected-error @+1 {{scale must be positive, got 0.000000e+00}}
  %o = bonsai.attention %q, %q, %q {scale = 0.0 : f64} : (tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x2x4xf32>
  return
}

// -----

// attention: the result has the query's type.
func.func @attention_result_type(%q: tensor<2x8x4x4xf32>, %k: tensor<2x8x2x4xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<2x8x4x4xf32>' (the type of query), got 'tensor<2x8x2x4xf32>'}}
  %o = bonsai.attention %q, %k, %k {causal, scale = 0.5 : f64} : (tensor<2x8x4x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x2x4xf32>
  return
}

// -----

// attention (ODS): scale is required.
func.func @attention_missing_scale(%q: tensor<2x8x2x4xf32>) {
  // expected-error @+1 {{requires attribute 'scale'}}
  %o = bonsai.attention %q, %q, %q : (tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>, tensor<2x8x2x4xf32>) -> tensor<2x8x2x4xf32>
  return
}

//===----------------------------------------------------------------------===//
// Activations and softmax
//===----------------------------------------------------------------------===//

// -----

// silu: the result has the input's type.
func.func @silu_result_type(%x: tensor<2x8x16xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<2x8x16xf32>' (the type of input), got 'tensor<2x8x16xf16>'}}
  %y = bonsai.silu %x : (tensor<2x8x16xf32>) -> tensor<2x8x16xf16>
  return
}

// -----

// gelu: the result has the input's type.
func.func @gelu_result_type(%x: tensor<2x8x16xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<2x8x16xf32>' (the type of input), got 'tensor<2x8x8xf32>'}}
  %y = bonsai.gelu %x {approximation = #bonsai.gelu_approximation<tanh>} : (tensor<2x8x16xf32>) -> tensor<2x8x8xf32>
  return
}

// -----

// gelu: the approximation is `none` or `tanh` (enum attribute parser).
func.func @gelu_unknown_approximation(%x: tensor<2x8x16xf32>) {
  // expected-error @+2 {{expected ::mlir::bonsai::GeluApproximation to be one of: none, tanh}}
  // expected-error @+1 {{failed to parse Bonsai_GeluApproximationAttr parameter 'value' which is to be a `::mlir::bonsai::GeluApproximation`}}
  %y = bonsai.gelu %x {approximation = #bonsai.gelu_approximation<erf>} : (tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// swiglu: up has the gate's type.
func.func @swiglu_up_type(%g: tensor<2x8x16xf32>, %u: tensor<2x8x8xf32>) {
  // expected-error @+1 {{up type: expected 'tensor<2x8x16xf32>' (the type of gate), got 'tensor<2x8x8xf32>'}}
  %y = bonsai.swiglu %g, %u : (tensor<2x8x16xf32>, tensor<2x8x8xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// swiglu: the result has the gate's type.
func.func @swiglu_result_type(%g: tensor<2x8x16xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<2x8x16xf32>' (the type of gate), got 'tensor<2x8x16xbf16>'}}
  %y = bonsai.swiglu %g, %g : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xbf16>
  return
}

// -----

// softmax: axis below zero (I64Attr getters are unsigned; the verifier compares signed values).
func.func @softmax_negative_axis(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{axis -1 is out of range for rank 2}}
  %y = bonsai.softmax %x {axis = -1 : i64} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return
}

// -----

// softmax: axis beyond the rank.
func.func @softmax_axis_too_large(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{axis 2 is out of range for rank 2}}
  %y = bonsai.softmax %x {axis = 2 : i64} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return
}

// -----

// softmax: the result has the input's type.
func.func @softmax_result_type(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{result type: expected 'tensor<8x16xf32>' (the type of input), got 'tensor<16x8xf32>'}}
  %y = bonsai.softmax %x {axis = 1 : i64} : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return
}

// -----

// softmax (ODS): axis is required.
func.func @softmax_missing_axis(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{requires attribute 'axis'}}
  %y = bonsai.softmax %x : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return
}

//===----------------------------------------------------------------------===//
// bonsai.cross_entropy
//===----------------------------------------------------------------------===//

// -----

// cross_entropy: logits need a vocab dimension and at least one position dimension.
func.func @cross_entropy_logits_rank(%l: tensor<16xf32>, %y: tensor<i32>) {
  // expected-error @+1 {{logits rank: expected at least 2 ([..., vocab]), got 1}}
  %loss = bonsai.cross_entropy %l, %y : (tensor<16xf32>, tensor<i32>) -> tensor<f32>
  return
}

// -----

// cross_entropy: labels have the logits' shape without the vocab dimension.
func.func @cross_entropy_labels_shape(%l: tensor<2x8x16xf32>, %y: tensor<2x16xi32>) {
  // expected-error @+1 {{labels shape: expected [2, 8], got [2, 16]}}
  %loss = bonsai.cross_entropy %l, %y : (tensor<2x8x16xf32>, tensor<2x16xi32>) -> tensor<f32>
  return
}

// -----

// cross_entropy (ODS): the loss is a 0-d f32 tensor.
func.func @cross_entropy_loss_type(%l: tensor<2x8x16xbf16>, %y: tensor<2x8xi32>) {
  // expected-error @+1 {{result #0 must be 0D tensor of 32-bit float values}}
  %loss = bonsai.cross_entropy %l, %y : (tensor<2x8x16xbf16>, tensor<2x8xi32>) -> tensor<bf16>
  return
}

// -----

// cross_entropy (ODS): the loss is a scalar, not per token.
func.func @cross_entropy_loss_rank(%l: tensor<2x8x16xf32>, %y: tensor<2x8xi32>) {
  // expected-error @+1 {{result #0 must be 0D tensor of 32-bit float values}}
  %loss = bonsai.cross_entropy %l, %y : (tensor<2x8x16xf32>, tensor<2x8xi32>) -> tensor<2x8xf32>
  return
}

//===----------------------------------------------------------------------===//
// Shape ops
//===----------------------------------------------------------------------===//

// -----

// reshape: the element count is kept.
func.func @reshape_count(%x: tensor<2x8x16xf32>) {
  // expected-error @+1 {{element count: input [2, 8, 16] has 256, result [2, 8, 4, 2] has 128}}
  %y = bonsai.reshape %x : (tensor<2x8x16xf32>) -> tensor<2x8x4x2xf32>
  return
}

// -----

// reshape: the element type is kept.
func.func @reshape_element(%x: tensor<2x8x16xf32>) {
  // expected-error @+1 {{result element type: expected 'f32', got 'bf16'}}
  %y = bonsai.reshape %x : (tensor<2x8x16xf32>) -> tensor<2x8x4x4xbf16>
  return
}

// -----

// transpose: one permutation entry per input dimension.
func.func @transpose_perm_size(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{permutation has 3 entries, input rank is 2}}
  %y = bonsai.transpose %x {permutation = array<i64: 1, 0, 2>} : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return
}

// -----

// transpose: a repeated entry is not a permutation.
func.func @transpose_perm_repeat(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{permutation [0, 0] is not a permutation of [0, 2)}}
  %y = bonsai.transpose %x {permutation = array<i64: 0, 0>} : (tensor<8x16xf32>) -> tensor<8x8xf32>
  return
}

// -----

// transpose: an out-of-range entry is not a permutation.
func.func @transpose_perm_range(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{permutation [2, 0] is not a permutation of [0, 2)}}
  %y = bonsai.transpose %x {permutation = array<i64: 2, 0>} : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return
}

// -----

// transpose: result shape is the permuted input shape.
func.func @transpose_result_shape(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{result shape: expected [16, 8], got [8, 16]}}
  %y = bonsai.transpose %x {permutation = array<i64: 1, 0>} : (tensor<8x16xf32>) -> tensor<8x16xf32>
  return
}

// -----

// transpose: the element type is kept.
func.func @transpose_element(%x: tensor<8x16xf32>) {
  // expected-error @+1 {{result element type: expected 'f32', got 'f16'}}
  %y = bonsai.transpose %x {permutation = array<i64: 1, 0>} : (tensor<8x16xf32>) -> tensor<16x8xf16>
  return
}

// -----

// concat: axis within the rank.
func.func @concat_axis(%a: tensor<2x8x16xf32>, %b: tensor<2x8x16xf32>) {
  // expected-error @+1 {{axis 3 is out of range for rank 3}}
  %y = bonsai.concat %a, %b {axis = 3 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x32xf32>
  return
}

// -----

// concat: dimensions other than the axis agree.
func.func @concat_other_dim(%a: tensor<2x8x16xf32>, %b: tensor<2x4x16xf32>) {
  // expected-error @+1 {{input 1 dimension 1: expected 8 (only axis 2 is joined), got 4}}
  %y = bonsai.concat %a, %b {axis = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x4x16xf32>) -> tensor<2x8x32xf32>
  return
}

// -----

// concat: the result's size along the axis is the inputs' summed.
func.func @concat_sum(%a: tensor<2x8x16xf32>, %b: tensor<2x8x16xf32>) {
  // expected-error @+1 {{result dimension 1: expected 16 (the inputs' sizes summed), got 12}}
  %y = bonsai.concat %a, %b {axis = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x12x16xf32>
  return
}

// -----

// concat: one element type.
func.func @concat_element_type(%a: tensor<2x8x16xf32>, %b: tensor<2x8x16xbf16>) {
  // expected-error @+1 {{input 1}}
  %y = bonsai.concat %a, %b {axis = 1 : i64} : (tensor<2x8x16xf32>, tensor<2x8x16xbf16>) -> tensor<2x16x16xf32>
  return
}

// -----

// concat: at least one input.
func.func @concat_empty() {
  // expected-error @+1 {{needs at least one input}}
  %y = bonsai.concat {axis = 1 : i64} : () -> tensor<2x16x16xf32>
  return
}

// -----

// slice: axis within the rank.
func.func @slice_axis(%x: tensor<2x8x48xf32>) {
  // expected-error @+1 {{axis 3 is out of range for rank 3}}
  %y = bonsai.slice %x {axis = 3 : i64, start = 0 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// slice: the result keeps the rank.
func.func @slice_result_rank(%x: tensor<2x8x48xf32>) {
  // expected-error @+1 {{result rank: expected 3, got 2}}
  %y = bonsai.slice %x {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x48xf32>) -> tensor<16x16xf32>
  return
}

// -----

// slice: dimensions other than the axis are kept.
func.func @slice_other_dim(%x: tensor<2x8x48xf32>) {
  // expected-error @+1 {{result dimension 1: expected 8 (only axis 2 is sliced), got 4}}
  %y = bonsai.slice %x {axis = 2 : i64, start = 0 : i64} : (tensor<2x8x48xf32>) -> tensor<2x4x16xf32>
  return
}

// -----

// slice: a negative start is outside the dimension.
func.func @slice_negative_start(%x: tensor<2x8x48xf32>) {
  // expected-error @+1 {{range [-1, 15) is outside dimension 2 of size 48}}
  %y = bonsai.slice %x {axis = 2 : i64, start = -1 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// slice: the range ends past the dimension.
func.func @slice_past_end(%x: tensor<2x8x48xf32>) {
  // expected-error @+1 {{range [40, 56) is outside dimension 2 of size 48}}
  %y = bonsai.slice %x {axis = 2 : i64, start = 40 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

// slice: the element type is kept.
func.func @slice_element(%x: tensor<2x8x48xf32>) {
  // expected-error @+1 {{result element type: expected 'f32', got 'bf16'}}
  %y = bonsai.slice %x {axis = 2 : i64, start = 16 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xbf16>
  return
}

// -----

// cast: the shape is kept.
func.func @cast_shape(%x: tensor<2x8x16xf32>) {
  // expected-error @+1 {{result shape: expected [2, 8, 16], got [2, 16, 8]}}
  %y = bonsai.cast %x : (tensor<2x8x16xf32>) -> tensor<2x16x8xbf16>
  return
}

// -----

// cast: a cast to the same element type is rejected.
func.func @cast_identity(%x: tensor<2x8x16xbf16>) {
  // expected-error @+1 {{casts 'bf16' to itself}}
  %y = bonsai.cast %x : (tensor<2x8x16xbf16>) -> tensor<2x8x16xbf16>
  return
}

// -----

// cast (ODS): only float tensors are cast.
func.func @cast_integer(%x: tensor<2x8xi32>) {
  // expected-error @+1 {{operand #0 must be non-empty statically shaped tensor of bfloat16 type or 16-bit float or 32-bit float or f8E4M3FN type or f8E5M2 type values}}
  %y = bonsai.cast %x : (tensor<2x8xi32>) -> tensor<2x8xf32>
  return
}

// -----

// dequantize: the shape is kept.
func.func @dequantize_shape(%q: tensor<32x16x!bonsai.nf4<64, 256>>) {
  // expected-error @+1 {{result shape: expected [32, 16], got [16, 32]}}
  %w = bonsai.dequantize %q : (tensor<32x16x!bonsai.nf4<64, 256>>) -> tensor<16x32xbf16>
  return
}

// -----

// dequantize (ODS): the input is an NF4 tensor.
func.func @dequantize_not_nf4(%q: tensor<32x16xf8E4M3FN>) {
  // expected-error @+1 {{operand #0 must be non-empty statically shaped tensor of NF4 element values}}
  %w = bonsai.dequantize %q : (tensor<32x16xf8E4M3FN>) -> tensor<32x16xbf16>
  return
}

// -----

// dequantize (ODS): the result is a compute type.
func.func @dequantize_to_f8(%q: tensor<32x16x!bonsai.nf4<64, 256>>) {
  // expected-error @+1 {{result #0 must be non-empty statically shaped tensor of bfloat16 type or 16-bit float or 32-bit float values}}
  %w = bonsai.dequantize %q : (tensor<32x16x!bonsai.nf4<64, 256>>) -> tensor<32x16xf8E4M3FN>
  return
}

// -----

// Zero-sized dimensions are rejected by the type constraint (a GQA verifier would otherwise
// divide by zero key/value heads).
func.func @zero_kv_heads(%q: tensor<2x4x4x16xf32>, %k: tensor<2x4x0x16xf32>) {
  // expected-error @+1 {{operand #1 must be non-empty statically shaped tensor}}
  %o = bonsai.attention %q, %k, %k {scale = 0.25 : f64} : (tensor<2x4x4x16xf32>, tensor<2x4x0x16xf32>, tensor<2x4x0x16xf32>) -> tensor<2x4x4x16xf32>
  return
}

// -----

// A zero-sized parameter is rejected too (the cost model divides by input features).
func.func @zero_features() {
  // expected-error @+1 {{result #0 must be non-empty statically shaped tensor}}
  %w = bonsai.param "w" trainable : tensor<4x0xf32>
  return
}

// -----

// slice: a start so large that start + size would overflow is still out of range, and the
// message names the range without computing the overflowing end (found by bonsai-fuzz-bonsai-ir).
func.func @slice_overflow(%x: tensor<2x8x48xf32>) {
  // expected-error @+1 {{range [9223372036854775807, 9223372036854775807 + 16) is outside dimension 2 of size 48}}
  %y = bonsai.slice %x {axis = 2 : i64, start = 9223372036854775807 : i64} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  return
}

//===----------------------------------------------------------------------===//
// Collectives (bonsai-shard)
//===----------------------------------------------------------------------===//

// -----

// all_gather of an NF4 tensor: the shares are of its storage bytes.
func.func @all_gather_nf4_wrong_share(%s: tensor<1000xui8>) -> tensor<64x64x!bonsai.nf4<64, 256>> {
  // expected-error @+1 {{shard type 'tensor<1000xui8>' is not one of 2 flat shares of the 2120 storage bytes of 'tensor<64x64x!bonsai.nf4<64, 256>>' (expected tensor<1060xui8>)}}
  %w = bonsai.all_gather %s {ranks = 2 : i64} : (tensor<1000xui8>) -> tensor<64x64x!bonsai.nf4<64, 256>>
  return %w : tensor<64x64x!bonsai.nf4<64, 256>>
}

// -----

// all_gather: the shard is not one of `ranks` flat shares of the result.
func.func @all_gather_wrong_share(%s: tensor<100xf32>) -> tensor<16x16xf32> {
  // expected-error @+1 {{shard type 'tensor<100xf32>' is not one of 2 flat shares of 'tensor<16x16xf32>' (expected tensor<128x...>)}}
  %w = bonsai.all_gather %s {ranks = 2 : i64} : (tensor<100xf32>) -> tensor<16x16xf32>
  return %w : tensor<16x16xf32>
}

// -----

// reduce_scatter: the element types differ.
func.func @reduce_scatter_dtype(%g: tensor<16x16xf32>) -> tensor<128xbf16> {
  // expected-error @+1 {{shard element type 'bf16' differs from the whole tensor's 'f32'}}
  %s = bonsai.reduce_scatter %g {ranks = 2 : i64} : (tensor<16x16xf32>) -> tensor<128xbf16>
  return %s : tensor<128xbf16>
}

// -----

// all_reduce: an L2 combination of bf16 values.
func.func @all_reduce_l2_bf16(%n: tensor<bf16>) -> tensor<bf16> {
  // expected-error @+1 {{reduction "l2" needs f32, got 'tensor<bf16>'}}
  %r = bonsai.all_reduce %n {ranks = 2 : i64, reduction = "l2"} : (tensor<bf16>) -> tensor<bf16>
  return %r : tensor<bf16>
}

// -----

// shard_slice: no ranks.
func.func @shard_slice_zero_ranks(%w: tensor<16xf32>) -> tensor<16xf32> {
  // expected-error @+1 {{ranks must be at least 1, got 0}}
  %s = bonsai.shard_slice %w {ranks = 0 : i64} : (tensor<16xf32>) -> tensor<16xf32>
  return %s : tensor<16xf32>
}
