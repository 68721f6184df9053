"""Driver of shard.test: data-parallel training under mpirun against the 1-rank run.

For each model and recipe it compiles the unsharded plan and the zero1/zero2/zero3 plans over N
ranks, runs the unsharded plan on one process with N micro-batches per step (the N ranks' work
as gradient accumulation), runs each sharded plan under `mpirun -np N` with one micro-batch per
rank, and compares the step losses rank 0 prints. Each line says the largest relative
difference over the steps and whether every loss is bit-identical. Nothing passes unless
every sharded run's losses are within the tolerance (1e-6 relative)."""
import json
import os
import subprocess
import sys
import time

from shard_recipes import MPIRUN, RECIPES

compile_tool, run_tool, models, out, steps = sys.argv[1:6]
steps = int(steps)
RANKS = [int(n) for n in sys.argv[6].split(",")] if len(sys.argv) > 6 else [2, 4]
TOLERANCE = 1e-6
TIMEOUT = 300
CASES = [("tiny_llama", "adamw"), ("tiny_gpt2", "adamw"), ("tiny_llama", "lora"),
         ("tiny_llama", "qlora"), ("tiny_llama", "qdora"), ("tiny_llama", "galore")]


def recipe(path, body, shard=None, options=""):
    with open(path, "w") as f:
        f.write("bonsai.recipe @train {\n  bonsai.target \"cpu\"\n")
        if shard:
            f.write('  bonsai.shard "%s" ranks %d%s\n' % (shard + (options,)))
        f.write(body + "}\n")


def compile_plan(model, recipe_path, plan, flags=()):
    """Compiles; returns the compiler's diagnostics (its remarks)."""
    result = subprocess.run([compile_tool, os.path.join(models, model + ".mlir"), recipe_path,
                             "-o", plan] + list(flags),
                            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    return result.stderr


def losses(command, metrics):
    """The (step, loss, loss as printed) of each step rank 0 wrote to `metrics` (%.9g: an f32
    exactly). Under mpirun a rank's stdout is a terminal, so the plain step lines are not
    printed there; the metrics file is the same on every launcher."""
    if os.path.exists(metrics):
        os.remove(metrics)
    command = command + ["--metrics", metrics]
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    if result.returncode != 0:
        sys.exit("FAILED (%d): %s\n%s%s" % (result.returncode, " ".join(command), result.stdout,
                                           result.stderr))
    found = []
    with open(metrics) as f:
        for line in f:
            raw = line.split('"loss": ')[1].split(",")[0]
            found.append((json.loads(line)["step"], float(raw), raw))
    expected = int(command[command.index("--steps") + 1])
    if len(found) != expected:
        sys.exit("FAILED: %d step lines, expected %d: %s\n%s" % (len(found), expected,
                                                                 " ".join(command), result.stdout))
    return found


def steps_of(name):
    """AdamW trains the full `steps` (the sharding issue's acceptance); the adapters and GaLore,
    which add no collective AdamW lacks but a share of their own, 20 (CI's time)."""
    return steps if name == "adamw" else min(steps, 20)


failed = False
references = {}
for model, name in CASES:
    base_recipe = os.path.join(out, "%s.%s.mlir" % (model, name))
    recipe(base_recipe, RECIPES[name])
    base_plan = os.path.join(out, "%s.%s.plan" % (model, name))
    compile_plan(model, base_recipe, base_plan)
    for n in RANKS:
        reference = losses([run_tool, base_plan, "--seed", "7", "--steps", str(steps_of(name)),
                            "--micro-batches", str(n)], base_plan + ".%d.jsonl" % n)
        references[(model, name, n)] = reference
        for stage in ["zero1", "zero2", "zero3"]:
            sharded_recipe = os.path.join(out, "%s.%s.%s.%d.mlir" % (model, name, stage, n))
            recipe(sharded_recipe, RECIPES[name], (stage, n))
            plan = sharded_recipe[:-len(".mlir")] + ".plan"
            compile_plan(model, sharded_recipe, plan)
            got = losses(MPIRUN + ["-np", str(n), run_tool, plan, "--seed", "7", "--steps",
                                   str(steps_of(name)), "--micro-batches", "1"], plan + ".jsonl")
            worst = max(abs(g[1] - r[1]) / abs(r[1]) for g, r in zip(got, reference))
            identical = all(g[2] == r[2] for g, r in zip(got, reference))
            ok = worst <= TOLERANCE
            failed = failed or not ok
            print("%s %s %s ranks %d: %d steps, last loss %s (1 rank: %s), max relative "
                  "difference %.3g, %s%s" % (model, name, stage, n, len(got), got[-1][2],
                                            reference[-1][2], worst,
                                            "bit-identical" if identical else "not bit-identical",
                                            "" if ok else " FAILED"))

# zero3 with reshard_after_forward false: each parameter gathered once per micro-batch and kept
# for the backward pass computes what gathering it twice does.
for model, name in [("tiny_llama", "adamw"), ("tiny_llama", "lora")]:
    for n in RANKS:
        sharded_recipe = os.path.join(out, "%s.%s.zero3-kept.%d.mlir" % (model, name, n))
        recipe(sharded_recipe, RECIPES[name], ("zero3", n), " reshard_after_forward false")
        plan = sharded_recipe[:-len(".mlir")] + ".plan"
        compile_plan(model, sharded_recipe, plan)
        got = losses(MPIRUN + ["-np", str(n), run_tool, plan, "--seed", "7", "--steps",
                               str(steps_of(name)), "--micro-batches", "1"], plan + ".jsonl")
        reference = references[(model, name, n)]
        worst = max(abs(g[1] - r[1]) / abs(r[1]) for g, r in zip(got, reference))
        identical = all(g[2] == r[2] for g, r in zip(got, reference))
        ok = worst <= TOLERANCE
        failed = failed or not ok
        print("%s %s zero3 reshard_after_forward false ranks %d: %d steps, max relative "
              "difference %.3g, %s%s" % (model, name, n, len(got), worst,
                                        "bit-identical" if identical else "not bit-identical",
                                        "" if ok else " FAILED"))

# The all-gathers issued three gathers ahead of their readers (bonsai-compile
# --gathers-ahead; the target "cpu" has no step time to choose one by): another order of
# the collectives stream, the same losses.
for n in RANKS:
    sharded_recipe = os.path.join(out, "tiny_llama.adamw.zero3-ahead3.%d.mlir" % n)
    recipe(sharded_recipe, RECIPES["adamw"], ("zero3", n))
    plan = sharded_recipe[:-len(".mlir")] + ".plan"
    remarks = compile_plan("tiny_llama", sharded_recipe, plan, ["--gathers-ahead=3"])
    ahead = [l.split("; ")[1] for l in remarks.splitlines() if "collectives stream;" in l]
    got = losses(MPIRUN + ["-np", str(n), run_tool, plan, "--seed", "7", "--steps", str(steps),
                           "--micro-batches", "1"], plan + ".jsonl")
    reference = references[("tiny_llama", "adamw", n)]
    worst = max(abs(g[1] - r[1]) / abs(r[1]) for g, r in zip(got, reference))
    identical = all(g[2] == r[2] for g, r in zip(got, reference))
    ok = worst <= TOLERANCE and len(ahead) == 1
    failed = failed or not ok
    print("tiny_llama adamw zero3 %s ranks %d: %d steps, max relative difference %.3g, %s%s" % (
        ahead[0] if ahead else "(no schedule remark)", n, len(got), worst,
        "bit-identical" if identical else "not bit-identical", "" if ok else " FAILED"))

# bonsai-run --nproc 2 starts the two ranks itself (through mpirun): the same losses as the run
# mpirun started above.
plan = os.path.join(out, "tiny_llama.adamw.zero3.2.plan")
if os.path.exists(plan):
    by_mpirun = losses(MPIRUN + ["-np", "2", run_tool, plan, "--seed", "7", "--steps", str(steps),
                                 "--micro-batches", "1"], plan + ".mpirun.jsonl")
    by_nproc = losses([run_tool, plan, "--nproc", "2", "--seed", "7", "--steps", str(steps),
                       "--micro-batches", "1"], plan + ".nproc.jsonl")
    same = [g[2] for g in by_nproc] == [g[2] for g in by_mpirun]
    failed = failed or not same
    print("nproc: bonsai-run --nproc 2: %d steps, %s" % (
        len(by_nproc), "the losses of mpirun -np 2" if same else "losses differ FAILED"))

# Rank 1 started with another plan than rank 0's: every rank stops before training, naming both
# plans' hashes.
if os.path.exists(plan):
    other = os.path.join(out, "tiny_llama.adamw.zero2.2.plan")
    chooser = os.path.join(out, "plan-by-rank.sh")
    with open(chooser, "w") as f:
        f.write('#!/bin/sh\nplan="$1"; shift\n'
                'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then plan="$OTHER_PLAN"; fi\n'
                'exec "$@" "$plan"\n')
    os.chmod(chooser, 0o755)
    result = subprocess.run(MPIRUN + ["-x", "OTHER_PLAN", "-np", "2", chooser, plan, run_tool],
                            capture_output=True, text=True, timeout=TIMEOUT,
                            env=dict(os.environ, OTHER_PLAN=other))
    ranks = sorted(l.split(": ")[2] for l in result.stderr.splitlines()
                   if "differs between the ranks" in l)
    ok = result.returncode != 0 and ranks == ["rank 0 of 2", "rank 1 of 2"]
    failed = failed or not ok
    print("mismatch: exit %s%s" % ("non-zero" if result.returncode else "0",
                                   "" if ok else " FAILED\n" + result.stderr))
    print("mismatch: errors on " + ", ".join(ranks))

# A rank killed (SIGKILL) during training: mpirun ends the job, non-zero, long before its steps
# would; under --enable-recovery, which lets the survivor run on, the survivor ends at the
# collective deadline with an error naming the rank and the step. Rank 1 is killed once rank 0
# has logged its first step, so that the kill lands in training however loaded the machine is
# (a kill at a fixed 4 s came before the first step on a busy machine, and the survivor's error
# then named no step).
killer = os.path.join(out, "kill-rank-1.sh")
progress = os.path.join(out, "kill-rank-0.log")
with open(killer, "w") as f:
    f.write('#!/bin/sh\n'
            'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exec "$@" > "%s"; fi\n'
            '"$@" &\n'
            'pid=$!\n'
            'tries=0\n'
            'until grep -q "^step 1 " "%s" 2>/dev/null || [ $tries -ge 600 ]; do\n'
            '  tries=$((tries + 1)); sleep 0.1\n'
            'done\n'
            'kill -KILL $pid\n'
            'wait $pid\n' % (progress, progress))
os.chmod(killer, 0o755)
plan = os.path.join(out, "tiny_llama.adamw.zero3.2.plan")
env = dict(os.environ, BONSAI_COLLECTIVE_TIMEOUT="10")
for recovery in [[], ["--enable-recovery"]]:
    command = MPIRUN + recovery + ["-x", "BONSAI_COLLECTIVE_TIMEOUT", "-np", "2", killer,
                                   run_tool, plan, "--steps", "1000000"]
    if os.path.exists(progress):
        os.remove(progress)
    start = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    seconds = time.monotonic() - start
    errors = [l for l in result.stderr.splitlines() if "bonsai-run: error" in l]
    if not recovery:
        ok = result.returncode != 0 and seconds < 60
        print("kill: rank 1 killed after step 1: exit %s after %s s%s" % (
            "non-zero" if result.returncode else "0", "under 60" if seconds < 60 else "%.0f" % seconds,
            "" if ok else " FAILED"))
    else:
        error = errors[0] if errors else "(no error)"
        ok = "rank 1 did not" in error and "[step " in error and seconds < 60
        print("kill with recovery: %s%s" % (error, "" if ok else " FAILED"))
    failed = failed or not ok
sys.exit(1 if failed else 0)
