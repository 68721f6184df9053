#!/usr/bin/env python3
"""bench/remat_bench.py - recomputation policies: Bonsai's none / selective / full / auto next to
PyTorch with and without full activation checkpointing, in one run.

Runs on a GPU machine with PyTorch and transformers. The Bonsai plans are compiled ahead of time
on the build machine (bench/prepare_gpu_run.sh, "remat" block) as PLANS/<model>.<policy>.plan,
each with the compiler's report PLANS/<model>.<policy>.txt (its remat remark and planned
memory, or the error of a budget that nothing meets). For each plan it runs `bonsai-run
--backend=cuda` and reads the measured device peak (driver-level: free memory at start minus the
lowest free memory seen) and tokens/s; for PyTorch the Hugging Face model with fp32 master
weights, bf16 autocast, SDPA and fused AdamW (bench/train_bench.py), without and with
`gradient_checkpointing_enable()`.

Prints one table: the recompute share of the step's FLOPs, planned and measured peak (and their
ratio: one arena per lifetime, so fragmentation cannot add to the plan), tokens/s, and each
row's speed relative to Bonsai without recomputation; then the issue's bar: Bonsai's speed at
the memory PyTorch's full checkpointing needs, as a share of its own no-recomputation speed.
"""
import argparse
import os
import re
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_bench  # noqa: E402

GIB = 1 << 30


def compile_report(path):
    """(recompute % of the step's FLOPs, planned peak bytes, error line) from a compile report."""
    text = open(path).read() if os.path.exists(path) else ""
    error = next((l for l in text.splitlines() if "error:" in l), None)
    share = 0.0
    m = re.search(r"FLOPs per step, ([0-9.]+)% of the step", text)
    if m:
        share = float(m.group(1))
    planned = None
    m = re.search(r"peak device\s+([0-9.]+) (GiB|MiB)", text)
    if m:
        planned = float(m.group(1)) * (GIB if m.group(2) == "GiB" else 1 << 20)
    return share, planned, error


def infeasible_note(error):
    """The compiler's reason in a few words: the smallest peak recomputation reaches."""
    if not error:
        return "no plan"
    m = re.search(r"budget of ([0-9.]+ \w+).*?smallest planned device peak[^0-9]* is ([0-9.]+ \w+)",
                  error)
    fixed = re.search(r"inputs alone take ([0-9.]+ \w+)", error)
    if not m:
        return error.split("error: ")[-1]
    return "does not fit %s: smallest planned peak %s%s" % (
        m.group(1), m.group(2),
        " (weights, gradients, optimizer state, inputs: %s)" % fixed.group(1) if fixed else "")


def run_bonsai(bonsai_run, plan, steps, warmup, workdir):
    tps, step_s, measured, loss, stdout = train_bench.bench_bonsai(
        bonsai_run, plan, steps, warmup, workdir)
    _, planned = train_bench.device_memory(stdout)
    return tps, step_s, measured, planned, loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(train_bench.SHAPES), required=True)
    ap.add_argument("--plans", required=True, help="folder of <model>.<policy>.plan and .txt")
    ap.add_argument("--policies", required=True,
                    help="comma-separated policies in table order, e.g. none,selective,full,auto-8GiB")
    ap.add_argument("--bonsai-run", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--workdir", default=".")
    args = ap.parse_args()

    rows = []  # (name, recompute %, planned, measured, tokens/s, note)
    for policy in args.policies.split(","):
        base = os.path.join(args.plans, "%s.%s" % (args.model, policy))
        share, planned, error = compile_report(base + ".txt")
        if error or not os.path.exists(base + ".plan"):
            rows.append(("Bonsai " + policy, None, None, None, None, infeasible_note(error)))
            continue
        tps, step_s, measured, planned_run, loss = run_bonsai(
            args.bonsai_run, base + ".plan", args.steps, args.warmup, args.workdir)
        rows.append(("Bonsai " + policy, share, planned_run or planned, measured, tps,
                     "loss %.3f" % loss))
        print("%-24s %.0f tokens/s, measured %.2f GiB, planned %.2f GiB" % (
            policy, tps, measured / GIB if measured else 0, (planned_run or 0) / GIB), flush=True)

    torch_rows = []
    for ckpt in (False, True):
        tps, step_s, peak, loss = train_bench.bench_torch(
            args.model, args.batch, args.seq, args.steps, args.warmup, False, checkpointing=ckpt)
        name = "PyTorch eager" + (", full checkpointing" if ckpt else "")
        torch_rows.append((name, None, None, peak, tps, "loss %.3f" % loss))
        print("%-24s %.0f tokens/s, peak %.2f GiB" % (name, tps, peak / GIB), flush=True)

    none = next((r for r in rows if r[0] == "Bonsai none" and r[4]), None)
    print("\n%s, batch %d x seq %d, bf16, AdamW, %s (%s)" % (
        args.model, args.batch, args.seq, torch.cuda.get_device_name(), time.strftime("%Y-%m-%d")))
    print("| system | recompute (% of step FLOPs) | planned GiB | measured GiB | measured / planned "
          "| tokens/s | vs Bonsai none | note |")
    print("|---|---|---|---|---|---|---|---|")
    for name, share, planned, measured, tps, note in rows + torch_rows:
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name,
            "%.2f%%" % share if share is not None else "",
            "%.2f" % (planned / GIB) if planned else "",
            "%.2f" % (measured / GIB) if measured else "",
            "%.3f" % (measured / planned) if measured and planned else "",
            "%.0f" % tps if tps else "",
            "%.3f" % (tps / none[4]) if tps and none else "",
            note))

    # The bar: at the memory of PyTorch's full checkpointing, the fastest Bonsai policy that
    # fits in it, against Bonsai's own no-recomputation speed.
    ckpt_peak = torch_rows[1][3]
    fitting = [r for r in rows if r[3] and r[3] <= ckpt_peak]
    if none and fitting:
        best = max(fitting, key=lambda r: r[4])
        print("\nAt PyTorch's full-checkpointing peak (%.2f GiB): %s, measured %.2f GiB, %.0f "
              "tokens/s = %.1f%% of Bonsai none (%.0f); PyTorch with checkpointing %.0f tokens/s "
              "= %.1f%% of PyTorch without" % (
                  ckpt_peak / GIB, best[0], best[3] / GIB, best[4], 100 * best[4] / none[4],
                  none[4], torch_rows[1][4], 100 * torch_rows[1][4] / torch_rows[0][4]))
    elif none:
        print("\nNo Bonsai plan fits in PyTorch's full-checkpointing peak (%.2f GiB)" %
              (ckpt_peak / GIB))


if __name__ == "__main__":
    main()
