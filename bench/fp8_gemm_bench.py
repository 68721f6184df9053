#!/usr/bin/env python3
"""bench/fp8_gemm_bench.py - Bonsai's FP8 and bf16 GEMMs next to PyTorch's, in one run.

Runs build-cuda/bin/fp8_gemm_bench (Bonsai: cuBLASLt bf16, cuBLASLt FP8 with E4M3 operands,
and FP8 plus the activation's cast) and times, on the same shapes, torch.matmul in bf16 and
torch._scaled_mm with float8_e4m3fn operands and per-tensor scales (bf16 output). Prints one
table: TFLOP/s of each and the ratios. Needs a GPU with FP8 tensor cores (sm_89, sm_90).

    python3 bench/fp8_gemm_bench.py --bench .gpu-run/bin/fp8_gemm_bench
"""
import argparse
import subprocess

import torch


def time_us(fn, reps):
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", required=True, help="path of fp8_gemm_bench")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()

    out = subprocess.run([args.bench, "--reps", str(args.reps)], check=True,
                         capture_output=True, text=True).stdout
    rows = [line.split() for line in out.strip().splitlines()[1:]]
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| shape (m, n, k) | Bonsai bf16 | Bonsai FP8 | Bonsai FP8 + cast of x | torch bf16 "
          "| torch._scaled_mm | FP8 / bf16 (Bonsai) | Bonsai FP8 / _scaled_mm | FP8 rel. error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, m, n, k, _, bf16, _, f8, _, f8cast, err in rows:
        m, n, k = int(m), int(n), int(k)
        flops = 2.0 * m * n * k
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        torch_bf16 = flops / time_us(lambda: x @ w.t(), args.reps) / 1e6
        sx = torch.tensor(5.0 / 448.0, device="cuda")
        sw = torch.tensor(0.1 / 448.0, device="cuda")
        x8 = (x / sx).to(torch.float8_e4m3fn)
        w8 = (w / sw).to(torch.float8_e4m3fn)
        scaled = flops / time_us(lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw,
                                                          out_dtype=torch.bfloat16),
                                 args.reps) / 1e6
        bf16, f8, f8cast = float(bf16), float(f8), float(f8cast)
        print(f"| {name} ({m}, {n}, {k}) | {bf16:.0f} | {f8:.0f} | {f8cast:.0f} | "
              f"{torch_bf16:.0f} | {scaled:.0f} | {f8 / bf16:.2f} | {f8 / scaled:.2f} | "
              f"{float(err):.3f} |")


if __name__ == "__main__":
    main()
