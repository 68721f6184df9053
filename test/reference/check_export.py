#!/usr/bin/python3
"""test/reference/check_export.py - check bonsai-run's PEFT adapter and merged-weight exports.

    check_export.py files --base W.safetensors --adapter DIR --merged M.safetensors
                          --rank R --alpha A --targets q_proj,v_proj [--dora] [--nf4]
                          [--base-model NAME] [--combined OUT.safetensors] [--dtype BF16]

checks, independently of the runtime:
  * DIR/adapter_config.json: peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, use_dora,
    target_modules, bias "none", lora_dropout 0, base_model_name_or_path;
  * DIR/adapter_model.safetensors: exactly the keys PEFT saves for the modules the targets select
    among W's 2-D weights (PEFT's rule: the module path equals a target or ends with "." + it):
    base_model.model.<module>.lora_A.weight [r, in], .lora_B.weight [out, r] and, with --dora,
    .lora_magnitude_vector [out]; lora_B is not all zero (the adapters trained);
  * M: every tensor of W under its name and shape; the others unchanged, bit for bit; each
    adapted weight equal to W + s·B·A (LoRA) or m / ||W + s·B·A||_row * (W + s·B·A) (DoRA),
    s = alpha / r, computed in float64 from W (with --nf4: W quantized and dequantized by the
    NumPy NF4 reference, nf4.py) and the exported A, B, m: max |M - ref| <= 1e-5 max |ref|,
    while the adapter's contribution is at least 100 times that tolerance.
With --dtype BF16 (a bf16 model), every adapter and merged tensor must be BF16; W is rounded to
bf16 first (as the runtime binds it) and the tolerance is bf16's rounding, 2^-8 of the largest
entry (the adapter-effect bound is then not checked).
M may be a Hugging Face model directory (bonsai-run --export-merged DIR): its layout is checked
first: model.safetensors.index.json's weight_map names every tensor once, in shards named
model-0000k-of-0000N.safetensors, k = 1..N, each holding exactly the tensors the map puts in it,
no other .safetensors file, metadata.total_size the sum of the tensors' bytes, with --shard-size
no shard over it but one of a single tensor (Hugging Face's greedy rule), and config.json.
With --source DIR (the model directory the run's weights came from), config.json and every
tokenizer file of DIR (tokenizer.json, tokenizer.model, tokenizer_config.json,
special_tokens_map.json) must be copies. --merged-dtype D: every merged tensor's dtype is D (the source dtype).
With --combined, writes W plus the exported adapters under Bonsai's names (the PEFT prefix
removed), the weights of the LoRA plan whose loss the merged weights must reproduce.

    check_export.py losses --adapted A.out --merged M.out --base B.out

compares bonsai-run outputs ("step <n> loss <x>" lines) step by step: the LoRA plan with the
exported adapters (A) and the base plan with the merged weights (M) agree to 1e-5 relative,
and the base plan with the original weights (B) differs from M by more than 1e-4 relative at
some step (else the comparison would not show anything). Exits 1 on any failure.
"""

import argparse
import json
import math
import os
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import nf4  # noqa: E402
import safetensors_np  # noqa: E402

PREFIX = "base_model.model."
STEP_LINE = re.compile(r"^\s*step\s+(\d+)\s+loss\s+(\S+)")


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def peft_matches(target, module):
    return module == target or module.endswith("." + target)


SHARD = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")
TOKENIZER_FILES = ["tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json"]
ELEMENT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4}


def check_model_dir(a):
    """The layout of a Hugging Face model directory; returns its tensors and dtypes."""
    d = a.merged
    index_path = os.path.join(d, "model.safetensors.index.json")
    if not os.path.isfile(index_path):
        fail("%s has no model.safetensors.index.json" % d)
    with open(index_path) as f:
        index = json.load(f)
    weight_map = index["weight_map"]
    shards = sorted(set(weight_map.values()))
    files = sorted(n for n in os.listdir(d) if n.endswith(".safetensors"))
    if files != shards:
        fail("shard files %s, the weight map names %s" % (files, shards))
    count = len(shards)
    for k, name in enumerate(shards, 1):
        m = SHARD.match(name)
        if not m or int(m.group(1)) != k or int(m.group(2)) != count:
            fail("shard %d of %d is named %s" % (k, count, name))
    tensors, dtypes = safetensors_np.read_index(index_path)
    if set(tensors) != set(weight_map):
        fail("the shards hold %s, the weight map %s" % (sorted(tensors), sorted(weight_map)))
    sizes = {n: t.size * ELEMENT_BYTES[dtypes[n]] for n, t in tensors.items()}
    if index["metadata"]["total_size"] != sum(sizes.values()):
        fail("metadata.total_size %s, the tensors hold %d bytes"
             % (index["metadata"]["total_size"], sum(sizes.values())))
    if a.shard_size:
        for name in shards[:-1]:
            shard_bytes = sum(v for n, v in sizes.items() if weight_map[n] == name)
            if shard_bytes > a.shard_size and sum(1 for n in weight_map if weight_map[n] == name) > 1:
                fail("%s holds %d bytes, over --shard-size %d" % (name, shard_bytes, a.shard_size))
    if not os.path.isfile(os.path.join(d, "config.json")):
        fail("%s has no config.json" % d)
    with open(os.path.join(d, "config.json")) as f:
        json.load(f)
    if a.source:
        copied = []
        for name in ["config.json"] + TOKENIZER_FILES:
            src = os.path.join(a.source, name)
            if not os.path.exists(src):
                if os.path.exists(os.path.join(d, name)):
                    fail("%s has %s, which %s lacks" % (d, name, a.source))
                continue
            with open(src, "rb") as f1, open(os.path.join(d, name), "rb") as f2:
                if f1.read() != f2.read():
                    fail("%s is not a copy of %s" % (os.path.join(d, name), src))
            copied.append(name)
        print("copied from %s: %s" % (a.source, ", ".join(copied)))
    print("%s: %d tensors in %d shard%s, index and config.json present"
          % (d, len(tensors), count, "" if count == 1 else "s"))
    return tensors, dtypes


def check_files(a):
    base = safetensors_np.load_float(a.base, out=np.float64)
    targets = a.targets.split(",")
    modules = sorted(name[:-len(".weight")] for name, w in base.items()
                     if name.endswith(".weight") and w.ndim == 2
                     and any(peft_matches(t, name[:-len(".weight")]) for t in targets))
    if not modules:
        fail("the targets select no weight of %s" % a.base)

    with open(os.path.join(a.adapter, "adapter_config.json")) as f:
        config = json.load(f)
    expected = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": a.rank,
                "lora_alpha": a.alpha, "use_dora": a.dora, "bias": "none",
                "lora_dropout": 0.0, "base_model_name_or_path": a.base_model,
                "fan_in_fan_out": False, "use_rslora": False}
    for key, value in expected.items():
        if config.get(key) != value:
            fail("adapter_config.json: %s is %r, expected %r" % (key, config.get(key), value))
    if sorted(config.get("target_modules") or []) not in (sorted(targets), modules):
        fail("adapter_config.json: target_modules %r select other modules than %r"
             % (config.get("target_modules"), targets))
    print("adapter_config.json: r=%d lora_alpha=%g use_dora=%s target_modules=%s"
          % (config["r"], config["lora_alpha"], config["use_dora"], config["target_modules"]))

    tensors, dtypes, _ = safetensors_np.read(os.path.join(a.adapter, "adapter_model.safetensors"))
    adapters = safetensors_np.to_float(tensors, dtypes, out=np.float64)
    want = {}
    for m in modules:
        out, inp = base[m + ".weight"].shape
        want[PREFIX + m + ".lora_A.weight"] = (a.rank, inp)
        want[PREFIX + m + ".lora_B.weight"] = (out, a.rank)
        if a.dora:
            want[PREFIX + m + ".lora_magnitude_vector"] = (out,)
    if set(adapters) != set(want):
        fail("adapter keys: missing %s, extra %s" % (sorted(set(want) - set(adapters)),
                                                     sorted(set(adapters) - set(want))))
    for key, shape in want.items():
        if adapters[key].shape != shape:
            fail("%s has shape %s, expected %s" % (key, adapters[key].shape, shape))
    if set(dtypes.values()) != {a.dtype}:
        fail("adapter dtypes %s, expected %s" % (sorted(set(dtypes.values())), a.dtype))
    if all(not np.any(adapters[PREFIX + m + ".lora_B.weight"]) for m in modules):
        fail("every lora_B is zero: the exported adapters did not train")
    print("adapter_model.safetensors: %d tensors for %d modules (%s)"
          % (len(adapters), len(modules), sorted(set(dtypes.values()))))

    if os.path.isdir(a.merged):
        merged_raw, merged_dtypes = check_model_dir(a)
    else:
        merged_raw, merged_dtypes, _ = safetensors_np.read(a.merged)
    if a.merged_dtype and set(merged_dtypes.values()) != {a.merged_dtype}:
        fail("merged dtypes %s, expected %s" % (sorted(set(merged_dtypes.values())),
                                                a.merged_dtype))
    merged = safetensors_np.to_float(merged_raw, merged_dtypes, out=np.float64)
    if set(merged) != set(base):
        fail("merged keys: missing %s, extra %s" % (sorted(set(base) - set(merged)),
                                                    sorted(set(merged) - set(base))))
    s = a.alpha / a.rank
    worst = 0.0
    for name, w in base.items():
        if merged[name].shape != w.shape:
            fail("merged %s has shape %s, expected %s" % (name, merged[name].shape, w.shape))
        module = name[:-len(".weight")]
        if a.dtype == "BF16":
            w = safetensors_np.bf16_to_f32(safetensors_np.f32_to_bf16(w)).astype(np.float64)
        if module not in modules:
            if not np.array_equal(merged[name], w):
                fail("merged %s differs from the base weight, and it has no adapter" % name)
            continue
        if merged_dtypes[name] != a.dtype:
            fail("merged %s is %s, expected %s" % (name, merged_dtypes[name], a.dtype))
        if a.nf4:
            w = nf4.dequantize(nf4.quantize(w.astype(np.float32)), w.size).reshape(w.shape)
            w = w.astype(np.float64)
        A = adapters[PREFIX + module + ".lora_A.weight"]
        B = adapters[PREFIX + module + ".lora_B.weight"]
        delta = s * (B @ A)
        ref = w + delta
        if a.dora:
            m = adapters[PREFIX + module + ".lora_magnitude_vector"]
            ref = (m / np.linalg.norm(ref, axis=1))[:, None] * ref
        tol = (2.0 ** -8 if a.dtype == "BF16" else 1e-5) * np.max(np.abs(ref))
        err = np.max(np.abs(merged[name] - ref))
        effect = np.max(np.abs(ref - w))
        print("merged %-45s max|err| %.3e (tol %.3e), adapter effect %.3e"
              % (name, err, tol, effect))
        if not err <= tol:
            fail("merged %s: max |merged - reference| = %g > %g" % (name, err, tol))
        if a.dtype == "F32" and not effect >= 100 * tol:
            fail("merged %s: the adapter changes it by only %g" % (name, effect))
        worst = max(worst, err / tol)
    print("merged: %d tensors, %d adapted, worst error %.3f of the tolerance"
          % (len(merged), len(modules), worst))

    if a.combined:
        out = dict(base)
        for key, value in adapters.items():
            out[key[len(PREFIX):]] = value
        safetensors_np.write(a.combined, {k: v.astype(np.float32) for k, v in out.items()})


def read_losses(path):
    with open(path) as f:
        steps = [(int(m.group(1)), float(m.group(2)))
                 for m in map(STEP_LINE.match, f.read().splitlines()) if m]
    if not steps:
        fail("%s has no step lines" % path)
    return dict(steps)


def check_losses(a):
    adapted, merged, base = read_losses(a.adapted), read_losses(a.merged), read_losses(a.base)
    if not (set(adapted) == set(merged) == set(base)):
        fail("the runs have different steps: %s %s %s" % (sorted(adapted), sorted(merged),
                                                         sorted(base)))
    moved = False
    print("step  LoRA plan + adapters   base + merged   base + original")
    for step in sorted(adapted):
        x, y, z = adapted[step], merged[step], base[step]
        print("%4d  %20.9f  %14.9f  %16.9f" % (step, x, y, z))
        if not (math.isfinite(x) and abs(x - y) <= 1e-5 * abs(x)):
            fail("step %d: LoRA plan loss %.9g, merged weights %.9g" % (step, x, y))
        moved = moved or abs(z - y) > 1e-4 * abs(y)
    if not moved:
        fail("the merged weights give the base model's loss: the comparison shows nothing")
    print("losses: the merged weights reproduce the LoRA plan's loss")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    f = sub.add_parser("files")
    f.add_argument("--base", required=True)
    f.add_argument("--adapter", required=True)
    f.add_argument("--merged", required=True)
    f.add_argument("--rank", type=int, required=True)
    f.add_argument("--alpha", type=float, required=True)
    f.add_argument("--targets", required=True)
    f.add_argument("--dora", action="store_true")
    f.add_argument("--nf4", action="store_true")
    f.add_argument("--base-model", default="")
    f.add_argument("--combined")
    f.add_argument("--dtype", default="F32", choices=["F32", "BF16"])
    f.add_argument("--source", help="model directory whose config and tokenizer were copied")
    f.add_argument("--shard-size", type=int, help="the --shard-size the export was given")
    f.add_argument("--merged-dtype", help="the dtype of every merged tensor")
    l = sub.add_parser("losses")
    l.add_argument("--adapted", required=True)
    l.add_argument("--merged", required=True)
    l.add_argument("--base", required=True)
    a = ap.parse_args()
    check_files(a) if a.command == "files" else check_losses(a)


if __name__ == "__main__":
    main()
