// One linear with a q_proj weight, for the option-driven runs of insert-lora-invalid.mlir.
func.func @f(%x: tensor<2x8x16xf32>) -> tensor<2x8x32xf32> {
  %w = bonsai.param "m.q_proj.weight" trainable : tensor<32x16xf32>
  %y = bonsai.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  return %y : tensor<2x8x32xf32>
}
