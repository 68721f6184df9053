// examples/recipes/fp8.mlir - FP8 GEMMs for every block linear of Llama-3-8B (E4M3 forward,
// E5M2 gradients, delayed scaling over a 16-step amax history); the embedding and lm_head stay
// bf16. On sm_80/sm_86 the same recipe compiles to bf16.
//
// Applies to examples/models/llama3_8b.mlir:
//   cat examples/models/llama3_8b.mlir examples/recipes/fp8.mlir | bonsai-opt

bonsai.recipe @fp8 {
  bonsai.target "sm_90"
  bonsai.fp8 "delayed" amax_history 16 margin 0 targets ["model.layers.*"]
  bonsai.optimizer "adamw" lr 3.000000e-04 {grad_clip = 1.000000e+00 : f64}
}
