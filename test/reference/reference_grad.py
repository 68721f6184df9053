#!/usr/bin/python3
"""test/reference/reference_grad.py - a hand-written NumPy backward of the example models.

Gradients of the mean cross-entropy loss (reference.py's loss) with respect to every parameter
of LlamaForCausalLM and GPT2LMHeadModel as scripts/gen_models.py writes them, by reverse mode
written out op by op: a forward pass that keeps what the backward needs, then the backward in
the opposite order. Independent of the C++ runtime and of reference.py's forward (which
test_reference.py checks this forward against, and whose loss it differentiates numerically to
check these gradients).

Everything is computed in float64 by default; `dtype=np.float32` runs the same arithmetic in
float32 (test_reference.py uses it to measure how far an fp32 implementation drifts, which is
what the tolerances of compare_grads.py and training.test rest on).

Backward of each op (dy: the gradient of the op's result):
  linear        y = x W^T + b:  dx = dy W,  dW = sum over positions of dy^T x,  db = sum dy
  embedding     dtable[v] = sum of dy at the positions whose id is v (scatter-add)
  rms_norm      n = x r, r = 1/sqrt(mean(x^2) + eps), y = n w:
                dw = sum dy n,  dx = r (dn - n mean(dn n)),  dn = dy w
  layer_norm    n = (x - mean) r, r = 1/sqrt(var + eps), y = n w + b:
                dw = sum dy n,  db = sum dy,  dx = r (dn - mean(dn) - n mean(dn n))
  rope          a rotation per pair (i, i + D/2): dx is dy rotated by -angle
  attention     P = softmax(scale q k^T, causal), o = P v:
                dv = P^T do,  dP = do v^T,  dS = P (dP - rowsum(do o)),
                dq = scale dS k,  dk = scale dS^T q;  with GQA, dk and dv of kv head j sum over
                the query heads h with h // (H / KV) = j
  swiglu        y = silu(g) u:  dg = dy u silu'(g),  du = dy silu(g),
                silu'(g) = sigmoid(g) (1 + g (1 - sigmoid(g)))
  gelu (tanh)   y = x/2 (1 + tanh z), z = k (x + 0.044715 x^3), k = sqrt(2/pi):
                dx = dy (1/2 (1 + tanh z) + x/2 (1 - tanh^2 z) k (1 + 3 * 0.044715 x^2))
  cross_entropy dlogits = (softmax(logits) - onehot(label)) / count at the count positions
                whose label is not -100, 0 elsewhere
A parameter used twice (GPT-2's wte: embedding and LM head; a tied Llama's embed_tokens)
receives the sum of both gradients.

    loss, grads = loss_and_grads(arch, c, weights, ids, labels)          # float64
    loss, grads = step_grads("tiny_llama", weights, tokens, window)      # a window of a token file

Command line (writes the reference gradients of one window as F32 or F64 safetensors):
    reference_grad.py --model tiny_llama --weights W.safetensors --data T.tokens \
                      [--window 0] [--out G.safetensors] [--f64]
"""

import argparse
import math
import os
import sys

sys.dont_write_bytecode = True

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference  # noqa: E402
import safetensors_np  # noqa: E402
import tokens_np  # noqa: E402

LLAMA, GPT2, MODELS = reference.LLAMA, reference.GPT2, reference.MODELS
IGNORE_INDEX = reference.IGNORE_INDEX
GELU_K = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715


# ----------------------------------------------------------------------------------------------
# Ops: forward (returning what the backward needs) and backward
# ----------------------------------------------------------------------------------------------

def _rows(t):
    """A tensor [..., n] as a matrix [positions, n]."""
    return t.reshape(-1, t.shape[-1])


def linear_fwd(x, w, b=None):
    """y = x W^T (+ b), W [out, in] (torch.nn.Linear's layout)."""
    y = x @ w.T
    return y if b is None else y + b


def linear_bwd(dy, x, w):
    """(dx, dW, db) of y = x W^T + b."""
    dx = dy @ w
    dw = _rows(dy).T @ _rows(x)
    db = _rows(dy).sum(axis=0)
    return dx, dw, db


def embedding_bwd(dy, ids, vocab):
    """Scatter-add of dy [B, S, D] into the rows of a [vocab, D] table."""
    dtable = np.zeros((vocab, dy.shape[-1]), dtype=dy.dtype)
    np.add.at(dtable, np.asarray(ids).reshape(-1), _rows(dy))
    return dtable


def rms_norm_fwd(x, w, eps):
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    n = x * r
    return n * w, (n, r)


def rms_norm_bwd(dy, w, cache):
    n, r = cache
    dw = _rows(dy * n).sum(axis=0)
    dn = dy * w
    dx = r * (dn - n * np.mean(dn * n, axis=-1, keepdims=True))
    return dx, dw


def layer_norm_fwd(x, w, b, eps):
    mean = np.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    r = 1.0 / np.sqrt(np.mean(centered * centered, axis=-1, keepdims=True) + eps)  # biased var
    n = centered * r
    return n * w + b, (n, r)


def layer_norm_bwd(dy, w, cache):
    n, r = cache
    dw = _rows(dy * n).sum(axis=0)
    db = _rows(dy).sum(axis=0)
    dn = dy * w
    dx = r * (dn - np.mean(dn, axis=-1, keepdims=True)
              - n * np.mean(dn * n, axis=-1, keepdims=True))
    return dx, dw, db


def _rope_tables(S, D, theta, dtype):
    half = D // 2
    inv_freq = theta ** (-2.0 * np.arange(half, dtype=np.float64) / D)
    angle = np.arange(S, dtype=np.float64)[:, None] * inv_freq[None, :]  # [S, D/2]
    cos = np.cos(angle)[None, :, None, :].astype(dtype)  # [1, S, 1, D/2]
    sin = np.sin(angle)[None, :, None, :].astype(dtype)
    return cos, sin


def rope_fwd(x, theta, inverse=False):
    """Hugging Face rotate-half on x [B, S, H, D]; `inverse` rotates by -angle (the adjoint:
    a rotation's transpose is its inverse)."""
    S, D = x.shape[1], x.shape[3]
    cos, sin = _rope_tables(S, D, theta, x.dtype)
    if inverse:
        sin = -sin
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_bwd(dy, theta):
    return rope_fwd(dy, theta, inverse=True)


def _softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _heads(t, KV):
    """[B, S, H, D] -> [B, KV, G, S, D] with query head h = j * G + g (G = H / KV)."""
    B, S, H, D = t.shape
    return t.reshape(B, S, KV, H // KV, D).transpose(0, 2, 3, 1, 4)


def _unheads(t):
    """[B, KV, G, S, D] -> [B, S, KV * G, D]."""
    B, KV, G, S, D = t.shape
    return t.transpose(0, 3, 1, 2, 4).reshape(B, S, KV * G, D)


def attention_fwd(q, k, v, scale, causal=True):
    """q [B, S, H, D], k and v [B, S, KV, D]; query head h = j * G + g reads kv head j
    (G = H / KV). Returns o [B, S, H, D] and the probabilities P [B, KV, G, S, S]."""
    KV = k.shape[2]
    qh, kh, vh = _heads(q, KV), _heads(k, KV), _heads(v, KV)  # kh, vh: [B, KV, 1, S, D]
    scores = (qh @ kh.swapaxes(-1, -2)) * scale  # [B, KV, G, S, S]
    if causal:
        scores = np.where(reference.causal_mask(q.shape[1]), scores, -np.inf)
    p = _softmax(scores)
    return _unheads(p @ vh), p


def attention_bwd(do, q, k, v, o, p, scale):
    """(dq, dk, dv); dk and dv of a kv head sum over the G query heads that read it."""
    KV = k.shape[2]
    qh, kh, vh, doh, oh = (_heads(t, KV) for t in (q, k, v, do, o))
    dv = np.sum(p.swapaxes(-1, -2) @ doh, axis=2, keepdims=True)  # sum over the group
    dp = doh @ vh.swapaxes(-1, -2)  # [B, KV, G, S, S]
    row = np.sum(doh * oh, axis=-1, keepdims=True)  # rowsum(dP * P) = rowsum(dO * O)
    ds = p * (dp - row)  # masked entries have p = 0, hence ds = 0
    dq = (ds @ kh) * scale
    dk = np.sum(ds.swapaxes(-1, -2) @ qh, axis=2, keepdims=True) * scale
    return _unheads(dq), _unheads(dk), _unheads(dv)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def swiglu_fwd(gate, up):
    return gate * _sigmoid(gate) * up


def swiglu_bwd(dy, gate, up):
    s = _sigmoid(gate)
    dgate = dy * up * s * (1.0 + gate * (1.0 - s))
    dup = dy * gate * s
    return dgate, dup


def gelu_fwd(x):
    return 0.5 * x * (1.0 + np.tanh(GELU_K * (x + GELU_C * x * x * x)))


def gelu_bwd(dy, x):
    t = np.tanh(GELU_K * (x + GELU_C * x * x * x))
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x))


def cross_entropy_fwd_bwd(logits, labels, ignore_index=IGNORE_INDEX):
    """(loss, dlogits) of the mean cross-entropy over labels != ignore_index."""
    V = logits.shape[-1]
    flat = _rows(logits)
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    keep = labels != ignore_index
    if ((labels[keep] < 0) | (labels[keep] >= V)).any():
        raise ValueError("label outside [0, %d)" % V)
    count = int(keep.sum())
    dlogits = np.zeros_like(flat)
    if count == 0:
        return float("nan"), dlogits.reshape(logits.shape)
    rows = flat[keep]
    top = np.max(rows, axis=-1, keepdims=True)
    e = np.exp(rows - top)
    z = np.sum(e, axis=-1, keepdims=True)
    picked = np.take_along_axis(rows, labels[keep][:, None], axis=-1)
    loss = float(np.mean(np.log(z) + top - picked, dtype=np.float64))
    d = e / z
    d[np.arange(count), labels[keep]] -= 1.0
    dlogits[keep] = d / count
    return loss, dlogits.reshape(logits.shape)


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------

class Grads(dict):
    """name -> gradient; add() accumulates (a parameter used twice gets both contributions)."""

    def add(self, name, g):
        if name in self:
            self[name] = self[name] + g
        else:
            self[name] = g


def _llama(W, c, ids, labels):
    D, H, KV, eps, theta = c["hidden"], c["heads"], c["kv_heads"], c["eps"], c["rope_theta"]
    hd = D // H
    scale = 1.0 / math.sqrt(hd)
    B, S = ids.shape
    embed = W["model.embed_tokens.weight"]
    x = embed[ids]
    layers = []
    for i in range(c["layers"]):
        p = "model.layers.%d." % i
        s = {"x0": x}
        h, s["ln1"] = rms_norm_fwd(x, W[p + "input_layernorm.weight"], eps)
        s["h1"] = h
        q = linear_fwd(h, W[p + "self_attn.q_proj.weight"]).reshape(B, S, H, hd)
        k = linear_fwd(h, W[p + "self_attn.k_proj.weight"]).reshape(B, S, KV, hd)
        v = linear_fwd(h, W[p + "self_attn.v_proj.weight"]).reshape(B, S, KV, hd)
        s["q"], s["k"], s["v"] = rope_fwd(q, theta), rope_fwd(k, theta), v
        s["o"], s["p"] = attention_fwd(s["q"], s["k"], v, scale, causal=True)
        s["a"] = s["o"].reshape(B, S, H * hd)
        x = x + linear_fwd(s["a"], W[p + "self_attn.o_proj.weight"])
        s["x1"] = x
        h, s["ln2"] = rms_norm_fwd(x, W[p + "post_attention_layernorm.weight"], eps)
        s["h2"] = h
        s["gate"] = linear_fwd(h, W[p + "mlp.gate_proj.weight"])
        s["up"] = linear_fwd(h, W[p + "mlp.up_proj.weight"])
        s["m"] = swiglu_fwd(s["gate"], s["up"])
        x = x + linear_fwd(s["m"], W[p + "mlp.down_proj.weight"])
        layers.append(s)
    hf, lnf = rms_norm_fwd(x, W["model.norm.weight"], eps)
    head_name = "model.embed_tokens.weight" if c["tied"] else "lm_head.weight"
    logits = linear_fwd(hf, W[head_name])
    loss, dlogits = cross_entropy_fwd_bwd(logits, labels)

    g = Grads()
    dhf, dhead, _ = linear_bwd(dlogits, hf, W[head_name])
    g.add(head_name, dhead)
    dx, dw = rms_norm_bwd(dhf, W["model.norm.weight"], lnf)
    g.add("model.norm.weight", dw)
    for i in reversed(range(c["layers"])):
        p, s = "model.layers.%d." % i, layers[i]
        # x2 = x1 + down(swiglu(gate(h2), up(h2))), h2 = rms_norm(x1)
        dm, dw, _ = linear_bwd(dx, s["m"], W[p + "mlp.down_proj.weight"])
        g.add(p + "mlp.down_proj.weight", dw)
        dgate, dup = swiglu_bwd(dm, s["gate"], s["up"])
        dh_g, dw, _ = linear_bwd(dgate, s["h2"], W[p + "mlp.gate_proj.weight"])
        g.add(p + "mlp.gate_proj.weight", dw)
        dh_u, dw, _ = linear_bwd(dup, s["h2"], W[p + "mlp.up_proj.weight"])
        g.add(p + "mlp.up_proj.weight", dw)
        dx1_norm, dw = rms_norm_bwd(dh_g + dh_u, W[p + "post_attention_layernorm.weight"],
                                    s["ln2"])
        g.add(p + "post_attention_layernorm.weight", dw)
        dx = dx + dx1_norm  # the residual and the norm both read x1
        # x1 = x0 + o_proj(attention(rope(q(h1)), rope(k(h1)), v(h1))), h1 = rms_norm(x0)
        da, dw, _ = linear_bwd(dx, s["a"], W[p + "self_attn.o_proj.weight"])
        g.add(p + "self_attn.o_proj.weight", dw)
        dq, dk, dv = attention_bwd(da.reshape(B, S, H, hd), s["q"], s["k"], s["v"], s["o"],
                                   s["p"], scale)
        dq, dk = rope_bwd(dq, theta), rope_bwd(dk, theta)
        dh = 0
        for name, dproj in (("q_proj", dq), ("k_proj", dk), ("v_proj", dv)):
            dh_j, dw, _ = linear_bwd(dproj.reshape(B, S, -1), s["h1"],
                                     W[p + "self_attn.%s.weight" % name])
            g.add(p + "self_attn.%s.weight" % name, dw)
            dh = dh + dh_j
        dx0_norm, dw = rms_norm_bwd(dh, W[p + "input_layernorm.weight"], s["ln1"])
        g.add(p + "input_layernorm.weight", dw)
        dx = dx + dx0_norm
    g.add("model.embed_tokens.weight", embedding_bwd(dx, ids, embed.shape[0]))
    return loss, g


def _gpt2(W, c, ids, labels):
    D, H, eps = c["hidden"], c["heads"], c["eps"]
    hd = D // H
    scale = 1.0 / math.sqrt(hd)
    B, S = ids.shape
    if S > c["positions"]:
        raise ValueError("sequence %d longer than the %d learned positions" % (S, c["positions"]))
    wte, wpe = W["transformer.wte.weight"], W["transformer.wpe.weight"]

    def conv1d(inp, name):  # GPT-2's Conv1D: weight [in, out], y = x W + b
        return linear_fwd(inp, W[name + ".weight"].T, W[name + ".bias"])

    def conv1d_bwd(dy, inp, name, g):
        dx, dwt, db = linear_bwd(dy, inp, W[name + ".weight"].T)
        g.add(name + ".weight", dwt.T)
        g.add(name + ".bias", db)
        return dx

    x = wte[ids] + wpe[:S]
    layers = []
    for i in range(c["layers"]):
        p = "transformer.h.%d." % i
        s = {}
        s["h1"], s["ln1"] = layer_norm_fwd(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = conv1d(s["h1"], p + "attn.c_attn")
        s["q"], s["k"], s["v"] = (qkv[..., j * D:(j + 1) * D].reshape(B, S, H, hd)
                                  for j in range(3))
        s["o"], s["p"] = attention_fwd(s["q"], s["k"], s["v"], scale, causal=True)
        s["a"] = s["o"].reshape(B, S, D)
        x = x + conv1d(s["a"], p + "attn.c_proj")
        s["h2"], s["ln2"] = layer_norm_fwd(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        s["fc"] = conv1d(s["h2"], p + "mlp.c_fc")
        s["act"] = gelu_fwd(s["fc"])
        x = x + conv1d(s["act"], p + "mlp.c_proj")
        layers.append(s)
    hf, lnf = layer_norm_fwd(x, W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    logits = linear_fwd(hf, wte)  # the LM head is tied to the token embedding
    loss, dlogits = cross_entropy_fwd_bwd(logits, labels)

    g = Grads()
    dhf, dwte_head, _ = linear_bwd(dlogits, hf, wte)
    g.add("transformer.wte.weight", dwte_head)
    dx, dw, db = layer_norm_bwd(dhf, W["transformer.ln_f.weight"], lnf)
    g.add("transformer.ln_f.weight", dw)
    g.add("transformer.ln_f.bias", db)
    for i in reversed(range(c["layers"])):
        p, s = "transformer.h.%d." % i, layers[i]
        dact = conv1d_bwd(dx, s["act"], p + "mlp.c_proj", g)
        dh2 = conv1d_bwd(gelu_bwd(dact, s["fc"]), s["h2"], p + "mlp.c_fc", g)
        dxn, dw, db = layer_norm_bwd(dh2, W[p + "ln_2.weight"], s["ln2"])
        g.add(p + "ln_2.weight", dw)
        g.add(p + "ln_2.bias", db)
        dx = dx + dxn
        da = conv1d_bwd(dx, s["a"], p + "attn.c_proj", g)
        dq, dk, dv = attention_bwd(da.reshape(B, S, H, hd), s["q"], s["k"], s["v"], s["o"],
                                   s["p"], scale)
        dqkv = np.concatenate([t.reshape(B, S, D) for t in (dq, dk, dv)], axis=-1)
        dh1 = conv1d_bwd(dqkv, s["h1"], p + "attn.c_attn", g)
        dxn, dw, db = layer_norm_bwd(dh1, W[p + "ln_1.weight"], s["ln1"])
        g.add(p + "ln_1.weight", dw)
        g.add(p + "ln_1.bias", db)
        dx = dx + dxn
    dwpe = np.zeros_like(wpe)
    dwpe[:S] = dx.sum(axis=0)  # the positions broadcast over the batch
    g.add("transformer.wpe.weight", dwpe)
    g.add("transformer.wte.weight", embedding_bwd(dx, ids, wte.shape[0]))  # both uses add up
    return loss, g


def loss_and_grads(arch, c, weights, ids, labels, dtype=np.float64):
    """(loss, {name: gradient}) of the mean loss of one batch; gradients have the parameters'
    shapes and `dtype`. Every parameter of reference.param_shapes gets a gradient."""
    weights = reference.normalize_names(arch, weights)
    reference.check_weights(arch, c, weights)
    shapes = reference.param_shapes(arch, c)
    W = {name: np.asarray(weights[name]).astype(dtype) for name in shapes}
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= c["vocab"]):
        raise ValueError("token id outside [0, %d)" % c["vocab"])
    loss, g = (_llama if arch == LLAMA else _gpt2)(W, c, ids, labels)
    missing = sorted(set(shapes) - set(g))
    if missing or set(g) - set(shapes):
        raise AssertionError("gradients for %s, missing %s" % (sorted(set(g) - set(shapes)),
                                                              missing))
    return loss, {name: np.asarray(g[name], dtype=dtype).reshape(shapes[name])
                  for name in shapes}


def step_grads(name, weights, tokens, window, batch=None, seq=None, dtype=np.float64):
    """(loss, grads) of token window `window` (tokens_np.batch's step index) for a named model."""
    arch, c = MODELS[name]
    ids, labels = tokens_np.batch(tokens, window, batch or c["batch"], seq or c["seq"])
    return loss_and_grads(arch, c, weights, ids, labels, dtype)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, choices=sorted(MODELS))
    parser.add_argument("--weights", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--window", type=int, default=0,
                        help="token window index (tokens_np.batch's step, from 0)")
    parser.add_argument("--batch", type=int)
    parser.add_argument("--seq", type=int)
    parser.add_argument("--out", help="write the gradients to this .safetensors file")
    parser.add_argument("--f64", action="store_true", help="write F64 instead of F32")
    args = parser.parse_args(argv)
    loss, grads = step_grads(args.model, reference.load_weights(args.weights),
                             tokens_np.read(args.data), args.window, args.batch, args.seq)
    print("loss %.9g" % loss)
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
    print("grad_norm %.9g" % norm)
    if args.out:
        out = grads if args.f64 else {k: v.astype(np.float32) for k, v in grads.items()}
        safetensors_np.write(args.out, out, metadata={"generator": "reference_grad.py",
                                                      "model": args.model,
                                                      "window": str(args.window)})
        print("wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
