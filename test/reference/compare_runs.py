#!/usr/bin/python3
"""test/reference/compare_runs.py - two bonsai-run results that must agree within a tolerance.

For transformations that change the arithmetic by a few f32 ulps (generated elementwise kernels
evaluate activations in f32 where the unfused CPU kernels use f64; docs/fusion.md), bit-for-bit
`cmp` is too strict. This compares

  --gradients A B   two `bonsai-run --dump-gradients` files: the same tensors and shapes, and
                    for each tensor max |a - b| / max |b| <= --rtol (relative to the tensor's
                    largest entry, as compare_grads.py argues: entries that cancel to nearly 0
                    have no meaningful elementwise relative error);
  --losses A B      two files of `step <n> loss <l> grad_norm <g> lr <r>` lines: the same steps,
                    and |a - b| <= --loss-rtol |b| for the loss and the gradient norm.

Prints the largest error of each kind and exits 1 on any failure (a missing tensor or step, a
shape mismatch, a non-finite value, an error above the tolerance).

    compare_runs.py [--gradients A.safetensors B.safetensors] [--rtol 1e-5]
                    [--losses A.txt B.txt] [--loss-rtol 1e-6]
"""

import argparse
import math
import os
import sys

sys.dont_write_bytecode = True

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402


def compare_gradients(path_a, path_b, rtol):
    a = safetensors_np.load_float(path_a, np.float64)
    b = safetensors_np.load_float(path_b, np.float64)
    ok = True
    if sorted(a) != sorted(b):
        print(f"tensors differ: only in {path_a}: {sorted(set(a) - set(b))}, "
              f"only in {path_b}: {sorted(set(b) - set(a))}")
        return False
    worst, worst_name = 0.0, ""
    for name in sorted(a):
        x, y = a[name], b[name]
        if x.shape != y.shape:
            print(f"{name}: shape {x.shape} vs {y.shape}")
            ok = False
            continue
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            print(f"{name}: non-finite values")
            ok = False
            continue
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        diff = float(np.max(np.abs(x - y))) if y.size else 0.0
        err = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        if err > worst:
            worst, worst_name = err, name
        if err > rtol:
            print(f"{name}: error {err:.3e} above {rtol:.1e}")
            ok = False
    print(f"gradients: {len(a)} tensors, largest error {worst:.3e}"
          + (f" ({worst_name})" if worst_name else ""))
    return ok


def read_steps(path):
    steps = {}
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[0] == "step":
                steps[int(fields[1])] = (float(fields[3]), float(fields[5]))
    return steps


def compare_losses(path_a, path_b, rtol):
    a, b = read_steps(path_a), read_steps(path_b)
    if not a or sorted(a) != sorted(b):
        print(f"steps differ: {sorted(a)} vs {sorted(b)}")
        return False
    ok, worst = True, 0.0
    for step in sorted(a):
        for what, x, y in zip(("loss", "grad_norm"), a[step], b[step]):
            err = abs(x - y) / abs(y) if y != 0 else (0.0 if x == y else math.inf)
            worst = max(worst, err)
            if not (math.isfinite(x) and math.isfinite(y)) or err > rtol:
                print(f"step {step} {what}: {x} vs {y} (error {err:.3e} above {rtol:.1e})")
                ok = False
    print(f"losses: {len(a)} steps, largest error {worst:.3e}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gradients", nargs=2)
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--losses", nargs=2)
    parser.add_argument("--loss-rtol", type=float, default=1e-6)
    args = parser.parse_args()
    if not args.gradients and not args.losses:
        parser.error("nothing to compare: give --gradients and/or --losses")
    ok = True
    if args.gradients:
        ok &= compare_gradients(args.gradients[0], args.gradients[1], args.rtol)
    if args.losses:
        ok &= compare_losses(args.losses[0], args.losses[1], args.loss_rtol)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
