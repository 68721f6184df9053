"""What the data-parallel drivers share (shard.test.py, shard-checkpoint.test.py): the mpirun
command line and the recipe bodies they train with, after the recipe's target line.

AdamW with warmup, cosine and clipping (the demo's), LoRA (frozen base weights: under zero3
they are sharded and gathered like the rest), QLoRA (NF4 base weights: under zero3 shared out
by their storage bytes), QDoRA (the same with DoRA magnitudes, the row norms of the whole base
weights), and GaLore (its weights kept whole on every rank, their gradients reduced whole)."""

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]

RECIPES = {
    "adamw": '  bonsai.optimizer "adamw" lr 2.000000e-03 {beta2 = 9.500000e-01 : f64, '
             'grad_clip = 1.000000e+00 : f64, weight_decay = 1.000000e-02 : f64, '
             'schedule = "cosine", warmup_steps = 5 : i64, total_steps = 100 : i64}\n',
    "lora": '  bonsai.lora rank 8 alpha 1.600000e+01 targets ["q_proj", "v_proj", "down_proj"]\n'
            '  bonsai.optimizer "adamw" lr 1.000000e-02 {grad_clip = 1.000000e+00 : f64}\n',
    "qlora": '  bonsai.quantize "nf4" block 64 double_quant 256 targets ["q_proj", "v_proj", '
             '"down_proj"]\n'
             '  bonsai.lora rank 8 alpha 1.600000e+01 targets ["q_proj", "v_proj", "down_proj"]\n'
             '  bonsai.optimizer "adamw" lr 1.000000e-02 {grad_clip = 1.000000e+00 : f64}\n',
    "qdora": '  bonsai.quantize "nf4" block 64 double_quant 256 targets ["q_proj", "v_proj", '
             '"down_proj"]\n'
             '  bonsai.lora rank 8 alpha 1.600000e+01 targets ["q_proj", "v_proj", "down_proj"] '
             '{dora}\n'
             '  bonsai.optimizer "adamw" lr 1.000000e-02 {grad_clip = 1.000000e+00 : f64}\n',
    "galore": '  bonsai.optimizer "adamw" lr 1.000000e-03 {grad_clip = 1.000000e+00 : f64}\n'
              '  bonsai.galore rank 4 update_proj_gap 2 scale 2.500000e-01 projector "svd" '
              'targets ["lm_head", "q_proj"]\n',
}
