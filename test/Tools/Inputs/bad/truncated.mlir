func.func @f() {
  %0 = bonsai.param "w" trainable : tensor<4x4xf32>
