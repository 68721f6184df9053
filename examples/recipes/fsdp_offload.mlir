// examples/recipes/fsdp_offload.mlir - Llama-3-8B full fine-tune over two 48 GB GPUs: ZeRO-3
// sharding of parameters, gradients and optimizer state (docs/sharding.md), with each rank's
// share of the optimizer state and of the fp32 master weights in pinned host memory and their
// PCIe copies overlapped with compute.
//
// Applies to examples/models/llama3_8b.mlir (each rank's plan; run it with mpirun -np 2):
//   bonsai-compile examples/models/llama3_8b.mlir examples/recipes/fsdp_offload.mlir -o 8b.plan

bonsai.recipe @fsdp_offload {
  bonsai.target "sm_89" device_memory 49152 MiB
  bonsai.shard "zero3" ranks 2
  bonsai.offload ["optimizer_state", "master_weights"]
  bonsai.optimizer "adamw" lr 1.000000e-05 {beta2 = 9.500000e-01 : f64, grad_clip = 1.000000e+00 : f64, weight_decay = 1.000000e-01 : f64}
  bonsai.remat "auto"
}
