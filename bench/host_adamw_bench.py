#!/usr/bin/env python3
"""host_adamw_bench.py - Bonsai's host AdamW step against PyTorch's CPU AdamW, in one run.

Runs host_adamw_bench (bench/host_adamw_bench.cpp, built by the standalone runtime project)
and, in the same run, torch.optim.AdamW(fused=True) and AdamW(foreach=True) on CPU tensors of
the same Llama shapes (--layers decoder layers of --hidden / --ffn: q, k, v, o, gate, up, down
and two norm weights each; 5 layers of Llama-2-7B's shapes are 1.01 G parameters) with the
same thread count, hyperparameters (lr 1e-4, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1)
and timing (--warmup untimed steps, which also create PyTorch's lazily allocated moments, then
the median of --steps), and prints one table: step time, G params/s, GB/s (28 bytes per fp32
parameter: gradient, parameter and both moments read, parameter and moments written) and each
peer's speed as a fraction of Bonsai's. Bonsai's step also clips by a global norm (one more
multiply, fused in the same pass); PyTorch's AdamW does not clip. A bf16 row (bf16 gradients
and parameters, f32 masters and moments: the mixed-precision recipe) is Bonsai's alone, as
PyTorch's AdamW has no f32 masters. On an AVX-512 host a row of the AVX2 loops (what an
AVX2-only host runs, from the same binary) is added.

Without PyTorch (this build machine) the script says so and prints Bonsai's rows.

    python3 bench/host_adamw_bench.py --bench build-rt/bin/host_adamw_bench [--threads 16]
"""

import argparse
import json
import os
import statistics
import subprocess
import time

BYTES_PER_PARAM_F32 = 28


def shapes(layers, hidden, ffn):
    out = []
    for _ in range(layers):
        out += [(hidden, hidden)] * 4 + [(ffn, hidden), (ffn, hidden), (hidden, ffn)]
        out += [(hidden,), (hidden,)]
    return out


def run_bonsai(args, dtype, isa=None):
    cmd = [args.bench, "--threads", str(args.threads), "--layers", str(args.layers),
           "--hidden", str(args.hidden), "--ffn", str(args.ffn), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--dtype", dtype, "--json"]
    if isa:
        cmd += ["--isa", isa]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_torch(torch, args, **flavour):
    """Median seconds of torch.optim.AdamW(**flavour).step() on fp32 CPU tensors."""
    gen = torch.Generator().manual_seed(0)
    params = []
    for shape in shapes(args.layers, args.hidden, args.ffn):
        p = torch.empty(shape, dtype=torch.float32)
        p.uniform_(-1.0, 1.0, generator=gen)
        p.requires_grad_(True)
        p.grad = torch.empty(shape, dtype=torch.float32).uniform_(-1e-2, 1e-2, generator=gen)
        params.append(p)
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                            **flavour)
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        if i >= args.warmup:
            times.append(t1 - t0)
    del opt, params
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="the host_adamw_bench binary")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=11008)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()

    f32 = run_bonsai(args, "f32")
    bf16 = run_bonsai(args, "bf16")
    n = f32["params"]
    rows = []  # (name, median seconds, bytes per param)
    failed = []  # why a peer has no row

    def add(name, seconds, bytes_per_param):
        rows.append((name, seconds, bytes_per_param))

    add(f"Bonsai host::adamwStep ({f32['isa']}), f32", f32["median_s"], f32["bytes_per_param"])
    try:
        import torch
    except ImportError as e:
        torch = None
        missing = f"PyTorch is not installed here ({e}): its rows are left out"
    if torch is not None:
        torch.set_num_threads(args.threads)
        for label, flavour in (("fused=True", {"fused": True}),
                               ("foreach=True", {"foreach": True})):
            name = f"torch.optim.AdamW({label}), f32"
            try:
                add(name, run_torch(torch, args, **flavour), BYTES_PER_PARAM_F32)
            except (RuntimeError, TypeError, ValueError) as e:
                failed.append(f"{name} did not run: {e}")
    add(f"Bonsai host::adamwStep ({bf16['isa']}), bf16 + f32 masters", bf16["median_s"],
        bf16["bytes_per_param"])
    if f32["isa"] == "avx512":  # what an AVX2-only host would run, from the same binary
        avx2 = run_bonsai(args, "f32", "avx2")
        add("Bonsai host::adamwStep (avx2 loops), f32", avx2["median_s"], avx2["bytes_per_param"])

    print(f"Host AdamW step: {n / 1e9:.3f} G params in {f32['tensors']} Llama-shaped tensors "
          f"({args.layers} x [{args.hidden}, {args.ffn}]), {args.threads} threads "
          f"(os.cpu_count() {os.cpu_count()}), median of {args.steps} steps after {args.warmup}"
          + (f"; torch {torch.__version__}" if torch is not None else ""))
    print()
    print("| implementation | step (ms) | G params/s | GB/s | step / Bonsai f32 step |")
    print("|---|---:|---:|---:|---:|")
    for name, seconds, bpp in rows:
        ratio = seconds / f32["median_s"]
        print(f"| {name} | {seconds * 1e3:.1f} | {n / seconds / 1e9:.3f} | "
              f"{n * bpp / seconds / 1e9:.1f} | {ratio:.2f}x |")
    if torch is None:
        failed.append(missing)
    if failed:
        print()
    for line in failed:
        print(line)


if __name__ == "__main__":
    main()
