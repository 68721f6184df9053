bonsai.recipe @r for @nowhere {
  bonsai.remat "full"
}
