// examples/recipes/fsdp_qlora.mlir - FSDP-QLoRA (Answer.AI's): a Llama-2-70B-shaped model
// fine-tuned over two 24 GB GPUs. ZeRO-3 shards the NF4 base weights by their storage bytes
// (codes and double-quantized block constants alike; docs/sharding.md), and the LoRA adapters
// with their optimizer state; each block's weights are gathered whole before they are
// dequantized. Recomputation, and the saved activations in pinned host memory between the
// passes (docs/offload.md), keep each rank's step within 24 GiB.
//
// Applies to a Llama-2-70B-shaped model, which scripts/gen_models.py writes:
//   python3 scripts/gen_models.py --print llama2_7b --set=hidden=8192 --set=layers=80 \
//     --set=heads=64 --set=kv_heads=8 --set=intermediate=28672 --set=seq=2048 > llama2_70b.mlir
//   bonsai-compile llama2_70b.mlir examples/recipes/fsdp_qlora.mlir -o 70b.plan
//   mpirun -np 2 bonsai-run 70b.plan --weights <Llama-2-70B's safetensors directory> ...
// (The model's base weights are declared trainable; the recipe's LoRA makes them frozen.)

bonsai.recipe @fsdp_qlora {
  bonsai.target "sm_89" device_memory 24576 MiB
  bonsai.shard "zero3" ranks 2
  bonsai.quantize "nf4" block 64 double_quant 256 targets ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
  bonsai.lora rank 16 alpha 3.200000e+01 targets ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
  bonsai.optimizer "adamw" lr 2.000000e-04 {grad_clip = 3.000000e-01 : f64, schedule = "cosine", total_steps = 1000 : i64, warmup_steps = 30 : i64}
  bonsai.offload ["activations"]
  bonsai.remat "auto"
}
