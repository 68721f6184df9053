#!/usr/bin/env python3
"""bench/offload_bench.py - host offload (issue #24, docs/offload.md): one model trained with
its optimizer state and master weights on the device, and kept in pinned host memory with the
copies in order on the compute stream or on the copy streams, in one run.

Runs on a GPU machine. The plans are compiled on the build machine (bench/prepare_offload_run.sh)
as PLANS/<model>.<variant>.plan, each with the compiler's report PLANS/<model>.<variant>.txt.
For each plan it runs `bonsai-run --backend=cuda` (bench/train_bench.py's bench_bonsai) and
prints one table: planned and measured device peak, pinned host memory, PCIe bytes per step each
way, step time, tokens/s, the speed relative to the first variant (the state on the device),
the time the step spends beyond that variant's, and what that is as a PCIe rate (bytes each way
over the extra time: near 55 GB/s, the transfers are exposed at the link's speed; far above it,
they are hidden behind compute), and the compiler's predicted step beside its error. The final
losses must agree: the arithmetic is the same kernels' on the same bytes.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_bench  # noqa: E402

GIB = 1 << 30
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def report(path):
    """Figures of a bonsai-compile report: planned device peak, pinned host peak, PCIe bytes
    each way (0 when the plan keeps everything on the device)."""
    text = open(path).read()

    def size(pattern):
        m = re.search(pattern + r"\s+([0-9.]+) (B|KiB|MiB|GiB|TiB)", text)
        return float(m.group(1)) * UNITS[m.group(2)] if m else 0.0

    predicted = re.search(r"predicted step on \S+: ([0-9.e+]+) ms", text)
    host = re.search(r"host steps ([0-9.e+]+) ms", text)
    return {"predicted_host_ms": float(host.group(1)) if host else None,
            "device": size(r"peak device"), "host": size(r"peak pinned host"),
            "h2d": size(r"host to device"), "d2h": size(r"device to host"),
            "predicted_ms": float(predicted.group(1)) if predicted else None}


def measured_host_ms(workdir, warmup):
    """The mean time a step spent in host steps (bonsai-run's metrics, `offload.host_step_s`)
    over the timed steps of the last run; None without host steps."""
    path = os.path.join(workdir, "bonsai_metrics.jsonl")
    rows = [json.loads(line) for line in open(path)][warmup:]
    seconds = [r["offload"]["host_step_s"] for r in rows if r.get("offload")]
    if not seconds or not any(seconds):
        return None
    return 1e3 * sum(seconds) / len(seconds)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--plans", required=True)
    ap.add_argument("--variants", required=True,
                    help="comma-separated; the first is the reference (state on the device)")
    ap.add_argument("--bonsai-run", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--workdir", default=".")
    args = ap.parse_args()

    rows = []
    for variant in args.variants.split(","):
        stem = os.path.join(args.plans, "%s.%s" % (args.model, variant))
        planned = report(stem + ".txt")
        try:
            tps, step_s, measured, loss, _ = train_bench.bench_bonsai(
                args.bonsai_run, stem + ".plan", args.steps, args.warmup, args.workdir)
        except SystemExit as failure:  # a failed run is a row that says so, not the end
            print("%-20s failed: %s" % (variant, str(failure)[-600:]), flush=True)
            continue
        host_ms = measured_host_ms(args.workdir, args.warmup)
        rows.append((variant, planned, measured, step_s, tps, loss, host_ms))
        print("%-20s %.0f tokens/s, %.1f ms/step, measured %.2f GiB, loss %.6f" % (
            variant, tps, step_s * 1e3, measured / GIB, loss), flush=True)

    ref_step, ref_tps = rows[0][3], rows[0][4]
    print()
    print("| %s | planned device | measured device | pinned host | PCIe each way | step ms | "
          "tokens/s | vs %s | extra ms | extra as GB/s | predicted ms | prediction error | "
          "host steps ms measured / predicted | final loss |" % (args.model, rows[0][0]))
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for variant, planned, measured, step_s, tps, loss, host_ms in rows:
        extra = step_s - ref_step
        pcie = max(planned["h2d"], planned["d2h"])
        rate = "%.1f" % (pcie / extra / 1e9) if pcie and extra > 0 else "-"
        # The compiler's prediction (bonsai-compile's report) against the measured step.
        predicted = planned["predicted_ms"]
        error = "%+.1f%%" % (100 * (predicted - step_s * 1e3) / (step_s * 1e3)) if predicted else "-"
        # The host steps' time a step (bonsai-run's metrics) beside the compiler's: a slower host
        # than the profile says shows here, a mis-simulated overlap does not.
        host = "%s / %s" % ("%.1f" % host_ms if host_ms else "-",
                            "%.1f" % planned["predicted_host_ms"]
                            if planned["predicted_host_ms"] else "-")
        print("| %s | %.2f GiB | %.2f GiB | %.2f GiB | %.2f GiB | %.1f | %.0f | %.3f | %.1f | %s "
              "| %s | %s | %s | %.6f |" % (
                  variant, planned["device"] / GIB, measured / GIB, planned["host"] / GIB,
                  pcie / GIB, step_s * 1e3, tps, tps / ref_tps, extra * 1e3, rate,
                  "%.1f" % predicted if predicted else "-", error, host, loss))


if __name__ == "__main__":
    main()
