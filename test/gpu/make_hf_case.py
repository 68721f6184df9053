#!/usr/bin/python3
"""test/gpu/make_hf_case.py - fill a Hugging Face model directory with random fp32 weights.

test/Tools/import-hf.test.py writes config.json and a safetensors file of the architecture's
names and shapes (zeros); this rewrites that file with random values, as
test/reference/make_case.py draws them (matrices normal(0, std), norm weights 1 + 0.1 normal,
biases 0.02 normal), and writes a token file of random ids for `steps` batches.

    make_hf_case.py HF_DIR --tokens OUT.tokens --batch B --seq S [--std 0.1] [--seed 0]
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import safetensors_np  # noqa: E402
import tokens_np  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--std", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    path = os.path.join(a.hf_dir, "model.safetensors")
    tensors, _, _ = safetensors_np.read(path)
    rng = np.random.default_rng(a.seed)
    weights = {}
    for name in sorted(tensors):
        shape = tensors[name].shape
        if len(shape) == 1 and name.endswith(".bias"):
            value = 0.02 * rng.standard_normal(shape)
        elif len(shape) == 1:
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            value = a.std * rng.standard_normal(shape)
        weights[name] = value.astype(np.float32)
    safetensors_np.write(path, weights, None, metadata={"format": "pt"})
    config = json.load(open(os.path.join(a.hf_dir, "config.json")))
    vocab = config["vocab_size"]
    tokens_np.write(a.tokens, rng.integers(0, vocab, size=4 * a.batch * a.seq + 37), 2)


if __name__ == "__main__":
    main()
