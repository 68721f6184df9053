#!/usr/bin/python3
"""test/reference/galore_reference.py - the NumPy reference of GaLore training (docs/galore.md).

Trains like train_reference.py (same models, data, gradients in float64, same AdamW for the
parameters GaLore does not target) with the `bonsai.galore` directive of a recipe applied to
the 2-D weights its targets match, written from the semantics of docs/galore.md and
plan.fbs's Galore*Attrs, not from the runtime's code:

  slots      the matched weights in model order; n of them; offset_i = floor(i T / n)
  side       left (P is m x r, R = Pᵀ G, r x n) when m <= n, else right (P n x r, R = G P)
  refresh    before update t (t = s + 1; `done` = s updates so far) when done == 0, or
             (done + offset) % T == 0, or the last attempted refresh met a non-finite gradient
             and done % n == slot (round robin: one retry per step at most; a zero sketch
             waits for the schedule); from the unclipped G:
             A = G (left) or Gᵀ (right), s x l
    svd         P = the top-r left singular vectors of A (np.linalg.svd), each signed so that
                its largest-magnitude entry is positive
    randomized  Ω[i, j] = gaussian(key, i r + j) (l x r), key = sketch_key(seed, slot, done);
                Q = basis(A Ω); `power_iterations` times Q = basis(A (Aᵀ Q)); P = Q, where
                basis is the thin QR's Q with R's diagonal made positive (unique) when the
                sketch Y has full column rank; a column of Y whose distance to the span of
                the ones before it is at most 1e-4 sqrt(shift) (shift = 11 (s r + r (r + 1))
                2^-53 ||Y||_F^2) is dependent, and its place is taken, in order, by the unit
                vectors e_0, e_1, ... (i < r) orthonormalised against the kept columns and
                the ones taken before (Gram-Schmidt), taken when their squared residual
                exceeds 1 / (4 r); a zero Y fails (the projector is kept)
  update     c = clip coefficient; m = b1 m + (1 - b1) c R; v = b2 v + (1 - b2) (c R)²;
             N = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps);
             W = W (1 - lr wd) - lr scale (P N  or  N Pᵀ)

    galore_reference.py --model tiny_llama --weights W.safetensors --data T.tokens --steps 6 \
        --recipe recipe.mlir --run-output RUN.txt [--checkpoint CKPT_DIR] [--rtol 1e-5]

prints `step <n> loss <l> grad_norm <g> lr <r>` per step and, with --run-output, compares every
step of a bonsai-run output (loss and grad_norm relative to 1e-5, lr to 1e-5). With
--checkpoint (a bonsai-run checkpoint after the same steps), every parameter, every GaLore
projector and moment must agree to --state-atol (absolute, default 1e-5). Exit 1 on any
mismatch.
"""

import argparse
import fnmatch
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
import train_reference as tr  # noqa: E402

MASK = (1 << 64) - 1


def parse_galore(text):
    """rank, T, scale, projector and targets of the recipe's `bonsai.galore` directive."""
    m = re.search(r'bonsai\.galore\s+rank\s+(\d+)\s+update_proj_gap\s+(\d+)\s+scale\s+'
                  r'([-+0-9.eE]+)\s+projector\s+"(\w+)"\s+targets\s+\[([^\]]*)\]', text)
    if not m:
        raise ValueError("no bonsai.galore directive in the recipe")
    return dict(rank=int(m.group(1)), gap=int(m.group(2)), scale=float(m.group(3)),
                projector=m.group(4), targets=re.findall(r'"([^"]*)"', m.group(5)))


def matches(pattern, name):
    """ModelSummary.h's matchesTargetPattern: a glob over the weight name, or a module path
    equal to the pattern or ending in "." + pattern."""
    if any(ch in pattern for ch in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    module = name[:-len(".weight")] if name.endswith(".weight") else name
    return module == pattern or module.endswith("." + pattern)


def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def sketch_key(seed, slot, step):
    return mix64(mix64(mix64(seed) ^ slot) ^ step)


def gaussians(key, count):
    """gaussian(key, i) for i in [0, count): Box-Muller from two 53-bit uniforms."""
    out = np.empty(count)
    for i in range(count):
        a, b = mix64((key + 2 * i) & MASK), mix64((key + 2 * i + 1) & MASK)
        u1 = ((a >> 11) + 1) * 2.0 ** -53
        u2 = (b >> 11) * 2.0 ** -53
        out[i] = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
    return out


def range_basis(y):
    """docs/galore.md's orthonormal basis of the sketch's range, completed by unit vectors;
    None for a zero sketch."""
    s, r = y.shape
    frobenius2 = float(np.sum(y * y))
    if frobenius2 == 0.0:
        return None
    q, rr = np.linalg.qr(y)
    q = q * np.where(np.diag(rr) < 0, -1.0, 1.0)
    shift = 11.0 * (s * r + r * (r + 1)) * 2.0 ** -53 * frobenius2
    kept = np.abs(np.diag(rr)) > 1e-4 * math.sqrt(shift)
    if np.all(kept):
        return q
    basis = [q[:, j] for j in range(r) if kept[j]]
    completion = []
    for i in range(r):
        if len(completion) == r - len(basis):
            break
        w = np.zeros(s)
        w[i] = 1.0
        for _ in range(2):
            for b in basis + completion:
                w -= (b @ w) * b
        if w @ w > 0.25 / r:
            completion.append(w / math.sqrt(w @ w))
    out, taken, filled = np.empty((s, r)), 0, 0
    for j in range(r):
        if kept[j]:
            out[:, j] = basis[taken]
            taken += 1
        else:
            out[:, j] = completion[filled]
            filled += 1
    return out


def projector(a, rank, kind, seed, slot, done, power_iterations):
    if kind == "svd":
        u = np.linalg.svd(a, full_matrices=False)[0][:, :rank]
        signs = np.where(u[np.argmax(np.abs(u), axis=0), np.arange(rank)] < 0, -1.0, 1.0)
        return u * signs
    omega = gaussians(sketch_key(seed, slot, done), a.shape[1] * rank).reshape(a.shape[1], rank)
    q = range_basis(a @ omega)
    for _ in range(power_iterations):
        if q is None:
            break
        q = range_basis(a @ (a.T @ q))
    return q


class GaLoreAdamW(tr.AdamW):
    """AdamW, with GaLore on the weights `galore` targets."""

    def __init__(self, params, hp, galore, seed=0, power_iterations=1):
        super().__init__(params, hp)
        self.g = galore
        self.seed, self.power = seed, power_iterations
        self.names = [k for k in params if params[k].ndim == 2 and
                      any(matches(p, k) for p in galore["targets"])]
        n, r = len(self.names), galore["rank"]
        self.offset = {k: i * galore["gap"] // n for i, k in enumerate(self.names)}
        self.slot = {k: i for i, k in enumerate(self.names)}
        self.failed = {k: None for k in self.names}  # None, "non-finite" or "zero sketch"
        self.p = {}
        for k in self.names:
            m, nn = params[k].shape
            left = m <= nn
            self.p[k] = np.zeros((m if left else nn, r))
            shape = (r, nn) if left else (m, r)
            self.m[k], self.v[k] = np.zeros(shape), np.zeros(shape)

    def update(self, params, grads, t, lr, norm):
        b1, b2, eps, wd = (self.hp[k] for k in ("beta1", "beta2", "eps", "weight_decay"))
        c = tr.clip_coefficient(self.hp["grad_clip"], norm)
        plain = {k: v for k, v in params.items() if k not in self.p}
        tr.AdamW.update(self, plain, grads, t, lr, norm)
        params.update(plain)
        done, gap, rank, scale = t - 1, self.g["gap"], self.g["rank"], self.g["scale"]
        bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
        for k in self.names:
            g = grads[k]
            m, n = g.shape
            left = m <= n
            retry = self.failed[k] == "non-finite" and done % len(self.names) == self.slot[k]
            if done == 0 or (done + self.offset[k]) % gap == 0 or retry:
                if np.all(np.isfinite(g)):
                    p = projector(g if left else g.T, rank, self.g["projector"],
                                  self.seed, self.slot[k], done, self.power)
                    if p is None:
                        self.failed[k] = "zero sketch"
                    else:
                        self.p[k], self.failed[k] = p, None
                else:
                    self.failed[k] = "non-finite"
            p = self.p[k]
            r = (p.T @ g if left else g @ p) * c
            self.m[k] = b1 * self.m[k] + (1.0 - b1) * r
            self.v[k] = b2 * self.v[k] + (1.0 - b2) * r * r
            direction = (self.m[k] / bc1) / (np.sqrt(self.v[k] / bc2) + eps)
            back = p @ direction if left else direction @ p.T
            params[k] = params[k] * (1.0 - lr * wd) - lr * scale * back


def train(name, weights, tokens, steps, hp, galore, on_step):
    arch, cfg = reference.MODELS[name]
    weights = reference.normalize_names(arch, weights)
    reference.check_weights(arch, cfg, weights)
    params = {k: np.asarray(weights[k]).astype(np.float64)
              for k in reference.param_shapes(arch, cfg)}
    opt = GaLoreAdamW(params, hp, galore)
    if not opt.names:
        raise ValueError("the GaLore targets match no 2-D weight")
    K = int(hp["micro_batches"])
    records = []
    for s in range(steps):
        losses, total = [], None
        for mb in range(K):
            loss, grads = reference_grad.step_grads(name, params, tokens, s * K + mb, None, None,
                                                    np.float64)
            losses.append(loss)
            total = grads if total is None else {k: total[k] + grads[k] for k in total}
        grads = {k: g / K for k, g in total.items()}
        loss, norm, t = float(np.mean(losses)), tr.global_norm(grads), s + 1
        lr = tr.learning_rate(hp, t)
        opt.update(params, grads, t, lr, norm)
        records.append((t, loss, norm, lr))
        on_step(t, loss, norm, lr)
    return records, params, opt


def compare_checkpoint(path, params, opt, atol):
    """Failures of a checkpoint's parameters, projectors and GaLore moments."""
    model = safetensors_np.load_float(os.path.join(path, "model.safetensors"), out=np.float64)
    state = safetensors_np.load_float(os.path.join(path, "optimizer.safetensors"),
                                      out=np.float64)
    wanted = [(k, model, k, params[k]) for k in params]
    for k in opt.names:
        wanted += [(k + ".galore_projector", state, k, opt.p[k]),
                   (k + ".exp_avg", state, k, opt.m[k]), (k + ".exp_avg_sq", state, k, opt.v[k])]
    failures, worst = 0, 0.0
    for key, tensors, _, want in wanted:
        if key not in tensors:
            print("FAIL: %s is not in the checkpoint" % key)
            failures += 1
            continue
        got = np.asarray(tensors[key], dtype=np.float64).reshape(want.shape)
        err = float(np.max(np.abs(got - want))) if want.size else 0.0
        worst = max(worst, err)
        if not err <= atol:
            print("FAIL: %s differs by %.3g (atol %g)" % (key, err, atol))
            failures += 1
    print("checkpoint: %d tensors compared, largest difference %.3g (atol %g)"
          % (len(wanted), worst, atol))
    return failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(reference.MODELS))
    parser.add_argument("--weights", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--run-output")
    parser.add_argument("--checkpoint")
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--state-atol", type=float, default=1e-5)
    args = parser.parse_args(argv)
    text = tr._read(args.recipe)
    hp, galore = tr.parse_recipe(text), parse_galore(text)
    print("reference: %s, GaLore %s" % (args.model, galore))

    def show(n, loss, norm, lr):
        print("step %d loss %.9g grad_norm %.9g lr %.9g" % (n, loss, norm, lr))

    records, params, opt = train(args.model, reference.load_weights(args.weights),
                                 tokens_np.read(args.data), args.steps, hp, galore, show)
    failures = 0
    if args.run_output:
        failures += tr.compare_run(records, tr.parse_run_output(tr._read(args.run_output)),
                                   args.rtol, args.rtol, 1e-5)
    if args.checkpoint:
        failures += compare_checkpoint(args.checkpoint, params, opt, args.state_atol)
    if failures:
        print("%s: %d mismatch(es) against the GaLore reference" % (args.model, failures))
        return 1
    print("%s: %d steps match the GaLore reference" % (args.model, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
