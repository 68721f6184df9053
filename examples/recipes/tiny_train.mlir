// examples/recipes/tiny_train.mlir - full training of the tiny Llama on a CPU: AdamW with a
// warmup and cosine schedule and gradient clipping. The README's first command (scripts/demo.sh)
// trains examples/models/tiny_llama.mlir with it on a text file every Debian machine has.
//
//   bonsai-compile examples/models/tiny_llama.mlir examples/recipes/tiny_train.mlir -o tiny.plan

bonsai.recipe @tiny_train {
  bonsai.target "cpu"
  bonsai.optimizer "adamw" lr 2.000000e-03 {beta2 = 9.500000e-01 : f64, grad_clip = 1.000000e+00 : f64, min_lr_ratio = 1.000000e-01 : f64, schedule = "cosine", total_steps = 1500 : i64, warmup_steps = 20 : i64, weight_decay = 1.000000e-02 : f64}
}
