#!/usr/bin/python3
"""test/reference/reference.py - a NumPy reference of the example models' forward loss.

Implements LlamaForCausalLM and GPT2LMHeadModel as scripts/gen_models.py writes them in the
bonsai dialect, from a dict of weights under their Hugging Face names, independently of the C++
runtime. Everything is computed in float64 (weights are widened exactly from their stored
type), so the result is an accurate value of the loss the fp32 runtime approximates.

Op semantics (those of the bonsai dialect and runtime/include/bonsai/runtime/CpuKernels.h):
  linear        y = x W^T (+ b), W [out, in]; GPT-2's Conv1D weights [in, out] are transposed
  rms_norm      x / sqrt(mean(x^2) + eps) * w
  layer_norm    (x - mean) / sqrt(var + eps) * w + b, biased variance
  rope          Hugging Face rotate-half: position s of the sequence (0-based in every batch row),
                angle_i = s * theta^(-2i/D), pairs (i, i + D/2)
  attention     softmax(scale q k^T, causal) v; query head h reads kv head h // (H / KV)
  swiglu        silu(gate) * up
  gelu (tanh)   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  cross_entropy mean of -log softmax(logits)[label] over labels != -100 (NaN if none)
Labels are already shifted (the data loader's labels[t] = tokens[t + 1]); nothing shifts here.

Command line (the batch of a step is that of test/reference/tokens_np.py):
    reference.py --model tiny_llama --weights W.safetensors --data tokens.bin \
                 [--batch 4 --seq 64] [--step S]          # prints "loss <%.9g>"
S counts batches from 0; bonsai-run prints its steps from 1 (its "step n" reads batch n - 1).
"""

import argparse
import importlib.util
import math
import os
import sys

sys.dont_write_bytecode = True  # keep the source tree free of __pycache__

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import safetensors_np  # noqa: E402
import tokens_np  # noqa: E402

IGNORE_INDEX = -100


def load_gen_models():
    """scripts/gen_models.py as a module (its MODELS dict is the source of every config)."""
    path = os.path.join(REPO, "scripts", "gen_models.py")
    spec = importlib.util.spec_from_file_location("gen_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_models = load_gen_models()
MODELS = gen_models.MODELS
LLAMA, GPT2 = gen_models.LLAMA, gen_models.GPT2


# ----------------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------------

def param_shapes(arch, c):
    """Hugging Face name -> shape of every parameter of a model, in graph order."""
    D, V, L = c["hidden"], c["vocab"], c["layers"]
    shapes = {}
    if arch == LLAMA:
        hd = D // c["heads"]
        q_out, kv_out, inter = c["heads"] * hd, c["kv_heads"] * hd, c["intermediate"]
        shapes["model.embed_tokens.weight"] = (V, D)
        for i in range(L):
            p = "model.layers.%d." % i
            shapes[p + "input_layernorm.weight"] = (D,)
            shapes[p + "self_attn.q_proj.weight"] = (q_out, D)
            shapes[p + "self_attn.k_proj.weight"] = (kv_out, D)
            shapes[p + "self_attn.v_proj.weight"] = (kv_out, D)
            shapes[p + "self_attn.o_proj.weight"] = (D, q_out)
            shapes[p + "post_attention_layernorm.weight"] = (D,)
            shapes[p + "mlp.gate_proj.weight"] = (inter, D)
            shapes[p + "mlp.up_proj.weight"] = (inter, D)
            shapes[p + "mlp.down_proj.weight"] = (D, inter)
        shapes["model.norm.weight"] = (D,)
        if not c["tied"]:
            shapes["lm_head.weight"] = (V, D)
    elif arch == GPT2:
        shapes["transformer.wte.weight"] = (V, D)
        shapes["transformer.wpe.weight"] = (c["positions"], D)
        for i in range(L):
            p = "transformer.h.%d." % i
            shapes[p + "ln_1.weight"] = (D,)
            shapes[p + "ln_1.bias"] = (D,)
            shapes[p + "attn.c_attn.weight"] = (D, 3 * D)
            shapes[p + "attn.c_attn.bias"] = (3 * D,)
            shapes[p + "attn.c_proj.weight"] = (D, D)
            shapes[p + "attn.c_proj.bias"] = (D,)
            shapes[p + "ln_2.weight"] = (D,)
            shapes[p + "ln_2.bias"] = (D,)
            shapes[p + "mlp.c_fc.weight"] = (D, 4 * D)
            shapes[p + "mlp.c_fc.bias"] = (4 * D,)
            shapes[p + "mlp.c_proj.weight"] = (4 * D, D)
            shapes[p + "mlp.c_proj.bias"] = (D,)
        shapes["transformer.ln_f.weight"] = (D,)
        shapes["transformer.ln_f.bias"] = (D,)
    else:
        raise ValueError("unknown architecture %r" % (arch,))
    return shapes


def check_weights(arch, c, weights):
    """Raises if a parameter is missing or has the wrong shape (extra tensors are ignored)."""
    problems = []
    for name, shape in param_shapes(arch, c).items():
        if name not in weights:
            problems.append("missing %s" % name)
        elif tuple(np.shape(weights[name])) != tuple(shape):
            problems.append("%s has shape %s, expected %s"
                            % (name, tuple(np.shape(weights[name])), tuple(shape)))
    if problems:
        raise ValueError("weights do not fit the model: " + "; ".join(problems))


def _w(weights, name):
    return np.asarray(weights[name], dtype=np.float64)


# ----------------------------------------------------------------------------------------------
# Ops, float64
# ----------------------------------------------------------------------------------------------

def linear(x, w, b=None):
    """x [..., in], w [out, in] (torch.nn.Linear's layout), b [out]."""
    y = x @ w.T
    return y if b is None else y + b


def rms_norm(x, w, eps):
    mean_square = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(mean_square + eps) * w


def layer_norm(x, w, b, eps):
    mean = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)  # biased, as torch.nn.LayerNorm
    return (x - mean) / np.sqrt(var + eps) * w + b


def rope(x, theta):
    """x [B, S, H, D]; position s of each row rotated as LlamaRotaryEmbedding (rotate half)."""
    S, D = x.shape[1], x.shape[3]
    half = D // 2
    inv_freq = theta ** (-2.0 * np.arange(half, dtype=np.float64) / D)  # [D/2]
    angle = np.arange(S, dtype=np.float64)[:, None] * inv_freq[None, :]  # [S, D/2]
    cos = np.cos(angle)[None, :, None, :]  # [1, S, 1, D/2]
    sin = np.sin(angle)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def softmax(x, axis=-1):
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def causal_mask(S):
    """[S, S] boolean: True where key t may be seen from query s (t <= s)."""
    return np.tril(np.ones((S, S), dtype=bool))


def attention(q, k, v, scale, causal=True):
    """Grouped-query attention, one query head at a time. q [B, S, H, D]; k, v [B, S, KV, D]
    with H a multiple of KV; query head h reads kv head h // (H // KV)."""
    B, S, H, D = q.shape
    KV = k.shape[2]
    if H % KV:
        raise ValueError("%d query heads are not a multiple of %d kv heads" % (H, KV))
    group = H // KV
    allowed = causal_mask(S) if causal else np.ones((S, S), dtype=bool)
    out = np.empty((B, S, H, v.shape[3]), dtype=np.float64)
    for h in range(H):
        j = h // group
        scores = np.einsum("bsd,btd->bst", q[:, :, h, :], k[:, :, j, :]) * scale
        scores = np.where(allowed[None], scores, -np.inf)
        out[:, :, h, :] = np.einsum("bst,btd->bsd", softmax(scores), v[:, :, j, :])
    return out


def attention_mha(q, k, v, scale, causal=True):
    """Multi-head attention with as many kv heads as query heads, all heads at once."""
    qh, kh, vh = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # [B, H, S, D]
    scores = (qh @ kh.transpose(0, 1, 3, 2)) * scale  # [B, H, S, S]
    if causal:
        S = q.shape[1]
        scores = scores + np.where(causal_mask(S), 0.0, -np.inf)
    return (softmax(scores) @ vh).transpose(0, 2, 1, 3)


def silu(x):
    return x / (1.0 + np.exp(-x))


def swiglu(gate, up):
    return silu(gate) * up


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def cross_entropy(logits, labels, ignore_index=IGNORE_INDEX):
    """Mean over labels != ignore_index of -log softmax(logits)[label]; NaN when all ignored."""
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    keep = labels != ignore_index
    bad = keep & ((labels < 0) | (labels >= V))
    if bad.any():
        raise ValueError("label %d outside [0, %d)" % (labels[bad][0], V))
    if not keep.any():
        return float("nan")
    rows = flat[keep]
    top = np.max(rows, axis=-1)
    log_z = top + np.log(np.sum(np.exp(rows - top[:, None]), axis=-1))
    picked = rows[np.arange(rows.shape[0]), labels[keep]]
    return float(np.mean(log_z - picked))


def embedding(table, ids):
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise ValueError("token id outside [0, %d)" % table.shape[0])
    return table[ids]


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------

def llama_logits(weights, c, ids):
    D, H, KV = c["hidden"], c["heads"], c["kv_heads"]
    hd, eps, theta = D // H, c["eps"], c["rope_theta"]
    B, S = np.shape(ids)
    embed = _w(weights, "model.embed_tokens.weight")
    x = embedding(embed, ids)
    for i in range(c["layers"]):
        p = "model.layers.%d." % i
        h = rms_norm(x, _w(weights, p + "input_layernorm.weight"), eps)
        q = linear(h, _w(weights, p + "self_attn.q_proj.weight")).reshape(B, S, H, hd)
        k = linear(h, _w(weights, p + "self_attn.k_proj.weight")).reshape(B, S, KV, hd)
        v = linear(h, _w(weights, p + "self_attn.v_proj.weight")).reshape(B, S, KV, hd)
        a = attention(rope(q, theta), rope(k, theta), v, 1.0 / math.sqrt(hd), causal=True)
        x = x + linear(a.reshape(B, S, H * hd), _w(weights, p + "self_attn.o_proj.weight"))
        h = rms_norm(x, _w(weights, p + "post_attention_layernorm.weight"), eps)
        m = swiglu(linear(h, _w(weights, p + "mlp.gate_proj.weight")),
                   linear(h, _w(weights, p + "mlp.up_proj.weight")))
        x = x + linear(m, _w(weights, p + "mlp.down_proj.weight"))
    h = rms_norm(x, _w(weights, "model.norm.weight"), eps)
    head = embed if c["tied"] else _w(weights, "lm_head.weight")
    return linear(h, head)


def gpt2_logits(weights, c, ids):
    D, H, eps = c["hidden"], c["heads"], c["eps"]
    hd = D // H
    B, S = np.shape(ids)
    if S > c["positions"]:
        raise ValueError("sequence %d longer than the %d learned positions" % (S, c["positions"]))
    wte = _w(weights, "transformer.wte.weight")
    x = embedding(wte, ids) + _w(weights, "transformer.wpe.weight")[:S]

    def conv1d(inp, name):  # GPT-2's Conv1D: weight [in, out], y = x W + b
        return linear(inp, _w(weights, name + ".weight").T, _w(weights, name + ".bias"))

    for i in range(c["layers"]):
        p = "transformer.h.%d." % i
        h = layer_norm(x, _w(weights, p + "ln_1.weight"), _w(weights, p + "ln_1.bias"), eps)
        qkv = conv1d(h, p + "attn.c_attn")
        q, k, v = (qkv[..., j * D:(j + 1) * D].reshape(B, S, H, hd) for j in range(3))
        a = attention_mha(q, k, v, 1.0 / math.sqrt(hd), causal=True)
        x = x + conv1d(a.reshape(B, S, D), p + "attn.c_proj")
        h = layer_norm(x, _w(weights, p + "ln_2.weight"), _w(weights, p + "ln_2.bias"), eps)
        x = x + conv1d(gelu_tanh(conv1d(h, p + "mlp.c_fc")), p + "mlp.c_proj")
    h = layer_norm(x, _w(weights, "transformer.ln_f.weight"), _w(weights, "transformer.ln_f.bias"),
                   eps)
    return linear(h, wte)  # tied to the token embedding


def normalize_names(arch, weights):
    """Hugging Face's GPT-2 checkpoints name tensors without the "transformer." prefix of
    GPT2LMHeadModel ("h.0.attn.c_attn.weight", "wte.weight"): accept both spellings."""
    if arch != GPT2 or "transformer.wte.weight" in weights or "wte.weight" not in weights:
        return weights
    return {("transformer." + k if not k.startswith("lm_head.") else k): v
            for k, v in weights.items()}


def logits(arch, c, weights, ids):
    """Logits [B, S, vocab] in float64."""
    weights = normalize_names(arch, weights)
    check_weights(arch, c, weights)
    return (llama_logits if arch == LLAMA else gpt2_logits)(weights, c, ids)


def loss(arch, c, weights, ids, labels, ignore_index=IGNORE_INDEX):
    """The scalar loss of the model's graph, as a Python float (float64)."""
    return cross_entropy(logits(arch, c, weights, ids), labels, ignore_index)


def model_loss(name, weights, ids, labels):
    arch, c = MODELS[name]
    return loss(arch, c, weights, ids, labels)


def step_loss(name, weights, tokens, step, batch=None, seq=None):
    """The loss of `step`'s batch of a token array (tokens_np.batch) for a named model."""
    arch, c = MODELS[name]
    ids, labels = tokens_np.batch(tokens, step, batch or c["batch"], seq or c["seq"])
    return loss(arch, c, weights, ids, labels)


def load_weights(path):
    """Weights of a .safetensors file or a sharded .index.json, as float64."""
    return safetensors_np.load_float(path, out=np.float64)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--weights", required=True,
                        help="a .safetensors file or a sharded model.safetensors.index.json")
    parser.add_argument("--data", required=True, help="token file (BONSAITK)")
    parser.add_argument("--batch", type=int, help="default: the model's configured batch")
    parser.add_argument("--seq", type=int, help="default: the model's configured sequence")
    parser.add_argument("--step", type=int, default=0,
                        help="batch index s of the token file, from 0 (bonsai-run's 'step n' "
                             "line is s = n - 1)")
    args = parser.parse_args(argv)
    weights = load_weights(args.weights)
    tokens = tokens_np.read(args.data)
    value = step_loss(args.model, weights, tokens, args.step, args.batch, args.seq)
    print("loss %.9g" % value)
    return 0


if __name__ == "__main__":
    sys.exit(main())
