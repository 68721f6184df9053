func.func @f(%x: tensor<2x8x16xf32>) {
  %w = bonsai.param "w" trainable : tensor<32x8xf32>
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x8xf32>) -> tensor<2x8x32xf32>
  return
}
