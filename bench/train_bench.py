#!/usr/bin/env python3
"""bench/train_bench.py - training throughput of Bonsai next to PyTorch eager and torch.compile.

Runs on a GPU machine with PyTorch and transformers. For one workload (the Llama 124M or GPT-2
124M shape, batch 16 x sequence 1024, bf16, AdamW) it measures, in the same run:

  * Bonsai: `bonsai-run PLAN --backend=cuda --steps N` on a plan compiled ahead of time
    (bench/README.md says how), tokens/s over the steps after the warmup, from its metrics file;
  * PyTorch eager: the Hugging Face model with fp32 master weights, bf16 autocast, SDPA attention
    and fused AdamW, the usual mixed-precision recipe;
  * torch.compile of the same;
  * with --unfused-plan, Bonsai again on the same model compiled with `--fuse=false` (every op
    its own kernel), which shows what bonsai-fuse gains;
  * with --nondeterministic, Bonsai again with `bonsai-run --nondeterministic` (kernels may add
    partial results in the order their blocks run: attention's backward on Hopper forms dq in
    its dk/dv pass), the row's last loss showing how far that moves it.

and prints one table: tokens/s, step time, peak memory, and Bonsai's ratio to each peer.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

SHAPES = {
    "llama_124m": dict(kind="llama", vocab=32000, hidden=768, layers=12, heads=12, kv_heads=12,
                       intermediate=2048),
    "gpt2_124m": dict(kind="gpt2", vocab=50257, hidden=768, layers=12, heads=12, positions=1024),
    "tinyllama_1_1b": dict(kind="llama", vocab=32000, hidden=2048, layers=22, heads=32,
                           kv_heads=4, intermediate=5632),
}


def hf_model(name, seq):
    import transformers
    s = SHAPES[name]
    if s["kind"] == "llama":
        config = transformers.LlamaConfig(
            vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
            num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
            intermediate_size=s["intermediate"], max_position_embeddings=seq,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
            attn_implementation="sdpa")
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(vocab_size=s["vocab"], n_embd=s["hidden"],
                                     n_layer=s["layers"], n_head=s["heads"],
                                     n_positions=s["positions"], attn_implementation="sdpa")
    return transformers.GPT2LMHeadModel(config)


def bench_torch(name, batch, seq, steps, warmup, compile_model, checkpointing=False):
    """PyTorch's tokens/s, step time, peak bytes and last loss; `checkpointing` turns on
    Hugging Face's full activation checkpointing (every decoder layer recomputed)."""
    torch.manual_seed(0)
    model = hf_model(name, seq).cuda()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    step_fn = model
    if compile_model:
        step_fn = torch.compile(model)
    vocab = SHAPES[name]["vocab"]
    ids = torch.randint(0, vocab, (batch, seq + 1), device="cuda")
    inputs, labels = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_fn(input_ids=inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab),
                                                     labels.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated()
    del model, opt, step_fn
    torch.cuda.empty_cache()
    return batch * seq * steps / elapsed, elapsed / steps, peak, float(loss)


def bench_bonsai(bonsai_run, plan, steps, warmup, workdir, extra=()):
    metrics = os.path.join(workdir, "bonsai_metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [bonsai_run, plan, "--backend=cuda", "--steps", str(steps + warmup), "--seed", "1",
           "--metrics", metrics, *extra]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("bonsai-run failed (exit %d):\n" % p.returncode + p.stdout[-3000:] +
                         p.stderr[-3000:])
    rows = [json.loads(line) for line in open(metrics)]
    timed = rows[warmup:]
    elapsed = timed[-1]["elapsed_s"] - rows[warmup - 1]["elapsed_s"] if warmup else \
        timed[-1]["elapsed_s"]
    tokens = sum(r["tokens"] for r in timed)
    peak, _ = device_memory(p.stdout)
    return tokens / elapsed, elapsed / len(timed), peak, timed[-1]["loss"], p.stdout


def device_memory(stdout):
    """(measured peak bytes, planned bytes) from bonsai-run's line
    "device memory: measured peak N bytes (X MiB, driver), planned Y MiB, +Z%"."""
    for line in stdout.splitlines():
        if line.startswith("device memory: measured peak"):
            words = line.split()
            measured = int(words[4])
            planned = float(words[words.index("planned") + 1]) * (1 << 20)
            return measured, planned
    return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(SHAPES), required=True)
    ap.add_argument("--plan", required=True, help="Bonsai plan compiled for this shape")
    ap.add_argument("--bonsai-run", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--skip-torch", action="store_true", help="Bonsai's rows only")
    ap.add_argument("--nondeterministic", action="store_true",
                    help="also run Bonsai with bonsai-run --nondeterministic")
    ap.add_argument("--unfused-plan", help="the same model compiled with --fuse=false")
    args = ap.parse_args()

    gib = 1 << 30
    rows = []
    b = bench_bonsai(args.bonsai_run, args.plan, args.steps, args.warmup, args.workdir)
    rows.append(("Bonsai", b[0], b[1], b[2], b[3]))
    if args.unfused_plan:
        u = bench_bonsai(args.bonsai_run, args.unfused_plan, args.steps, args.warmup,
                         args.workdir)
        rows.append(("Bonsai, --fuse=false", u[0], u[1], u[2], u[3]))
    if args.nondeterministic:
        n = bench_bonsai(args.bonsai_run, args.plan, args.steps, args.warmup, args.workdir,
                         ["--nondeterministic"])
        rows.append(("Bonsai, --nondeterministic", n[0], n[1], n[2], n[3]))
    if not args.skip_torch:
        e = bench_torch(args.model, args.batch, args.seq, args.steps, args.warmup, False)
        rows.append(("PyTorch eager", *e))
    if not args.skip_torch and not args.skip_compile:
        c = bench_torch(args.model, args.batch, args.seq, args.steps, args.warmup, True)
        rows.append(("torch.compile", *c))
    print("\n%s, batch %d x seq %d, bf16, AdamW, %s (%s)" % (
        args.model, args.batch, args.seq, torch.cuda.get_device_name(), time.strftime("%Y-%m-%d")))
    print("| system | tokens/s | step ms | peak GiB | Bonsai / system | last loss |")
    print("|---|---|---|---|---|---|")
    for name, tps, step_s, peak, loss in rows:
        print("| %s | %.0f | %.1f | %s | %.2f | %.7f |" % (
            name, tps, step_s * 1e3, "%.1f" % (peak / gib) if peak else "n/a",
            rows[0][1] / tps, loss))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
