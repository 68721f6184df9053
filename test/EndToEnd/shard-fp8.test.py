"""Driver of shard-fp8.test: FP8 training sharded over CPU ranks against the 1-rank run.

The tiny Llama with bonsai.fp8 (delayed scaling, compiled for sm_90; the CPU backend emulates
the FP8 kinds exactly) is compiled unsharded and with zero1, zero2 and zero3 over N ranks. The
unsharded plan runs on one process with N micro-batches per step, each sharded plan under
`mpirun -np N` with one micro-batch per rank: the same tokens. Both fold the step's cast
statistics into their largest (bonsai-fp8 over micro-batches, bonsai-shard over ranks), so the
delayed scales, the casts and the losses must be the same bit for bit. Each line prints the
largest relative difference of the losses and whether they are bit-identical; anything but
bit-identical fails, as does a sharded plan whose compile remark does not count the
all-reduced statistics."""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_recipes import MPIRUN  # noqa: E402

compile_tool, run_tool, models, out, steps = sys.argv[1:6]
RANKS = [2, 4]
TIMEOUT = 300
BODY = ('  bonsai.fp8 "delayed" amax_history 4 margin 0 targets []\n'
        '  bonsai.optimizer "adamw" lr 3.000000e-03 {grad_clip = 1.000000e+00 : f64}\n')


def recipe(path, shard=None):
    with open(path, "w") as f:
        f.write('bonsai.recipe @train {\n  bonsai.target "sm_90"\n')
        if shard:
            f.write('  bonsai.shard "%s" ranks %d\n' % shard)
        f.write(BODY + "}\n")


def compile_plan(recipe_path, plan):
    result = subprocess.run([compile_tool, os.path.join(models, "tiny_llama.mlir"), recipe_path,
                             "-o", plan], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit("FAILED: bonsai-compile %s\n%s" % (recipe_path, result.stderr))
    return result.stderr


def losses(command, metrics):
    if os.path.exists(metrics):
        os.remove(metrics)
    command = command + ["--metrics", metrics]
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    if result.returncode != 0:
        sys.exit("FAILED (%d): %s\n%s%s" % (result.returncode, " ".join(command), result.stdout,
                                           result.stderr))
    with open(metrics) as f:
        return [line.split('"loss": ')[1].split(",")[0] for line in f]


failed = False
base_recipe = os.path.join(out, "fp8.mlir")
recipe(base_recipe)
base_plan = os.path.join(out, "fp8.plan")
compile_plan(base_recipe, base_plan)
for n in RANKS:
    reference = losses([run_tool, base_plan, "--seed", "7", "--steps", steps, "--micro-batches",
                        str(n)], base_plan + ".%d.jsonl" % n)
    for stage in ["zero1", "zero2", "zero3"]:
        sharded_recipe = os.path.join(out, "fp8.%s.%d.mlir" % (stage, n))
        recipe(sharded_recipe, (stage, n))
        plan = sharded_recipe[:-len(".mlir")] + ".plan"
        remarks = compile_plan(sharded_recipe, plan)
        counted = re.search(r"(\d+) FP8 cast statistics \(([^)]*)\) all-reduced to their largest",
                            remarks)
        got = losses(MPIRUN + ["-np", str(n), run_tool, plan, "--seed", "7", "--steps", steps,
                               "--micro-batches", "1"], plan + ".jsonl")
        worst = max(abs(float(g) - float(r)) / abs(float(r)) for g, r in zip(got, reference))
        identical = len(got) == len(reference) == int(steps) and got == reference
        ok = identical and counted is not None
        failed = failed or not ok
        print("fp8 %s ranks %d: %d steps, last loss %s (1 rank: %s), %s statistics all-reduced, "
              "max relative difference %.3g, %s%s" % (
                  stage, n, len(got), got[-1], reference[-1],
                  "%s (%s)" % counted.groups() if counted else "no",
                  worst, "bit-identical" if identical else "not bit-identical",
                  "" if ok else " FAILED"))

# A checkpoint of the zero3 run over 2 ranks holds the delayed scales whole (every rank's are
# the same; rank 0 writes them): resumed by the unsharded plan on one process, the next 10 steps
# are the uninterrupted 2-rank run's.
ckpt = os.path.join(out, "fp8.zero3.2.ckpt")
shutil.rmtree(ckpt, ignore_errors=True)
plan = os.path.join(out, "fp8.zero3.2.plan")
full = losses(MPIRUN + ["-np", "2", run_tool, plan, "--seed", "7", "--steps", "20",
                        "--micro-batches", "1", "--save-every", "10", "--ckpt-dir", ckpt],
              ckpt + ".full.jsonl")
resumed = losses([run_tool, base_plan, "--resume", os.path.join(ckpt, "step-00000010"),
                  "--steps", "10", "--micro-batches", "2"], ckpt + ".resumed.jsonl")
ok = resumed == full[10:]
failed = failed or not ok
print("fp8 zero3 saved on 2 ranks at step 10, resumed on 1 rank: %d steps, %s%s" % (
    len(resumed), "the uninterrupted losses" if ok else "losses differ", "" if ok else " FAILED"))
sys.exit(1 if failed else 0)
