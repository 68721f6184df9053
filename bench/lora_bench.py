#!/usr/bin/env python3
"""bench/lora_bench.py - adapter fine-tuning: Bonsai LoRA / QLoRA / DoRA / QDoRA next to PEFT.

Runs on a GPU machine with PyTorch, transformers and peft. The Bonsai plans are compiled ahead
of time on the build machine (bench/prepare_gpu_run.sh, "adapters" block) as
PLANS/<model>.<variant>.plan with the compiler's report PLANS/<model>.<variant>.txt. For each it
runs `bonsai-run --backend=cuda` (random base weights from the seed, quantized to NF4 at bind
time for the Q variants) and reads tokens/s and the driver-level peak. The peers, in the same
run: PEFT LoRA and DoRA (r, alpha and target modules as the recipe) on the Hugging Face model
with bf16 base weights, fp32 adapters, bf16 autocast, SDPA attention and fused AdamW over the
adapter parameters, no activation checkpointing.

Prints one table: tokens/s, step time, peak memory, and each row relative to PEFT LoRA.
"""
import argparse
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_bench  # noqa: E402

GIB = 1 << 30
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def bench_peft(name, batch, seq, steps, warmup, rank, alpha, dora):
    import peft
    torch.manual_seed(0)
    model = train_bench.hf_model(name, seq).to(torch.bfloat16).cuda()
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=TARGETS,
                             use_dora=dora, task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, config)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4, fused=True)
    vocab = train_bench.SHAPES[name]["vocab"]
    ids = torch.randint(0, vocab, (batch, seq + 1), device="cuda")
    inputs, labels = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=inputs).logits
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
    trainable = sum(p.numel() for p in params)
    del model, opt
    torch.cuda.empty_cache()
    return batch * seq * steps / elapsed, elapsed / steps, peak, float(loss.detach()), trainable


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(train_bench.SHAPES), required=True)
    ap.add_argument("--plans", required=True)
    ap.add_argument("--variants", default="lora,qlora,dora,qdora")
    ap.add_argument("--bonsai-run", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--peft", default="lora,dora",
                    help="PEFT peers to measure: lora, dora, both, or '' for none")
    args = ap.parse_args()

    rows = []
    for variant in args.variants.split(","):
        base = os.path.join(args.plans, "%s.%s" % (args.model, variant))
        report = open(base + ".txt").read() if os.path.exists(base + ".txt") else ""
        if not os.path.exists(base + ".plan"):
            err = next((l for l in report.splitlines() if "error:" in l), "no plan")
            rows.append(("Bonsai " + variant, None, None, None, err.split("error: ")[-1]))
            continue
        tps, step_s, peak, loss, stdout = train_bench.bench_bonsai(
            args.bonsai_run, base + ".plan", args.steps, args.warmup, args.workdir)
        _, planned = train_bench.device_memory(stdout)
        weights = re.search(r"weights\s+([0-9.]+ \w+)", report)
        rows.append(("Bonsai " + variant, tps, step_s, peak,
                     "planned %.2f GiB; weights %s" % ((planned or 0) / GIB,
                                                      weights.group(1) if weights else "?")))
        print("%-14s %.0f tokens/s, measured %.2f GiB" % (variant, tps, peak / GIB), flush=True)
    peers = [p for p in args.peft.split(",") if p]
    for peer in peers:
        if peer not in ("lora", "dora"):
            raise SystemExit("--peft: unknown peer '%s' (lora, dora)" % peer)
    if peers:
        for dora in [p == "dora" for p in peers]:
            tps, step_s, peak, loss, trainable = bench_peft(
                args.model, args.batch, args.seq, args.steps, args.warmup, args.rank, args.alpha,
                dora)
            name = "PEFT " + ("DoRA" if dora else "LoRA")
            rows.append((name, tps, step_s, peak, "%d trainable parameters" % trainable))
            print("%-14s %.0f tokens/s, peak %.2f GiB" % (name, tps, peak / GIB), flush=True)

    ref = next((r for r in rows if r[0] == "PEFT LoRA"), None)
    print("\n%s, batch %d x seq %d, LoRA r%d alpha %g on %s, %s (%s)" % (
        args.model, args.batch, args.seq, args.rank, args.alpha, ",".join(TARGETS),
        torch.cuda.get_device_name(), time.strftime("%Y-%m-%d")))
    print("| system | tokens/s | step ms | peak GiB | tokens/s vs PEFT LoRA | peak vs PEFT LoRA | note |")
    print("|---|---|---|---|---|---|---|")
    for name, tps, step_s, peak, note in rows:
        print("| %s | %s | %s | %s | %s | %s | %s |" % (
            name, "%.0f" % tps if tps else "", "%.1f" % (step_s * 1e3) if step_s else "",
            "%.2f" % (peak / GIB) if peak else "",
            "%.2f" % (tps / ref[1]) if tps and ref else "",
            "%.2f" % (peak / ref[3]) if peak and ref else "", note))


if __name__ == "__main__":
    main()
