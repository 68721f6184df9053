func.func @f() {
  %0 = bonsai.param "w" frozen : tensor<?x4xf32>
  return
}
