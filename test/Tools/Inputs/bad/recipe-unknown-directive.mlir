bonsai.recipe @r {
  bonsai.target "sm_90"
  func.func private @not_a_directive()
}
