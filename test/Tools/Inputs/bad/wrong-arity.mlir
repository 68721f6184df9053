func.func @f(%x: tensor<2x8x16xf32>) {
  %y = bonsai.silu %x, %x : (tensor<2x8x16xf32>, tensor<2x8x16xf32>) -> tensor<2x8x16xf32>
  return
}
