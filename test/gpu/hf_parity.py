#!/usr/bin/env python3
"""test/gpu/hf_parity.py - Bonsai's CUDA backend against Hugging Face models, on a GPU machine.

For each case (a model name of scripts/gen_models.py, its random fp32 weights as safetensors
and a token file, all written by test/reference/make_case.py, and a training plan compiled with
an AdamW recipe at lr 1e-3), in fp32 with TF32 off:

1. gradients: `bonsai-run --backend=cuda --dump-gradients` on micro-batch 0 against the
   gradients of the Hugging Face model (LlamaForCausalLM / GPT2LMHeadModel) loaded with the same
   weights: max |bonsai - hf| <= 1e-4 * max |hf| for every parameter, and the same loss;
2. training: 50 steps of `bonsai-run --backend=cuda` against 50 steps of torch.optim.AdamW on the
   Hugging Face model over the same token windows: every step's loss within 1e-3 relative.

Prints a table per case and exits 1 on any mismatch. Needs torch, transformers, safetensors.
"""
import argparse
import json
import os
import re
import struct
import subprocess
import sys

import torch
from safetensors.torch import load_file

CONFIGS = {
    "tiny_llama": dict(kind="llama", vocab=256, hidden=64, layers=2, heads=4, kv_heads=2,
                       intermediate=176, batch=4, seq=64),
    "tiny_gpt2": dict(kind="gpt2", vocab=256, hidden=64, layers=2, heads=4, positions=64,
                      batch=4, seq=64),
}


def hf_model(name):
    import transformers
    c = CONFIGS[name]
    if c["kind"] == "llama":
        config = transformers.LlamaConfig(
            vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
            num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
            intermediate_size=c["intermediate"], max_position_embeddings=c["seq"],
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
            attn_implementation="eager")
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(vocab_size=c["vocab"], n_embd=c["hidden"],
                                     n_layer=c["layers"], n_head=c["heads"],
                                     n_positions=c["positions"], attn_implementation="eager",
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, width, count = struct.unpack_from("<8sIIQ", data, 0)
    assert magic == b"BONSAITK" and version == 1, path
    dtype = torch.int16 if width == 2 else torch.int32
    tokens = torch.frombuffer(bytearray(data[24:24 + count * width]), dtype=dtype)
    return tokens.to(torch.int64) & (0xFFFF if width == 2 else 0xFFFFFFFF)


def window(tokens, step, batch, seq):
    count = tokens.numel()
    p = (step * batch * seq) % (count - batch * seq)
    chunk = tokens[p:p + batch * seq + 1]
    return chunk[:-1].view(batch, seq), chunk[1:].view(batch, seq)


def loss_of(model, inputs, labels, vocab):
    logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.view(-1, vocab), labels.reshape(-1))


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("command failed: %s\n%s%s" % (" ".join(cmd), p.stdout[-3000:],
                                                      p.stderr[-3000:]))
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bonsai-run", required=True)
    ap.add_argument("--cases", required=True, help="folder with NAME.safetensors, "
                    "NAME.tokens and NAME_train.plan")
    ap.add_argument("--work", default="/tmp/hf_parity")
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.work, exist_ok=True)
    failures = 0
    for name, c in CONFIGS.items():
        weights = os.path.join(args.cases, name + ".safetensors")
        tokens_path = os.path.join(args.cases, name + ".tokens")
        plan = os.path.join(args.cases, name + "_train.plan")
        tokens = read_tokens(tokens_path)
        state = load_file(weights)

        # 1. Loss and gradients of micro-batch 0.
        grads_path = os.path.join(args.work, name + "_grads.safetensors")
        out = run([args.bonsai_run, plan, "--backend=cuda", "--weights", weights, "--data",
                   tokens_path, "--dump-gradients", grads_path])
        ours = load_file(grads_path)
        model = hf_model(name).cuda().float()
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all(k == "lm_head.weight" for k in missing), missing  # GPT-2 ties it to wte
        inputs, labels = window(tokens, 0, c["batch"], c["seq"])
        loss = loss_of(model, inputs.cuda(), labels.cuda(), c["vocab"])
        loss.backward()
        reference = {n: p.grad.float().cpu() for n, p in model.named_parameters()
                     if p.grad is not None}
        print("\n%s: gradients of micro-batch 0 (loss %.7f), bonsai CUDA vs Hugging Face fp32" %
              (name, float(loss)))
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
            failures += rel > 1e-4
            print("| %s | %.3e | %.3e | %.2e%s |" % (n, scale, diff, rel,
                                                    "  MISMATCH" if rel > 1e-4 else ""))
        extra = sorted(set(ours) - set(reference))
        if extra:
            print("extra tensors in bonsai's dump:", extra)
            failures += 1
        print("worst relative gradient difference: %.2e (bound 1e-4)" % worst)

        # 2. Fifty AdamW steps on both.
        out = run([args.bonsai_run, plan, "--backend=cuda", "--weights", weights, "--data",
                   tokens_path, "--steps", str(args.steps)])
        bonsai_losses = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", out,
                                                                 re.M)]
        model = hf_model(name).cuda().float()
        model.load_state_dict(state, strict=False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.0)
        hf_losses = []
        for s in range(args.steps):
            inputs, labels = window(tokens, s, c["batch"], c["seq"])
            loss = loss_of(model, inputs.cuda(), labels.cuda(), c["vocab"])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            hf_losses.append(float(loss))
        worst = max(abs(a - b) / abs(b) for a, b in zip(bonsai_losses, hf_losses))
        ok = len(bonsai_losses) == args.steps and worst <= 1e-3
        failures += not ok
        print("%s: %d AdamW steps, loss %.4f -> %.4f (bonsai) vs %.4f -> %.4f (hf), worst "
              "relative step difference %.2e (bound 1e-3)%s" % (
                  name, args.steps, bonsai_losses[0], bonsai_losses[-1], hf_losses[0],
                  hf_losses[-1], worst, "" if ok else "  MISMATCH"))
    print("\n%d passed, %d failed" % (2 if not failures else 0, failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
