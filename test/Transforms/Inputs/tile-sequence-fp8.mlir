// An MLP under a recipe with bonsai.fp8 (test/Transforms/tile-sequence.mlir): tiling is
// refused rather than leaving the chunks' linears in bf16.
func.func @mlp(%x: tensor<2x32x16xbf16>) -> tensor<2x32x16xbf16> {
  %w1 = bonsai.param "mlp.up_proj.weight" trainable : tensor<64x16xbf16>
  %a = bonsai.linear %x, %w1 : (tensor<2x32x16xbf16>, tensor<64x16xbf16>) -> tensor<2x32x64xbf16>
  %s = bonsai.silu %a : (tensor<2x32x64xbf16>) -> tensor<2x32x64xbf16>
  %w2 = bonsai.param "mlp.down_proj.weight" trainable : tensor<16x64xbf16>
  %y = bonsai.linear %s, %w2 : (tensor<2x32x64xbf16>, tensor<16x64xbf16>) -> tensor<2x32x16xbf16>
  return %y : tensor<2x32x16xbf16>
}
bonsai.recipe @r {
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["up_proj"]
  bonsai.remat "full" sequence_chunks 2
}
