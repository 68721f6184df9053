#!/usr/bin/python3
"""test/reference/compare_grads.py - check bonsai-run --dump-gradients against the NumPy backward.

Reads the safetensors file `bonsai-run PLAN --weights W --data T --dump-gradients G` writes (one
micro-batch of forward and backward, no update: the gradient of every parameter, keyed by the
parameter's name), computes the gradients of the same batch with reference_grad.py in float64
(token window --window, 0 by default: micro-batch 0 of step 0), and compares tensor by tensor:

    err(t) = max |got - ref| / max |ref|      (the error relative to the tensor's largest entry)

Every tensor must have err(t) <= --rtol (1e-4 by default). Why relative to the tensor's largest
entry and not elementwise: a gradient entry is a sum of many terms of both signs (over the
batch's positions, a matmul's inner dimension, the heads that share a kv head), so an fp32
implementation has an absolute error of a few ulp of the terms' magnitude, which is about the
magnitude of the tensor's large entries; entries that cancel to nearly 0 have an unbounded
elementwise relative error without anything being wrong. The same backward run in float32
(reference_grad.py, dtype=np.float32) has err(t) <= 1.3e-6 for every tensor of the tiny models,
at init and with matrices of std 0.1 (test_reference.py requires < 5e-6), so 1e-4 leaves ~100x
for another summation order; each wrong formula test_reference.py tries (RoPE not inverted,
GQA's dk/dv from one head, the softmax row sum dropped, a norm's projection term dropped, the
embedding's part of a tied table dropped, GELU's erf derivative for the tanh one) is off by more
than 4e-4 on the std 0.1 case, most by 3e-2 to 1.

Missing tensors, extra tensors, a wrong shape, a non-finite value, or a tensor whose reference
is all zero while the dump is not, are failures. Prints one table row per parameter and exits 1
on any failure.

    compare_grads.py --model tiny_llama --weights W.safetensors --data T.tokens \
                     --gradients G.safetensors [--window 0] [--scale 1] [--rtol 1e-4]

--scale multiplies the reference (e.g. 1/K if the dump of one of K micro-batches is scaled by
the loss scale of the step).
"""

import argparse
import math
import os
import sys

sys.dont_write_bytecode = True

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference  # noqa: E402
import reference_grad  # noqa: E402
import safetensors_np  # noqa: E402
import tokens_np  # noqa: E402

DEFAULT_RTOL = 1e-4


def compare(reference_grads, got, dtypes=None, rtol=DEFAULT_RTOL, out=sys.stdout):
    """Number of failures comparing name -> array dumps with reference gradients; prints a
    table."""
    failures = 0
    dtypes = dtypes or {}
    width = max([len(n) for n in list(reference_grads) + list(got)] + [9])
    print("%-*s %-14s %-5s %11s %11s %10s  %s" % (width, "parameter", "shape", "dtype",
                                                 "max|ref|", "max|diff|", "rel_err",
                                                 "(rtol %g)" % rtol), file=out)
    for name in reference_grads:
        want = np.asarray(reference_grads[name], dtype=np.float64)
        shape = "x".join(str(d) for d in want.shape)
        if name not in got:
            print("%-*s %-14s %-5s %11s %11s %10s  FAIL missing" % (width, name, shape, "-", "-",
                                                                  "-", "-"), file=out)
            failures += 1
            continue
        g = np.asarray(got[name], dtype=np.float64)
        dtype = dtypes.get(name, str(np.asarray(got[name]).dtype))
        if g.shape != want.shape:
            print("%-*s %-14s %-5s FAIL shape %s" % (width, name, shape, dtype,
                                                     "x".join(str(d) for d in g.shape)),
                  file=out)
            failures += 1
            continue
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        diff = float(np.max(np.abs(g - want))) if want.size else 0.0
        if not np.all(np.isfinite(g)):
            status, rel = "FAIL non-finite", float("nan")
        elif scale == 0.0:
            rel = diff
            status = "ok" if diff == 0.0 else "FAIL reference is zero"
        else:
            rel = diff / scale
            status = "ok" if rel <= rtol else "FAIL"
        if status != "ok":
            failures += 1
            if g.size and np.all(np.isfinite(g)) and status == "FAIL":
                worst = np.unravel_index(int(np.argmax(np.abs(g - want))), g.shape)
                status += " at %s: got %.6g, reference %.6g" % (list(map(int, worst)),
                                                                 g[worst], want[worst])
        print("%-*s %-14s %-5s %11.4g %11.4g %10.3g  %s" % (width, name, shape, dtype, scale, diff,
                                                          rel, status), file=out)
    for name in sorted(set(got) - set(reference_grads)):
        print("%-*s %-14s %-5s %11s %11s %10s  FAIL not a parameter of the model"
              % (width, name, "x".join(str(d) for d in np.shape(got[name])),
                 dtypes.get(name, "?"), "-", "-", "-"), file=out)
        failures += 1
    return failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(reference.MODELS))
    parser.add_argument("--weights", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--gradients", required=True, help="bonsai-run --dump-gradients output")
    parser.add_argument("--window", type=int, default=0,
                        help="token window of the dumped micro-batch (default 0)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="factor applied to the reference gradients (default 1)")
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL,
                        help="max |diff| / max |ref| allowed per tensor (default %g)"
                        % DEFAULT_RTOL)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    args = parser.parse_args(argv)

    tensors, dtypes, _ = safetensors_np.read(args.gradients)
    got = safetensors_np.to_float(tensors, dtypes, np.float64)
    loss, want = reference_grad.step_grads(args.model, reference.load_weights(args.weights),
                                           tokens_np.read(args.data), args.window, args.batch,
                                           args.seq)
    want = {k: v * args.scale for k, v in want.items()}
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in want.values()))
    print("%s: window %d, reference loss %.9g, gradient norm %.9g, %d parameters, %d dumped"
          % (args.model, args.window, loss, norm, len(want), len(got)))
    failures = compare(want, got, dtypes, args.rtol)
    if failures:
        print("%s: %d gradient mismatch(es) against the NumPy backward" % (args.model, failures))
        return 1
    print("%s: all %d gradients match the NumPy backward (rtol %g)"
          % (args.model, len(want), args.rtol))
    return 0


if __name__ == "__main__":
    sys.exit(main())
