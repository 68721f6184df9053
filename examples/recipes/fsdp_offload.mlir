// examples/recipes/fsdp_offload.mlir - Llama-3-8B full fine-tune over two 48 GB GPUs: ZeRO-3
// sharding of parameters, gradients and optimizer state, with the optimizer state offloaded to
// pinned host memory and its PCIe copies overlapped with compute.
//
// Applies to examples/models/llama3_8b.mlir:
//   cat examples/models/llama3_8b.mlir examples/recipes/fsdp_offload.mlir | bonsai-opt

bonsai.recipe @fsdp_offload {
  bonsai.target "sm_89" device_memory 49152 MiB
  bonsai.shard "zero3" ranks 2
  bonsai.offload ["optimizer_state"]
  bonsai.optimizer "adamw" lr 1.000000e-05 {beta2 = 9.500000e-01 : f64, grad_clip = 1.000000e+00 : f64, weight_decay = 1.000000e-01 : f64}
  bonsai.remat "auto"
}
