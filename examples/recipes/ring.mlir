// examples/recipes/ring.mlir - RingAttention: Llama-3-8B's 8192-token sequence split over two
// GPUs, each passing its key/value block on while it computes the current one, with ZeRO-3
// over the two (a data x ring grid). bonsai-compile refuses it today: a ring with sharding
// is not built yet (docs/ring-attention.md, "Status"); a ring alone is.
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
