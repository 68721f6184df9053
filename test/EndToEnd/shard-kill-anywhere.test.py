"""Driver of shard-kill-anywhere.test: one rank of a sharded run killed at random moments.

Standard library only. Usage:

  shard-kill-anywhere.test.py COMPILE RUN MODELS WORK [TRIALS] [SEED]

1. Compiles tiny_llama with AdamW and bonsai.shard "zero3" ranks 2, and runs the uninterrupted
   reference under mpirun: STEPS steps with --save-every 1, keeping each step's loss (from
   --metrics) and the bytes of every file of each step's checkpoint (both ranks' pieces and the
   manifest). Timed runs give the wall time of a run of no step (start-up: MPI, the plan, the
   weights) and of the whole run.
2. Trials in one chain: a run starts fresh when the checkpoint directory has no `latest`, else
   resumes from it for the remaining steps; at a moment drawn uniformly between the start-up
   time and the end of the steps it has left (seeded RNG), one of its two ranks (drawn too)
   gets SIGKILL,
   through the pid its launch wrapper recorded. mpirun then ends the other rank. Every trial
   checks that the losses the run wrote are the reference's, bit for bit, and that `latest`,
   when there is one, names a checkpoint whose every file is byte-identical to the reference's
   of that step (so it loads, on any number of ranks, and binds the uninterrupted run's state).
   A run that ends before its kill completes the chain, which must end with the reference's
   last checkpoint; the chain then starts again from an empty directory.
A kill counts as landing in a save when the run had already written the loss of the step
after the one `latest` names (every step saves, and the metrics line is written before the
save starts).
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

compile_tool, run_tool, models, work = sys.argv[1:5]
TRIALS = int(sys.argv[5]) if len(sys.argv) > 5 else 40
SEED = int(sys.argv[6]) if len(sys.argv) > 6 else 1
STEPS = 24
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
          "-x", "BONSAI_COLLECTIVE_TIMEOUT"]
ENV = dict(os.environ, BONSAI_COLLECTIVE_TIMEOUT="10")


class Failure(Exception):
    pass


def step_dir(step):
    return "step-%08d" % step


def checkpoint_bytes(directory):
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory))}


def latest_step(ckpt):
    path = os.path.join(ckpt, "latest")
    if not os.path.exists(path):
        return 0
    return int(open(path).read().strip()[len("step-"):])


def losses(metrics):
    """step -> loss as written (%.9g), from a metrics file that may end in a cut line."""
    found = {}
    if os.path.exists(metrics):
        for line in open(metrics):
            try:
                record = json.loads(line)
            except ValueError:
                continue  # the line the kill cut short
            found[record["step"]] = line.split('"loss": ')[1].split(",")[0]
    return found


scratch = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else work
root = os.path.join(scratch, "bonsai-shard-kill-%d" % os.getpid())
shutil.rmtree(root, ignore_errors=True)
os.makedirs(root)
try:
    recipe = os.path.join(work, "zero3.mlir")
    with open(recipe, "w") as f:
        f.write('bonsai.recipe @train {\n  bonsai.target "cpu"\n  bonsai.shard "zero3" ranks 2\n'
                '  bonsai.optimizer "adamw" lr 2.000000e-03 {grad_clip = 1.000000e+00 : f64}\n}\n')
    plan = os.path.join(work, "zero3.plan")
    subprocess.run([compile_tool, os.path.join(models, "tiny_llama.mlir"), recipe, "-o", plan],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wrapper = os.path.join(work, "record-pid.sh")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\necho $$ > "$PID_DIR/rank-$OMPI_COMM_WORLD_RANK"\nexec "$@"\n')
    os.chmod(wrapper, 0o755)

    def command(ckpt, steps, resume, metrics):
        argv = MPIRUN + ["-x", "PID_DIR", "-np", "2", wrapper, run_tool, plan, "--seed", "7",
                         "--steps", str(steps), "--micro-batches", "2", "--save-every", "1",
                         "--ckpt-dir", ckpt, "--metrics", metrics]
        return argv + (["--resume"] if resume else [])

    # The reference, and the wall times of start-up and of a whole run.
    reference_dir = os.path.join(root, "reference")
    env = dict(ENV, PID_DIR=root)
    start = time.monotonic()
    subprocess.run(command(reference_dir, 0, False, os.path.join(root, "none.jsonl")), env=env,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    startup = time.monotonic() - start
    start = time.monotonic()
    subprocess.run(command(reference_dir, STEPS, False, os.path.join(root, "ref.jsonl")),
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    whole = time.monotonic() - start
    reference = losses(os.path.join(root, "ref.jsonl"))
    saved = {k: checkpoint_bytes(os.path.join(reference_dir, step_dir(k)))
             for k in range(1, STEPS + 1)}
    if sorted(reference) != list(range(1, STEPS + 1)):
        raise Failure("the reference wrote the losses of steps %s" % sorted(reference))
    print("reference: %d steps on 2 ranks, %d files per checkpoint, start-up %.2f s, run %.2f s"
          % (STEPS, len(saved[1]), startup, whole))

    rng = random.Random(SEED)
    ckpt = os.path.join(root, "chain")
    trials = kills = in_save = chains = 0
    while trials < TRIALS:
        if not os.path.exists(os.path.join(ckpt, "latest")):
            shutil.rmtree(ckpt, ignore_errors=True)
        done = latest_step(ckpt)
        metrics = os.path.join(root, "run.jsonl")
        if os.path.exists(metrics):
            os.remove(metrics)
        for name in os.listdir(root):
            if name.startswith("rank-"):
                os.remove(os.path.join(root, name))
        what = "trial %d (from step %d)" % (trials + 1, done)
        run = subprocess.Popen(command(ckpt, STEPS - done, done > 0, metrics), env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        delay = rng.uniform(startup, startup + (whole - startup) * (STEPS - done) / STEPS)
        victim = rng.randrange(2)
        killed = False
        try:
            run.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            pid_file = os.path.join(root, "rank-%d" % victim)
            if os.path.exists(pid_file):
                try:
                    os.kill(int(open(pid_file).read()), signal.SIGKILL)
                    killed = True
                except (ProcessLookupError, ValueError):
                    pass
        try:
            _, errors = run.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
            raise Failure("%s: the run did not end within 60 s of the kill" % what)
        wrote = losses(metrics)
        for step, loss in wrote.items():
            if reference.get(step) != loss:
                raise Failure("%s: step %d loss %s, the uninterrupted run's %s" %
                              (what, step, loss, reference.get(step)))
        latest = latest_step(ckpt)
        if latest:
            got = checkpoint_bytes(os.path.join(ckpt, step_dir(latest)))
            if got != saved[latest]:
                differ = sorted(n for n in set(got) | set(saved[latest])
                                if got.get(n) != saved[latest].get(n))
                raise Failure("%s: latest names step %d, whose %s differ from the "
                              "uninterrupted run's" % (what, latest, ", ".join(differ)))
        if latest < done:
            raise Failure("%s: latest went back from step %d to %d" % (what, done, latest))
        if killed:
            trials += 1
            kills += 1
            in_save += (latest + 1) in wrote
        elif run.returncode != 0:
            raise Failure("%s: the run failed without a kill:\n%s" % (what, errors))
        elif latest != STEPS:
            raise Failure("%s: the run ended at step %d" % (what, latest))
        else:
            chains += 1
            shutil.rmtree(ckpt)
    print("kill trials: %d (SIGKILL of one of 2 ranks at a moment uniform over the steps), %d "
          "in a save; %d chains completed with the reference's checkpoint" %
          (kills, in_save, chains))
    print("every latest checkpoint: the uninterrupted run's bytes; every loss: the "
          "uninterrupted run's")
except Failure as failure:
    print("FAILED: %s" % failure)
    sys.exit(1)
finally:
    shutil.rmtree(root, ignore_errors=True)
