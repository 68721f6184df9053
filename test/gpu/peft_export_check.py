#!/usr/bin/env python3
"""test/gpu/peft_export_check.py - Bonsai's imports and PEFT exports against Hugging Face.

For each case, a tiny Hugging Face model directory (config.json with the keys transformers
writes, random fp32 weights in model.safetensors) is imported with bonsai-import-hf, trained
with a LoRA or DoRA recipe by bonsai-run, and exported with --export-adapter and
--export-merged. Then, in fp32 with TF32 off:

  1. `PeftModel.from_pretrained(base, adapter_dir)` loads every exported tensor (each PEFT
     lora_* parameter equals the exported one; none is left at its initial value);
  2. the loss of PEFT's model on two batches equals Bonsai's loss of the same batches with the
     trained adapters (the forward-only LoRA plan, weights = base + the exported adapters) and
     of the base plan with the merged weights, to 1e-4 relative;
  3. the transformers model loaded with the merged weights gives PEFT's logits (max abs
     difference <= 1e-4 of the largest logit), and PEFT's own merge_and_unload() gives Bonsai's
     merged weights (<= 1e-5 of the largest entry per tensor);
  4. (gpt2-import) the imported GPT-2 without adapters gives transformers' loss.

Prints a table per case and exits 1 on any mismatch.

Commands (the build machine prepares, the GPU machine checks; bonsai-import-hf and
bonsai-compile need LLVM 22, which a GPU image may lack):

    # on the build machine (/usr/bin/python3 has numpy; no torch needed). prepare_gpu_run.sh
    # first: it recreates .gpu-run/ and puts a CUDA bonsai-run in .gpu-run/bin.
    bench/prepare_gpu_run.sh
    /usr/bin/python3 test/gpu/peft_export_check.py prepare --build build --out .gpu-run/peft
    # copy .gpu-run/ and test/ to the GPU machine, then there (torch, transformers, peft,
    # safetensors):
    LD_LIBRARY_PATH=.gpu-run/lib python3 test/gpu/peft_export_check.py check \
        --work .gpu-run/peft --bonsai-run .gpu-run/bin/bonsai-run

`check --backend cpu` runs Bonsai on the CPU (a local dry run of the same comparison).
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

BATCH, SEQ, STEPS, EVAL_STEPS = 4, 64, 5, 2
ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

LLAMA = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=256,
             hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, hidden_act="silu", max_position_embeddings=SEQ,
             rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, attention_bias=False,
             attention_dropout=0.0, mlp_bias=False, tie_word_embeddings=False,
             torch_dtype="float32", bos_token_id=1, eos_token_id=2, initializer_range=0.02,
             use_cache=True, pretraining_tp=1)
QWEN2 = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=256,
             hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, hidden_act="silu", max_position_embeddings=SEQ,
             rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None,
             attention_dropout=0.0, tie_word_embeddings=True, use_sliding_window=False,
             sliding_window=SEQ, max_window_layers=2, torch_dtype="float32",
             initializer_range=0.02, use_cache=True)
GPT2 = dict(architectures=["GPT2LMHeadModel"], model_type="gpt2", vocab_size=256, n_embd=64,
            n_layer=2, n_head=4, n_positions=SEQ, n_inner=None, activation_function="gelu_new",
            layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            scale_attn_weights=True, tie_word_embeddings=True, torch_dtype="float32",
            initializer_range=0.02, use_cache=True)

# name: (config, lora directive or None)
CASES = {
    "llama-lora": (LLAMA, 'bonsai.lora rank 8 alpha 1.600000e+01 targets %s' % json.dumps(ALL_LINEARS)),
    "llama-dora": (LLAMA, 'bonsai.lora dora rank 8 alpha 1.600000e+01 targets %s' % json.dumps(ALL_LINEARS)),
    "qwen2-lora": (QWEN2, 'bonsai.lora rank 8 alpha 1.600000e+01 targets ["q_proj", "k_proj", "v_proj", "o_proj"]'),
    "gpt2-import": (GPT2, None),
}


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("command failed: %s\n%s%s" % (" ".join(cmd), p.stdout[-3000:],
                                                      p.stderr[-3000:]))
    return p.stdout


def losses(text):
    return [float(m.group(1)) for m in re.finditer(r"^step \d+ loss (\S+)", text, re.M)]


# ----------------------------------------------------------------------------------------------
# prepare (build machine: numpy, bonsai-import-hf, bonsai-compile)
# ----------------------------------------------------------------------------------------------

def hf_tensors(c):
    """The checkpoint names and shapes of the transformers implementation of config `c`."""
    if c["model_type"] == "gpt2":
        D, P, V = c["n_embd"], c["n_positions"], c["vocab_size"]
        t = {"transformer.wte.weight": [V, D], "transformer.wpe.weight": [P, D],
             "transformer.ln_f.weight": [D], "transformer.ln_f.bias": [D]}
        for i in range(c["n_layer"]):
            p = "transformer.h.%d." % i
            for ln in ("ln_1", "ln_2"):
                t[p + ln + ".weight"], t[p + ln + ".bias"] = [D], [D]
            for name, fin, fout in (("attn.c_attn", D, 3 * D), ("attn.c_proj", D, D),
                                    ("mlp.c_fc", D, 4 * D), ("mlp.c_proj", 4 * D, D)):
                t[p + name + ".weight"], t[p + name + ".bias"] = [fin, fout], [fout]
        return t
    D, V, I = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    H, KV = c["num_attention_heads"], c["num_key_value_heads"]
    hd = D // H
    t = {"model.embed_tokens.weight": [V, D], "model.norm.weight": [D]}
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = [D]
        t[p + "post_attention_layernorm.weight"] = [D]
        for name, out in (("q_proj", H * hd), ("k_proj", KV * hd), ("v_proj", KV * hd)):
            t[p + "self_attn.%s.weight" % name] = [out, D]
            if c["model_type"] == "qwen2":
                t[p + "self_attn.%s.bias" % name] = [out]
        t[p + "self_attn.o_proj.weight"] = [D, H * hd]
        t[p + "mlp.gate_proj.weight"] = [I, D]
        t[p + "mlp.up_proj.weight"] = [I, D]
        t[p + "mlp.down_proj.weight"] = [D, I]
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = [V, D]
    return t


def prepare(args):
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "test", "reference"))
    import safetensors_np
    import tokens_np

    bin_dir = os.path.join(args.build, "bin")
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    for name, (config, lora) in CASES.items():
        case = os.path.join(args.out, name)
        hf = os.path.join(case, "hf")
        os.makedirs(hf, exist_ok=True)
        with open(os.path.join(hf, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        weights = {}
        for tensor, shape in hf_tensors(config).items():
            if len(shape) == 1 and ("norm" in tensor or "ln_" in tensor) and tensor.endswith("weight"):
                w = 1 + 0.1 * rng.standard_normal(shape)
            elif len(shape) == 1:
                w = 0.02 * rng.standard_normal(shape)
            else:
                w = 0.05 * rng.standard_normal(shape)
            weights[tensor] = w.astype(np.float32)
        safetensors_np.write(os.path.join(hf, "model.safetensors"), weights,
                             metadata={"format": "pt"})
        vocab = config["vocab_size"]
        tokens = rng.integers(0, vocab, size=(STEPS + EVAL_STEPS + 1) * BATCH * SEQ + 1)
        tokens_np.write(os.path.join(case, "tokens.bin"), tokens.astype(np.int64))

        model = os.path.join(case, "model.mlir")
        run([os.path.join(bin_dir, "bonsai-import-hf"), hf, "--batch", str(BATCH), "--seq",
             str(SEQ), "-o", model])
        run([os.path.join(bin_dir, "bonsai-compile"), model, "-o",
             os.path.join(case, "base.plan")])
        if lora:
            for plan, optimizer in (("lora", True), ("lora_fwd", False)):
                recipe = os.path.join(case, plan + ".mlir")
                with open(recipe, "w") as f:
                    f.write("bonsai.recipe @%s {\n  %s\n%s}\n" % (
                        plan, lora,
                        '  bonsai.optimizer "adamw" lr 1.000000e-02\n' if optimizer else ""))
                run([os.path.join(bin_dir, "bonsai-compile"), model, recipe, "-o",
                     os.path.join(case, plan + ".plan")])
        print("prepared %s: %s" % (name, case))


# ----------------------------------------------------------------------------------------------
# check (GPU machine: torch, transformers, peft)
# ----------------------------------------------------------------------------------------------

def read_tokens(path):
    import struct
    import torch
    with open(path, "rb") as f:
        data = f.read()
    magic, version, width, count = struct.unpack_from("<8sIIQ", data, 0)
    assert magic == b"BONSAITK" and version == 1, path
    dtype = torch.int16 if width == 2 else torch.int32
    tokens = torch.frombuffer(bytearray(data[24:24 + count * width]), dtype=dtype)
    return tokens.to(torch.int64) & (0xFFFF if width == 2 else 0xFFFFFFFF)


def window(tokens, step):
    """Micro-batch `step` as bonsai-run reads it (docs/data-format.md)."""
    count = tokens.numel()
    p = (step * BATCH * SEQ) % (count - BATCH * SEQ)
    chunk = tokens[p:p + BATCH * SEQ + 1]
    return chunk[:-1].view(BATCH, SEQ), chunk[1:].view(BATCH, SEQ)


def check_case(name, case, args, device):
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    config, lora = CASES[name]
    hf = os.path.join(case, "hf")
    tokens = read_tokens(os.path.join(case, "tokens.bin"))
    bonsai = [args.bonsai_run, "--backend=" + args.backend]
    failures = []

    def hf_loss(model, step):
        inputs, labels = window(tokens, step)
        with torch.no_grad():
            logits = model(input_ids=inputs.to(device)).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 labels.to(device).reshape(-1))
        return float(loss), logits

    # transformers 4.56 renamed from_pretrained's torch_dtype to dtype.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"

    def base_model():
        return transformers.AutoModelForCausalLM.from_pretrained(
            hf, attn_implementation="eager", **{dtype_arg: torch.float32}).to(device).eval()

    if lora is None:
        out = run(bonsai + [os.path.join(case, "base.plan"), "--weights",
                            os.path.join(hf, "model.safetensors"), "--data",
                            os.path.join(case, "tokens.bin"), "--steps", str(EVAL_STEPS)])
        ours = losses(out)
        model = base_model()
        print("\n%s: imported model, bonsai vs transformers (fp32)" % name)
        print("| batch | bonsai | transformers | relative |")
        print("|---|---|---|---|")
        for s in range(EVAL_STEPS):
            ref, _ = hf_loss(model, s)
            rel = abs(ours[s] - ref) / abs(ref)
            bad = rel > 1e-4
            print("| %d | %.7f | %.7f | %.2e%s |" % (s, ours[s], ref, rel, "  MISMATCH" if bad else ""))
            if bad:
                failures.append("%s batch %d loss" % (name, s))
        return failures

    # Train, export, and evaluate the trained adapters two ways in Bonsai.
    adapter = os.path.join(case, "adapter")
    merged = os.path.join(case, "merged.safetensors")
    run(bonsai + [os.path.join(case, "lora.plan"), "--weights",
                  os.path.join(hf, "model.safetensors"), "--data",
                  os.path.join(case, "tokens.bin"), "--steps", str(STEPS), "--export-adapter",
                  adapter, "--base-model", hf, "--export-merged", merged])
    exported = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    combined = load_file(os.path.join(hf, "model.safetensors"))
    prefix = "base_model.model."
    for key, value in exported.items():
        combined[key[len(prefix):]] = value
    combined_path = os.path.join(case, "combined.safetensors")
    save_file(combined, combined_path)
    # The evaluation batches come after the training ones: the plans read batch s at step s+1.
    eval_steps = str(STEPS + EVAL_STEPS)
    adapted = losses(run(bonsai + [os.path.join(case, "lora_fwd.plan"), "--weights",
                                   combined_path, "--data", os.path.join(case, "tokens.bin"),
                                   "--steps", eval_steps]))[STEPS:]
    merged_losses = losses(run(bonsai + [os.path.join(case, "base.plan"), "--weights", merged,
                                         "--data", os.path.join(case, "tokens.bin"), "--steps",
                                         eval_steps]))[STEPS:]

    import peft
    model = peft.PeftModel.from_pretrained(base_model(), adapter).to(device).eval()
    # 1. Every exported tensor is what PEFT loaded, and PEFT has no adapter tensor we did not
    # export (it would have kept its initial value).
    loaded = {}
    for pname, param in model.named_parameters():
        if "lora_" not in pname:
            continue
        key = pname.replace(".default.weight", ".weight").replace(
            "lora_magnitude_vector.weight", "lora_magnitude_vector")
        loaded[key] = param.detach().float().cpu()
    if set(loaded) != set(exported):
        failures.append("%s: PEFT's adapter tensors %s differ from the exported %s" % (
            name, sorted(set(loaded) ^ set(exported))[:4], len(exported)))
    worst_load = max((float((loaded[k] - exported[k].float()).abs().max()) for k in exported
                      if k in loaded), default=float("inf"))
    if worst_load != 0.0:
        failures.append("%s: PEFT loaded different adapter values (max diff %g)" % (name, worst_load))

    # 2. and 3.
    merged_model = base_model()
    state = {k: v.to(torch.float32) for k, v in load_file(merged).items()}
    missing, unexpected = merged_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.get("tie_word_embeddings")]
    if missing or unexpected:
        failures.append("%s: merged weights: missing %s, unexpected %s" % (name, missing, unexpected))
    merged_model.tie_weights()
    print("\n%s: %d adapter tensors (%s), %d steps of bonsai-run; losses of the next %d batches"
          % (name, len(exported), "DoRA" if "dora" in lora else "LoRA", STEPS, EVAL_STEPS))
    print("| batch | bonsai LoRA plan | bonsai merged | PEFT | transformers merged | "
          "max rel | logits PEFT vs merged |")
    print("|---|---|---|---|---|---|---|")
    for i in range(EVAL_STEPS):
        s = STEPS + i
        peft_loss, peft_logits = hf_loss(model, s)
        hf_merged_loss, merged_logits = hf_loss(merged_model, s)
        values = [adapted[i], merged_losses[i], peft_loss, hf_merged_loss]
        rel = max(abs(v - peft_loss) for v in values) / abs(peft_loss)
        logit_diff = float((peft_logits - merged_logits).abs().max() /
                           peft_logits.abs().max())
        bad = rel > 1e-4 or logit_diff > 1e-4
        print("| %d | %.7f | %.7f | %.7f | %.7f | %.2e | %.2e%s |" % (
            s, values[0], values[1], values[2], values[3], rel, logit_diff,
            "  MISMATCH" if bad else ""))
        if bad:
            failures.append("%s batch %d" % (name, s))

    # 3. PEFT's own merge against Bonsai's.
    unloaded = model.merge_and_unload()
    theirs = {k: v.detach().float().cpu() for k, v in unloaded.state_dict().items()}
    worst = 0.0
    for key, ours in load_file(merged).items():
        if key not in theirs:
            continue
        diff = float((ours.float() - theirs[key]).abs().max())
        scale = float(theirs[key].abs().max()) or 1.0
        worst = max(worst, diff / scale)
    print("PEFT merge_and_unload vs bonsai --export-merged: worst relative difference %.2e "
          "(bound 1e-5)" % worst)
    if worst > 1e-5:
        failures.append("%s: merged weights differ from PEFT's merge (%.2e)" % (name, worst))
    return failures


def check(args):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if args.backend == "cuda" else "cpu"
    failures = []
    for name in CASES:
        failures += check_case(name, os.path.join(args.work, name), args, device)
    print()
    for f in failures:
        print("FAIL: " + f)
    print("%d cases, %d failures" % (len(CASES), len(failures)))
    sys.exit(1 if failures else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write, import and compile the cases (build machine)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("check", help="train, export and compare with PEFT (GPU machine)")
    c.add_argument("--work", required=True)
    c.add_argument("--bonsai-run", required=True)
    c.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    prepare(args) if args.command == "prepare" else check(args)


if __name__ == "__main__":
    main()
