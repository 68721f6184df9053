#!/usr/bin/env python3
"""packed_attention_bench.py - attention over packed rows against PyTorch's FlexAttention.

Packed fine-tuning rows hold several documents; attention reads only within a document (segment
ids, docs/finetune.md). This runs the attention_bench program (bench/attention_bench.cpp) with
`--document L` (each row packed with documents of L tokens, causal within each) and PyTorch's
FlexAttention with the same document mask as a block mask (compiled; it skips the blocks
outside the documents as Bonsai's kernels do), on the same shapes in the same process run
(bf16, fresh N(0, 1) inputs, CUDA events, two warm-up calls, median of --reps), and prints one
table: TFLOP/s of the forward and of forward+backward and Bonsai's ratio to FlexAttention. The
same shape without documents (one causal document per row, Bonsai's kernels) is the row
`dense`: packing pays when the packed row is faster.

FLOPs count only the pairs inside a document, by FlashAttention's convention: forward
4 H D sum(L_i^2) / 2 per row (causal), backward 2.5 times that.

    python3 bench/packed_attention_bench.py --bin build-attn/bin/attention_bench [--reps 20]
"""

import argparse
import subprocess
import sys

from attention_bench import median_ms

# (name, B, S, H, KVH, D, document length): a fine-tuning row of 4096 tokens holding documents
# of 512 and of 128 tokens, at head dims 128 and 64.
SHAPES = [
    ("B4 S4096 doc512", 4, 4096, 32, 32, 128, 512),
    ("B4 S4096 doc128", 4, 4096, 32, 32, 128, 128),
    ("B4 S4096 GQA doc512", 4, 4096, 32, 8, 128, 512),
    ("B16 S1024 H12 D64 doc256", 16, 1024, 12, 12, 64, 256),
]


def packed_flops(b, s, h, d, doc):
    lengths = [doc] * (s // doc) + ([s % doc] if s % doc else [])
    return sum(4.0 * b * h * d * l * l / 2 for l in lengths)


def bonsai_times(binary, reps, document):
    """{(B, S, H, KVH, D): (fwd ms, fwd+bwd ms)} of the flash pair (the fused plan's kernels)."""
    times = {}
    for _, b, s, h, kvh, d, doc in SHAPES:
        args = [binary, "--reps", str(reps)]
        if document:
            args += ["--document", str(doc)]
        args += [str(b), str(s), str(h), str(kvh), str(d)]
        out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
        for line in out.splitlines():
            f = line.split()
            if f and f[0] == "shape":
                ms = lambda field: float(f[f.index(field) + 1])
                times[(b, s, h, kvh, d, doc)] = (ms("flash_fwd_ms"), ms("flash_fwdbwd_ms"))
    return times


def flex_times(b, s, h, kvh, d, doc, reps):
    """(fwd ms, fwd+bwd ms) of compiled FlexAttention with the causal document mask."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(heads):  # Bonsai's [B, S, H, D] layout, viewed as [B, H, S, D]
        x = torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
        return x.transpose(1, 2).requires_grad_(True)

    q, k, v = rnd(h), rnd(kvh), rnd(kvh)
    dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g)
    document = torch.arange(s, device="cuda") // doc

    def mask(bi, hi, qi, ki):
        return (document[qi] == document[ki]) & (ki <= qi)

    block_mask = create_block_mask(mask, None, None, s, s, device="cuda")
    attend = torch.compile(flex_attention)
    kw = {"block_mask": block_mask, "enable_gqa": kvh != h}
    try:
        def fwd():
            with torch.no_grad():
                attend(q, k, v, **kw)

        def step():
            o = attend(q, k, v, **kw)
            torch.autograd.grad(o, (q, k, v), dout)

        return median_ms(fwd, reps), median_ms(step, reps)
    except Exception as e:  # a compile or launch failure: report and leave the peer out
        print(f"# FlexAttention failed on B{b} S{s} H{h}/{kvh} D{d} doc{doc}: "
              f"{str(e).splitlines()[0]}", file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build-attn/bin/attention_bench")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    import torch
    packed = bonsai_times(args.bin, args.reps, document=True)
    dense = bonsai_times(args.bin, args.reps, document=False)
    print(f"packed causal bf16 attention on {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}, median of {args.reps}; TFLOP/s by the pairs inside documents "
          f"(fwd 2 H D sum L^2, bwd 2.5x)")
    hdr = (f"{'shape':<26} {'pass':<8} {'Bonsai ms':>9} {'TFLOP/s':>7} {'Flex ms':>8}"
           f" {'TFLOP/s':>7} {'B/Flex':>6} {'dense ms':>8}")
    print(hdr)
    print("-" * len(hdr))
    for name, b, s, h, kvh, d, doc in SHAPES:
        key = (b, s, h, kvh, d, doc)
        flex = flex_times(b, s, h, kvh, d, doc, args.reps)
        f = packed_flops(b, s, h, d, doc)
        for i, (label, flops) in enumerate((("fwd", f), ("fwd+bwd", 3.5 * f))):
            tf = lambda ms: flops / (ms * 1e-3) / 1e12
            ours = packed[key][i]
            theirs = flex[i] if flex else float("nan")
            print(f"{name:<26} {label:<8} {ours:9.3f} {tf(ours):7.1f} {theirs:8.3f}"
                  f" {tf(theirs):7.1f} {theirs / ours:6.2f} {dense[key][i]:8.3f}")


if __name__ == "__main__":
    main()
