#!/usr/bin/env python3
"""bench/fp8_gemm_bench.py - Bonsai's FP8 linear kernels next to its bf16 GEMMs and PyTorch's.

Runs bin/fp8_gemm_bench (Bonsai: the cuBLASLt bf16 GEMM, and the FP8 linear kernel of a plan:
casts of x and W with their statistics plus the FP8 GEMM; the three GEMMs of a training step
both ways, and with the backward fused as plans run it (dy cast once for dx and dW, dW added
into f32); the cast of x alone, plain and transposing) and times, on the same shapes,
torch.matmul in bf16 and torch._scaled_mm with float8_e4m3fn operands already cast (per-tensor
scales, bf16 output: the GEMM alone). Prints one table. Needs a GPU with FP8 tensor cores
(sm_89, sm_90).

    python3 bench/fp8_gemm_bench.py --bench .gpu-fp8/bin/fp8_gemm_bench
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
    print("TFLOP/s of y = x Wᵀ (M = tokens); 'step' = the y, dx and dW GEMMs together; "
          "'fused' = the FP8 step with the backward fused (plan kind 95)")
    print("'fast' = the forward GEMM with fast accumulation (the recipe's forward_accumulation "
          "\"fast\"; _scaled_mm's use_fast_accum=True)")
    print("| shape (m, n, k) | Bonsai bf16 | Bonsai FP8 linear | torch bf16 | torch._scaled_mm "
          "| FP8 / bf16 (Bonsai) | Bonsai FP8 / _scaled_mm | Bonsai FP8 linear, fast "
          "| _scaled_mm, fast | Bonsai fast / _scaled_mm fast | step bf16 | step FP8 "
          "| step ratio | step FP8 fused | fused ratio | FP8 rel. error | cast of x (µs, GB/s) "
          "| transposing cast of x (µs, GB/s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, m, n, k, _, bf16, _, f8, bf16_step, f8_step, err, cast_us, cast_gbps, castt_us,
         castt_gbps, fused_step, f8_fast_us) in rows:
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
        scaled_fast = flops / time_us(
            lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw,
                                     out_dtype=torch.bfloat16, use_fast_accum=True),
            args.reps) / 1e6
        f8_fast = flops / float(f8_fast_us) / 1e6
        bf16, f8 = float(bf16), float(f8)
        bf16_step, f8_step = 3 * flops / float(bf16_step) / 1e6, 3 * flops / float(f8_step) / 1e6
        fused_step = 3 * flops / float(fused_step) / 1e6
        print(f"| {name} ({m}, {n}, {k}) | {bf16:.0f} | {f8:.0f} | {torch_bf16:.0f} | "
              f"{scaled:.0f} | {f8 / bf16:.2f} | {f8 / scaled:.2f} | {f8_fast:.0f} | "
              f"{scaled_fast:.0f} | {f8_fast / scaled_fast:.2f} | {bf16_step:.0f} | "
              f"{f8_step:.0f} | {f8_step / bf16_step:.2f} | {fused_step:.0f} | "
              f"{fused_step / bf16_step:.2f} | {float(err):.3f} | "
              f"{float(cast_us):.0f}, {float(cast_gbps):.0f} | "
              f"{float(castt_us):.0f}, {float(castt_gbps):.0f} |")


if __name__ == "__main__":
    main()
