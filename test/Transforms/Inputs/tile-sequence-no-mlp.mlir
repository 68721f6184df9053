// A model without an MLP (test/Transforms/tile-sequence.mlir): a linear's region whose
// intermediate is no wider than its input and output.
func.func @narrow(%x: tensor<2x32x16xf32>) -> tensor<2x32x16xf32> {
  %w1 = bonsai.param "w1" trainable : tensor<16x16xf32>
  %a = bonsai.linear %x, %w1 : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  %s = bonsai.silu %a : (tensor<2x32x16xf32>) -> tensor<2x32x16xf32>
  %w2 = bonsai.param "w2" trainable : tensor<16x16xf32>
  %y = bonsai.linear %s, %w2 : (tensor<2x32x16xf32>, tensor<16x16xf32>) -> tensor<2x32x16xf32>
  return %y : tensor<2x32x16xf32>
}
