#!/usr/bin/env python3
"""attention_bench.py - Bonsai's causal attention against PyTorch SDPA (flash and cuDNN).

Runs the attention_bench program (bench/attention_bench.cpp) for each shape, times PyTorch's
scaled_dot_product_attention with the FlashAttention-2 backend and with the cuDNN backend on the
same shapes in the same process run (bf16, causal, fresh N(0, 1) inputs, CUDA events, two warm-up
calls, median of --reps), and prints one table: TFLOP/s of the forward and of forward+backward,
and Bonsai's ratio to each peer. Bonsai has two rows per pass: `attention` (attention and
attentionGrad, a plan compiled without the flash-attention fusion) and `flash` (flashAttention,
which writes the log-sum-exp, and flashAttentionGrad, which reads it: the fused plan), and
forward+backward has a third, `flash-nd`: the same with the runtime's deterministic mode off
(`bonsai-run --nondeterministic`; on Hopper the backward then forms dq in its dk/dv pass, adding
it up in the order the blocks run, as FlashAttention-2/3 and cuDNN do).

FLOPs follow FlashAttention's benchmark convention for all three: forward 4 B H S^2 D, halved
when causal; backward 2.5 times the forward (five products against two), forward+backward 3.5
times. With GQA the count is per query head, as for the others.

    python3 bench/attention_bench.py --bin build-attn/bin/attention_bench [--reps 20]
"""

import argparse
import statistics
import subprocess
import sys

# (name, B, S, H, KVH, D): issue #8's bar (16k tokens per batch), a GQA row, and head dim 64:
# the same 16k tokens and the 124M models' attention (B16 S1024, 12 heads).
SHAPES = [
    ("B4 S4096", 4, 4096, 32, 32, 128),
    ("B1 S16384", 1, 16384, 32, 32, 128),
    ("B4 S4096 GQA 32/8", 4, 4096, 32, 8, 128),
    ("B4 S4096 D64", 4, 4096, 32, 32, 64),
    ("B16 S1024 H12 D64", 16, 1024, 12, 12, 64),
]


def fwd_flops(b, s, h, d, causal=True):
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def bonsai_times(binary, reps):
    args = [binary, "--reps", str(reps)]
    for _, b, s, h, kvh, d in SHAPES:
        args += [str(b), str(s), str(h), str(kvh), str(d)]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    times = {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "shape":
            key = tuple(int(x) for x in f[1:6])
            ms = lambda field: float(f[f.index(field) + 1])
            times[key] = {"attention": (ms("fwd_ms"), ms("fwdbwd_ms")),
                          "flash": (ms("flash_fwd_ms"), ms("flash_fwdbwd_ms")),
                          "flash-nd": (ms("flash_fwd_ms"), ms("flash_nd_fwdbwd_ms"))}
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


def torch_times(backend, b, s, h, kvh, d, reps):
    """(fwd ms, fwd+bwd ms) of SDPA with one backend, or None where it refuses the shape."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(heads):  # Bonsai's [B, S, H, D] layout, viewed as SDPA's [B, H, S, D]
        x = torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
        return x.transpose(1, 2).requires_grad_(True)

    q, k, v = rnd(h), rnd(kvh), rnd(kvh)
    dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kw = {"is_causal": True}
    if kvh != h:
        kw["enable_gqa"] = True
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    try:
        with sdpa_kernel([be]):
            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, **kw)

            def step():
                o = F.scaled_dot_product_attention(q, k, v, **kw)
                torch.autograd.grad(o, (q, k, v), dout)

            return median_ms(fwd, reps), median_ms(step, reps)
    except RuntimeError as e:
        print(f"# {backend} refused B{b} S{s} H{h}/{kvh} D{d}: {str(e).splitlines()[0]}",
              file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build-attn/bin/attention_bench")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    import torch
    bonsai = bonsai_times(args.bin, args.reps)
    print(f"causal bf16 attention on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"median of {args.reps}; TFLOP/s by FlashAttention's count (fwd 2BHS^2D, bwd 2.5x)")
    hdr = (f"{'shape':<20} {'pass':<8} {'Bonsai':<9} {'ms':>8} {'TFLOP/s':>7} {'FA2':>7}"
           f" {'cuDNN':>7} {'B/FA2':>6} {'B/cuDNN':>7}")
    print(hdr)
    print("-" * len(hdr))
    for name, b, s, h, kvh, d in SHAPES:
        ours = bonsai[(b, s, h, kvh, d)]
        peers = {be: torch_times(be, b, s, h, kvh, d, args.reps) for be in ("flash", "cudnn")}
        f = fwd_flops(b, s, h, d)
        for i, (label, flops) in enumerate((("fwd", f), ("fwd+bwd", 3.5 * f))):
            tf = lambda ms: flops / (ms * 1e-3) / 1e12
            fa = tf(peers["flash"][i]) if peers["flash"] else float("nan")
            cu = tf(peers["cudnn"][i]) if peers["cudnn"] else float("nan")
            for variant in ("attention", "flash") + (("flash-nd",) if i == 1 else ()):
                ms = ours[variant][i]
                ours_tf = tf(ms)
                print(f"{name:<20} {label:<8} {variant:<9} {ms:8.3f} {ours_tf:7.1f} {fa:7.1f}"
                      f" {cu:7.1f} {ours_tf / fa:6.2f} {ours_tf / cu:7.2f}")


if __name__ == "__main__":
    main()
