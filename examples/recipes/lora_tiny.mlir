// examples/recipes/lora_tiny.mlir - LoRA r8 (alpha 16) on every linear of the tiny Llama's
// blocks, trained with AdamW on a CPU. The base model is frozen; only the adapters train and
// only they get gradients and optimizer state (docs/lora.md).
//
//   bonsai-compile examples/models/tiny_llama.mlir examples/recipes/lora_tiny.mlir -o lora.plan
//   bonsai-run lora.plan --weights base.safetensors --data tokens.bin --steps 50
//
// (Write `bonsai.lora dora rank 8 ...` for DoRA; --weights may hold the adapters too, else they
// start from PEFT's initialization: A Kaiming-uniform, B zero, DoRA's magnitude ||W||.)

bonsai.recipe @lora_tiny {
  bonsai.target "cpu"
  bonsai.lora rank 8 alpha 1.600000e+01 targets ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
  bonsai.optimizer "adamw" lr 1.000000e-02
}
