bonsai.recipe @r {
  bonsai.optimizer "lion" lr 1.0e-3
}
