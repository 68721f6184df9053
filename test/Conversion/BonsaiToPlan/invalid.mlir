// RUN: bonsai-opt --bonsai-lower-to-plan %s -split-input-file -verify-diagnostics

// NF4 tensors need the quantize pass's lowering, which does not exist yet.
func.func @forward(%ids: tensor<1x4xi32>, %labels: tensor<1x4xi32>) -> tensor<f32> {
  %emb = bonsai.param "e" frozen : tensor<16x64xf32>
  %h = bonsai.embedding %emb, %ids : (tensor<16x64xf32>, tensor<1x4xi32>) -> tensor<1x4x64xf32>
  // expected-error @+1 {{NF4 tensors have no runtime layout yet}}
  %q = bonsai.param "w" frozen : tensor<16x64x!bonsai.nf4<64, 256>>
  %w = bonsai.dequantize %q : (tensor<16x64x!bonsai.nf4<64, 256>>) -> tensor<16x64xf32>
  %l = bonsai.linear %h, %w : (tensor<1x4x64xf32>, tensor<16x64xf32>) -> tensor<1x4x16xf32>
  %loss = bonsai.cross_entropy %l, %labels : (tensor<1x4x16xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %loss : tensor<f32>
}

// -----

// expected-error @+1 {{no model function to lower: no func.func declares a bonsai.param}}
module {
  func.func @not_a_model(%x: tensor<4xf32>) -> tensor<4xf32> {
    return %x : tensor<4xf32>
  }
}
