#!/usr/bin/env python3
"""test/gpu/hf_families.py - imported Hugging Face families against transformers, on a GPU machine.

Each case is a folder made by bench/prepare_finetune_run.sh on the build machine: a Hugging Face
model directory (config.json + model.safetensors with random fp32 weights), the model imported
by bonsai-import-hf and compiled with an SGD recipe (`train.plan`), and a token file. Here the
same directory is loaded with `AutoModelForCausalLM.from_pretrained` (eager attention, fp32,
TF32 off) and, for micro-batch 0,

    loss(bonsai) vs loss(transformers)         |diff| <= 1e-5 * |loss|
    every gradient                             max |diff| <= 1e-5 * max |grad(transformers)|

on both of Bonsai's backends (`--backend=cuda` and `--backend=cpu`). Cases: a tiny Qwen3 (q/k
norms, head_dim larger than hidden/heads, tied embeddings) and a tiny Llama with `rope_scaling`
type "llama3" (tied embeddings, as Llama 3.2 1B/3B), whose original context is short enough
that the scaling changes most frequencies.

    hf_families.py --bonsai-run PATH --cases DIR [--work DIR]

Prints one table per case and backend and exits 1 on any mismatch.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import torch
from safetensors.torch import load_file


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, width, count = struct.unpack_from("<8sIIQ", data, 0)
    assert magic == b"BONSAITK" and version == 1, path
    dtype = torch.int16 if width == 2 else torch.int32
    tokens = torch.frombuffer(bytearray(data[24:24 + count * width]), dtype=dtype)
    return tokens.to(torch.int64) & (0xFFFF if width == 2 else 0xFFFFFFFF)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("command failed: %s\n%s%s" % (" ".join(cmd), p.stdout[-3000:],
                                                      p.stderr[-3000:]))
    return p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bonsai-run", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--work", default="/tmp/hf_families")
    ap.add_argument("--tolerance", type=float, default=1e-5)
    args = ap.parse_args()
    import transformers
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.work, exist_ok=True)
    failures = checked = 0
    for name in sorted(os.listdir(args.cases)):
        case = os.path.join(args.cases, name)
        hf_dir = os.path.join(case, "hf")
        if not os.path.isfile(os.path.join(hf_dir, "config.json")):
            continue
        meta = json.load(open(os.path.join(case, "case.json")))
        B, S = meta["batch"], meta["seq"]
        tokens = read_tokens(os.path.join(case, "data.tokens"))
        inputs = tokens[:B * S].view(B, S).cuda()
        labels = tokens[1:B * S + 1].view(B, S).cuda()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            hf_dir, torch_dtype=torch.float32, attn_implementation="eager").cuda()
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 labels.reshape(-1))
        loss.backward()
        # A tied head's gradient lands on the embedding; both names hold the same tensor.
        reference = {}
        for n, p in model.named_parameters():
            if p.grad is not None:
                reference[n] = p.grad.float().cpu()
        for backend in ("cuda", "cpu"):
            grads_path = os.path.join(args.work, "%s_%s.safetensors" % (name, backend))
            common = [args.bonsai_run, os.path.join(case, "train.plan"), "--backend=" + backend,
                      "--weights", os.path.join(hf_dir, "model.safetensors"), "--data",
                      os.path.join(case, "data.tokens")]
            run(common + ["--dump-gradients", grads_path])
            ours = load_file(grads_path)
            # Step 1's loss is micro-batch 0's at the initial weights (printed before the update).
            out = run(common + ["--steps", "1"])
            ours_loss = None
            for line in out.splitlines():
                if line.startswith("step 1 loss "):
                    ours_loss = float(line.split()[3])
            ok_loss = ours_loss is not None and abs(ours_loss - float(loss)) <= \
                args.tolerance * abs(float(loss))
            print("\n%s (%s): loss bonsai %.8f, transformers %.8f%s" % (
                name, backend, ours_loss if ours_loss is not None else float("nan"),
                float(loss), "" if ok_loss else "  MISMATCH"))
            failures += not ok_loss
            print("| parameter | max abs(hf) | max abs diff | relative |")
            print("|---|---|---|---|")
            worst = 0.0
            for n, ref in sorted(reference.items()):
                if n not in ours:
                    print("| %s | missing in bonsai's dump |" % n)
                    failures += 1
                    continue
                diff = (ours[n].float() - ref).abs().max().item()
                scale = ref.abs().max().item()
                rel = diff / scale if scale else diff
                worst = max(worst, rel)
                bad = rel > args.tolerance
                failures += bad
                print("| %s | %.3e | %.3e | %.2e%s |" % (n, scale, diff, rel,
                                                        "  MISMATCH" if bad else ""))
            extra = sorted(set(ours) - set(reference))
            if extra:
                print("extra tensors in bonsai's dump:", extra)
                failures += 1
            print("worst relative gradient difference: %.2e (bound %.0e)" % (worst,
                                                                            args.tolerance))
            checked += 1
    print("\n%d case/backend pairs checked, %d mismatches" % (checked, failures))
    sys.exit(1 if failures or not checked else 0)


if __name__ == "__main__":
    main()
