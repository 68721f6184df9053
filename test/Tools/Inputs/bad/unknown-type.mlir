func.func @f() {
  %0 = bonsai.param "w" frozen : tensor<4x!bonsai.int3>
  return
}
