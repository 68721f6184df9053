#!/usr/bin/python3
"""test/reference/compare_loss.py - check bonsai-run's losses against the NumPy reference.

Reads bonsai-run's output (lines "step <n> loss <value>"; other lines are ignored), computes the
reference loss of each step's batch with the same weights and token file, and requires
|bonsai - reference| <= rtol * |reference| for every step (rtol 1e-5 by default). bonsai-run
numbers its steps from 1 (tools/bonsai-run: "step <n> loss", n from 1) and step n reads batch
s = n - 1 of the token file (tokens_np.batch); --first-step 0 is for 0-based output. The weights
are those of the file at every step: the comparison is for forward-only runs (once bonsai-run
updates weights between steps, only the first step is comparable: pass --steps 1).

    compare_loss.py --model tiny_llama --weights W.safetensors --data T.tokens \
                    --run-output run.txt [--steps 2] [--rtol 1e-5] [--first-step 1]

Prints both values of every step; exits 1 on any mismatch, a missing or repeated step, a
non-finite loss, or an output without step lines.
"""

import argparse
import math
import os
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference  # noqa: E402
import tokens_np  # noqa: E402

STEP_LINE = re.compile(r"^\s*step\s+(\d+)\s+loss\s+(\S+)\s*$")


def parse_run_output(text):
    """[(step, loss)] in the order printed."""
    steps = []
    for line in text.splitlines():
        m = STEP_LINE.match(line)
        if m:
            steps.append((int(m.group(1)), float(m.group(2))))
    return steps


def compare(model, weights, tokens, steps_seen, expected_steps=None, rtol=1e-5, batch=None,
            seq=None, first_step=1, out=sys.stdout):
    """Returns the number of failures, printing one line per step. Printed step n is batch
    n - first_step."""
    failures = 0
    if not steps_seen:
        print("FAIL: no 'step <n> loss <value>' lines in the run output", file=out)
        return 1
    numbers = [n for n, _ in steps_seen]
    if len(set(numbers)) != len(numbers):
        print("FAIL: repeated step numbers %s" % numbers, file=out)
        failures += 1
    if expected_steps is not None and numbers != list(range(first_step,
                                                            first_step + expected_steps)):
        print("FAIL: steps %s printed, expected %d steps numbered from %d"
              % (numbers, expected_steps, first_step), file=out)
        failures += 1
    for n, got in steps_seen:
        if n < first_step:
            print("FAIL: step %d printed, steps are numbered from %d" % (n, first_step), file=out)
            failures += 1
            continue
        want = reference.step_loss(model, weights, tokens, n - first_step, batch, seq)
        ok = math.isfinite(got) and math.isfinite(want) and abs(got - want) <= rtol * abs(want)
        rel = abs(got - want) / abs(want) if math.isfinite(got) and want else float("nan")
        print("%s %s step %d bonsai %.9g reference %.9g rel_err %.3g (rtol %g)"
              % ("ok  " if ok else "FAIL", model, n, got, want, rel, rtol), file=out)
        failures += 0 if ok else 1
    return failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(reference.MODELS))
    parser.add_argument("--weights", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--run-output", required=True, help="bonsai-run's stdout ('-': stdin)")
    parser.add_argument("--steps", type=int, help="the number of step lines expected")
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--first-step", type=int, default=1, choices=(0, 1),
                        help="the number bonsai-run prints for the first step (default 1)")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    args = parser.parse_args(argv)
    if args.run_output == "-":
        text = sys.stdin.read()
    else:
        with open(args.run_output) as f:
            text = f.read()
    failures = compare(args.model, reference.load_weights(args.weights),
                       tokens_np.read(args.data), parse_run_output(text), args.steps, args.rtol,
                       args.batch, args.seq, args.first_step)
    if failures:
        print("%s: %d mismatch(es) against the NumPy reference" % (args.model, failures))
        return 1
    print("%s: all steps match the NumPy reference" % args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
