func.func @f(%q: tensor<1x8x6x4xf32>, %k: tensor<1x8x4x4xf32>) {
  %o = bonsai.attention %q, %k, %k {causal, scale = 0.5 : f64} : (tensor<1x8x6x4xf32>, tensor<1x8x4x4xf32>, tensor<1x8x4x4xf32>) -> tensor<1x8x6x4xf32>
  return
}
