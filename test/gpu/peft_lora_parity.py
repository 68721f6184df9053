#!/usr/bin/env python3
"""test/gpu/peft_lora_parity.py - Bonsai's LoRA/DoRA against PEFT, on a GPU machine.

For LoRA and DoRA (r 8, alpha 16, dropout 0, on q,k,v,o,gate,up,down of the tiny Llama of
examples/models/tiny_llama.mlir, fp32, TF32 off):

1. PEFT (peft.get_peft_model with LoraConfig(use_dora=...)) wraps a transformers
   LlamaForCausalLM loaded with the case's base weights (test/reference/make_case.py). PEFT
   initializes A (Kaiming-uniform) and, for DoRA, the magnitude (row norms of W); lora_B is then
   set to small random values (normal, std 0.02, seeded) so that every gradient is non-trivial.
   Base and adapter weights are saved under Bonsai's names (docs/lora.md: PEFT's names without
   `base_model.model.`, `.base_layer` and the adapter name `.default`; DoRA's magnitude as
   `M.lora_magnitude_vector`) into one safetensors file.
2. gradients: `bonsai-run PLAN --backend=cuda --weights W --dump-gradients G` on micro-batch 0
   against PEFT's gradients of the same batch: max |bonsai - peft| <= 1e-4 max |peft| for every
   adapter tensor (and exactly the adapter tensors);
3. training: `bonsai-run --steps N` against N steps of torch.optim.AdamW (lr 1e-3, weight decay
   0, the recipe's) over the trainable (adapter) parameters of the PEFT model, on the same token
   windows: step 1's loss (the loss of the initial weights) within 1e-5 relative, every step's
   within 1e-3.

The plans are compiled on the build machine (the GPU machine has no MLIR): bench/prepare_gpu_run.sh
writes PLANS/tiny_llama_lora.plan and PLANS/tiny_llama_dora.plan from
examples/recipes/lora_tiny.mlir with lr 1e-3 (and `dora`). Prints a table per variant and exits
1 on any mismatch. Needs torch, transformers, peft, safetensors.

    peft_lora_parity.py --bonsai-run BIN --cases CASES --lora-plan P1 --dora-plan P2 [--steps 20]
"""
import argparse
import os
import re
import struct
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK, ALPHA, LR = 8, 16.0, 1e-3
CONFIG = dict(vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=176, batch=4,
              seq=64)


def base_model():
    import transformers
    c = CONFIG
    config = transformers.LlamaConfig(
        vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
        num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"],
        intermediate_size=c["intermediate"], max_position_embeddings=c["seq"],
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        attn_implementation="eager")
    return transformers.LlamaForCausalLM(config)


def peft_model(base_state, dora, seed):
    """The PEFT-wrapped model on the GPU, lora_B set to N(0, 0.02) values."""
    import peft
    # PEFT draws lora_A from torch's global generator: seed it, so that every model built with
    # the same seed has the same adapters (the gradient check's and the training check's).
    torch.manual_seed(seed)
    model = base_model()
    model.load_state_dict(base_state, strict=True)
    model = model.cuda().float()
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, bias="none",
                             target_modules=TARGETS, use_dora=dora, init_lora_weights=True)
    model = peft.get_peft_model(model, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))
    return model


def bonsai_name(peft_name):
    """PEFT's parameter name -> Bonsai's (docs/lora.md)."""
    n = peft_name
    if n.startswith("base_model.model."):
        n = n[len("base_model.model."):]
    n = n.replace(".base_layer.", ".").replace(".default.", ".").replace(".default", "")
    if n.endswith(".lora_magnitude_vector.weight"):
        n = n[:-len(".weight")]
    return n


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


def loss_of(model, inputs, labels):
    logits = model(input_ids=inputs).logits
    return torch.nn.functional.cross_entropy(logits.view(-1, CONFIG["vocab"]),
                                             labels.reshape(-1))


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("command failed: %s\n%s%s" % (" ".join(cmd), p.stdout[-3000:],
                                                      p.stderr[-3000:]))
    return p.stdout


def check_variant(args, variant, plan, base_state, tokens):
    dora = variant == "dora"
    failures = 0
    model = peft_model(base_state, dora, seed=1234 + dora)
    weights = {bonsai_name(n): p.detach().float().cpu().contiguous()
               for n, p in model.named_parameters()}
    weights_path = os.path.join(args.work, "tiny_llama_%s.safetensors" % variant)
    save_file(weights, weights_path)
    adapters = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    print("\n%s: %d adapter tensors (%d elements), PEFT %s" % (
        variant, len(adapters), sum(p.numel() for p in model.parameters() if p.requires_grad),
        __import__("peft").__version__))

    # 1. Gradients of micro-batch 0.
    grads_path = os.path.join(args.work, "tiny_llama_%s_grads.safetensors" % variant)
    run([args.bonsai_run, plan, "--backend=cuda", "--weights", weights_path, "--data",
         args.tokens, "--dump-gradients", grads_path])
    ours = load_file(grads_path)
    inputs, labels = window(tokens, 0, CONFIG["batch"], CONFIG["seq"])
    loss = loss_of(model, inputs.cuda(), labels.cuda())
    loss.backward()
    reference = {bonsai_name(n): p.grad.float().cpu() for n, p in model.named_parameters()
                 if p.requires_grad}
    print("| parameter | max abs(peft) | max abs diff | relative |")
    print("|---|---|---|---|")
    worst = 0.0
    for n, ref in sorted(reference.items()):
        if n not in ours:
            print("| %s | missing in bonsai's dump | | |" % n)
            failures += 1
            continue
        got = ours[n].float().reshape(ref.shape)
        diff = (got - ref).abs().max().item()
        scale = ref.abs().max().item()
        rel = diff / scale if scale else diff
        worst = max(worst, rel)
        failures += rel > 1e-4
        print("| %s | %.3e | %.3e | %.2e%s |" % (n, scale, diff, rel,
                                                "  MISMATCH" if rel > 1e-4 else ""))
    extra = sorted(set(ours) - set(reference))
    if extra:
        print("extra tensors in bonsai's dump (the base must be frozen):", extra)
        failures += 1
    print("%s: worst relative gradient difference %.2e (bound 1e-4)" % (variant, worst))

    # 2. Training: N AdamW steps on both, over the same windows.
    out = run([args.bonsai_run, plan, "--backend=cuda", "--weights", weights_path, "--data",
               args.tokens, "--steps", str(args.steps)])
    ours = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", out, re.M)]
    model = peft_model(base_state, dora, seed=1234 + dora)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR,
                            betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    theirs = []
    for s in range(args.steps):
        inputs, labels = window(tokens, s, CONFIG["batch"], CONFIG["seq"])
        loss = loss_of(model, inputs.cuda(), labels.cuda())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        theirs.append(float(loss))
    first = abs(ours[0] - theirs[0]) / abs(theirs[0]) if ours else float("inf")
    worst = max((abs(a - b) / abs(b) for a, b in zip(ours, theirs)), default=float("inf"))
    ok = len(ours) == args.steps and first <= 1e-5 and worst <= 1e-3
    failures += not ok
    print("%s: step 1 loss %.7f (bonsai) vs %.7f (peft), relative %.2e (bound 1e-5); %d AdamW "
          "steps, loss -> %.4f vs %.4f, worst relative step difference %.2e (bound 1e-3)%s" % (
              variant, ours[0] if ours else float("nan"), theirs[0], first, args.steps,
              ours[-1] if ours else float("nan"), theirs[-1], worst, "" if ok else "  MISMATCH"))
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bonsai-run", required=True)
    ap.add_argument("--cases", required=True,
                    help="folder with tiny_llama.safetensors and tiny_llama.tokens")
    ap.add_argument("--lora-plan", required=True)
    ap.add_argument("--dora-plan", required=True)
    ap.add_argument("--work", default="/tmp/peft_lora_parity")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU here")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.work, exist_ok=True)
    args.tokens = os.path.join(args.cases, "tiny_llama.tokens")
    base_state = load_file(os.path.join(args.cases, "tiny_llama.safetensors"))
    tokens = read_tokens(args.tokens)
    failures = 0
    for variant, plan in (("lora", args.lora_plan), ("dora", args.dora_plan)):
        failures += check_variant(args, variant, plan, base_state, tokens)
    print("\nPEFT parity: %s" % ("all passed" if not failures else "%d failure(s)" % failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
