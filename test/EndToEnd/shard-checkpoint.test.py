"""Driver of shard-checkpoint.test: sharded checkpoints saved on 4 ranks and resumed on 4, 2
and 1, exports from a sharded run, and what a killed rank or a wrong checkpoint leaves.

For each case a 4-rank run trains 20 steps and saves at step 10; the run resumed from that
checkpoint on 4 ranks (one micro-batch each), 2 ranks (two each) and 1 rank (four) must give
the uninterrupted run's losses of steps 11 to 20 within 1e-6 relative (each line says whether
they are bit-identical), and the exports of the 4-rank and the 1-rank resumed runs must be the
same bytes. Nothing passes unless every check does; failures print FAILED."""
import filecmp
import os
import shutil
import signal
import subprocess
import sys
import time

from shard_recipes import MPIRUN, RECIPES

compile_tool, run_tool, models, out = sys.argv[1:5]
TOLERANCE = 1e-6
TIMEOUT = 300

# (model, recipe, stage): every stage, both models, and each recipe kind once.
CASES = [("tiny_llama", "adamw", "zero3"), ("tiny_gpt2", "adamw", "zero1"),
         ("tiny_llama", "lora", "zero2"), ("tiny_llama", "qlora", "zero3"),
         ("tiny_llama", "qdora", "zero3"), ("tiny_llama", "galore", "zero1")]

failed = False


def check(ok, line):
    global failed
    failed = failed or not ok
    print(line + ("" if ok else " FAILED"))


def plan_for(model, name, stage, ranks):
    """Compiles the recipe for `ranks` ranks (unsharded for 1) and returns the plan path."""
    base = os.path.join(out, "%s.%s.%s.%d" % (model, name, stage, ranks))
    with open(base + ".mlir", "w") as f:
        f.write("bonsai.recipe @train {\n  bonsai.target \"cpu\"\n")
        if ranks > 1:
            f.write('  bonsai.shard "%s" ranks %d\n' % (stage, ranks))
        f.write(RECIPES[name] + "}\n")
    subprocess.run([compile_tool, os.path.join(models, model + ".mlir"), base + ".mlir", "-o",
                    base + ".plan"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return base + ".plan"


def launch(ranks):
    return MPIRUN + ["-np", str(ranks)] if ranks > 1 else []


def run(command, expect_ok=True, env=None):
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=env)
    if expect_ok and result.returncode != 0:
        sys.exit("FAILED (%d): %s\n%s%s" % (result.returncode, " ".join(command), result.stdout,
                                           result.stderr))
    return result


def losses(command, metrics):
    """The losses rank 0 wrote to `metrics`, as printed (%.9g: an f32 exactly)."""
    if os.path.exists(metrics):
        os.remove(metrics)
    run(command + ["--metrics", metrics])
    with open(metrics) as f:
        return [line.split('"loss": ')[1].split(",")[0] for line in f]


def compare(got, want):
    worst = max(abs(float(g) - float(w)) / abs(float(w)) for g, w in zip(got, want))
    ok = len(got) == len(want) and worst <= TOLERANCE
    return ok, "%d steps, max relative difference %.3g, %s" % (
        len(got), worst, "bit-identical" if got == want else "not bit-identical")


def errors(result):
    return sorted(l.split("bonsai-run: error: ")[1] for l in result.stderr.splitlines()
                  if "bonsai-run: error: " in l)


for model, name, stage in CASES:
    plans = {n: plan_for(model, name, stage, n) for n in [4, 2, 1]}
    tag = "%s %s %s" % (model, name, stage)
    ckpt = os.path.join(out, tag.replace(" ", ".") + ".ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)
    full = losses(launch(4) + [run_tool, plans[4], "--seed", "7", "--steps", "20",
                               "--micro-batches", "1", "--save-every", "10", "--ckpt-dir", ckpt],
                  ckpt + ".full.jsonl")
    step10 = os.path.join(ckpt, "step-00000010")
    exports = {}
    for n in [4, 2, 1]:
        command = launch(n) + [run_tool, plans[n], "--resume", step10, "--steps", "10",
                               "--micro-batches", str(4 // n)]
        if n != 2:
            # The exports of the resumed 4-rank and 1-rank runs, compared below.
            exports[n] = os.path.join(out, "%s.export%d" % (tag.replace(" ", "."), n))
            shutil.rmtree(exports[n], ignore_errors=True)
            os.makedirs(exports[n])
            command += ["--export-merged", os.path.join(exports[n], "merged.safetensors")]
            if name in ("lora", "qlora", "qdora"):
                command += ["--export-adapter", os.path.join(exports[n], "adapter")]
        ok, summary = compare(losses(command, ckpt + ".%d.jsonl" % n), full[10:])
        check(ok, "%s: saved on 4 ranks, resumed on %d rank%s: %s" % (
            tag, n, "" if n == 1 else "s", summary))
    files = sorted(os.path.relpath(os.path.join(d, f), exports[1])
                   for d, _, names in os.walk(exports[1]) for f in names)
    same = all(filecmp.cmp(os.path.join(exports[4], f), os.path.join(exports[1], f),
                           shallow=False) for f in files)
    check(same and len(files) > 0, "%s: exports of 4 ranks and of 1 rank: %s %s" % (
        tag, ", ".join(files), "byte for byte the same" if same else "differ"))

# A checkpoint of one rank resumes on 2 ranks: the 1-rank run's losses.
plans = {n: plan_for("tiny_llama", "adamw", "zero2", n) for n in [2, 1]}
ckpt = os.path.join(out, "one-rank.ckpt")
shutil.rmtree(ckpt, ignore_errors=True)
full = losses([run_tool, plans[1], "--seed", "7", "--steps", "20", "--micro-batches", "2",
               "--save-every", "10", "--ckpt-dir", ckpt], ckpt + ".full.jsonl")
got = losses(launch(2) + [run_tool, plans[2], "--resume", ckpt + "/step-00000010", "--steps",
                          "10", "--micro-batches", "1"], ckpt + ".2.jsonl")
ok, summary = compare(got, full[10:])
check(ok, "tiny_llama adamw zero2: saved on 1 rank, resumed on 2 ranks: " + summary)

# A plan sharded over one rank (what one GPU runs, test/gpu/shard-one-rank.sh): its shards are
# whole tensors, saved and exported with their whole shapes, so that the unsharded plan resumes
# its checkpoint and its export is the unsharded run's.
one = plan_for("tiny_llama", "qlora", "zero3", 1)
with open(one[:-len(".plan")] + ".mlir") as f:
    text = f.read()
one_sharded = one.replace(".1.plan", ".r1.plan")
with open(one_sharded[:-len(".plan")] + ".mlir", "w") as f:
    f.write(text.replace('  bonsai.target "cpu"\n',
                         '  bonsai.target "cpu"\n  bonsai.shard "zero3" ranks 1\n'))
subprocess.run([compile_tool, os.path.join(models, "tiny_llama.mlir"),
                one_sharded[:-len(".plan")] + ".mlir", "-o", one_sharded], check=True,
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
ckpt = os.path.join(out, "ranks1.ckpt")
shutil.rmtree(ckpt, ignore_errors=True)
full = losses([run_tool, one_sharded, "--seed", "7", "--steps", "20", "--save-every", "10",
               "--ckpt-dir", ckpt], ckpt + ".full.jsonl")
exports = {}
for label, plan in [("sharded", one_sharded), ("unsharded", one)]:
    exports[label] = os.path.join(out, "ranks1.export." + label)
    shutil.rmtree(exports[label], ignore_errors=True)
    os.makedirs(exports[label])
    got = losses([run_tool, plan, "--resume", ckpt + "/step-00000010", "--steps", "10",
                  "--export-merged", os.path.join(exports[label], "merged.safetensors"),
                  "--export-adapter", os.path.join(exports[label], "adapter")],
                 ckpt + "." + label + ".jsonl")
    ok, summary = compare(got, full[10:])
    check(ok, "tiny_llama qlora zero3 ranks 1: resumed on the %s plan: %s" % (label, summary))
same = all(filecmp.cmp(os.path.join(exports["sharded"], f), os.path.join(exports["unsharded"], f),
                       shallow=False)
           for f in ["merged.safetensors", "adapter/adapter_model.safetensors"])
check(same, "tiny_llama qlora zero3 ranks 1: exports %s" % (
    "byte for byte the unsharded plan's" if same else "differ from the unsharded plan's"))

# A rank that dies in the middle of a save (after writing its model file) leaves the
# checkpoint before it the latest, and loadable.
plan = plan_for("tiny_llama", "adamw", "zero3", 2)
ckpt = os.path.join(out, "crash.ckpt")
shutil.rmtree(ckpt, ignore_errors=True)
run(launch(2) + [run_tool, plan, "--steps", "4", "--save-every", "2", "--ckpt-dir", ckpt])
crasher = os.path.join(out, "crash-rank-1.sh")
with open(crasher, "w") as f:
    f.write('#!/bin/sh\nif [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then\n'
            '  BONSAI_TEST_CRASH_IN_SAVE=after-model; export BONSAI_TEST_CRASH_IN_SAVE\nfi\n'
            'exec "$@"\n')
os.chmod(crasher, 0o755)
env = dict(os.environ, BONSAI_COLLECTIVE_TIMEOUT="10")
result = run(MPIRUN + ["-x", "BONSAI_COLLECTIVE_TIMEOUT", "-np", "2", crasher, run_tool, plan,
                       "--resume", "--ckpt-dir", ckpt, "--steps", "4", "--save-every", "2"],
             expect_ok=False, env=env)
latest = open(os.path.join(ckpt, "latest")).read().strip()
resumed = run(launch(2) + [run_tool, plan, "--resume", "--ckpt-dir", ckpt, "--steps", "2"],
              expect_ok=False)
ok = result.returncode != 0 and latest == "step-00000004" and resumed.returncode == 0
check(ok, "crash: rank 1 died saving step 6: exit %s, latest %s, resumed from it: exit %d" % (
    "non-zero" if result.returncode else "0", latest, resumed.returncode))

# A rank killed (SIGKILL) during the steps of a run saving every step: the survivor stops at
# the deadline with an error naming the dead rank, and the latest checkpoint resumes.
ckpt = os.path.join(out, "kill.ckpt")
shutil.rmtree(ckpt, ignore_errors=True)
killer = os.path.join(out, "kill-rank-1.sh")
with open(killer, "w") as f:
    f.write('#!/bin/sh\nif [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec timeout -s KILL 4 "$@"; fi\n'
            'exec "$@"\n')
os.chmod(killer, 0o755)
start = time.monotonic()
result = run(MPIRUN + ["--enable-recovery", "-x", "BONSAI_COLLECTIVE_TIMEOUT", "-np", "2", killer,
                       run_tool, plan, "--steps", "1000000", "--save-every", "1", "--keep-last",
                       "2", "--ckpt-dir", ckpt], expect_ok=False, env=env)
seconds = time.monotonic() - start
found = errors(result)
latest = open(os.path.join(ckpt, "latest")).read().strip()
resumed = run(launch(2) + [run_tool, plan, "--resume", "--ckpt-dir", ckpt, "--steps", "2"],
              expect_ok=False)
# (Under --enable-recovery mpirun's own exit status does not say that a rank failed.)
named = bool(found) and "rank 1 did not" in found[0]
ok = seconds < 60 and named and resumed.returncode == 0 and "resume: " in resumed.stdout
check(ok, "kill: rank 1 killed during the steps: rank 0 stopped after %s s, %s; the latest "
      "checkpoint resumes: exit %d" % ("under 60" if seconds < 60 else "%.0f" % seconds,
                                       "naming rank 1" if named else "not naming rank 1",
                                       resumed.returncode))

# SIGTERM to one rank only: the ranks agree after each step, stop after the same one, save it
# together and exit 0; the checkpoint resumes.
ckpt = os.path.join(out, "sigterm.ckpt")
shutil.rmtree(ckpt, ignore_errors=True)
pids = os.path.join(out, "pids")
os.makedirs(pids, exist_ok=True)
recorder = os.path.join(out, "record-pid.sh")
with open(recorder, "w") as f:
    f.write('#!/bin/sh\necho $$ > "$PID_DIR/rank-$OMPI_COMM_WORLD_RANK"\nexec "$@"\n')
os.chmod(recorder, 0o755)
for name in os.listdir(pids):
    os.remove(os.path.join(pids, name))
run_env = dict(os.environ, PID_DIR=pids)
process = subprocess.Popen(MPIRUN + ["-x", "PID_DIR", "-np", "2", recorder, run_tool, plan,
                                     "--steps", "1000000", "--ckpt-dir", ckpt],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=run_env)
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(pids, "rank-1")) and time.monotonic() < deadline:
    time.sleep(0.1)
time.sleep(2)
os.kill(int(open(os.path.join(pids, "rank-1")).read()), signal.SIGTERM)
stdout, stderr = process.communicate(timeout=120)
interrupted = [l for l in stdout.splitlines() if l.startswith("interrupted: ")]
latest = open(os.path.join(ckpt, "latest")).read().strip() if os.path.exists(
    os.path.join(ckpt, "latest")) else "none"
resumed = run(launch(2) + [run_tool, plan, "--resume", "--ckpt-dir", ckpt, "--steps", "1"],
              expect_ok=False)
ok = (process.returncode == 0 and len(interrupted) == 1 and "SIGTERM" in interrupted[0] and
      interrupted[0].endswith(latest) and resumed.returncode == 0)
check(ok, "sigterm: rank 1 alone got SIGTERM: exit %d, %s; resumed: exit %d" % (
    process.returncode, "every rank stopped after the same step and saved it" if ok else
    (interrupted or stderr), resumed.returncode))

# A corrupt piece that only rank 1 reads: rank 1 reports it, and rank 0 stops with rank 1's
# error rather than waiting at its first collective.
ckpt = os.path.join(out, "corrupt.ckpt")
shutil.rmtree(ckpt, ignore_errors=True)
run(launch(2) + [run_tool, plan, "--steps", "2", "--save-every", "2", "--ckpt-dir", ckpt])
piece = os.path.join(ckpt, "step-00000002", "optimizer.rank-00001-of-00002.safetensors")
with open(piece, "r+b") as f:
    f.seek(-4, 2)
    byte = f.read(1)
    f.seek(-4, 2)
    f.write(bytes([byte[0] ^ 1]))
result = run(launch(2) + [run_tool, plan, "--resume", "--ckpt-dir", ckpt, "--steps", "1"],
             expect_ok=False)
found = errors(result)
ok = (result.returncode != 0 and len(found) == 2 and all("fails its SHA-256 check" in e
                                                         for e in found))
check(ok, "corrupt: " + ("; ".join(e.split(" checkpoint '")[0] + " ... fails its SHA-256 check"
                                   for e in found) if ok else result.stderr))

# Another model's checkpoint: every rank names the mismatch.
other = os.path.join(out, "tiny_gpt2.adamw.zero1.ckpt", "step-00000010")
result = run(launch(2) + [run_tool, plan, "--resume", other, "--steps", "1"], expect_ok=False)
found = errors(result)
ok = (result.returncode != 0 and len(found) == 2 and
      all("is of another model than plan" in e for e in found))
check(ok, "other model: " + ("; ".join(e.split(" checkpoint '")[0] + " ... " +
                                       e.split("' is of another model than plan '")[1].split(
                                           "': ")[1] for e in found) if ok else result.stderr))
sys.exit(1 if failed else 0)
