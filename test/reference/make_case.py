#!/usr/bin/python3
"""test/reference/make_case.py - random weights and tokens for a model of gen_models.MODELS.

Writes <out>/<model>.safetensors (every parameter under its Hugging Face name, in the model's
dtype: F32 or BF16) and <out>/<model>.tokens (a BONSAITK token file of ids below the vocab).
Matrices (and embeddings) are normal(0, 0.02); norm weights 1 + 0.1 normal(0, 1), so they are
not trivially one; biases normal(0, 0.02). Deterministic for a given --seed.

    make_case.py --model tiny_llama --out DIR [--seed 0] [--std 0.02] [--steps 4] [--token-bytes 2]

--std sets the matrices' standard deviation. At 0.02 the attention scores are so small that
attention is almost uniform: a wrong RoPE convention, a missing RoPE or a missing attention
scale moves the tiny models' loss by less than 1e-5 relative. At 0.1 each of these (and a
wrong GQA mapping, a missing causal mask, an unbiased layer_norm variance) moves it by more than
2e-4 relative (test_reference.py checks this), so parity tests should run both.

Meant for the small models: the weights are generated in memory.
"""

import argparse
import os
import sys
import zlib

sys.dont_write_bytecode = True

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference  # noqa: E402
import safetensors_np  # noqa: E402
import tokens_np  # noqa: E402


def random_weights(name, seed=0, std=0.02):
    """name -> float32 array for every parameter of the named model; matrices normal(0, std)."""
    arch, c = reference.MODELS[name]
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    weights = {}
    for pname, shape in reference.param_shapes(arch, c).items():
        if len(shape) == 1 and pname.endswith(".bias"):
            value = 0.02 * rng.standard_normal(shape)
        elif len(shape) == 1:  # rms_norm / layer_norm weights
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            value = std * rng.standard_normal(shape)
        weights[pname] = value.astype(np.float32)
    return weights


def random_tokens(name, steps=4, seed=0):
    """Token ids for `steps` distinct batches plus a remainder, so step offsets wrap around."""
    arch, c = reference.MODELS[name]
    span = c["batch"] * c["seq"]
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), 1])
    count = steps * span + 37
    return rng.integers(0, c["vocab"], size=count, dtype=np.int64)


def write_case(name, out, seed=0, steps=4, token_bytes=2, std=0.02):
    """Writes the weights and tokens of a case; returns (weights path, tokens path)."""
    arch, c = reference.MODELS[name]
    if c["vocab"] > (1 << (8 * token_bytes)):
        token_bytes = 4
    os.makedirs(out, exist_ok=True)
    weights = random_weights(name, seed, std)
    dtypes = None
    if c["dtype"] == "bf16":
        weights = {k: safetensors_np.f32_to_bf16(v) for k, v in weights.items()}
        dtypes = {k: "BF16" for k in weights}
    elif c["dtype"] != "f32":
        raise ValueError("%s: dtype %s not supported here" % (name, c["dtype"]))
    weights_path = os.path.join(out, name + ".safetensors")
    tokens_path = os.path.join(out, name + ".tokens")
    safetensors_np.write(weights_path, weights, dtypes,
                         metadata={"format": "pt", "generator": "test/reference/make_case.py",
                                   "model": name, "seed": str(seed), "std": repr(std)})
    tokens_np.write(tokens_path, random_tokens(name, steps, seed), token_bytes)
    return weights_path, tokens_path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(reference.MODELS))
    parser.add_argument("--out", required=True, help="directory for the two files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--std", type=float, default=0.02,
                        help="standard deviation of the matrices (default 0.02)")
    parser.add_argument("--steps", type=int, default=4,
                        help="distinct batches in the token file (default 4)")
    parser.add_argument("--token-bytes", type=int, choices=(2, 4), default=2)
    args = parser.parse_args(argv)
    paths = write_case(args.model, args.out, args.seed, args.steps, args.token_bytes, args.std)
    for path in paths:
        print("wrote %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
