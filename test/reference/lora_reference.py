#!/usr/bin/python3
"""test/reference/lora_reference.py - NumPy LoRA / DoRA on the Llama reference (docs/lora.md).

The loss and the adapter gradients of a LlamaForCausalLM whose targeted linears carry PEFT
adapters, written out op by op in float64, independently of the compiler and the runtime
(the other ops' forward and backward come from reference_grad.py). For a targeted linear with
weight W [out, in] (frozen), lora_A [r, in], lora_B [out, r], s = alpha / r:

  LoRA   y = x W^T + s (x A^T) B^T
         u = x A^T;  dB = sum over positions of dy^T (s u);  dA = s (dy B)^T x;
         dx = dy W + s (dy B) A
  DoRA   h = x W^T + s (x A^T) B^T;  n = ||W + s B A|| per row (DETACHED: a constant);
         y = h * (m / n)
         dm = sum over positions of dy * h / n;  dh = dy * m / n, then LoRA's backward on dh

Only the adapters are trainable (PEFT freezes the base model), so the gradients are those of
lora_A, lora_B (and lora_magnitude_vector) of every targeted linear, under Bonsai's parameter
names (M.lora_A.weight, M.lora_B.weight, M.lora_magnitude_vector).

    make:    lora_reference.py make --model tiny_llama --weights BASE.safetensors --out W.safetensors
                 --rank 8 [--dora] [--targets q_proj,v_proj] [--seed 0]
             (the base weights plus adapters with A Kaiming-uniform, B normal(0, 0.02) -- not
             zero, so that every gradient is non-trivial -- and, for DoRA, m = ||W|| (1 + 0.1 N))
    grads:   lora_reference.py compare --model tiny_llama --weights W.safetensors --data T.tokens
                 --gradients G.safetensors --rank 8 --alpha 16 [--dora] [--targets ...]
             (compare_grads.compare's table of bonsai-run --dump-gradients against this backward)
    loss:    lora_reference.py loss --model tiny_llama --weights W.safetensors --data T.tokens
                 --rank 8 --alpha 16 [--dora] [--targets ...] [--window 0]
                 [--run-output OUT]   (OUT's "step 1 loss" within 1e-5 relative, window 0)
"""

import argparse
import math
import os
import re
import sys
import zlib

sys.dont_write_bytecode = True

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compare_grads  # noqa: E402
import reference  # noqa: E402
import reference_grad as rg  # noqa: E402
import safetensors_np  # noqa: E402
import tokens_np  # noqa: E402

ALL_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def targeted_modules(c, targets):
    """Module paths of the Llama linears whose last component is one of `targets`."""
    modules = []
    for i in range(c["layers"]):
        for name in ALL_LINEARS:
            part = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            if name in targets:
                modules.append("model.layers.%d.%s.%s" % (i, part, name))
    return modules


class Adapted:
    """The linears of one forward/backward: plain for untargeted modules, LoRA/DoRA otherwise.
    Caches what the backward needs per module; collects the adapter gradients."""

    def __init__(self, W, modules, rank, alpha, dora):
        self.W, self.modules, self.s, self.dora = W, set(modules), alpha / rank, dora
        self.cache, self.grads = {}, rg.Grads()

    def fwd(self, module, x):
        w = self.W[module + ".weight"]
        y = rg.linear_fwd(x, w)
        if module not in self.modules:
            self.cache[module] = (x,)
            return y
        a, b = self.W[module + ".lora_A.weight"], self.W[module + ".lora_B.weight"]
        u = x @ a.T
        h = y + self.s * (u @ b.T)
        if not self.dora:
            self.cache[module] = (x, u)
            return h
        n = np.sqrt(np.sum((w + self.s * (b @ a)) ** 2, axis=1))  # detached
        m = self.W[module + ".lora_magnitude_vector"]
        self.cache[module] = (x, u, h, n, m)
        return h * (m / n)

    def bwd(self, module, dy):
        """dx of the module's linear; adds the adapter gradients."""
        w = self.W[module + ".weight"]
        if module not in self.modules:
            return dy @ w
        x, u = self.cache[module][:2]
        if self.dora:
            h, n, m = self.cache[module][2:]
            self.grads.add(module + ".lora_magnitude_vector", rg._rows(dy * h).sum(axis=0) / n)
            dy = dy * (m / n)
        a, b = self.W[module + ".lora_A.weight"], self.W[module + ".lora_B.weight"]
        dyb = dy @ b  # [.., r]
        self.grads.add(module + ".lora_B.weight", rg._rows(dy).T @ rg._rows(self.s * u))
        self.grads.add(module + ".lora_A.weight", self.s * (rg._rows(dyb).T @ rg._rows(x)))
        return dy @ w + self.s * (dyb @ a)


def llama_loss_and_adapter_grads(W, c, ids, labels, lin):
    """Llama's loss and the gradients `lin` collects (reference_grad._llama's structure, with
    every projection through `lin`)."""
    D, H, KV, eps, theta = c["hidden"], c["heads"], c["kv_heads"], c["eps"], c["rope_theta"]
    hd = D // H
    scale = 1.0 / math.sqrt(hd)
    B, S = ids.shape
    x = W["model.embed_tokens.weight"][ids]
    layers = []
    for i in range(c["layers"]):
        p = "model.layers.%d." % i
        s = {}
        h, s["ln1"] = rg.rms_norm_fwd(x, W[p + "input_layernorm.weight"], eps)
        q = lin.fwd(p + "self_attn.q_proj", h).reshape(B, S, H, hd)
        k = lin.fwd(p + "self_attn.k_proj", h).reshape(B, S, KV, hd)
        v = lin.fwd(p + "self_attn.v_proj", h).reshape(B, S, KV, hd)
        s["q"], s["k"], s["v"] = rg.rope_fwd(q, theta), rg.rope_fwd(k, theta), v
        s["o"], s["p"] = rg.attention_fwd(s["q"], s["k"], v, scale, causal=True)
        x = x + lin.fwd(p + "self_attn.o_proj", s["o"].reshape(B, S, H * hd))
        h, s["ln2"] = rg.rms_norm_fwd(x, W[p + "post_attention_layernorm.weight"], eps)
        s["gate"] = lin.fwd(p + "mlp.gate_proj", h)
        s["up"] = lin.fwd(p + "mlp.up_proj", h)
        x = x + lin.fwd(p + "mlp.down_proj", rg.swiglu_fwd(s["gate"], s["up"]))
        layers.append(s)
    hf, lnf = rg.rms_norm_fwd(x, W["model.norm.weight"], eps)
    head = "model.embed_tokens.weight" if c["tied"] else "lm_head.weight"
    loss, dlogits = rg.cross_entropy_fwd_bwd(rg.linear_fwd(hf, W[head]), labels)

    dx, _ = rg.rms_norm_bwd(dlogits @ W[head], W["model.norm.weight"], lnf)
    for i in reversed(range(c["layers"])):
        p, s = "model.layers.%d." % i, layers[i]
        dm = lin.bwd(p + "mlp.down_proj", dx)
        dgate, dup = rg.swiglu_bwd(dm, s["gate"], s["up"])
        dh = lin.bwd(p + "mlp.gate_proj", dgate) + lin.bwd(p + "mlp.up_proj", dup)
        dxn, _ = rg.rms_norm_bwd(dh, W[p + "post_attention_layernorm.weight"], s["ln2"])
        dx = dx + dxn
        da = lin.bwd(p + "self_attn.o_proj", dx)
        dq, dk, dv = rg.attention_bwd(da.reshape(B, S, H, hd), s["q"], s["k"], s["v"], s["o"],
                                      s["p"], scale)
        dq, dk = rg.rope_bwd(dq, theta), rg.rope_bwd(dk, theta)
        dh = (lin.bwd(p + "self_attn.q_proj", dq.reshape(B, S, -1))
              + lin.bwd(p + "self_attn.k_proj", dk.reshape(B, S, -1))
              + lin.bwd(p + "self_attn.v_proj", dv.reshape(B, S, -1)))
        dxn, _ = rg.rms_norm_bwd(dh, W[p + "input_layernorm.weight"], s["ln1"])
        dx = dx + dxn
    return loss, dict(lin.grads)


def step(model, weights, tokens, window, rank, alpha, dora, targets):
    """(loss, adapter gradients) of token window `window`, all in float64."""
    arch, c = reference.MODELS[model]
    if arch != reference.LLAMA:
        raise ValueError("lora_reference.py implements the Llama models")
    W = {k: np.asarray(v, dtype=np.float64) for k, v in weights.items()}
    ids, labels = tokens_np.batch(tokens, window, c["batch"], c["seq"])
    lin = Adapted(W, targeted_modules(c, targets), rank, alpha, dora)
    return llama_loss_and_adapter_grads(W, c, np.asarray(ids, dtype=np.int64), labels, lin)


def make_weights(model, base, rank, dora, targets, seed=0):
    """`base` plus adapters: A ~ U(+-1/sqrt(in)), B ~ N(0, 0.02), DoRA m = ||W|| (1 + 0.1 N)."""
    arch, c = reference.MODELS[model]
    out = dict(base)
    for module in targeted_modules(c, targets):
        rng = np.random.default_rng([seed, zlib.crc32(module.encode())])
        w = np.asarray(base[module + ".weight"], dtype=np.float64)
        o, i = w.shape
        out[module + ".lora_A.weight"] = rng.uniform(-1, 1, (rank, i)) / math.sqrt(i)
        out[module + ".lora_B.weight"] = 0.02 * rng.standard_normal((o, rank))
        if dora:
            norm = np.sqrt(np.sum(w * w, axis=1))
            out[module + ".lora_magnitude_vector"] = norm * (1 + 0.1 * rng.standard_normal(o))
    return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("make", "compare", "loss"))
    parser.add_argument("--model", required=True, choices=sorted(reference.MODELS))
    parser.add_argument("--weights", required=True)
    parser.add_argument("--out")
    parser.add_argument("--data")
    parser.add_argument("--gradients")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--alpha", type=float)
    parser.add_argument("--dora", action="store_true")
    parser.add_argument("--targets", default=",".join(ALL_LINEARS))
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rtol", type=float, default=compare_grads.DEFAULT_RTOL)
    parser.add_argument("--run-output",
                        help="loss: bonsai-run output whose 'step 1 loss' must be within 1e-5 "
                             "relative of the reference (window 0)")
    args = parser.parse_args(argv)
    targets = args.targets.split(",")

    if args.command == "make":
        base = reference.load_weights(args.weights)
        weights = make_weights(args.model, base, args.rank, args.dora, targets, args.seed)
        safetensors_np.write(args.out, weights, metadata={"generator": "lora_reference.py"})
        print("wrote %s (%d adapter tensors)" % (args.out, len(weights) - len(base)))
        return 0

    alpha = args.alpha if args.alpha is not None else float(args.rank)
    loss, want = step(args.model, reference.load_weights(args.weights),
                      tokens_np.read(args.data), args.window, args.rank, alpha, args.dora,
                      targets)
    if args.command == "loss":
        print("reference loss %.9g" % loss)
        if not args.run_output:
            return 0
        with open(args.run_output) as f:
            found = re.search(r"^step 1 loss (\S+)", f.read(), re.M)
        if not found:
            print("no 'step 1 loss' in %s" % args.run_output)
            return 1
        got = float(found.group(1))
        rel = abs(got - loss) / abs(loss)
        print("bonsai loss %.9g, relative difference %.2e (bound 1e-5)" % (got, rel))
        return 0 if rel <= 1e-5 else 1
    tensors, dtypes, _ = safetensors_np.read(args.gradients)
    got = safetensors_np.to_float(tensors, dtypes, np.float64)
    print("%s %s r%d alpha %g: reference loss %.9g, %d adapter tensors, %d dumped"
          % (args.model, "DoRA" if args.dora else "LoRA", args.rank, alpha, loss, len(want),
             len(got)))
    failures = compare_grads.compare(want, got, dtypes, args.rtol)
    if failures:
        print("%d adapter gradient mismatch(es) against the NumPy backward" % failures)
        return 1
    print("all %d adapter gradients match the NumPy backward (rtol %g)" % (len(want), args.rtol))
    return 0


if __name__ == "__main__":
    sys.exit(main())
