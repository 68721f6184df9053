// examples/recipes/lora_7b.mlir - LoRA r16 (alpha 32) on every linear of Llama-2-7B's blocks,
// bf16 base, AdamW on one H200. The base is frozen: a checkpoint of this run holds the adapters,
// their AdamW moments and the run state, not the 13 GB base (docs/checkpoints.md).
//
//   bonsai-compile examples/models/llama2_7b.mlir examples/recipes/lora_7b.mlir -o lora7b.plan
//   bonsai-run lora7b.plan --print-plan | grep checkpoint:

bonsai.recipe @lora_7b {
  bonsai.target "sm_90" device_memory 141312 MiB
  bonsai.lora rank 16 alpha 3.200000e+01 targets ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
  bonsai.optimizer "adamw" lr 2.000000e-04 {schedule = "cosine", total_steps = 1000 : i64, warmup_steps = 30 : i64}
}
