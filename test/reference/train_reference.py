#!/usr/bin/python3
"""test/reference/train_reference.py - the NumPy reference of bonsai-run's training loop.

Trains a model of gen_models.MODELS from a weights file on a token file with AdamW or SGD, with
the semantics of runtime/schema/plan.fbs (LearningRateAttrs, AdamWAttrs, SGDAttrs), gradients
from reference_grad.py, everything in float64 (the parameters start as the file's values,
widened exactly):

  step s = 0, 1, ... (printed as n = s + 1); K micro-batches; micro-batch m reads token window
  s*K + m (tokens_np.batch); loss = mean of the K losses; g = mean of the K gradients
  norm   = sqrt(sum of g^2 over every element of every parameter)   (before clipping)
  t      = s + 1
  lr_t   = lr * t / warmup while t <= warmup; then lr (constant) or, cosine,
           lr * (r + (1 - r) (1 + cos(pi p)) / 2), r = min_lr_ratio,
           p = min(1, (t - warmup) / (total - warmup))   (p = 1 when total = warmup)
  clip   c = min(1, grad_clip / (norm + 1e-6)) if grad_clip > 0 else 1;  g = c g
  AdamW  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p = p (1 - lr_t wd);
         p -= lr_t (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
  SGD    g = g + wd p;  buf = momentum buf + g;  p -= lr_t buf
Weight decay applies to every parameter (norm weights, biases and embeddings included), as the
plan's AdamWUpdate/SGDUpdate kernels do. Each step prints

  step <n> loss <%.9g> grad_norm <%.9g> lr <%.9g>

the loss being that of the weights before the step's update (bonsai-run's format).

    train_reference.py --model tiny_llama --weights W.safetensors --data T.tokens --steps 5 \
        [--recipe recipe.mlir | --optimizer adamw --lr 1e-3 --weight-decay 0.1 ...] \
        [--micro-batches K] [--save FINAL.safetensors] [--run-output RUN.txt --rtol 1e-4]

--recipe reads the hyper-parameters from the `bonsai.optimizer` line of a recipe file (its
defaults are those of the directive: beta1 0.9, beta2 0.999, eps 1e-8, weight_decay 0,
momentum 0, grad_clip 0, schedule constant, warmup 0, micro_batches 1); hyper-parameter
flags override it (as bonsai-run's --lr and --micro-batches override the plan's). --run-output compares the printed steps of a bonsai-run output with the reference
and exits 1 on any mismatch, missing step or missing field. Tolerances (relative):
  loss      1e-4  (--rtol)       The same computation in float32 (--f32) stays within 2e-8 of
  grad_norm 1e-4  (--norm-rtol)  float64 over the 5 steps of training.test's recipes (loss) and
                                 within 3e-7 (grad_norm): Adam divides each gradient by its own
                                 running RMS, so fp32 relative errors of the gradient (~1e-6)
                                 become parameter errors of ~1e-6 lr per step, not amplified,
                                 and a coordinate whose update direction flips (gradient within
                                 rounding of 0) moves the loss only to second order. 1e-4 is
                                 over 1000x that drift and than the runtime's fp32 forward error
                                 (~1e-7, parity.test), and still below what a wrong reading of
                                 the optimizer's semantics moves in 5 steps (test_reference.py
                                 checks both).
  lr        1e-5  (--lr-rtol)    lr is an f32 scalar (6e-8) printed with >= 6 digits (5e-6).

Helpers of the end-to-end tests:
    train_reference.py repetitive-tokens --out T.tokens [--period 24] [--count 4096] [--vocab 256]
        a token file repeating one random sequence of `period` distinct ids
    train_reference.py check-converged --run-output RUN.txt --steps N --loss-below X
        every step 1..N printed once with a finite loss, and the loss of step N below X
    train_reference.py same-files DIR_A DIR_B --prefix step-00000020
        the files (or directories, recursively) under DIR_A whose names start with the prefix
        exist under DIR_B with byte-identical contents, and DIR_B has no others (exit 1 if not)
"""

import argparse
import filecmp
import json
import math
import os
import re
import sys

sys.dont_write_bytecode = True

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference  # noqa: E402
import reference_grad  # noqa: E402
import safetensors_np  # noqa: E402
import tokens_np  # noqa: E402

CLIP_EPS = 1e-6

# The defaults of bonsai.optimizer (BonsaiOps.td, Bonsai_OptimizerDirectiveOp).
DEFAULTS = dict(optimizer="adamw", lr=None, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                momentum=0.0, grad_clip=0.0, schedule="constant", warmup_steps=0,
                total_steps=0, min_lr_ratio=0.0, micro_batches=1, update_in_backward=False,
                master_weights=True)

RUN_LINE = re.compile(r"^\s*step\s+(\d+)\s+loss\s+(\S+)(.*)$")
RUN_FIELD = re.compile(r"(?:^|\s)(grad_norm|lr)\s+(\S+)")


# ----------------------------------------------------------------------------------------------
# Hyper-parameters
# ----------------------------------------------------------------------------------------------

def parse_recipe(text):
    """The hyper-parameters of the `bonsai.optimizer` directive of a recipe (MLIR text), as a
    dict over DEFAULTS' keys (directive defaults filled in)."""
    m = re.search(r'bonsai\.optimizer\s+"(\w+)"\s+lr\s+([-+0-9.eE]+)\s*(\{[^}]*\})?', text)
    if not m:
        raise ValueError("no bonsai.optimizer directive in the recipe")
    hp = dict(DEFAULTS, optimizer=m.group(1), lr=float(m.group(2)))
    for key, value in re.findall(r'(\w+)\s*=\s*("[^"]*"|[^,}]+)', m.group(3) or ""):
        value = value.strip()
        if key not in hp:
            raise ValueError("unknown optimizer attribute %r" % key)
        if value.startswith('"'):
            hp[key] = value.strip('"')
        elif value in ("true", "false"):
            # update_in_backward moves the updates, not their arithmetic; master_weights
            # matters only to bf16/f16 models, which the float64 reference does not run.
            hp[key] = value == "true"
        else:
            number = value.split(":")[0].strip()  # "1.000000e-01 : f64", "100 : i64"
            hp[key] = int(number) if key in ("warmup_steps", "total_steps",
                                             "micro_batches") else float(number)
    return hp


def learning_rate(hp, t):
    """lr at step t (t = 1 for the first step): LearningRateAttrs of plan.fbs."""
    lr, warmup = hp["lr"], hp["warmup_steps"]
    if warmup > 0 and t <= warmup:
        return lr * t / warmup
    if hp["schedule"] == "constant":
        return lr
    total, r = hp["total_steps"], hp["min_lr_ratio"]
    p = 1.0 if total <= warmup else min(1.0, (t - warmup) / (total - warmup))
    return lr * (r + (1.0 - r) * (1.0 + math.cos(math.pi * p)) / 2.0)


# ----------------------------------------------------------------------------------------------
# Optimizers
# ----------------------------------------------------------------------------------------------

def global_norm(grads):
    return math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads.values()))


def clip_coefficient(grad_clip, norm):
    return min(1.0, grad_clip / (norm + CLIP_EPS)) if grad_clip > 0 else 1.0


class AdamW:
    def __init__(self, params, hp):
        self.hp = hp
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def update(self, params, grads, t, lr, norm):
        b1, b2, eps, wd = (self.hp[k] for k in ("beta1", "beta2", "eps", "weight_decay"))
        c = clip_coefficient(self.hp["grad_clip"], norm)
        bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
        for name, p in params.items():
            g = grads[name] * c
            self.m[name] = b1 * self.m[name] + (1.0 - b1) * g
            self.v[name] = b2 * self.v[name] + (1.0 - b2) * g * g
            p = p * (1.0 - lr * wd)
            params[name] = p - lr * (self.m[name] / bc1) / (np.sqrt(self.v[name] / bc2) + eps)


class SGD:
    def __init__(self, params, hp):
        self.hp = hp
        self.buf = {k: np.zeros_like(v) for k, v in params.items()}

    def update(self, params, grads, t, lr, norm):
        c = clip_coefficient(self.hp["grad_clip"], norm)
        for name, p in params.items():
            g = grads[name] * c + self.hp["weight_decay"] * p
            self.buf[name] = self.hp["momentum"] * self.buf[name] + g
            params[name] = p - lr * self.buf[name]


def train(name, weights, tokens, steps, hp, batch=None, seq=None, dtype=np.float64,
          on_step=None):
    """Runs `steps` steps; returns (records, params) with records [(n, loss, norm, lr)] and the
    final parameters. on_step(n, loss, norm, lr) is called after each step."""
    arch, c = reference.MODELS[name]
    weights = reference.normalize_names(arch, weights)
    reference.check_weights(arch, c, weights)
    params = {k: np.asarray(weights[k]).astype(dtype)
              for k in reference.param_shapes(arch, c)}
    K = int(hp["micro_batches"])
    if K < 1:
        raise ValueError("micro_batches must be at least 1")
    if hp["lr"] is None:
        raise ValueError("no learning rate (--lr or --recipe)")
    opt = (AdamW if hp["optimizer"] == "adamw" else SGD)(params, hp)
    records = []
    for s in range(steps):
        losses, total = [], None
        for m in range(K):
            loss, grads = reference_grad.step_grads(name, params, tokens, s * K + m, batch, seq,
                                                    dtype)
            losses.append(loss)
            total = grads if total is None else {k: total[k] + grads[k] for k in total}
        grads = {k: g / K for k, g in total.items()}
        loss = float(np.mean(losses))
        norm = global_norm(grads)
        t = s + 1
        lr = learning_rate(hp, t)
        opt.update(params, grads, t, lr, norm)
        records.append((t, loss, norm, lr))
        if on_step:
            on_step(t, loss, norm, lr)
    return records, params


# ----------------------------------------------------------------------------------------------
# bonsai-run output
# ----------------------------------------------------------------------------------------------

def parse_run_output(text):
    """[(n, loss, grad_norm or None, lr or None)] of the `step` lines, in the order printed."""
    out = []
    for line in text.splitlines():
        m = RUN_LINE.match(line)
        if m:
            fields = dict(RUN_FIELD.findall(m.group(3)))
            out.append((int(m.group(1)), float(m.group(2)),
                        float(fields["grad_norm"]) if "grad_norm" in fields else None,
                        float(fields["lr"]) if "lr" in fields else None))
    return out


def parse_metrics(text):
    """parse_run_output's records from bonsai-run's --metrics JSONL, whose loss, grad_norm and
    lr have 9 significant digits (the progress line's grad_norm and lr have 6)."""
    out = []
    for line in text.splitlines():
        if line.strip():
            r = json.loads(line)
            out.append((int(r["step"]), float(r["loss"]), r.get("grad_norm"), r.get("lr")))
    return out


def _read(path):
    if path == "-":
        return sys.stdin.read()
    with open(path) as f:
        return f.read()


def _rel(got, want):
    if not (math.isfinite(got) and math.isfinite(want)):
        return float("inf")
    return abs(got - want) / abs(want) if want else abs(got)


def compare_run(records, seen, rtol, norm_rtol, lr_rtol, out=sys.stdout):
    """Failures of a bonsai-run output against reference records (every step expected once)."""
    failures = 0
    numbers = [r[0] for r in seen]
    want_numbers = [r[0] for r in records]
    if numbers != want_numbers:
        print("FAIL: steps %s printed, expected %s" % (numbers, want_numbers), file=out)
        failures += 1
    got_by_step = {r[0]: r for r in seen}
    for n, loss, norm, lr in records:
        if n not in got_by_step:
            continue
        _, g_loss, g_norm, g_lr = got_by_step[n]
        checks = [("loss", g_loss, loss, rtol), ("grad_norm", g_norm, norm, norm_rtol),
                  ("lr", g_lr, lr, lr_rtol)]
        parts, ok = [], True
        for what, got, want, tol in checks:
            if got is None:  # the line lacks the field
                ok = False
                parts.append("%s missing" % what)
                continue
            rel = _rel(got, want)
            ok = ok and rel <= tol
            parts.append("%s %.9g/%.9g rel %.2g (tol %g)" % (what, got, want, rel, tol))
        print("%s step %d bonsai/reference: %s" % ("ok  " if ok else "FAIL", n, "; ".join(parts)),
              file=out)
        failures += 0 if ok else 1
    return failures


# ----------------------------------------------------------------------------------------------
# Helpers of the end-to-end tests
# ----------------------------------------------------------------------------------------------

def repetitive_tokens(period=24, count=4096, vocab=256, seed=0):
    """One random sequence of `period` distinct ids below `vocab`, repeated to `count` tokens:
    every next token is a function of the current one, so the loss can approach 0."""
    rng = np.random.default_rng([seed, period])
    pattern = rng.permutation(vocab)[:period]
    return np.resize(pattern, count)


def check_converged(seen, steps, below, out=sys.stdout):
    numbers = [r[0] for r in seen]
    if numbers != list(range(1, steps + 1)):
        print("FAIL: steps %s printed, expected 1..%d" % (numbers[:8] + ["..."] if len(numbers) > 8
                                                           else numbers, steps), file=out)
        return 1
    losses = [r[1] for r in seen]
    if not all(math.isfinite(x) for x in losses):
        print("FAIL: a non-finite loss", file=out)
        return 1
    first, last = losses[0], losses[-1]
    ok = last < below
    print("%s loss %.6g at step 1, %.6g at step %d (required below %g)"
          % ("ok  " if ok else "FAIL", first, last, steps, below), file=out)
    return 0 if ok else 1


def same_files(a, b, prefix, out=sys.stdout):
    """Failures of comparing everything under a/ and b/ whose top-level name starts with
    prefix (files, or directories recursively), byte by byte."""

    def listing(root):
        found = set()
        for entry in sorted(os.listdir(root)) if os.path.isdir(root) else []:
            if not entry.startswith(prefix):
                continue
            path = os.path.join(root, entry)
            if os.path.isdir(path):
                for d, _, files in os.walk(path):
                    found.update(os.path.relpath(os.path.join(d, f), root) for f in files)
            else:
                found.add(entry)
        return found

    left, right = listing(a), listing(b)
    failures = 0
    if not left:
        print("FAIL: nothing named %s* under %s" % (prefix, a), file=out)
        return 1
    for rel in sorted(left | right):
        if rel not in right or rel not in left:
            print("FAIL: %s only under %s" % (rel, a if rel in left else b), file=out)
            failures += 1
            continue
        same = filecmp.cmp(os.path.join(a, rel), os.path.join(b, rel), shallow=False)
        print("%s %s (%d bytes)" % ("same" if same else "FAIL differs:", rel,
                                    os.path.getsize(os.path.join(a, rel))), file=out)
        failures += 0 if same else 1
    return failures


# ----------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------

def _main_train(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(reference.MODELS))
    parser.add_argument("--weights", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--recipe", help="read the hyper-parameters from a recipe file")
    parser.add_argument("--optimizer", choices=("adamw", "sgd"))
    parser.add_argument("--lr", type=float)
    for key in ("beta1", "beta2", "eps", "weight_decay", "momentum", "grad_clip",
                "min_lr_ratio"):
        parser.add_argument("--" + key.replace("_", "-"), dest=key, type=float)
    parser.add_argument("--schedule", choices=("constant", "cosine"))
    for key in ("warmup_steps", "total_steps", "micro_batches"):
        parser.add_argument("--" + key.replace("_", "-"), dest=key, type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--f32", action="store_true",
                        help="compute in float32 instead of float64 (to measure fp32 drift)")
    parser.add_argument("--save", help="write the final parameters (F32) to this file")
    parser.add_argument("--run-output", help="compare with a bonsai-run output ('-': stdin)")
    parser.add_argument("--rtol", type=float, default=1e-4, help="loss, relative (1e-4)")
    parser.add_argument("--norm-rtol", type=float, default=1e-4,
                        help="grad_norm, relative (1e-4)")
    parser.add_argument("--lr-rtol", type=float, default=1e-5, help="lr, relative (1e-5)")
    args = parser.parse_args(argv)

    hp = dict(DEFAULTS)
    if args.recipe:
        hp = parse_recipe(_read(args.recipe))
    for key in DEFAULTS:
        value = getattr(args, key, None)
        if value is not None:
            hp[key] = value
    print("reference: %s, %s" % (args.model, ", ".join("%s %s" % (k, hp[k]) for k in DEFAULTS)))

    def show(n, loss, norm, lr):
        print("step %d loss %.9g grad_norm %.9g lr %.9g" % (n, loss, norm, lr))
        sys.stdout.flush()

    records, params = train(args.model, reference.load_weights(args.weights),
                            tokens_np.read(args.data), args.steps, hp, args.batch, args.seq,
                            np.float32 if args.f32 else np.float64, show)
    if args.save:
        safetensors_np.write(args.save, {k: v.astype(np.float32) for k, v in params.items()},
                             metadata={"format": "pt", "generator": "train_reference.py",
                                       "model": args.model, "steps": str(args.steps)})
        print("wrote %s" % args.save)
    if args.run_output:
        failures = compare_run(records, parse_run_output(_read(args.run_output)), args.rtol,
                               args.norm_rtol, args.lr_rtol)
        if failures:
            print("%s: %d mismatch(es) against the training reference" % (args.model, failures))
            return 1
        print("%s: all %d steps match the training reference" % (args.model, args.steps))
    return 0


def _main_tokens(argv):
    parser = argparse.ArgumentParser(prog="train_reference.py repetitive-tokens")
    parser.add_argument("--out", required=True)
    parser.add_argument("--period", type=int, default=24)
    parser.add_argument("--count", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tokens_np.write(args.out, repetitive_tokens(args.period, args.count, args.vocab, args.seed),
                    2 if args.vocab <= 65536 else 4)
    print("wrote %s" % args.out)
    return 0


def _main_converged(argv):
    parser = argparse.ArgumentParser(prog="train_reference.py check-converged")
    parser.add_argument("--run-output", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--loss-below", type=float, required=True)
    args = parser.parse_args(argv)
    return check_converged(parse_run_output(_read(args.run_output)), args.steps,
                           args.loss_below)


def _main_same(argv):
    parser = argparse.ArgumentParser(prog="train_reference.py same-files")
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--prefix", required=True)
    args = parser.parse_args(argv)
    failures = same_files(args.a, args.b, args.prefix)
    print("%s: %s" % (args.prefix, "byte-identical" if not failures else
                      "%d difference(s)" % failures))
    return 1 if failures else 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    commands = {"repetitive-tokens": _main_tokens, "check-converged": _main_converged,
                "same-files": _main_same}
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    return _main_train(argv)


if __name__ == "__main__":
    sys.exit(main())
