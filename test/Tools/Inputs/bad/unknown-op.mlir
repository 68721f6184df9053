func.func @f() {
  %0 = bonsai.frobnicate : tensor<4xf32>
  return
}
