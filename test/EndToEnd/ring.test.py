"""Driver of ring.test: training with the sequence split over a ring of CPU ranks against the
unsplit plan on one process.

For each case it compiles the model with the recipe and with the recipe plus `bonsai.ring ranks
N` (and `bonsai.shard "zero3" ranks D`: a grid of D x N ranks, D data ranks each with its ring),
runs the first on one process with D micro-batches a step and the second under `mpirun -np
D*N` (the ranks of a ring on the same micro-batch, each taking its zigzag share of every row),
and compares the step losses rank 0 writes. Nothing passes unless every ring run is within
1e-5 relative of the 1-rank losses at every step. Then the errors: a sequence the ring cannot
split, a model with a learned position table, a ring with updates in the backward pass, and a
ring plan started on the wrong number of ranks."""
import json
import os
import subprocess
import sys

from shard_recipes import MPIRUN, RECIPES

compile_tool, run_tool, gen_models, models, out, steps = sys.argv[1:7]
steps = int(steps)
TOLERANCE = 1e-5
TIMEOUT = 300
# tiny_llama has 4 query heads over 2 key/value heads (GQA); "mha" has as many of each.
# (model, recipe, ring ranks, data ranks of bonsai.shard "zero3" or 0 without it)
# "packed" is tiny_llama with the positions and segment ids inputs, trained on packed
# documents with prompt tokens masked (a version-2 token file), so that the ranks' shares of
# counted tokens differ from step to step; it also evaluates every 10 steps.
CASES = [("tiny_llama", "adamw", 2, 0), ("tiny_llama", "adamw", 4, 0), ("mha", "adamw", 2, 0),
         ("tiny_llama", "lora", 4, 0), ("tiny_llama", "qlora", 2, 0),
         ("packed", "adamw", 2, 0), ("packed", "adamw", 4, 0),
         ("tiny_llama", "adamw", 2, 2), ("tiny_llama", "qlora", 2, 2)]


def packed_data(path):
    """A version-2 token file (docs/data-format.md): 300 documents of 3 to 90 tokens over a
    vocabulary of 256, each with a prompt of a third of its tokens masked out of the loss."""
    import random
    import struct
    rng = random.Random(5)
    tokens, ends, mask = [], [], []
    for _ in range(300):
        n = rng.randint(3, 90)
        tokens += [rng.randrange(1, 256) for _ in range(n)]
        mask += [0] * (n // 3) + [1] * (n - n // 3)
        ends.append(len(tokens))
    bits = bytearray((len(tokens) + 7) // 8)
    for i, m in enumerate(mask):
        bits[i // 8] |= m << (i % 8)
    with open(path, "wb") as f:
        f.write(b"BONSAITK" + struct.pack("<IIQ", 2, 2, len(tokens)))
        f.write(struct.pack("<IIQQ", 256, 0, 0, len(ends)))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))
        f.write(struct.pack("<%dQ" % len(ends), *ends))
        f.write(bytes(bits))


def model_path(model):
    if model not in ("mha", "packed"):
        return os.path.join(models, model + ".mlir")
    path = os.path.join(out, model + ".mlir")
    option = "--set=kv_heads=4" if model == "mha" else "--packed"
    with open(path, "w") as f:
        subprocess.run([sys.executable, gen_models, "--print", "tiny_llama", option], check=True,
                       stdout=f)
    return path


def recipe(path, body, extra=""):
    with open(path, "w") as f:
        f.write('bonsai.recipe @train {\n  bonsai.target "cpu"\n' + extra + body + "}\n")


def compile_plan(model, recipe_path, plan):
    return subprocess.run([compile_tool, model_path(model), recipe_path, "-o", plan],
                          capture_output=True, text=True)


def losses(command, metrics, expected=None):
    """The step losses rank 0 writes (`expected` of them, else `steps`), then the evaluation
    losses (when the run evaluates)."""
    expected = expected or steps
    if os.path.exists(metrics):
        os.remove(metrics)
    result = subprocess.run(command + ["--metrics", metrics], capture_output=True, text=True,
                            timeout=TIMEOUT)
    if result.returncode != 0:
        sys.exit("FAILED (%d): %s\n%s%s" % (result.returncode, " ".join(command), result.stdout,
                                           result.stderr))
    with open(metrics) as f:
        lines = [json.loads(line) for line in f]
    found = [line["loss"] for line in lines if "loss" in line]
    evals = [line["val_loss"] for line in lines if "val_loss" in line]
    if len(found) != expected:
        sys.exit("FAILED: %d steps, expected %d: %s" % (len(found), expected, " ".join(command)))
    return found + evals


data_file = os.path.join(out, "packed.bin")
packed_data(data_file)
failed = False
for model, name, n, data in CASES:
    base = os.path.join(out, "%s.%s" % (model, name))
    recipe(base + ".mlir", RECIPES[name])
    if compile_plan(model, base + ".mlir", base + ".plan").returncode != 0:
        sys.exit("FAILED: compile " + base)
    options = []
    if model == "packed":
        options = ["--data", data_file, "--eval-data", data_file, "--eval-every", "10",
                   "--eval-batches", "2"]
    reference = losses([run_tool, base + ".plan", "--seed", "7", "--steps", str(steps),
                        "--micro-batches", str(max(data, 1))] + options, base + ".jsonl")
    ring = "%s.ring%d%s" % (base, n, ".zero3x%d" % data if data else "")
    extra = "  bonsai.ring ranks %d\n" % n
    if data:
        extra += '  bonsai.shard "zero3" ranks %d\n' % data
    recipe(ring + ".mlir", RECIPES[name], extra)
    compiled = compile_plan(model, ring + ".mlir", ring + ".plan")
    if compiled.returncode != 0:
        sys.exit("FAILED: compile %s\n%s" % (ring, compiled.stderr))
    got = losses(MPIRUN + ["-np", str(n * max(data, 1)), run_tool, ring + ".plan", "--seed", "7",
                           "--steps", str(steps)] + options, ring + ".jsonl")
    if len(got) != len(reference):
        sys.exit("FAILED: %d losses, expected %d" % (len(got), len(reference)))
    worst = max(abs(g - r) / abs(r) for g, r in zip(got, reference))
    ok = worst <= TOLERANCE
    failed = failed or not ok
    print("%s %s ring %d%s: %d steps%s, max relative difference %.1e%s" %
          (model, name, n, " x zero3 %d" % data if data else "", steps,
           " and %d evaluations" % (len(got) - steps) if len(got) > steps else "", worst,
           "" if ok else " FAILED"))


# A checkpoint of the 2 x 2 grid (each rank's shards) resumes on one process, resharded, and
# continues the grid's losses.
grid = os.path.join(out, "tiny_llama.adamw.ring2.zero3x2")
ckpt = os.path.join(out, "ckpt")
whole = losses(MPIRUN + ["-np", "4", run_tool, grid + ".plan", "--seed", "7", "--steps", "6",
                         "--save-every", "3", "--ckpt-dir", ckpt], grid + ".ckpt.jsonl", 6)
resumed = losses([run_tool, os.path.join(out, "tiny_llama.adamw.plan"), "--micro-batches", "2",
                  "--steps", "3", "--resume", os.path.join(ckpt, "step-00000003")],
                 grid + ".resumed.jsonl", 3)
worst = max(abs(g - r) / abs(r) for g, r in zip(resumed, whole[3:]))
failed = failed or worst > TOLERANCE
print("checkpoint of the 2 x 2 grid at step 3, resumed on 1 rank: steps 4-6, max relative "
      "difference %.1e%s" % (worst, "" if worst <= TOLERANCE else " FAILED"))


def first_error(stderr):
    return next((line for line in stderr.splitlines() if "error" in line), stderr.strip())


# A sequence of 64 tokens does not split into 2 x 3 zigzag chunks.
bad = os.path.join(out, "bad")
recipe(bad + ".ranks3.mlir", RECIPES["adamw"], "  bonsai.ring ranks 3\n")
print("ranks 3:", first_error(compile_plan("tiny_llama", bad + ".ranks3.mlir",
                                           bad + ".plan").stderr))
# GPT-2's learned position table is added to every token by its index.
recipe(bad + ".gpt2.mlir", RECIPES["adamw"], "  bonsai.ring ranks 2\n")
print("gpt2:", first_error(compile_plan("tiny_gpt2", bad + ".gpt2.mlir", bad + ".plan").stderr))
recipe(bad + ".inbackward.mlir", '  bonsai.optimizer "adamw" lr 1.000000e-03 '
       '{update_in_backward = true}\n', "  bonsai.ring ranks 2\n")
print("update_in_backward:", first_error(compile_plan("tiny_llama", bad + ".inbackward.mlir",
                                                      bad + ".plan").stderr))
# A ring plan of 2 ranks started as 4.
result = subprocess.run(MPIRUN + ["-np", "4", run_tool, "%s/tiny_llama.adamw.ring2.plan" % out,
                                  "--steps", "1"], capture_output=True, text=True,
                        timeout=TIMEOUT)
print("np 4: exit %s, %s" % ("non-zero" if result.returncode else "0",
                             first_error(result.stderr)))
sys.exit(1 if failed else 0)
