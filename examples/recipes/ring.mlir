// examples/recipes/ring.mlir - RingAttention: Llama-3-8B's 8192-token sequence split over a
// ring of two GPUs, each passing its key/value block on while it computes the current one,
// and two such rings training on their own micro-batches with ZeRO-3 over all four GPUs (a
// 2 data x 2 ring grid: 4 ranks, `mpirun -np 4`). Per rank: 4096 tokens of activations, 1/4 of
// the parameters, gradients and AdamW state; 39.91 GiB planned (a 48 or 80 GB GPU). The figures are
// checked against a hand count in test/Tools/ring-plan.test; docs/ring-attention.md.
//
// Applies to examples/models/llama3_8b.mlir:
//   bonsai-compile examples/models/llama3_8b.mlir examples/recipes/ring.mlir -o ring.plan

bonsai.recipe @ring {
  bonsai.target "sm_90"
  bonsai.ring ranks 2
  bonsai.shard "zero3" ranks 2
  bonsai.optimizer "adamw" lr 1.000000e-05
  bonsai.remat "full"
}
