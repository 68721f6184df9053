// examples/recipes/galore.mlir - full-parameter training of TinyLlama-1.1B with GaLore: the
// AdamW moments of the attention and MLP matrices live in a rank-512 subspace refreshed every
// 200 steps. k_proj and v_proj are 256 x 2048 (4 KV heads): a rank-512 projection of them would
// save nothing (the recipe verifier rejects it), so they keep plain AdamW with the embeddings
// and norms.
//
// Applies to examples/models/tinyllama_1_1b.mlir:
//   cat examples/models/tinyllama_1_1b.mlir examples/recipes/galore.mlir | bonsai-opt

bonsai.recipe @galore {
  bonsai.target "sm_89" device_memory 24576 MiB
  bonsai.optimizer "adamw" lr 1.000000e-03 {weight_decay = 0.000000e+00 : f64}
  bonsai.galore rank 512 update_proj_gap 200 scale 2.500000e-01 projector "randomized" targets ["q_proj", "o_proj", "*.mlp.*_proj*"]
  bonsai.remat "selective"
}
