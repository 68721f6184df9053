"""Driver of kill-anywhere.test: kills bonsai-run at random moments of training and saving.

Standard library only. Usage:

  kill-anywhere.test.py --bonsai-run BIN --bonsai-compile BIN --src ROOT --work DIR
                        [--trials 200] [--graceful 20] [--steps 4] [--jobs 2] [--seed 1]
                        [--ckpt-root DIR] [--signals-only] [--backend cpu|cuda --plan PLAN]

1. Compiles examples/models/tiny_llama.mlir with examples/recipes/tiny_train.mlir and runs the
   uninterrupted reference: N + 5 steps with --save-every 1 from seed 7 on random tokens,
   keeping its `step K loss ...` lines and its checkpoints step-1 .. step-(N+5). Timed runs
   give C, the CPU time of the main thread of a run of N steps, S, that of a run of no step,
   and R, that of a resume with no step (R > S: the checkpoint is hashed and loaded).
2. Trials, in chains (one per --jobs worker, each with its own checkpoint directory and its own
   RNG seeded from --seed): a run starts fresh when the directory has no `latest`, else resumes
   from it (--resume, --steps N - K); once its main thread has run for a time drawn uniformly
   over that run's expected CPU time (S or R, plus (C - S)(N - K)/N) it gets SIGKILL (a kill
   trial) or, for --graceful trials, SIGTERM or SIGINT. The clock is the run's CPU time
   (/proc/PID/schedstat), not the wall clock: on a loaded machine a run waits for the CPU, and
   its wall time says little about how far it got. A run that ends before its signal is no
   trial: it completes its chain, its step lines and its step-N checkpoint are compared with
   the reference's, and the chain starts again from an empty directory. Every trial checks:
     - each `step K` line the run printed is the reference's line K, byte for byte;
     - every save the run reported ("checkpoint: step K saved") is still named by `latest`, or
       a later one is (an acknowledged save survives a kill);
     - `latest`, when there is one, names a directory whose model.safetensors,
       optimizer.safetensors and manifest.json are byte-identical to the reference's of that
       step (so it loads, and binds exactly the state of the uninterrupted run);
     - the next run of the chain resumes from it (verify + load) and continues with the
       reference's lines; every chain ends in a run that reaches step N with the reference's
       lines and the reference's step-N bytes.
   A graceful trial must instead end with exit 0 and "interrupted: SIG..., stopped after step
   K: checkpoint saved to DIR/step-K" (K the last step line) when the signal came during the
   steps, or die of the signal when it came before the steps started (loading) or after them.
   A kill trial is counted as landing in a save when the last line the run printed was a
   `step K` line (every step saves, and the line is flushed before the save starts); the state
   of the directory says how far the save got.
3. --signals-only (and after the trials): SIGTERM after step 1 with --ckpt-dir, SIGINT without
   it, and SIGINT followed at once by SIGTERM (the second signal ends the run at once).

The checkpoints go to a tmpfs (/dev/shm) when there is one: a SIGKILL loses nothing that was
written (the page cache survives the process), so what is tested does not depend on the disk,
and fsync on a tmpfs is free where on a busy disk it costs tens of ms a call.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

FILES = ("model.safetensors", "optimizer.safetensors", "manifest.json")
STEP_LINE = re.compile(r"^step (\d+) loss ")
SAVED_LINE = re.compile(r"^checkpoint: step (\d+) saved to (.*)$")
INTERRUPTED_LINE = re.compile(
    r"^interrupted: (SIGINT|SIGTERM), stopped after step (\d+): (.*)$", re.M)


BACKEND = "cpu"


class Failure(Exception):
    pass


def step_dir(step):
    return "step-%08d" % step


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def latest_step(ckpt):
    """The step `latest` names, 0 when there is none."""
    path = os.path.join(ckpt, "latest")
    if not os.path.exists(path):
        return 0
    text = read_bytes(path).decode().strip()
    m = re.fullmatch(r"step-(\d{8,})", text)
    if not m:
        raise Failure("%s: 'latest' holds %r" % (ckpt, text))
    return int(m.group(1))


class Reference:
    def __init__(self, lines, ckpt, seconds):
        self.lines = lines  # step K -> the line
        self.ckpt = ckpt
        self.seconds = seconds
        self.bytes = {}
        for k in lines:
            self.bytes[k] = {f: read_bytes(os.path.join(ckpt, step_dir(k), f)) for f in FILES}

    def check_checkpoint(self, ckpt, step, what):
        directory = os.path.join(ckpt, step_dir(step))
        if not os.path.isdir(directory):
            raise Failure("%s: 'latest' names %s, which does not exist" % (what, directory))
        for f in FILES:
            path = os.path.join(directory, f)
            if not os.path.exists(path):
                raise Failure("%s: %s is missing" % (what, path))
            if read_bytes(path) != self.bytes[step][f]:
                raise Failure("%s: %s differs from the uninterrupted run's" % (what, path))


def step_lines(text, what, reference):
    """The step numbers of the run's `step K` lines, each checked against the reference."""
    steps = []
    for line in text.splitlines():
        m = STEP_LINE.match(line)
        if not m:
            continue
        k = int(m.group(1))
        if k not in reference.lines or line != reference.lines[k]:
            raise Failure("%s: printed %r, the uninterrupted run %r" %
                          (what, line, reference.lines.get(k)))
        steps.append(k)
    return steps


class Run:
    """One bonsai-run process with its stdout in a file."""

    def __init__(self, argv, out_path):
        self.out_path = out_path
        self.out = open(out_path, "wb")
        self.start = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT)

    def signal_at(self, delay, sig):
        """Sends `sig` `delay` s after the start unless the run ended; returns the exit status."""
        deadline = self.start + delay
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                self.proc.wait(timeout=left)
                break
            except subprocess.TimeoutExpired:
                pass
        sent = False
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            sent = True
        rc = self.proc.wait(timeout=120)
        self.out.close()
        return rc, sent

    def cpu_seconds(self):
        """CPU time of the run's main thread so far (ns in /proc/PID/schedstat), None once gone.

        The kill moments are drawn on this clock, not the wall clock: on a loaded machine a run
        waits for the CPU, and its wall time says little about how far it got."""
        try:
            with open("/proc/%d/schedstat" % self.proc.pid) as f:
                return int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            return None

    def signal_at_cpu(self, cpu, sig):
        """Sends `sig` once the main thread has run `cpu` s, unless the run ended first."""
        sent = False
        while self.proc.poll() is None:
            used = self.cpu_seconds()
            if used is not None and used >= cpu:
                self.proc.send_signal(sig)
                sent = True
                break
            time.sleep(0.0005)
        rc = self.proc.wait(timeout=120)
        self.out.close()
        return rc, sent

    def text(self):
        return read_bytes(self.out_path).decode(errors="replace")


def check_acknowledged(text, ckpt, what):
    saved = [int(m.group(1)) for m in map(SAVED_LINE.match, text.splitlines()) if m]
    latest = latest_step(ckpt)
    if saved and latest < saved[-1]:
        raise Failure("%s: the run reported step %d saved, but 'latest' names step %d" %
                      (what, saved[-1], latest))
    return latest


def save_phase(ckpt, step):
    """How far the save of `step` got, from what it left in the directory."""
    names = os.listdir(ckpt) if os.path.isdir(ckpt) else []
    if latest_step(ckpt) == step:
        return "latest replaced"
    if step_dir(step) in names:
        return "renamed, latest not yet"
    if any(n.startswith(".tmp-" + step_dir(step) + "-") for n in names):
        return "writing the files"
    return "before the files"


class Worker:
    def __init__(self, index, args, reference, plan, root, stats, lock):
        self.index = index
        self.args = args
        self.reference = reference
        self.plan = plan
        self.ckpt = os.path.join(root, "chain-%d" % index)
        self.out = os.path.join(args.work, "run-%d.out" % index)
        self.stats = stats
        self.lock = lock
        self.rng = random.Random(args.seed * 1000 + index)
        self.error = None

    def count(self, key, n=1):
        with self.lock:
            self.stats[key] = self.stats.get(key, 0) + n

    def argv(self):
        n = self.args.steps
        base = [self.args.bonsai_run, self.plan, "--backend=" + BACKEND, "--save-every", "1",
                "--ckpt-dir", self.ckpt]
        k = latest_step(self.ckpt)
        if k == 0:
            return base + ["--seed", "7", "--steps", str(n)], 0
        return base + ["--resume", "--steps", str(n - k)], k

    def finish_chain(self, text, first, what):
        steps = step_lines(text, what, self.reference)
        n = self.args.steps
        if steps != list(range(first + 1, n + 1)):
            raise Failure("%s: completed with steps %s, expected %d..%d" %
                          (what, steps, first + 1, n))
        if latest_step(self.ckpt) != n:
            raise Failure("%s: completed, but 'latest' names step %d" %
                          (what, latest_step(self.ckpt)))
        self.reference.check_checkpoint(self.ckpt, n, what)
        self.count("chains completed")
        shutil.rmtree(self.ckpt)

    def trial(self, number, sig):
        argv, first = self.argv()
        what = "worker %d trial %d (%s, from step %d)" % (self.index, number, sig.name, first)
        # Uniform over this run's expected duration: the start, then N - K steps and saves.
        ref = self.reference
        span = (ref.resume_startup if first else ref.startup) + (
            ref.seconds - ref.startup) * (self.args.steps - first) / self.args.steps
        delay = self.rng.uniform(0.0, span)
        run = Run(argv, self.out)
        rc, sent = run.signal_at_cpu(delay, sig)
        text = run.text()
        if rc == 0 and not INTERRUPTED_LINE.search(text):
            # It ended before the signal, or as it was sent (a process that has exited but is
            # not yet reaped takes a signal without effect).
            self.count("runs that ended before their signal")
            self.finish_chain(text, first, what)
            return False
        steps = step_lines(text, what, self.reference)
        if steps and steps != list(range(first + 1, steps[-1] + 1)):
            raise Failure("%s: steps %s out of order" % (what, steps))
        if sig == signal.SIGKILL:
            if rc != -signal.SIGKILL:
                raise Failure("%s: exit status %d, expected death by SIGKILL:\n%s" %
                              (what, rc, text))
            latest = check_acknowledged(text, self.ckpt, what)
            if latest:
                self.reference.check_checkpoint(self.ckpt, latest, what)
            marks = [l for l in text.splitlines() if STEP_LINE.match(l) or SAVED_LINE.match(l)]
            last = marks[-1] if marks else ""
            if STEP_LINE.match(last):
                self.count("kills in a save")
                self.count("  save: " + save_phase(self.ckpt, int(STEP_LINE.match(last).group(1))))
            elif last and int(SAVED_LINE.match(last).group(1)) == self.args.steps:
                self.count("kills after the last save (exiting)")
            elif steps:
                self.count("kills in a step")
            else:
                self.count("kills before the first step line (loading or step %d)" % (first + 1))
            if latest == self.args.steps:
                # Killed after the last save (exit path): the chain is complete.
                self.reference.check_checkpoint(self.ckpt, latest, what)
                self.count("chains completed")
                shutil.rmtree(self.ckpt)
            return True
        # SIGTERM / SIGINT.
        m = None
        for line in text.splitlines():
            m = INTERRUPTED_LINE.match(line) or m
        if rc == 0:
            if not m or m.group(1) != sig.name:
                raise Failure("%s: exit 0 without the 'interrupted: %s' line:\n%s" %
                              (what, sig.name, text))
            k = int(m.group(2))
            expected_k = steps[-1] if steps else first
            if k != expected_k:
                raise Failure("%s: stopped after step %d, but the last step line is %d" %
                              (what, k, expected_k))
            if not steps:
                if m.group(3) != "no step ran in this run, nothing saved":
                    raise Failure("%s: %r" % (what, text))
            else:
                where = os.path.join(self.ckpt, step_dir(k))
                if m.group(3) != "checkpoint saved to " + where:
                    raise Failure("%s: %r, expected 'checkpoint saved to %s'" %
                                  (what, m.group(3), where))
                if latest_step(self.ckpt) != k:
                    raise Failure("%s: stopped after step %d, 'latest' names %d" %
                                  (what, k, latest_step(self.ckpt)))
                self.reference.check_checkpoint(self.ckpt, k, what)
            self.count("graceful stops (exit 0, checkpoint of the last step)")
            if latest_step(self.ckpt) == self.args.steps:
                self.count("chains completed")
                shutil.rmtree(self.ckpt)
            return True
        if rc == -sig:
            # Outside the steps (loading, or after the last one): the default action.
            if m:
                raise Failure("%s: died of %s after printing %r" % (what, sig.name, m.group(0)))
            if steps and steps[-1] != self.args.steps:
                raise Failure("%s: died of %s in the middle of the steps (%s)" %
                              (what, sig.name, steps))
            check_acknowledged(text, self.ckpt, what)
            self.count("graceful signals outside the steps (default action)")
            if latest_step(self.ckpt) == self.args.steps:
                self.count("chains completed")
                shutil.rmtree(self.ckpt)
            return True
        raise Failure("%s: exit status %d:\n%s" % (what, rc, text))

    def work(self, signals):
        try:
            # A run that ends before its signal is no trial: the signal goes to the next run.
            number = 0
            for sig in signals:
                while not self.trial(number, sig):
                    pass
                number += 1
            # End the chain: run to step N uninterrupted.
            while os.path.exists(self.ckpt):
                argv, first = self.argv()
                run = Run(argv, self.out)
                rc, _ = run.signal_at(1e9, signal.SIGKILL)
                if rc != 0:
                    raise Failure("worker %d: the final resume failed (%d):\n%s" %
                                  (self.index, rc, run.text()))
                self.finish_chain(run.text(), first, "worker %d final resume" % self.index)
        except Failure as e:
            self.error = str(e)
        except Exception as e:  # a bug of the driver, reported the same way
            self.error = "%s: %s" % (type(e).__name__, e)


def wait_for_line(run, pattern, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, run.text(), re.M):
            return
        if run.proc.poll() is not None:
            raise Failure("the run ended before printing %r:\n%s" % (pattern, run.text()))
        time.sleep(0.005)
    raise Failure("no %r within %d s" % (pattern, timeout))


def signal_tests(args, plan, reference, root):
    """SIGTERM / SIGINT at a known moment, and a second signal."""
    runs = []
    try:
        return signal_cases(args, plan, reference, root, runs)
    except subprocess.TimeoutExpired as e:
        raise Failure("a run did not stop: %s" % e)
    finally:
        for run in runs:  # a run that ignored its signal must not outlive the test
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait()


def signal_cases(args, plan, reference, root, runs):
    results = []
    # 1. SIGTERM during a long run with --ckpt-dir: finishes the step, saves it, exits 0.
    ckpt = os.path.join(root, "term")
    run = Run([args.bonsai_run, plan, "--backend=" + BACKEND, "--seed", "7", "--steps", "3000",
               "--ckpt-dir", ckpt], os.path.join(args.work, "term.out"))
    runs.append(run)
    wait_for_line(run, r"^step 1 loss ")
    run.proc.send_signal(signal.SIGTERM)
    rc = run.proc.wait(timeout=60)
    run.out.close()
    text = run.text()
    steps = step_lines(text, "SIGTERM run", reference)
    k = steps[-1]
    expected = "interrupted: SIGTERM, stopped after step %d: checkpoint saved to %s" % (
        k, os.path.join(ckpt, step_dir(k)))
    if rc != 0 or text.splitlines()[-1] != expected:
        raise Failure("SIGTERM run: exit %d, expected exit 0 ending in %r:\n%s" %
                      (rc, expected, text))
    if k + 1 not in reference.lines:
        raise Failure("SIGTERM run: %d steps ran before the signal was seen (the reference "
                      "has %d)" % (k, len(reference.lines)))
    if SAVED_LINE.match(text.splitlines()[-2]) is None:
        raise Failure("SIGTERM run: no 'checkpoint: step %d saved' line:\n%s" % (k, text))
    if latest_step(ckpt) != k:
        raise Failure("SIGTERM run: 'latest' names step %d, expected %d" % (latest_step(ckpt), k))
    reference.check_checkpoint(ckpt, k, "SIGTERM run")
    # ... and the checkpoint resumes as the uninterrupted run continues.
    run = Run([args.bonsai_run, plan, "--backend=" + BACKEND, "--ckpt-dir", ckpt, "--resume",
               "--save-every", "1", "--steps", "1"], os.path.join(args.work, "term-resume.out"))
    rc = run.proc.wait(timeout=60)
    run.out.close()
    if rc != 0 or step_lines(run.text(), "SIGTERM resume", reference) != [k + 1]:
        raise Failure("resume after SIGTERM: exit %d:\n%s" % (rc, run.text()))
    reference.check_checkpoint(ckpt, k + 1, "resume after SIGTERM")
    results.append("SIGTERM after step 1: stopped after step %d, saved, resumed to step %d "
                   "bit for bit" % (k, k + 1))

    # 2. SIGINT without --ckpt-dir: exits 0, says nothing was saved.
    run = Run([args.bonsai_run, plan, "--backend=" + BACKEND, "--seed", "7", "--steps", "3000"],
              os.path.join(args.work, "int.out"))
    runs.append(run)
    wait_for_line(run, r"^step 1 loss ")
    run.proc.send_signal(signal.SIGINT)
    rc = run.proc.wait(timeout=60)
    run.out.close()
    text = run.text()
    k = step_lines(text, "SIGINT run", reference)[-1]
    expected = "interrupted: SIGINT, stopped after step %d: nothing saved (no --ckpt-dir)" % k
    if rc != 0 or text.splitlines()[-1] != expected:
        raise Failure("SIGINT run: exit %d, expected exit 0 ending in %r:\n%s" %
                      (rc, expected, text))
    results.append("SIGINT without --ckpt-dir: exit 0, %r" % expected)

    # 3. A second signal while the first is honoured ends the run at once (here SIGINT then
    #    SIGTERM: two signals of one kind sent together may arrive as one). Sent together, the
    #    two may be handled in either order: the run dies of the one handled second.
    ckpt = os.path.join(root, "twice")
    run = Run([args.bonsai_run, plan, "--backend=" + BACKEND, "--seed", "7", "--steps", "3000",
               "--ckpt-dir", ckpt], os.path.join(args.work, "twice.out"))
    runs.append(run)
    wait_for_line(run, r"^step 1 loss ")
    run.proc.send_signal(signal.SIGINT)
    run.proc.send_signal(signal.SIGTERM)
    rc = run.proc.wait(timeout=60)
    run.out.close()
    text = run.text()
    if rc not in (-signal.SIGINT, -signal.SIGTERM) or "interrupted:" in text:
        raise Failure("second signal: exit status %d, expected death by SIGINT or SIGTERM:\n%s"
                      % (rc, text))
    results.append("SIGINT and SIGTERM: died of %s at once" % signal.Signals(-rc).name)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bonsai-run", default=shutil.which("bonsai-run"),
                        help="default: the one on PATH (lit puts the build's first)")
    parser.add_argument("--bonsai-compile", default=shutil.which("bonsai-compile"))
    parser.add_argument("--src", required=True, help="the Bonsai source tree")
    parser.add_argument("--work", required=True, help="a directory for the plan and outputs")
    parser.add_argument("--ckpt-root", help="where the checkpoints go (default: a new "
                        "directory in /dev/shm when it exists, else in --work)")
    parser.add_argument("--trials", type=int, default=200, help="SIGKILL trials")
    parser.add_argument("--graceful", type=int, default=20, help="SIGTERM / SIGINT trials")
    parser.add_argument("--steps", type=int, default=4, help="steps of a run (N)")
    parser.add_argument("--jobs", type=int, default=2, help="chains run in parallel")
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill moments")
    parser.add_argument("--backend", default="cpu", help="bonsai-run's --backend (cpu, cuda)")
    parser.add_argument("--plan", help="a compiled tiny_llama + tiny_train plan (for --backend "
                        "cuda: one compiled --target=sm_90); default: compiled here for the CPU")
    parser.add_argument("--signals-only", action="store_true",
                        help="only the SIGTERM / SIGINT tests at known moments")
    args = parser.parse_args()
    global BACKEND
    BACKEND = args.backend
    # lit's workers ignore SIGINT, and an ignored signal stays ignored across exec (bonsai-run
    # keeps it so, as nohup expects): give the runs the default actions.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    started = time.monotonic()
    os.makedirs(args.work, exist_ok=True)

    if args.ckpt_root:
        root = args.ckpt_root
        os.makedirs(root, exist_ok=True)
    elif os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        root = tempfile.mkdtemp(prefix="bonsai-kill-anywhere-", dir="/dev/shm")
    else:
        root = tempfile.mkdtemp(prefix="ckpt-", dir=args.work)

    plan = args.plan or os.path.join(args.work, "tiny.plan")
    if not args.plan:
        subprocess.run([args.bonsai_compile,
                       os.path.join(args.src, "examples/models/tiny_llama.mlir"),
                       os.path.join(args.src, "examples/recipes/tiny_train.mlir"), "-o", plan,
                       "--target=cpu"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    # The uninterrupted reference; its duration is the span of the kill moments.
    ref_ckpt = os.path.join(root, "reference")
    shutil.rmtree(ref_ckpt, ignore_errors=True)
    out = subprocess.run([args.bonsai_run, plan, "--backend=" + BACKEND, "--seed", "7", "--steps",
                          str(args.steps + 5), "--save-every", "1", "--ckpt-dir", ref_ckpt],
                         check=True, stdout=subprocess.PIPE).stdout.decode()
    lines = {}
    for line in out.splitlines():
        m = STEP_LINE.match(line)
        if m:
            lines[int(m.group(1))] = line
    # The kill moments span a run of N steps: the median of three timed runs (the reference
    # runs 5 more steps, for the signal tests).
    timing = os.path.join(root, "timing")

    def cpu_time(argv):
        """The main thread's CPU time of a whole run (its last reading before the exit)."""
        run = Run(argv, os.path.join(args.work, "timing.out"))
        used = 0.0
        while run.proc.poll() is None:
            used = run.cpu_seconds() or used
            time.sleep(0.0005)
        run.out.close()
        if run.proc.returncode != 0:
            raise Failure("timing run failed:\n" + run.text())
        shutil.rmtree(timing, ignore_errors=True)
        return used

    seconds = sorted(cpu_time([args.bonsai_run, plan, "--backend=" + BACKEND, "--seed", "7",
                               "--steps", str(args.steps), "--save-every", "1", "--ckpt-dir",
                               timing]) for _ in range(3))[1]
    startup = min(seconds, sorted(cpu_time([args.bonsai_run, plan, "--backend=" + BACKEND,
                                            "--steps", "0"]) for _ in range(3))[1])
    # A resumed run starts slower: it verifies (hashes) and loads a checkpoint first.
    resume_startup = sorted(cpu_time([args.bonsai_run, plan, "--backend=" + BACKEND, "--resume",
                                      os.path.join(ref_ckpt, step_dir(args.steps)), "--steps",
                                      "0"]) for _ in range(3))[1]
    reference = Reference(lines, ref_ckpt, seconds)
    reference.startup = startup
    reference.resume_startup = max(resume_startup, startup)
    print("reference: %d steps, one save a step; a run of %d steps takes about %.3f s of CPU "
          "(main thread), %.3f s of it before the first step (%.3f s when resuming)" %
          (len(lines), args.steps, seconds, startup, reference.resume_startup))

    failed = False
    try:
        if not args.signals_only:
            stats, lock = {}, threading.Lock()
            workers = [Worker(i, args, reference, plan, root, stats, lock)
                       for i in range(args.jobs)]
            for w in workers:
                # This worker's share of the trials, the graceful ones spread among the kills.
                kills = args.trials // args.jobs + (w.index < args.trials % args.jobs)
                graceful = args.graceful // args.jobs + (w.index < args.graceful % args.jobs)
                signals = [signal.SIGKILL] * kills + [
                    (signal.SIGTERM, signal.SIGINT)[i % 2] for i in range(graceful)]
                w.rng.shuffle(signals)
                w.signals = signals
            threads = [threading.Thread(target=w.work, args=(w.signals,)) for w in workers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for w in workers:
                if w.error:
                    print("FAIL: " + w.error)
                    failed = True
            kills = sum(v for k, v in stats.items() if k.startswith("kills "))
            print("kill trials: %d (SIGKILL at a moment uniform over the run's CPU time: [0, %.3f s] "
                  "for a run of %d steps, [0, %.3f s] for the last step)" %
                  (kills, seconds, args.steps,
                   reference.resume_startup + (seconds - startup) / args.steps))
            for key in sorted(k for k in stats if not k.startswith("  ")):
                print("  %s: %d" % (key, stats[key]))
                if key == "kills in a save":
                    for phase in sorted(k for k in stats if k.startswith("  ")):
                        print("    %s: %d" % (phase.strip(), stats[phase]))
        if not failed:
            for line in signal_tests(args, plan, reference, root):
                print(line)
    except Failure as e:
        print("FAIL: " + str(e))
        failed = True
    print("%s in %.1f s" % ("FAILED" if failed else "passed", time.monotonic() - started))
    if failed:
        print("checkpoints kept in " + root)
        return 1
    if not args.ckpt_root:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
