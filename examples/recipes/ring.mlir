// examples/recipes/ring.mlir - RingAttention: Llama-3-8B's 8192-token sequence split over two
// GPUs, each passing its key/value block on while it computes the current one.
//
// Applies to examples/models/llama3_8b.mlir:
//   cat examples/models/llama3_8b.mlir examples/recipes/ring.mlir | bonsai-opt

bonsai.recipe @ring {
  bonsai.target "sm_90"
  bonsai.ring ranks 2
  bonsai.shard "zero3" ranks 2
  bonsai.optimizer "adamw" lr 1.000000e-05
  bonsai.remat "full"
}
