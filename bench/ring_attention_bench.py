#!/usr/bin/env python3
"""ring_attention_bench.py - ring attention's block kernels against the unpartitioned ones.

Runs bench/ring_attention_bench.cpp (N virtual ranks in turn on one GPU, each its zigzag share of
one causal bf16 row of N*L tokens against every rank's key/value block, forward and backward)
and times PyTorch's scaled_dot_product_attention (FlashAttention-2 backend) on the whole row in
the same run, then prints one table: TFLOP/s of Bonsai's unpartitioned flash kernels, of the
ring's block steps on the same total work (issue #26: >= 95% of the unpartitioned), and of SDPA
flash on the whole row. No bytes move between ranks here: the ring's transfers and their overlap
are the multi-GPU measurement's.

FLOPs by FlashAttention's convention: forward 2 B H T^2 D (causal), backward 2.5 times that.

    python3 bench/ring_attention_bench.py --bin build-sm90a/bin/ring_attention_bench [--reps 5]
"""

import argparse
import statistics
import subprocess
import sys

# (ranks, tokens per rank, heads, kv heads, head dim): Llama-3-8B's attention at 64k tokens per
# rank (the acceptance shape), and a shorter one.
SHAPES = [
    (2, 65536, 32, 8, 128),
    (4, 65536, 32, 8, 128),
    (4, 16384, 32, 8, 128),
]


def bonsai_times(binary, reps):
    args = [binary, "--reps", str(reps)]
    for shape in SHAPES:
        args += [str(x) for x in shape]
    run = subprocess.run(args, capture_output=True, text=True)
    sys.stderr.write(run.stderr)
    if run.returncode != 0:
        sys.exit(f"ring_attention_bench failed ({run.returncode})")
    times = {}
    for line in run.stdout.splitlines():
        f = line.split()
        if f and f[0] == "ring":
            ms = lambda field: float(f[f.index(field) + 1])
            times[tuple(int(x) for x in f[1:6])] = {
                "whole": (ms("whole_fwd_ms"), ms("whole_bwd_ms")),
                "ring": (ms("ring_fwd_ms"), ms("ring_bwd_ms"))}
    return times


def median_ms(fn, reps):
    import torch
    fn()
    fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for r in range(reps):
        starts[r].record()
        fn()
        stops[r].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(starts, stops))


def sdpa_times(total, h, kvh, d, reps):
    """(fwd ms, bwd ms) of SDPA flash on the whole row; None where it refuses."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(heads):
        x = torch.randn(1, total, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
        return x.transpose(1, 2).requires_grad_(True)

    q, k, v = rnd(h), rnd(kvh), rnd(kvh)
    dout = torch.randn(1, h, total, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kw = {"is_causal": True, "enable_gqa": kvh != h}
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, **kw)

            o = F.scaled_dot_product_attention(q, k, v, **kw)

            def bwd():
                torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)

            return median_ms(fwd, reps), median_ms(bwd, reps)
    except RuntimeError as e:
        print(f"# SDPA flash refused T{total} H{h}/{kvh} D{d}: {str(e).splitlines()[0]}",
              file=sys.stderr)
        return None
    finally:
        del q, k, v, dout
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build-sm90a/bin/ring_attention_bench")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    import torch
    bonsai = bonsai_times(args.bin, args.reps)
    print(f"causal bf16 ring attention, N virtual ranks in turn on {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, median of {args.reps}; TFLOP/s by FlashAttention's count "
          f"(fwd 2HT^2D, bwd 2.5x)")
    hdr = (f"{'ranks x tokens':<15} {'pass':<4} {'whole ms':>9} {'ring ms':>9} {'whole':>6}"
           f" {'ring':>6} {'ring/whole':>10} {'SDPA FA2':>8} {'ring/FA2':>8}")
    print(hdr)
    print("-" * len(hdr))
    for shape in SHAPES:
        ranks, local, h, kvh, d = shape
        total = ranks * local
        ours = bonsai[shape]
        peer = sdpa_times(total, h, kvh, d, args.reps)
        fwd = 2.0 * h * total * total * d
        for i, (label, flops) in enumerate((("fwd", fwd), ("bwd", 2.5 * fwd))):
            tf = lambda ms: flops / (ms * 1e-3) / 1e12
            whole, ring = ours["whole"][i], ours["ring"][i]
            fa = tf(peer[i]) if peer else float("nan")
            print(f"{ranks} x {local:<11} {label:<4} {whole:9.2f} {ring:9.2f} {tf(whole):6.1f}"
                  f" {tf(ring):6.1f} {tf(ring) / tf(whole):10.3f} {fa:8.1f} {tf(ring) / fa:8.2f}")


if __name__ == "__main__":
    main()
