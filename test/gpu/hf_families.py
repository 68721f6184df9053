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

A case whose case.json says "packed" holds instruction data instead: a version-2 token file
written by `bonsai-tokenize --jsonl` (prompts masked out of the loss) and a model imported with
`--packed`. Micro-batch 0 is laid out here as docs/data-format.md specifies (file order, as
`bonsai-run --no-shuffle` reads it: documents placed greedily into rows), and transformers
computes each document alone with `labels = -100` on every token that is not a target; the
mean over the batch's targets must equal Bonsai's step-1 loss of the packed rows within 1e-5
(relative), on both backends. Its gradients are not compared (the token order of the sum
differs); the loss is.

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_parity import read_tokens  # noqa: E402  (the version-1 token reader)


def read_v2(path):
    """(tokens, document ends, mask) of a version-2 token file (docs/data-format.md)."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, width, count = struct.unpack_from("<8sIIQ", data, 0)
    assert magic == b"BONSAITK" and version == 2, path
    vocab, pad, fingerprint, docs = struct.unpack_from("<IIQQ", data, 24)
    off = 48
    tokens = list(struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), data, off))
    off += count * width
    ends = list(struct.unpack_from("<%dQ" % docs, data, off))
    off += 8 * docs
    mask = [(data[off + i // 8] >> (i % 8)) & 1 for i in range(count)]
    return tokens, ends, mask


def packed_rows(path, batch, seq):
    """Micro-batch 0's rows in file order: a list of rows, each a list of (tokens, labels) of
    the documents placed in it. Every document must fit a row (the case is made so)."""
    tokens, ends, mask = read_v2(path)
    rows, row, used, start = [], [], 0, 0
    for end in ends:
        n = end - start
        assert n <= seq, "a document of %d tokens does not fit a row of %d" % (n, seq)
        if used + n > seq:
            rows.append(row)
            row, used = [], 0
            if len(rows) == batch:
                return rows
        ids = tokens[start:end]
        labels = [tokens[i + 1] if i + 1 < end and mask[i + 1] else -100
                  for i in range(start, end)]
        row.append((ids, labels))
        used += n
        start = end
    rows.append(row)
    assert len(rows) >= batch, "the file fills fewer than %d rows" % batch
    return rows[:batch]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("command failed: %s\n%s%s" % (" ".join(cmd), p.stdout[-3000:],
                                                      p.stderr[-3000:]))
    return p.stdout + p.stderr


def check_packed(args, name, case, hf_dir, B, S, transformers):
    """Bonsai's loss on packed rows of masked instruction data against transformers computing
    each document alone with labels = -100; returns the number of mismatches."""
    data = os.path.join(case, "data.tokens")
    rows = packed_rows(data, B, S)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, torch_dtype=torch.float32, attn_implementation="eager").cuda()
    total, count, docs = 0.0, 0, 0
    with torch.no_grad():
        for row in rows:
            for ids, labels in row:
                docs += 1
                logits = model(input_ids=torch.tensor([ids]).cuda()).logits[0].double()
                target = torch.tensor(labels).cuda()
                total += float(torch.nn.functional.cross_entropy(
                    logits, target, ignore_index=-100, reduction="sum"))
                count += int((target != -100).sum())
    reference = total / count
    failures = 0
    for backend in ("cuda", "cpu"):
        out = run([args.bonsai_run, os.path.join(case, "train.plan"), "--backend=" + backend,
                   "--weights", hf_dir, "--data", data, "--no-shuffle", "--steps", "1"])
        ours = None
        for line in out.splitlines():
            if line.startswith("step 1 loss "):
                ours = float(line.split()[3])
        ok = ours is not None and abs(ours - reference) <= args.tolerance * abs(reference)
        failures += not ok
        print("\n%s (%s): packed rows of masked instruction data, %d documents in %d rows, %d "
              "targets: loss bonsai %.8f, transformers (each document alone, labels -100) "
              "%.8f, relative %.2e%s" % (name, backend, docs, len(rows), count,
                                         ours if ours is not None else float("nan"), reference,
                                         abs((ours or 0) - reference) / abs(reference),
                                         "" if ok else "  MISMATCH"))
    return failures


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
        if meta.get("packed"):
            failures += check_packed(args, name, case, hf_dir, B, S, transformers)
            checked += 2
            continue
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
