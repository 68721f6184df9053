#!/usr/bin/env python3
"""bench/galore_bench.py - full-parameter training with AdamW and with GaLore, side by side.

Runs on the GPU machine (no PyTorch needed). The plans are compiled on the build machine by
bench/prepare_gpu_run.sh ("GaLore" block) into DIR/galore/: tinyllama_1_1b.adamw.plan and
tinyllama_1_1b.galore.plan (TinyLlama-1.1B shape, batch 4, sequence 2048, bf16 weights), each
with the compiler's report (.txt), the token file corpus.tokens (byte-level text), and the
Llama-2-7B plan under a 24 GiB budget when it compiled (else its report says why not).

Each plan trains --steps steps (default 2 T + warmup, T = the recipe's update_proj_gap, so that
every weight's projector is refreshed twice inside the timed window) from the same seed on the
same tokens, with `bonsai-run --backend=cuda --metrics`. Prints one table:

  optimizer state (planned bytes), peak device memory (driver), tokens/s over the timed steps,
  step time p50 / p90 / p99 / max, the loss of the last step and the mean of the last 20,

then the GaLore run's step-time histogram, and the mean step time of the steps on which a
projector refresh is due in a non-staggered schedule (step ≡ 1 mod T) against the others: a
T-periodic spike would show there. Step times come from the metrics file (tokens of the step
over its tokens/s, bonsai-run's wall time of the step, which ends with the loss read back).

    python3 bench/galore_bench.py --dir .gpu-run [--steps N] [--warmup 5]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

GIB = 1 << 30


def run(bonsai_run, plan, steps, data, workdir, name, backend="cuda"):
    metrics = os.path.join(workdir, name + ".metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [bonsai_run, plan, "--backend=" + backend, "--steps", str(steps), "--seed", "1",
           "--data", data, "--metrics", metrics]
    p = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(workdir, name + ".log"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise SystemExit("bonsai-run %s failed:\n%s%s" % (plan, p.stdout[-3000:],
                                                         p.stderr[-3000:]))
    rows = [json.loads(line) for line in open(metrics)]
    return rows, p.stdout, p.stderr


def planned_state_bytes(stdout):
    """The plan's optimizer state from bonsai-run's `memory: planned ...` line."""
    m = re.search(r"optimizer state ([0-9.]+) MiB", stdout)
    return float(m.group(1)) * (1 << 20) if m else None


def measured_peak(stdout):
    for line in stdout.splitlines():
        if line.startswith("device memory: measured peak"):
            return int(line.split()[4])
    return None


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def summarize(rows, warmup):
    timed = rows[warmup:]
    times = [r["tokens"] / r["tokens_per_s"] for r in timed if r.get("tokens_per_s")]
    tokens = sum(r["tokens"] for r in timed)
    return dict(tps=tokens / sum(times), times=times, steps=[r["step"] for r in timed],
                last=timed[-1]["loss"],
                tail=statistics.fmean(r["loss"] for r in rows[-20:]))


def histogram(times, bins=12):
    lo, hi = min(times), max(times)
    width = (hi - lo) / bins or 1e-9
    counts = [0] * bins
    for t in times:
        counts[min(bins - 1, int((t - lo) / width))] += 1
    top = max(counts)
    lines = []
    for i, c in enumerate(counts):
        lines.append("  %7.1f-%7.1f ms | %-50s %d" % ((lo + i * width) * 1e3,
                                                   (lo + (i + 1) * width) * 1e3,
                                                   "#" * max(1 if c else 0, round(50 * c / top)),
                                                   c))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=".gpu-run")
    parser.add_argument("--bonsai-run", default=None)
    parser.add_argument("--steps", type=int, default=None,
                        help="timed steps (default 2 T, T the recipe's update_proj_gap)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps-7b", type=int, default=4, help="steps of the Llama-2-7B plan")
    parser.add_argument("--only-7b", action="store_true",
                        help="run only the Llama-2-7B plan (the TinyLlama pair takes minutes)")
    parser.add_argument("--backend", default="cuda", help="cuda, or cpu to try the script out")
    parser.add_argument("--workdir", default=os.environ.get("OUT", "/tmp/bonsai-out"))
    args = parser.parse_args()
    root = os.path.join(args.dir, "galore")
    bonsai_run = args.bonsai_run or os.path.join(args.dir, "bin", "bonsai-run")
    os.makedirs(args.workdir, exist_ok=True)
    recipe = open(os.path.join(root, "galore.mlir")).read()
    gap = int(re.search(r"update_proj_gap (\d+)", recipe).group(1))
    steps = (args.steps or 2 * gap) + args.warmup
    data = os.path.join(root, "corpus.tokens")

    if not args.only_7b:
        results = {}
        for name in ("adamw", "galore"):
            plan = os.path.join(root, "tinyllama_1_1b.%s.plan" % name)
            rows, stdout, stderr = run(bonsai_run, plan, steps, data, args.workdir, name,
                                       args.backend)
            s = summarize(rows, args.warmup)
            s["state"] = planned_state_bytes(stdout)
            s["peak"] = measured_peak(stdout)
            s["warnings"] = [l for l in stderr.splitlines() if l.startswith("warning:")]
            results[name] = s
            print("%s: %d steps, %.0f tokens/s" % (name, len(rows), s["tps"]), flush=True)

        a, g = results["adamw"], results["galore"]
        print("\nTinyLlama-1.1B shape, batch 4 x 2048, %d timed steps after %d warm-up steps "
              "(T = %d)" % (len(a["times"]), args.warmup, gap))
        print("| optimizer | optimizer state | peak (driver) | tokens/s "
              "| step p50 / p90 / p99 / max ms | last loss | mean loss, last 20 |")
        print("|---|---|---|---|---|---|---|")
        for name, s in (("AdamW", a), ("GaLore", g)):
            t = s["times"]
            print("| %s | %.2f GiB | %s | %.0f | %.1f / %.1f / %.1f / %.1f | %.4f | %.4f |" % (
                name, s["state"] / GIB if s["state"] else float("nan"),
                "%.2f GiB" % (s["peak"] / GIB) if s["peak"] else "n/a", s["tps"],
                percentile(t, 0.5) * 1e3, percentile(t, 0.9) * 1e3, percentile(t, 0.99) * 1e3,
                max(t) * 1e3, s["last"], s["tail"]))
        if a["state"] and g["state"]:
            print("\nGaLore / AdamW: optimizer state %.3fx (bar <= 0.35x), amortised step time "
                  "%+.1f%% (bar <= +5%%), mean loss of the last 20 steps %+.2f%%" % (
                      g["state"] / a["state"], 100.0 * (a["tps"] / g["tps"] - 1.0),
                      100.0 * (g["tail"] / a["tail"] - 1.0)))
        report = open(os.path.join(root, "tinyllama_1_1b.galore.txt")).read()
        remark = re.search(r"remark: (GaLore .*)", report)
        if remark:
            print("compiler: " + remark.group(1))
        print("(optimizer state is the plan's whole class: moments, GaLore projectors and the fp32 "
              "master copies of the bf16 weights, which GaLore does not change)")
        print("\nGaLore step-time histogram (%d steps):" % len(g["times"]))
        print(histogram(g["times"]))
        aligned = [t for t, n in zip(g["times"], g["steps"]) if (n - 1) % gap == 0]
        other = [t for t, n in zip(g["times"], g["steps"]) if (n - 1) % gap != 0]
        if aligned and other:
            print("steps with (step - 1) %% T == 0: mean %.1f ms over %d; the others: mean %.1f ms, "
                  "p99 %.1f ms" % (statistics.fmean(aligned) * 1e3, len(aligned),
                                   statistics.fmean(other) * 1e3, percentile(other, 0.99) * 1e3))
        if g["warnings"]:
            print("GaLore warnings:\n  " + "\n  ".join(g["warnings"][:10]))

    plan7b = os.path.join(root, "llama2_7b.galore.plan")
    print("\nLlama-2-7B shape, GaLore + bf16 weights + remat under --device-memory=24GiB:")
    if os.path.exists(plan7b):
        rows, stdout, _ = run(bonsai_run, plan7b, args.steps_7b, data, args.workdir,
                              "llama2_7b", args.backend)
        peak = measured_peak(stdout)
        planned = rows[-1].get("memory_planned_bytes")
        print("  ran %d steps (batch 1 x 2048); loss by step: %s" % (
            len(rows), ", ".join("%.3f" % r["loss"] for r in rows)))
        print("  step time: %s ms (the first computes all 224 projectors)" % ", ".join(
            "%.0f" % (1e3 * r["tokens"] / r["tokens_per_s"]) for r in rows))
        print("  peak device memory: planned %s, measured %s (driver)" % (
            "%.2f GiB" % (planned / GIB) if planned else "n/a",
            "%.2f GiB" % (peak / GIB) if peak else "n/a"))
    else:
        report = open(os.path.join(root, "llama2_7b.galore.txt")).read()
        print("  no plan; the compiler said:\n  " +
              "\n  ".join(l for l in report.splitlines() if "error" in l or "remark" in l))
    return 0


if __name__ == "__main__":
    sys.exit(main())
