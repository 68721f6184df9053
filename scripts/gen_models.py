#!/usr/bin/env python3
"""scripts/gen_models.py - write the example models of examples/models/ in the bonsai dialect.

Each model is a Hugging Face architecture (LlamaForCausalLM or GPT2LMHeadModel) at a fixed batch
and sequence length, written as `func.func @forward(%ids, %labels) -> tensor<f32>` with every
parameter under its checkpoint name. The configurations below are the published ones
(config.json of each checkpoint); only batch and sequence length are choices.

    scripts/gen_models.py                 # (re)write every model into examples/models/
    scripts/gen_models.py --check         # fail if a committed file differs from the generator
    scripts/gen_models.py --print NAME    # write one model to standard output
    scripts/gen_models.py --print NAME --packed   # ... taking packed rows (Llama only):
        @forward(%ids, %labels, %positions, %segment_ids), rope reading the positions and
        attention the segment ids (docs/training.md, "Packed sequences")

Uses only the Python standard library.
"""

import argparse
import math
import os
import sys

LLAMA = "llama"
GPT2 = "gpt2"

# name: (architecture, config)
MODELS = {
    # Trains on a laptop CPU in seconds (issue: 2 layers, hidden 64, 4 / 2 heads, vocab 256).
    "tiny_llama": (LLAMA, dict(vocab=256, hidden=64, layers=2, heads=4, kv_heads=2,
                               intermediate=176, rope_theta=10000.0, eps=1e-5, tied=False,
                               batch=4, seq=64, dtype="f32")),
    "tiny_gpt2": (GPT2, dict(vocab=256, hidden=64, layers=2, heads=4, positions=64,
                             eps=1e-5, batch=4, seq=64, dtype="f32")),
    # The benchmark shape of the CUDA backend issue (hidden 768, 12 layers, MLP 2048).
    "llama_124m": (LLAMA, dict(vocab=32000, hidden=768, layers=12, heads=12, kv_heads=12,
                               intermediate=2048, rope_theta=10000.0, eps=1e-5, tied=False,
                               batch=16, seq=1024, dtype="bf16")),
    "tinyllama_1_1b": (LLAMA, dict(vocab=32000, hidden=2048, layers=22, heads=32, kv_heads=4,
                                   intermediate=5632, rope_theta=10000.0, eps=1e-5,
                                   tied=False, batch=4, seq=2048, dtype="bf16")),
    "llama2_7b": (LLAMA, dict(vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32,
                              intermediate=11008, rope_theta=10000.0, eps=1e-5, tied=False,
                              batch=1, seq=2048, dtype="bf16")),
    "llama3_8b": (LLAMA, dict(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8,
                              intermediate=14336, rope_theta=500000.0, eps=1e-5, tied=False,
                              batch=1, seq=8192, dtype="bf16")),
    "gpt2_124m": (GPT2, dict(vocab=50257, hidden=768, layers=12, heads=12, positions=1024,
                             eps=1e-5, batch=16, seq=1024, dtype="bf16")),
}


def tensor(shape, dtype):
    return "tensor<" + "x".join(str(d) for d in shape) + ("x" if shape else "") + dtype + ">"


def f64(value):
    """An f64 attribute value as MLIR prints it (round-trips exactly)."""
    return "%.6e" % value if value == float("%.6e" % value) else repr(value)


class Emitter:
    """Writes SSA lines with readable value names."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.lines = []

    def op(self, name, text):
        self.lines.append("  %%%s = %s" % (name, text))
        return "%" + name

    def param(self, name, hf_name, shape, trainable=True):
        kind = "trainable" if trainable else "frozen"
        return self.op(name, 'bonsai.param "%s" %s : %s' % (hf_name, kind,
                                                            tensor(shape, self.dtype)))

    def compute(self, name, opname, operands, in_types, out_type, attrs=""):
        attrs = (" {" + attrs + "}") if attrs else ""
        return self.op(name, "bonsai.%s %s%s : (%s) -> %s" % (
            opname, ", ".join(operands), attrs, ", ".join(in_types), out_type))


def llama(c, packed=False):
    B, S, D, V = c["batch"], c["seq"], c["hidden"], c["vocab"]
    H, KV, I, dt = c["heads"], c["kv_heads"], c["intermediate"], c["dtype"]
    hd = D // H
    e = Emitter(dt)
    x_t = tensor([B, S, D], dt)
    ids_t = tensor([B, S], "i32")
    emb = e.param("embed", "model.embed_tokens.weight", [V, D])
    x = e.compute("h", "embedding", [emb, "%ids"], [tensor([V, D], dt), ids_t], x_t)
    vec_t = tensor([D], dt)
    eps = "epsilon = %s : f64" % f64(c["eps"])
    rope = "theta = %s : f64" % f64(c["rope_theta"])
    scale = "causal, scale = %s : f64" % f64(1.0 / math.sqrt(hd))
    for i in range(c["layers"]):
        p = "model.layers.%d." % i
        n = "l%d_" % i

        def linear(name, inp, in_t, hf, out_f, in_f):
            w = e.param(n + name + "_w", p + hf + ".weight", [out_f, in_f])
            return e.compute(n + name, "linear", [inp, w], [in_t, tensor([out_f, in_f], dt)],
                             tensor([B, S, out_f], dt))

        w = e.param(n + "ln1_w", p + "input_layernorm.weight", [D])
        h = e.compute(n + "ln1", "rms_norm", [x, w], [x_t, vec_t], x_t, eps)
        q = linear("q", h, x_t, "self_attn.q_proj", H * hd, D)
        k = linear("k", h, x_t, "self_attn.k_proj", KV * hd, D)
        v = linear("v", h, x_t, "self_attn.v_proj", KV * hd, D)
        q4_t, kv4_t = tensor([B, S, H, hd], dt), tensor([B, S, KV, hd], dt)
        q = e.compute(n + "q4", "reshape", [q], [tensor([B, S, H * hd], dt)], q4_t)
        k = e.compute(n + "k4", "reshape", [k], [tensor([B, S, KV * hd], dt)], kv4_t)
        v = e.compute(n + "v4", "reshape", [v], [tensor([B, S, KV * hd], dt)], kv4_t)
        if packed:
            # Packed rows: positions restart per document, attention stays inside it.
            q = e.compute(n + "qr", "rope", [q, "%positions"], [q4_t, ids_t], q4_t, rope)
            k = e.compute(n + "kr", "rope", [k, "%positions"], [kv4_t, ids_t], kv4_t, rope)
            a = e.compute(n + "attn", "attention", [q, k, v, "%segment_ids"],
                          [q4_t, kv4_t, kv4_t, ids_t], q4_t, scale)
        else:
            q = e.compute(n + "qr", "rope", [q], [q4_t], q4_t, rope)
            k = e.compute(n + "kr", "rope", [k], [kv4_t], kv4_t, rope)
            a = e.compute(n + "attn", "attention", [q, k, v], [q4_t, kv4_t, kv4_t], q4_t,
                          scale)
        a = e.compute(n + "attn2", "reshape", [a], [q4_t], tensor([B, S, H * hd], dt))
        o = linear("o", a, tensor([B, S, H * hd], dt), "self_attn.o_proj", D, H * hd)
        x = e.compute(n + "res1", "add", [x, o], [x_t, x_t], x_t)
        w = e.param(n + "ln2_w", p + "post_attention_layernorm.weight", [D])
        h = e.compute(n + "ln2", "rms_norm", [x, w], [x_t, vec_t], x_t, eps)
        g = linear("gate", h, x_t, "mlp.gate_proj", I, D)
        u = linear("up", h, x_t, "mlp.up_proj", I, D)
        i_t = tensor([B, S, I], dt)
        m = e.compute(n + "act", "swiglu", [g, u], [i_t, i_t], i_t)
        d = linear("down", m, i_t, "mlp.down_proj", D, I)
        x = e.compute(n + "res2", "add", [x, d], [x_t, x_t], x_t)
    w = e.param("norm_w", "model.norm.weight", [D])
    h = e.compute("norm", "rms_norm", [x, w], [x_t, vec_t], x_t, eps)
    head = emb if c["tied"] else e.param("lm_head", "lm_head.weight", [V, D])
    logits_t = tensor([B, S, V], dt)
    logits = e.compute("logits", "linear", [h, head], [x_t, tensor([V, D], dt)], logits_t)
    e.compute("loss", "cross_entropy", ["%s" % logits, "%labels"], [logits_t, ids_t],
              "tensor<f32>")
    return e.lines, ids_t


def gpt2(c):
    B, S, D, V, H, P, dt = (c["batch"], c["seq"], c["hidden"], c["vocab"], c["heads"],
                            c["positions"], c["dtype"])
    hd = D // H
    e = Emitter(dt)
    x_t, ids_t, vec_t = tensor([B, S, D], dt), tensor([B, S], "i32"), tensor([D], dt)
    wte = e.param("wte", "transformer.wte.weight", [V, D])
    wpe = e.param("wpe", "transformer.wpe.weight", [P, D])
    tok = e.compute("tok", "embedding", [wte, "%ids"], [tensor([V, D], dt), ids_t], x_t)
    pos = e.compute("pos", "slice", [wpe], [tensor([P, D], dt)], tensor([S, D], dt),
                    "axis = 0 : i64, start = 0 : i64")
    x = e.compute("h", "add", [tok, pos], [x_t, tensor([S, D], dt)], x_t)
    eps = "epsilon = %s : f64" % f64(c["eps"])
    scale = "causal, scale = %s : f64" % f64(1.0 / math.sqrt(hd))
    for i in range(c["layers"]):
        p = "transformer.h.%d." % i
        n = "l%d_" % i

        def layer_norm(name, inp, hf):
            w = e.param(n + name + "_w", p + hf + ".weight", [D])
            b = e.param(n + name + "_b", p + hf + ".bias", [D])
            return e.compute(n + name, "layer_norm", [inp, w, b], [x_t, vec_t, vec_t], x_t, eps)

        def conv1d(name, inp, hf, in_f, out_f):
            # GPT-2's Conv1D stores its weight as [in, out]: transpose to linear's [out, in].
            w = e.param(n + name + "_w", p + hf + ".weight", [in_f, out_f])
            b = e.param(n + name + "_b", p + hf + ".bias", [out_f])
            wt = e.compute(n + name + "_wt", "transpose", [w], [tensor([in_f, out_f], dt)],
                           tensor([out_f, in_f], dt), "permutation = array<i64: 1, 0>")
            return e.compute(n + name, "linear", [inp, wt, b],
                             [tensor([B, S, in_f], dt), tensor([out_f, in_f], dt),
                              tensor([out_f], dt)], tensor([B, S, out_f], dt))

        h = layer_norm("ln1", x, "ln_1")
        qkv = conv1d("qkv", h, "attn.c_attn", D, 3 * D)
        h4_t = tensor([B, S, H, hd], dt)
        heads = []
        for j, part in enumerate("qkv"):
            t = e.compute(n + part, "slice", [qkv], [tensor([B, S, 3 * D], dt)], x_t,
                          "axis = 2 : i64, start = %d : i64" % (j * D))
            heads.append(e.compute(n + part + "4", "reshape", [t], [x_t], h4_t))
        a = e.compute(n + "attn", "attention", heads, [h4_t] * 3, h4_t, scale)
        a = e.compute(n + "attn2", "reshape", [a], [h4_t], x_t)
        o = conv1d("proj", a, "attn.c_proj", D, D)
        x = e.compute(n + "res1", "add", [x, o], [x_t, x_t], x_t)
        h = layer_norm("ln2", x, "ln_2")
        f = conv1d("fc", h, "mlp.c_fc", D, 4 * D)
        f_t = tensor([B, S, 4 * D], dt)
        g = e.compute(n + "gelu", "gelu", [f], [f_t], f_t,
                      "approximation = #bonsai.gelu_approximation<tanh>")
        m = conv1d("mlp", g, "mlp.c_proj", 4 * D, D)
        x = e.compute(n + "res2", "add", [x, m], [x_t, x_t], x_t)
    w = e.param("lnf_w", "transformer.ln_f.weight", [D])
    b = e.param("lnf_b", "transformer.ln_f.bias", [D])
    h = e.compute("lnf", "layer_norm", [x, w, b], [x_t, vec_t, vec_t], x_t, eps)
    # GPT-2 ties the output projection to the token embedding.
    logits_t = tensor([B, S, V], dt)
    logits = e.compute("logits", "linear", [h, wte], [x_t, tensor([V, D], dt)], logits_t)
    e.compute("loss", "cross_entropy", [logits, "%labels"], [logits_t, ids_t], "tensor<f32>")
    return e.lines, ids_t


def render(name, overrides=None, packed=False):
    """The model file of `name`; `overrides` (config key -> value) change its config, for
    benchmarks that need another batch, sequence or layer count of the same shape. `packed`:
    the four-argument function of packed rows (Llama only)."""
    arch, c = MODELS[name]
    if packed and arch != LLAMA:
        raise SystemExit("gen_models.py: --packed needs rope (a Llama model); %s's learned "
                         "positions do not restart per document" % name)
    c = dict(c)
    for key, value in (overrides or {}).items():
        if key not in c:
            raise SystemExit("gen_models.py: %s has no config key '%s' (keys: %s)"
                             % (name, key, ", ".join(c)))
        c[key] = type(c[key])(value) if not isinstance(c[key], bool) else value == "True"
    lines, ids_t = llama(c, packed) if arch == LLAMA else gpt2(c)
    config = ", ".join("%s=%s" % kv for kv in c.items())
    out = [
        "// %s - %s forward pass and loss, batch %d, sequence %d, %s."
        % ("examples/models/%s.mlir" % name if not overrides else
           "%s with %s" % (name, ", ".join("%s=%s" % kv for kv in overrides.items())),
           "LlamaForCausalLM" if arch == LLAMA else "GPT2LMHeadModel", c["batch"],
           c["seq"], c["dtype"]),
        "//",
        "// Generated by scripts/gen_models.py; do not edit by hand.",
        "// Config: %s" % config,
        "// Inspect: bonsai-opt --bonsai-print-cost examples/models/%s.mlir -o /dev/null" % name,
        "",
        "func.func @forward(%%ids: %s, %%labels: %s) -> tensor<f32> {" % (ids_t, ids_t),
    ]
    if packed:
        out[0] = out[0].replace(" forward pass", " packed-row forward pass")
        out[-1] = ("func.func @forward(%%ids: %s, %%labels: %s, %%positions: %s, "
                   "%%segment_ids: %s) -> tensor<f32> {" % (ids_t, ids_t, ids_t, ids_t))
    out += lines
    out.append("  return %loss : tensor<f32>")
    out.append("}")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare the committed files with the generator's output")
    parser.add_argument("--print", metavar="NAME", choices=sorted(MODELS),
                        help="write one model to standard output")
    parser.add_argument("--packed", action="store_true",
                        help="with --print: the packed-row function (positions, segment ids)")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="with --print: override a config value (layers=8, seq=4096, ...)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..",
                                                      "examples", "models"))
    args = parser.parse_args()
    if args.set and not args.print:
        parser.error("--set needs --print")
    if args.packed and not args.print:
        parser.error("--packed needs --print")
    if args.print:
        overrides = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                parser.error("--set takes KEY=VALUE, got '%s'" % item)
            overrides[key] = value
        sys.stdout.write(render(args.print, overrides, args.packed))
        return 0
    stale = []
    for name in sorted(MODELS):
        path = os.path.join(args.out, name + ".mlir")
        text = render(name)
        if args.check:
            try:
                with open(path) as f:
                    if f.read() != text:
                        stale.append(path)
            except OSError:
                stale.append(path)
        else:
            with open(path, "w") as f:
                f.write(text)
            print("wrote %s" % os.path.normpath(path))
    if stale:
        print("out of date (run scripts/gen_models.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
