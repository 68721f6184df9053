#!/usr/bin/env python3
"""bench/fp8_train_bench.py - training steps of one model compiled in bf16 and with FP8 GEMMs.

Runs `bonsai-run PLAN --backend=cuda` on two plans of the same model, one compiled with a bf16
recipe and one with `bonsai.fp8` (docs/fp8.md), in the same run, and prints one table:
tokens/s, step time, peak device memory, the last loss, and FP8's speed-up.

With --data and --verify the two runs are the verification of issue 10 instead: both train
--steps steps on the same tokens from the same initialisation, and the table adds the mean loss
of the last --tail steps of each, their relative difference (the bar: within 1%), whether any
loss was not finite, and the FP8 run's telemetry (the largest underflow fraction bonsai-run
reported).

    python3 bench/fp8_train_bench.py --bonsai-run bin/bonsai-run --bf16-plan a.plan \\
        --fp8-plan b.plan --steps 30 --warmup 5
"""
import argparse
import json
import math
import os
import subprocess


def run(bonsai_run, plan, steps, data, workdir, tag):
    metrics = os.path.join(workdir, "fp8_bench_%s.jsonl" % tag)
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [bonsai_run, plan, "--backend=cuda", "--steps", str(steps), "--seed", "1",
           "--metrics", metrics]
    if data:
        cmd += ["--data", data]
    p = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(workdir, "fp8_bench_%s.log" % tag), "w") as log:
        log.write(p.stdout + p.stderr)
    if p.returncode != 0:
        raise SystemExit("bonsai-run failed:\n" + p.stdout[-3000:] + p.stderr[-3000:])
    rows = [json.loads(line) for line in open(metrics)]
    peak = None
    for line in p.stdout.splitlines():
        if line.startswith("device memory: measured peak"):
            peak = int(line.split()[4])
    return rows, peak, p.stderr


def throughput(rows, warmup):
    timed = rows[warmup:]
    elapsed = timed[-1]["elapsed_s"] - (rows[warmup - 1]["elapsed_s"] if warmup else 0.0)
    return sum(r["tokens"] for r in timed) / elapsed, elapsed / len(timed)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bonsai-run", required=True)
    ap.add_argument("--bf16-plan", required=True)
    ap.add_argument("--fp8-plan", required=True)
    ap.add_argument("--name", default="model")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--data", help="a Bonsai token file (default: random tokens)")
    ap.add_argument("--verify", action="store_true",
                    help="compare the losses of the two runs (use with --data)")
    ap.add_argument("--tail", type=int, default=20, help="steps averaged for --verify")
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--labels", default="bf16,fp8",
                    help="names of the two plans in the table (e.g. 'apart,fused' when both "
                         "are FP8 plans)")
    args = ap.parse_args()

    results = {}
    for tag, plan in (("bf16", args.bf16_plan), ("fp8", args.fp8_plan)):
        rows, peak, stderr = run(args.bonsai_run, plan, args.steps, args.data, args.workdir,
                                 "%s_%s" % (args.name, tag))
        tps, step = throughput(rows, min(args.warmup, len(rows) - 1))
        losses = [r["loss"] for r in rows]
        warnings = [line for line in stderr.splitlines() if "underflow" in line]
        results[tag] = dict(tps=tps, step=step, peak=peak, losses=losses, warnings=warnings,
                            rows=rows)

    gib = float(1 << 30)
    b, f = results["bf16"], results["fp8"]
    labels = dict(zip(("bf16", "fp8"), args.labels.split(",", 1)))
    print("| %s | tokens/s | step (ms) | peak (GiB) | last loss |" % args.name)
    print("|---|---|---|---|---|")
    for tag in ("bf16", "fp8"):
        r = results[tag]
        print("| %s | %.0f | %.1f | %s | %.4f |" % (
            labels[tag], r["tps"], r["step"] * 1e3,
            "%.1f" % (r["peak"] / gib) if r["peak"] else "?", r["losses"][-1]))
    print("%s / %s tokens/s: %.3f" % (labels["fp8"], labels["bf16"], f["tps"] / b["tps"]))
    if args.verify:
        tail = args.tail
        mb = sum(b["losses"][-tail:]) / tail
        mf = sum(f["losses"][-tail:]) / tail
        finite = all(math.isfinite(x) for x in b["losses"] + f["losses"])
        print("steps %d, mean loss of the last %d: bf16 %.5f, fp8 %.5f, relative difference "
              "%.3f%% (bar: within 1%%); first losses %.4f / %.4f; all finite: %s" % (
                  len(b["losses"]), tail, mb, mf, 100.0 * abs(mf - mb) / mb,
                  b["losses"][0], f["losses"][0], finite))
        worst = None
        for row in f["rows"]:
            fp8 = row.get("fp8")
            if isinstance(fp8, dict) and fp8.get("max_underflow"):
                u = fp8["max_underflow"]
                if worst is None or u.get("fraction", 0) > worst[1].get("fraction", 0):
                    worst = (row["step"], u)
        if worst:
            print("FP8 telemetry: largest underflow fraction %.4g (%s, %s) at step %d" % (
                worst[1].get("fraction", 0), worst[1].get("tensor"), worst[1].get("operand"),
                worst[0]))
        print("underflow warnings printed by bonsai-run: %d" % len(f["warnings"]))
        for line in f["warnings"][:3]:
            print("  " + line)


if __name__ == "__main__":
    main()
