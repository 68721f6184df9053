// examples/recipes/dora.mlir - DoRA r16 on all linears of TinyLlama-1.1B with a bf16 base.
//
// Applies to examples/models/tinyllama_1_1b.mlir:
//   cat examples/models/tinyllama_1_1b.mlir examples/recipes/dora.mlir | bonsai-opt

bonsai.recipe @dora {
  bonsai.target "sm_90" device_memory 49152 MiB
  bonsai.lora dora rank 16 alpha 3.200000e+01 targets ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
  bonsai.optimizer "adamw" lr 1.000000e-04 {schedule = "cosine", total_steps = 2000 : i64, warmup_steps = 100 : i64}
}
