// examples/recipes/remat.mlir - the Llama 124M benchmark shape trained under an 8 GiB budget:
// the compiler picks which activations to recompute.
//
// Applies to examples/models/llama_124m.mlir:
//   cat examples/models/llama_124m.mlir examples/recipes/remat.mlir | bonsai-opt

bonsai.recipe @remat {
  bonsai.target "sm_90" device_memory 8192 MiB
  bonsai.optimizer "adamw" lr 6.000000e-04 {beta2 = 9.500000e-01 : f64, grad_clip = 1.000000e+00 : f64, schedule = "cosine", total_steps = 5000 : i64, warmup_steps = 200 : i64, weight_decay = 1.000000e-01 : f64}
  bonsai.remat "auto"
}
