#!/usr/bin/env python3
"""test/gpu/hf_export_check.py - bonsai-run --export-merged DIR against transformers.

For each case, a tiny Hugging Face model directory (config.json with the keys transformers
writes, random fp32 weights, a tokenizer.json) is imported with bonsai-import-hf, fine-tuned by
bonsai-run (LoRA, DoRA, QLoRA on Llama; LoRA on Qwen2; the full model for GPT-2) and exported
with `--export-merged DIR --shard-size 100KB` (several shards). Then, in fp32 with TF32 off:

  1. `AutoModelForCausalLM.from_pretrained(DIR)` loads the directory (config.json, the sharded
     safetensors through model.safetensors.index.json) with no missing or unexpected key, and
     `AutoTokenizer.from_pretrained(DIR)` loads the copied tokenizer;
  2. its loss on two held-out batches equals Bonsai's loss of the fine-tuned model on the same
     batches (the forward-only adapter plan with the trained adapters, the NF4 base for QLoRA;
     the base plan with the trained weights for the full fine-tune) to 1e-5 relative, and
     Bonsai's base plan reading DIR (--weights DIR) gives the same loss;
  3. (llama-lora-rebuilt) a directory whose config.json Bonsai rebuilt from the plan (no source
     directory) loads and gives the same loss.

Prints a table per case and exits 1 on any mismatch. The issue 30 acceptance: every case within
1e-5.

Commands (as test/gpu/peft_export_check.py: the build machine prepares, the GPU checks):

    bench/prepare_gpu_run.sh
    /usr/bin/python3 test/gpu/hf_export_check.py prepare --build build --out .gpu-run/hfexport
    # on the GPU machine (torch, transformers, safetensors):
    LD_LIBRARY_PATH=.gpu-run/lib python3 test/gpu/hf_export_check.py check \\
        --work .gpu-run/hfexport --bonsai-run .gpu-run/bin/bonsai-run

`check --backend cpu` runs Bonsai on the CPU (a local dry run of the same comparison).
"""
import argparse
import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import peft_export_check as pec  # noqa: E402  (the configs, weights, tokens and batch helpers)

ALL = json.dumps(pec.ALL_LINEARS)
NF4 = 'bonsai.quantize "nf4" block 64 double_quant 256 targets %s' % ALL
# name: (config, recipe lines of the fine-tune (the optimizer is added), adapter plan or not)
CASES = {
    "llama-lora": (pec.LLAMA, ["bonsai.lora rank 8 alpha 1.600000e+01 targets %s" % ALL], True),
    "llama-dora": (pec.LLAMA, ["bonsai.lora dora rank 8 alpha 1.600000e+01 targets %s" % ALL], True),
    "llama-qlora": (pec.LLAMA, [NF4, "bonsai.lora rank 8 alpha 1.600000e+01 targets %s" % ALL], True),
    "llama-lora-rebuilt": (pec.LLAMA, ["bonsai.lora rank 8 alpha 1.600000e+01 targets %s" % ALL], True),
    "qwen2-lora": (pec.QWEN2, ['bonsai.lora rank 8 alpha 1.600000e+01 targets ["q_proj", "k_proj", "v_proj", "o_proj"]'], True),
    "gpt2-full": (pec.GPT2, [], False),
}
SHARD = "100KB"


def byte_tokenizer():
    """A byte-level BPE tokenizer.json whose 256 ids are the bytes (transformers loads it)."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, map(chr, cs)))
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
            "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {table[b]: b for b in range(256)}, "merges": []}}


def prepare(args):
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "test", "reference"))
    import safetensors_np
    import tokens_np

    bin_dir = os.path.join(args.build, "bin")
    rng = np.random.default_rng(args.seed)
    for name, (config, lines, adapters) in CASES.items():
        case = os.path.join(args.out, name)
        hf = os.path.join(case, "hf")
        os.makedirs(hf, exist_ok=True)
        with open(os.path.join(hf, "config.json"), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        with open(os.path.join(hf, "tokenizer.json"), "w") as f:
            json.dump(byte_tokenizer(), f)
        with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
        weights = {}
        for tensor, shape in pec.hf_tensors(config).items():
            if len(shape) == 1 and ("norm" in tensor or "ln_" in tensor) and tensor.endswith("weight"):
                w = 1 + 0.1 * rng.standard_normal(shape)
            elif len(shape) == 1:
                w = 0.02 * rng.standard_normal(shape)
            else:
                w = 0.05 * rng.standard_normal(shape)
            weights[tensor] = w.astype(np.float32)
        safetensors_np.write(os.path.join(hf, "model.safetensors"), weights,
                             metadata={"format": "pt"})
        tokens = rng.integers(0, config["vocab_size"],
                              size=(pec.STEPS + pec.EVAL_STEPS + 1) * pec.BATCH * pec.SEQ + 1)
        tokens_np.write(os.path.join(case, "tokens.bin"), tokens.astype(np.int64))
        model = os.path.join(case, "model.mlir")
        pec.run([os.path.join(bin_dir, "bonsai-import-hf"), hf, "--batch", str(pec.BATCH),
                 "--seq", str(pec.SEQ), "-o", model])
        pec.run([os.path.join(bin_dir, "bonsai-compile"), model, "-o",
                 os.path.join(case, "base.plan")])
        for plan, optimizer in (("train", True), ("fwd", False)):
            if not adapters and not optimizer:
                continue  # the full fine-tune is evaluated by the base plan
            body = "".join("  %s\n" % line for line in lines)
            if optimizer:
                body += '  bonsai.optimizer "adamw" lr 1.000000e-02\n'
            recipe = os.path.join(case, plan + ".mlir")
            with open(recipe, "w") as f:
                f.write("bonsai.recipe @%s {\n%s}\n" % (plan, body))
            pec.run([os.path.join(bin_dir, "bonsai-compile"), model, recipe, "-o",
                     os.path.join(case, plan + ".plan")])
        print("prepared %s: %s" % (name, case))


def check_case(name, case, args, device):
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    config, _, adapters = CASES[name]
    hf = os.path.join(case, "hf")
    data = os.path.join(case, "tokens.bin")
    tokens = pec.read_tokens(data)
    bonsai = [args.bonsai_run, "--backend=" + args.backend]
    failures = []
    out = os.path.join(case, "merged")
    eval_steps = str(pec.STEPS + pec.EVAL_STEPS)

    # Fine-tune and export. The rebuilt case gives the weights file, so no source directory.
    weights = os.path.join(hf, "model.safetensors") if name.endswith("rebuilt") else hf
    train = [os.path.join(case, "train.plan"), "--weights", weights, "--data", data, "--steps",
             str(pec.STEPS), "--export-merged", out, "--shard-size", SHARD]
    if adapters:
        train += ["--export-adapter", os.path.join(case, "adapter")]
    else:
        train += ["--save-every", str(pec.STEPS), "--ckpt-dir", os.path.join(case, "ckpt")]
    pec.run(bonsai + train)

    # Bonsai's loss of the fine-tuned model on the held-out batches (after the training ones).
    if adapters:
        exported = load_file(os.path.join(case, "adapter", "adapter_model.safetensors"))
        combined = load_file(os.path.join(hf, "model.safetensors"))
        for key, value in exported.items():
            combined[key[len("base_model.model."):]] = value
        combined_path = os.path.join(case, "combined.safetensors")
        save_file(combined, combined_path)
        tuned = pec.losses(pec.run(bonsai + [os.path.join(case, "fwd.plan"), "--weights",
                                             combined_path, "--data", data, "--steps",
                                             eval_steps]))[pec.STEPS:]
    else:
        # The trained full model, as the checkpoint holds it, through the base plan.
        ckpt = os.path.join(case, "ckpt", "step-%08d" % pec.STEPS, "model.safetensors")
        tuned = pec.losses(pec.run(bonsai + [os.path.join(case, "base.plan"), "--weights",
                                             ckpt, "--data", data, "--steps",
                                             eval_steps]))[pec.STEPS:]
    reread = pec.losses(pec.run(bonsai + [os.path.join(case, "base.plan"), "--weights", out,
                                          "--data", data, "--steps", eval_steps]))[pec.STEPS:]

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager", output_loading_info=True,
        **{dtype_arg: torch.float32})
    model = model.to(device).eval()
    missing = [k for k in info["missing_keys"]
               if not (k == "lm_head.weight" and config.get("tie_word_embeddings", True))]
    if missing or info["unexpected_keys"]:
        failures.append("%s: from_pretrained: missing %s, unexpected %s"
                        % (name, missing, info["unexpected_keys"]))
    if not name.endswith("rebuilt"):
        try:
            transformers.AutoTokenizer.from_pretrained(out)
        except Exception as e:  # noqa: BLE001 - report any loader failure
            failures.append("%s: AutoTokenizer.from_pretrained: %s" % (name, e))
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        shards = len(set(json.load(f)["weight_map"].values()))

    print("\n%s: %d shards; losses of the %d held-out batches" % (name, shards, pec.EVAL_STEPS))
    print("| batch | bonsai fine-tuned | bonsai --weights DIR | transformers DIR | max rel |")
    print("|---|---|---|---|---|")
    for i in range(pec.EVAL_STEPS):
        s = pec.STEPS + i
        inputs, labels = pec.window(tokens, s)
        with torch.no_grad():
            logits = model(input_ids=inputs.to(device)).logits.float()
        ref = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                      labels.to(device).reshape(-1)))
        rel = max(abs(tuned[i] - ref), abs(reread[i] - ref)) / abs(ref)
        bad = not rel <= 1e-5
        print("| %d | %.8f | %.8f | %.8f | %.2e%s |" % (s, tuned[i], reread[i], ref, rel,
                                                      "  MISMATCH" if bad else ""))
        if bad:
            failures.append("%s batch %d: relative difference %.2e > 1e-5" % (name, s, rel))
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
    c = sub.add_parser("check", help="fine-tune, export and load with transformers (GPU machine)")
    c.add_argument("--work", required=True)
    c.add_argument("--bonsai-run", required=True)
    c.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    args = ap.parse_args()
    prepare(args) if args.command == "prepare" else check(args)


if __name__ == "__main__":
    main()
