// examples/recipes/qlora.mlir - QLoRA: NF4 base weights (double quantization), LoRA r16 on
// every linear of the blocks, fine-tuning Llama-2-7B on one 24 GB card.
//
// Applies to examples/models/llama2_7b.mlir:
//   cat examples/models/llama2_7b.mlir examples/recipes/qlora.mlir | bonsai-opt
// (The model's base weights are declared trainable; the recipe's LoRA makes them frozen.)

bonsai.recipe @qlora {
  bonsai.target "sm_89" device_memory 24576 MiB
  bonsai.quantize "nf4" block 64 double_quant 256 targets ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
  bonsai.lora rank 16 alpha 3.200000e+01 targets ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
  bonsai.optimizer "adamw" lr 2.000000e-04 {grad_clip = 3.000000e-01 : f64, schedule = "cosine", total_steps = 1000 : i64, warmup_steps = 30 : i64}
  bonsai.remat "auto"
}
