#!/usr/bin/python3
"""test/reference/test_reference.py - self-tests of the NumPy reference and its file formats.

    /usr/bin/python3 test/reference/test_reference.py [-v] [NAME_SUBSTRING ...]

Prints one line per test and a summary "N passed, M failed"; exits 1 if any test fails.
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import traceback

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402

import compare_grads  # noqa: E402
import compare_loss  # noqa: E402
import make_case  # noqa: E402
import reference as ref  # noqa: E402
import reference_grad as rg  # noqa: E402
import safetensors_np as st  # noqa: E402
import tokens_np  # noqa: E402
import train_reference as tr  # noqa: E402

TESTS = []
LN256 = math.log(256.0)


def test(fn):
    TESTS.append(fn)
    return fn


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def small_batch(name, seed=1, batch=2, seq=None):
    """Random ids and labels for a named model (smaller batch than configured: faster)."""
    _, c = ref.MODELS[name]
    rng = np.random.default_rng(seed)
    seq = seq or c["seq"]
    ids = rng.integers(0, c["vocab"], size=(batch, seq))
    labels = rng.integers(0, c["vocab"], size=(batch, seq))
    return ids, labels


# ----------------------------------------------------------------------------------------------
# bf16 and safetensors
# ----------------------------------------------------------------------------------------------

def _bits(values):
    return np.array(values, dtype=np.uint32).view(np.float32)


@test
def bf16_round_to_nearest_even_ties():
    cases = [
        (0x3F808000, 0x3F80),  # exactly half way, even mantissa: stays
        (0x3F818000, 0x3F82),  # exactly half way, odd mantissa: rounds up to even
        (0x3F808001, 0x3F81),  # just above half: up
        (0x3F807FFF, 0x3F80),  # just below half: down
        (0xBF818000, 0xBF82),  # negative tie: magnitude rounds to even
        (0xBF808000, 0xBF80),
        (0x00008000, 0x0000),  # subnormal tie to even zero
        (0x00018000, 0x0002),
        (0x7F7FFFFF, 0x7F80),  # rounds past the largest bf16: +inf
        (0xFF7FFFFF, 0xFF80),
        (0x7F800000, 0x7F80),  # inf
        (0xFF800000, 0xFF80),
        (0x80000000, 0x8000),  # -0
    ]
    got = st.f32_to_bf16(_bits([a for a, _ in cases]))
    for (a, want), g in zip(cases, got):
        check(int(g) == want, "f32 0x%08X -> bf16 0x%04X, expected 0x%04X" % (a, g, want))
    nans = st.f32_to_bf16(_bits([0x7FC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF]))
    check(np.isnan(st.bf16_to_f32(nans)).all(), "NaN inputs must stay NaN: %s" % nans)
    check(int(nans[2]) & 0x8000, "the sign of a NaN is kept")


@test
def bf16_rounding_is_nearest_value():
    # Independent of the bit trick: pick the nearer of the two bf16 neighbours in float64.
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(20000) * np.exp(rng.uniform(-30, 30, 20000))).astype(np.float32)
    # Add exact ties: a bf16 value plus half its ulp.
    base = rng.integers(0x3000, 0x4F00, 2000).astype(np.uint32) << 16
    x = np.concatenate([x, (base | 0x8000).view(np.float32)])
    low_bits = (x.view(np.uint32) & 0xFFFF0000).view(np.float32).astype(np.float64)  # toward 0
    high_bits = ((x.view(np.uint32) & 0xFFFF0000) + 0x10000).view(np.float32).astype(np.float64)
    xv = x.astype(np.float64)
    d_low, d_high = np.abs(xv - low_bits), np.abs(high_bits - xv)
    low_even = ((x.view(np.uint32) >> 16) & 1) == 0
    expect = np.where((d_low < d_high) | ((d_low == d_high) & low_even), low_bits, high_bits)
    got = st.bf16_to_f32(st.f32_to_bf16(x)).astype(np.float64)
    bad = np.nonzero(got != expect)[0]
    check(bad.size == 0, "%d of %d wrong, first x=%r got %r expected %r"
          % (bad.size, x.size, *(float(v[bad[0]]) for v in (xv, got, expect)))
          if bad.size else "")


@test
def bf16_decode_encode_identity():
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f = st.bf16_to_f32(bits)
    finite = ~np.isnan(f)
    back = st.f32_to_bf16(f)
    check(np.array_equal(back[finite], bits[finite]), "bf16 -> f32 -> bf16 changed a value")
    check(np.isnan(st.bf16_to_f32(back[~finite])).all(), "a NaN pattern came back non-NaN")


@test
def safetensors_round_trip_all_dtypes():
    rng = np.random.default_rng(3)
    tensors = {
        "a.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "b.f16": rng.standard_normal((7,)).astype(np.float16),
        "c.bf16": st.f32_to_bf16(rng.standard_normal((2, 3, 4)).astype(np.float32)),
        "d.i32": rng.integers(-2**31, 2**31 - 1, (4, 1), dtype=np.int64).astype(np.int32),
        "e.i64": np.array([-2**63, 2**63 - 1, 0, -100], dtype=np.int64),
        "f.f64": rng.standard_normal((2, 2)),
        "g.scalar": np.array(1.5, dtype=np.float32),
        "h.empty": np.zeros((0, 3), dtype=np.float32),
    }
    dtypes = {"c.bf16": "BF16"}
    meta = {"format": "pt", "note": "round trip"}
    raw = st.write_bytes(tensors, dtypes, meta)
    (n,) = struct.unpack("<Q", raw[:8])
    check((8 + n) % 8 == 0, "data section not 8-byte aligned")
    back, back_dtypes, back_meta = st.read_bytes(raw)
    check(back_meta == meta, "metadata %r != %r" % (back_meta, meta))
    want = {"a.f32": "F32", "b.f16": "F16", "c.bf16": "BF16", "d.i32": "I32", "e.i64": "I64",
            "f.f64": "F64", "g.scalar": "F32", "h.empty": "F32"}
    check(back_dtypes == want, "dtypes %r" % back_dtypes)
    for name, array in tensors.items():
        check(back[name].shape == array.shape, "%s shape %s" % (name, back[name].shape))
        check(back[name].dtype == array.dtype, "%s dtype %s" % (name, back[name].dtype))
        check(np.array_equal(back[name], array), "%s values changed" % name)
    check(st.write_bytes(back, back_dtypes, back_meta) == raw, "re-writing is not byte-identical")
    floats = st.to_float(back, back_dtypes)
    check(np.array_equal(floats["c.bf16"], st.bf16_to_f32(tensors["c.bf16"])), "bf16 decode")
    check(floats["e.i64"].dtype == np.int64, "integers stay integers")
    # Files on disk, and no metadata.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "x.safetensors")
        st.write(path, {"w": tensors["a.f32"]})
        t, dt, m = st.read(path)
        check(m is None and dt == {"w": "F32"} and np.array_equal(t["w"], tensors["a.f32"]),
              "file round trip")


@test
def safetensors_reads_a_hand_built_file():
    # Built by hand (unsorted keys, offsets not in key order) so the reader is not only checked
    # against this module's writer.
    a = np.array([[1.0, -2.0]], dtype="<f4")
    b = np.array([0x3F80, 0xC000], dtype="<u2")  # bf16 1.0, -2.0
    header = {"zz": {"dtype": "F32", "shape": [1, 2], "data_offsets": [4, 12]},
              "aa": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
              "__metadata__": {"k": "v"}}
    text = json.dumps(header).encode()
    raw = struct.pack("<Q", len(text)) + text + b.tobytes() + a.tobytes()
    t, dt, m = st.read_bytes(raw)
    check(m == {"k": "v"}, "metadata")
    check(np.array_equal(t["zz"], a), "zz = %r" % t["zz"])
    check(np.array_equal(st.bf16_to_f32(t["aa"]), [1.0, -2.0]), "aa = %r" % t["aa"])


@test
def safetensors_rejects_corrupt_files():
    good = st.write_bytes({"x": np.arange(4, dtype=np.float32)})

    def header_with(entry):
        text = json.dumps({"x": entry}).encode()
        return struct.pack("<Q", len(text)) + text + np.arange(4, dtype=np.float32).tobytes()

    bad = {
        "truncated": good[:-1],
        "short": good[:5],
        "huge header": struct.pack("<Q", 1 << 40) + good[8:],
        "not json": struct.pack("<Q", 3) + b"{{{",
        "offsets past end": header_with({"dtype": "F32", "shape": [4], "data_offsets": [0, 20]}),
        "size mismatch": header_with({"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}),
        "unknown dtype": header_with({"dtype": "Q7", "shape": [4], "data_offsets": [0, 16]}),
        "gap": header_with({"dtype": "F32", "shape": [3], "data_offsets": [4, 16]}),
    }
    for what, raw in bad.items():
        try:
            st.read_bytes(raw)
        except st.FormatError:
            continue
        raise AssertionError("accepted a corrupt file (%s)" % what)
    try:
        st.write_bytes({"x": np.zeros(2, dtype=np.uint16)})
    except ValueError:
        pass
    else:
        raise AssertionError("uint16 without a BF16 dtype must be refused")


@test
def safetensors_sharded_index():
    rng = np.random.default_rng(5)
    tensors = {"l%d.w" % i: rng.standard_normal((i + 1, 2)).astype(np.float32) for i in range(5)}
    tensors["bf"] = st.f32_to_bf16(np.array([1.0, 3.0], dtype=np.float32))
    with tempfile.TemporaryDirectory() as d:
        index = st.write_sharded(d, tensors, {"bf": "BF16"}, shards=3)
        t, dt = st.read_index(index)
        check(sorted(t) == sorted(tensors), "names %s" % sorted(t))
        for name in tensors:
            check(np.array_equal(t[name], tensors[name]), "%s changed" % name)
        check(dt["bf"] == "BF16", "bf16 dtype kept")
        floats = st.load_float(index)
        check(np.array_equal(floats["bf"], [1.0, 3.0]), "load_float through the index")
        # A weight map naming a tensor its shard lacks is an error.
        with open(index) as f:
            data = json.load(f)
        data["weight_map"]["ghost"] = data["weight_map"]["bf"]
        with open(index, "w") as f:
            json.dump(data, f)
        try:
            st.read_index(index)
        except st.FormatError:
            pass
        else:
            raise AssertionError("a missing tensor of the weight map was not reported")


# ----------------------------------------------------------------------------------------------
# Token file
# ----------------------------------------------------------------------------------------------

@test
def tokens_round_trip_and_layout():
    toks = np.array([0, 1, 255, 65535, 7], dtype=np.int64)
    raw = tokens_np.write_bytes(toks, 2)
    check(raw[:24] == b"BONSAITK" + bytes([1, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]),
          "header bytes %r" % raw[:24])
    check(raw[24:] == b"\x00\x00\x01\x00\xff\x00\xff\xff\x07\x00", "little-endian uint16 tokens")
    back = tokens_np.read_bytes(raw)
    check(back.dtype == np.uint16 and np.array_equal(back, toks), "uint16 round trip")
    big = np.array([0, 70000, 2**32 - 1], dtype=np.int64)
    raw4 = tokens_np.write_bytes(big, 4)
    check(struct.unpack("<IIQ", raw4[8:24]) == (1, 4, 3), "uint32 header")
    back4 = tokens_np.read_bytes(raw4)
    check(back4.dtype == np.uint32 and np.array_equal(back4, big), "uint32 round trip")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.tokens")
        tokens_np.write(path, toks, 4)
        check(np.array_equal(tokens_np.read(path), toks), "file round trip")
    for what, bad in {"magic": b"BONSAITX" + raw[8:], "version": raw[:8] + b"\x02" + raw[9:],
                      "width": raw[:12] + b"\x03" + raw[13:], "truncated": raw[:-1],
                      "short": raw[:20]}.items():
        try:
            tokens_np.read_bytes(bad)
        except tokens_np.FormatError:
            continue
        raise AssertionError("accepted a bad token file (%s)" % what)
    try:
        tokens_np.write_bytes([70000], 2)
    except ValueError:
        pass
    else:
        raise AssertionError("a token above 65535 must not be written as uint16")


@test
def tokens_batch_formula():
    toks = np.arange(100, 120)  # count 20
    ids, labels = tokens_np.batch(toks, step=3, batch_size=2, seq=3)
    # p = (3 * 6) % (20 - 6) = 4
    check(ids.tolist() == [[104, 105, 106], [107, 108, 109]], "ids %s" % ids.tolist())
    check(labels.tolist() == [[105, 106, 107], [108, 109, 110]], "labels %s" % labels.tolist())
    ids0, _ = tokens_np.batch(toks, 0, 2, 3)
    check(ids0[0, 0] == 100, "step 0 starts at 0")
    # The last label of the largest offset is the last token.
    ids, labels = tokens_np.batch(toks, step=13, batch_size=1, seq=6)  # p = 78 % 14 = 8
    check(ids[0, 0] == 108 and labels[0, -1] == 114, "p=8: %s %s" % (ids, labels))
    for count in range(7, 40):
        t = np.arange(count)
        for s in range(50):
            i, l = tokens_np.batch(t, s, 2, 3)
            check(l.max() < count and np.array_equal(l, i + 1), "count %d step %d" % (count, s))


# ----------------------------------------------------------------------------------------------
# Ops
# ----------------------------------------------------------------------------------------------

@test
def cross_entropy_closed_form():
    V = 256
    logits = np.zeros((2, 3, V))
    labels = np.array([[0, 5, -100], [255, -100, 9]])
    a = [1.0, 2.0, 0.0, -3.0, 0.0, 0.5]
    for k, (b, t) in enumerate([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]):
        if labels[b, t] >= 0:
            logits[b, t, labels[b, t]] = a[k]
    # One logit a, V-1 zeros: -log softmax = log(e^a + V - 1) - a.
    want = np.mean([math.log(math.exp(x) + V - 1) - x for x in (1.0, 2.0, -3.0, 0.5)])
    got = ref.cross_entropy(logits, labels)
    check(abs(got - want) < 1e-12, "got %r want %r" % (got, want))
    # The ignored positions do not count, whatever their logits.
    logits[0, 2] = 50.0 * np.arange(V)
    check(abs(ref.cross_entropy(logits, labels) - want) < 1e-12, "ignored logits changed loss")
    check(math.isnan(ref.cross_entropy(logits, np.full((2, 3), -100))), "all ignored -> NaN")
    # Large logits do not overflow.
    big = np.zeros((1, V))
    big[0, 3] = 1000.0
    check(abs(ref.cross_entropy(big, [3])) < 1e-12, "stable for large logits")
    for bad_label in (256, -1):
        try:
            ref.cross_entropy(np.zeros((1, V)), [bad_label])
        except ValueError:
            continue
        raise AssertionError("label %d accepted" % bad_label)


@test
def norms_biased_variance_and_rms():
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    eps = 1e-5
    y = ref.layer_norm(x, np.ones(4), np.zeros(4), eps)
    want = (x - 2.5) / math.sqrt(1.25 + eps)  # biased variance 1.25, not 5/3
    check(np.allclose(y, want, rtol=0, atol=1e-15), "layer_norm %s" % y)
    y = ref.layer_norm(x, np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.5, 0, 0, 0]), 0.0)
    check(abs(y[0, 0] - (-1.5 / math.sqrt(1.25) + 0.5)) < 1e-15, "weight and bias")
    r = ref.rms_norm(np.array([3.0, 4.0]), np.array([1.0, 2.0]), eps)
    scale = 1.0 / math.sqrt(12.5 + eps)
    check(np.allclose(r, [3.0 * scale, 8.0 * scale], rtol=0, atol=1e-15), "rms_norm %s" % r)


@test
def activations():
    x = np.linspace(-6, 6, 101)
    g = ref.gelu_tanh(x)
    check(abs(ref.gelu_tanh(np.array(1.0)) - 0.8411919906082768) < 1e-15, "gelu_tanh(1)")
    check(np.allclose(g - ref.gelu_tanh(-x), x, atol=1e-14), "gelu(x) - gelu(-x) = x")
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    err = np.max(np.abs(g - exact))
    check(0 < err < 1e-3, "tanh approximation differs from erf gelu by %g" % err)
    s = ref.swiglu(x, np.full_like(x, 2.0))
    check(np.allclose(s, 2.0 * x / (1.0 + np.exp(-x)), atol=1e-15), "swiglu = silu(g) * up")
    check(ref.silu(np.array(0.0)) == 0.0, "silu(0)")


@test
def rope_position_zero_is_identity():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 5, 3, 16))
    y = ref.rope(x, 10000.0)
    check(np.array_equal(y[:, 0], x[:, 0]), "position 0 changed")
    check(not np.allclose(y[:, 1:], x[:, 1:]), "later positions must rotate")


@test
def rope_rotate_half_convention():
    D, theta = 8, 10000.0
    x = np.zeros((1, 4, 1, D))
    x[0, :, 0, 1] = 1.0  # element i = 1, paired with i + D/2 = 5
    y = ref.rope(x, theta)
    for s in range(4):
        angle = s * theta ** (-2.0 * 1 / D)
        want = np.zeros(D)
        want[1], want[5] = math.cos(angle), math.sin(angle)  # y[i+D/2] = x[i+D/2] cos + x[i] sin
        check(np.allclose(y[0, s, 0], want, atol=1e-15), "s=%d: %s vs %s" % (s, y[0, s, 0], want))
    x = np.zeros((1, 3, 1, D))
    x[0, :, 0, 4] = 1.0  # element D/2: y[0] = -x[4] sin(s)
    y = ref.rope(x, theta)
    check(np.allclose(y[0, 2, 0, [0, 4]], [-math.sin(2.0), math.cos(2.0)], atol=1e-15),
          "second half: %s" % y[0, 2, 0])
    # Scores depend on the offset between positions only.
    rng = np.random.default_rng(2)
    q = np.broadcast_to(rng.standard_normal(D), (1, 12, 1, D))
    k = np.broadcast_to(rng.standard_normal(D), (1, 12, 1, D))
    rq, rk = ref.rope(q, theta)[0, :, 0], ref.rope(k, theta)[0, :, 0]
    check(abs(rq[7] @ rk[4] - rq[3] @ rk[0]) < 1e-12, "relative position property")
    check(np.allclose(np.linalg.norm(rq, axis=-1), np.linalg.norm(q[0, :, 0], axis=-1)), "norm")


@test
def attention_gqa_equals_mha():
    rng = np.random.default_rng(4)
    B, S, H, D = 2, 9, 4, 8
    q = rng.standard_normal((B, S, H, D))
    k = rng.standard_normal((B, S, H, D))
    v = rng.standard_normal((B, S, H, D))
    for causal in (True, False):
        a, b = ref.attention(q, k, v, 0.3, causal), ref.attention_mha(q, k, v, 0.3, causal)
        check(np.allclose(a, b, rtol=0, atol=1e-13), "kv_heads == heads, causal=%s" % causal)
    # Grouped: query head h reads kv head h // (H / KV), i.e. each kv head repeated in place.
    KV = 2
    k2, v2 = k[:, :, :KV], v[:, :, :KV]
    g = ref.attention(q, k2, v2, 0.3, True)
    m = ref.attention_mha(q, np.repeat(k2, H // KV, axis=2), np.repeat(v2, H // KV, axis=2),
                          0.3, True)
    check(np.allclose(g, m, rtol=0, atol=1e-13), "GQA != MHA on repeated kv heads")
    tiled = ref.attention_mha(q, np.tile(k2, (1, 1, H // KV, 1)),
                              np.tile(v2, (1, 1, H // KV, 1)), 0.3, True)
    check(not np.allclose(g, tiled), "the test cannot tell repeat from tile")


@test
def attention_is_causal_and_normalised():
    rng = np.random.default_rng(6)
    q, k = rng.standard_normal((1, 6, 2, 4)), rng.standard_normal((1, 6, 1, 4))
    v = np.ones((1, 6, 1, 4))
    check(np.allclose(ref.attention(q, k, v, 0.5), 1.0), "weights sum to one")
    v = rng.standard_normal((1, 6, 1, 4))
    o = ref.attention(q, k, v, 0.5)
    check(np.allclose(o[0, 0, :, :], v[0, 0, 0]), "position 0 only sees itself")


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------

def _mlir_params(name):
    import re
    path = os.path.join(ref.REPO, "examples", "models", name + ".mlir")
    pattern = re.compile(r'bonsai\.param "([^"]+)" \w+ : tensor<([0-9x]+)x[a-z0-9]+>')
    with open(path) as f:
        return {m.group(1): tuple(int(d) for d in m.group(2).split("x"))
                for m in pattern.finditer(f.read())}


@test
def param_shapes_match_example_models():
    for name, (arch, c) in sorted(ref.MODELS.items()):
        want = _mlir_params(name)
        got = ref.param_shapes(arch, c)
        check(got == want, "%s: differs from examples/models/%s.mlir: %s"
              % (name, name, sorted(set(got.items()) ^ set(want.items()))[:4]))


@test
def zero_lm_head_loss_is_ln_vocab():
    for name, head in (("tiny_llama", "lm_head.weight"), ("tiny_gpt2", "transformer.wte.weight")):
        arch, c = ref.MODELS[name]
        w = make_case.random_weights(name, seed=3)
        w[head] = np.zeros_like(w[head])
        ids, labels = small_batch(name)
        got = ref.loss(arch, c, w, ids, labels)
        check(abs(got - LN256) < 1e-12, "%s: %r != ln 256 = %r" % (name, got, LN256))
        labels[0, ::2] = -100
        got = ref.loss(arch, c, w, ids, labels)
        check(abs(got - LN256) < 1e-12, "%s with ignored labels: %r" % (name, got))


@test
def random_init_loss_is_near_ln_vocab():
    for name in ("tiny_llama", "tiny_gpt2"):
        arch, c = ref.MODELS[name]
        w = make_case.random_weights(name)
        ids, labels = small_batch(name, batch=c["batch"])
        got = ref.loss(arch, c, w, ids, labels)
        check(math.isfinite(got) and abs(got - LN256) < 0.2 and got != LN256,
              "%s: %r far from ln 256" % (name, got))


@test
def causal_mask_holds_in_full_models():
    t0 = 40
    for name in ("tiny_llama", "tiny_gpt2"):
        arch, c = ref.MODELS[name]
        w = make_case.random_weights(name, seed=9)
        ids, _ = small_batch(name, seed=2)
        before = ref.logits(arch, c, w, ids)
        changed = ids.copy()
        changed[1, t0] = (changed[1, t0] + 1) % c["vocab"]
        after = ref.logits(arch, c, w, changed)
        diff = np.abs(after - before)
        check(diff[1, :t0].max() <= 1e-12, "%s: earlier positions moved by %g"
              % (name, diff[1, :t0].max()))
        check(diff[0].max() <= 1e-12, "%s: another batch row moved" % name)
        check(diff[1, t0:].min(axis=-1).max() > 0 and diff[1, t0].max() > 1e-6,
              "%s: the changed position did not change its own logits" % name)
        check(diff[1, -1].max() > 1e-9, "%s: later positions do not see the change" % name)


@test
def batch_rows_are_independent():
    for name in ("tiny_llama", "tiny_gpt2"):
        arch, c = ref.MODELS[name]
        w = make_case.random_weights(name, seed=4)
        ids, _ = small_batch(name, batch=3)
        full = ref.logits(arch, c, w, ids)
        alone = ref.logits(arch, c, w, ids[1:2])
        check(np.allclose(full[1:2], alone, rtol=0, atol=1e-12), "%s: rows interact" % name)


@test
def llama_gqa_path_equals_mha_path_when_kv_heads_equal_heads():
    arch, c = ref.MODELS["tiny_llama"]
    c = dict(c, kv_heads=c["heads"])
    rng = np.random.default_rng(8)
    w = {n: (1.0 + 0.1 * rng.standard_normal(s) if len(s) == 1 else
             0.05 * rng.standard_normal(s)) for n, s in ref.param_shapes(arch, c).items()}
    ids, labels = small_batch("tiny_llama", batch=2)
    gqa = ref.logits(arch, c, w, ids)
    saved = ref.attention
    try:
        ref.attention = ref.attention_mha
        mha = ref.logits(arch, c, w, ids)
    finally:
        ref.attention = saved
    check(np.allclose(gqa, mha, rtol=0, atol=1e-12), "max diff %g" % np.abs(gqa - mha).max())


@test
def llama_tied_head_uses_embedding():
    arch, c = ref.MODELS["tiny_llama"]
    w = make_case.random_weights("tiny_llama", seed=5)
    ids, labels = small_batch("tiny_llama")
    w_same = dict(w, **{"lm_head.weight": w["model.embed_tokens.weight"]})
    untied = ref.loss(arch, c, w_same, ids, labels)
    tied_w = {k: v for k, v in w.items() if k != "lm_head.weight"}
    tied = ref.loss(arch, dict(c, tied=True), tied_w, ids, labels)
    check(untied == tied, "tied %r != untied with lm_head = embed %r" % (tied, untied))
    try:
        ref.loss(arch, c, tied_w, ids, labels)
    except ValueError:
        pass
    else:
        raise AssertionError("a missing lm_head.weight was not reported")


@test
def gpt2_accepts_unprefixed_checkpoint_names():
    arch, c = ref.MODELS["tiny_gpt2"]
    w = make_case.random_weights("tiny_gpt2", seed=6)
    ids, labels = small_batch("tiny_gpt2")
    plain = {k[len("transformer."):]: v for k, v in w.items()}
    check(ref.loss(arch, c, w, ids, labels) == ref.loss(arch, c, plain, ids, labels),
          "un-prefixed names give another loss")


@test
def gpt2_uses_learned_positions():
    arch, c = ref.MODELS["tiny_gpt2"]
    w = make_case.random_weights("tiny_gpt2", seed=6)
    ids = np.full((1, c["seq"]), 17)
    out = ref.logits(arch, c, w, ids)
    check(np.abs(out[0, 1] - out[0, 0]).max() > 1e-6, "same token, same logits at two positions")
    w["transformer.wpe.weight"] = np.zeros_like(w["transformer.wpe.weight"])
    out = ref.logits(arch, c, w, ids)
    # Without positions, identical tokens attend to identical values: same output everywhere.
    check(np.allclose(out[0, 1:], out[0, :1], rtol=0, atol=1e-12), "no-position symmetry")


def _rope_interleaved(x, theta):
    """GPT-J / Meta-checkpoint pairing (2i, 2i + 1): the convention a runtime must NOT use."""
    S, D = x.shape[1], x.shape[3]
    inv_freq = theta ** (-2.0 * np.arange(D // 2) / D)
    angle = np.arange(S)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]
    y = np.empty_like(x)
    y[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
    y[..., 1::2] = x[..., 1::2] * cos + x[..., 0::2] * sin
    return y


@test
def sharp_parity_case_detects_convention_errors():
    # The std 0.1 case of parity.test must move by far more than its 1e-5 tolerance under each
    # plausible runtime bug; otherwise the parity test could not see the bug.
    gqa, mha = ref.attention, ref.attention_mha

    def gqa_tiled(q, k, v, scale, causal=True):
        r = q.shape[2] // k.shape[2]
        return mha(q, np.tile(k, (1, 1, r, 1)), np.tile(v, (1, 1, r, 1)), scale, causal)

    def unbiased(x, w, b, eps):
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, ddof=1, keepdims=True)
                                                         + eps) * w + b

    bugs = {
        "tiny_llama": {"rope interleaved": ("rope", _rope_interleaved),
                       "rope missing": ("rope", lambda x, theta: x),
                       "gqa tiled": ("attention", gqa_tiled),
                       "not causal": ("attention", lambda q, k, v, s, causal=True:
                                      gqa(q, k, v, s, False)),
                       "no scale": ("attention", lambda q, k, v, s, causal=True:
                                    gqa(q, k, v, 1.0, causal))},
        "tiny_gpt2": {"not causal": ("attention_mha", lambda q, k, v, s, causal=True:
                                     mha(q, k, v, s, False)),
                      "no scale": ("attention_mha", lambda q, k, v, s, causal=True:
                                   mha(q, k, v, 1.0, causal)),
                      "unbiased variance": ("layer_norm", unbiased)},
    }
    for name, cases in bugs.items():
        w = make_case.random_weights(name, seed=0, std=0.1)
        toks = make_case.random_tokens(name, seed=0)
        good = ref.step_loss(name, w, toks, 0)
        for what, (attr, impl) in cases.items():
            saved = getattr(ref, attr)
            try:
                setattr(ref, attr, impl)
                bad = ref.step_loss(name, w, toks, 0)
            finally:
                setattr(ref, attr, saved)
            check(abs(bad - good) > 2e-4 * good, "%s, %s: loss moves by only %.2g relative"
                  % (name, what, abs(bad - good) / good))


# ----------------------------------------------------------------------------------------------
# make_case, the command line, compare_loss
# ----------------------------------------------------------------------------------------------

@test
def make_case_files():
    with tempfile.TemporaryDirectory() as d:
        for name in ("tiny_llama", "tiny_gpt2"):
            arch, c = ref.MODELS[name]
            wpath, tpath = make_case.write_case(name, d, seed=1)
            tensors, dtypes, meta = st.read(wpath)
            check(meta["model"] == name, "metadata names the model")
            shapes = {k: v.shape for k, v in tensors.items()}
            check(shapes == _mlir_params(name), "%s: names/shapes differ from the .mlir" % name)
            check(set(dtypes.values()) == {"F32"}, "%s: dtypes %s" % (name, set(dtypes.values())))
            for k, v in tensors.items():
                if v.ndim == 2:
                    check(abs(v.std() - 0.02) < 0.004 and abs(v.mean()) < 0.005,
                          "%s: matrix %s std %g" % (name, k, v.std()))
                elif k.endswith(".bias"):
                    check(0 < np.abs(v).max() < 0.2 and abs(v.mean()) < 0.02, "bias %s" % k)
                else:
                    check(abs(v.mean() - 1) < 0.05 and 0.05 < v.std() < 0.15
                          and not np.any(v == 1.0), "norm weight %s" % k)
            toks = tokens_np.read(tpath)
            check(toks.dtype == np.uint16 and toks.max() < c["vocab"], "token ids")
            check(len(toks) > 2 * c["batch"] * c["seq"], "enough tokens for two steps")
            with open(wpath, "rb") as f:
                first = f.read()
            make_case.write_case(name, d, seed=1)
            with open(wpath, "rb") as f:
                check(f.read() == first, "not deterministic")
        w1 = make_case.random_weights("tiny_llama", seed=1)
        w2 = make_case.random_weights("tiny_llama", seed=2)
        check(not np.array_equal(w1["lm_head.weight"], w2["lm_head.weight"]), "seed ignored")


@test
def compare_loss_parses_step_lines():
    text = ("plan p: model m, target cpu\nstep 1 loss 5.5\nstep 2 loss 5.25e+00\n"
            "memory: arena 0 'weights' (persistent): planned 1 MiB\nstep x loss 1\n"
            "time: 2 steps in 0.1 s\n")
    got = compare_loss.parse_run_output(text)
    check(got == [(1, 5.5), (2, 5.25)], "parsed %r" % got)


def _run(args, stdin=None):
    p = subprocess.run([sys.executable] + args, input=stdin, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


@test
def command_lines_and_compare_loss():
    with tempfile.TemporaryDirectory() as d:
        for name in ("tiny_llama", "tiny_gpt2"):
            rc, out = _run([os.path.join(HERE, "make_case.py"), "--model", name, "--out", d])
            check(rc == 0, "make_case.py failed: %s" % out)
            wpath = os.path.join(d, name + ".safetensors")
            tpath = os.path.join(d, name + ".tokens")
            weights, toks = ref.load_weights(wpath), tokens_np.read(tpath)
            losses = [ref.step_loss(name, weights, toks, s) for s in range(2)]
            check(losses[0] != losses[1], "steps 0 and 1 read the same batch")
            rc, out = _run([os.path.join(HERE, "reference.py"), "--model", name, "--weights",
                            wpath, "--data", tpath, "--batch", "4", "--seq", "64", "--step", "1"])
            check(rc == 0 and out.strip() == "loss %.9g" % losses[1], "reference.py: %r" % out)

            def compare(text, *extra):
                path = os.path.join(d, "run.txt")
                with open(path, "w") as f:
                    f.write(text)
                return _run([os.path.join(HERE, "compare_loss.py"), "--model", name,
                             "--weights", wpath, "--data", tpath, "--run-output", path] +
                            list(extra))

            # bonsai-run numbers steps from 1; step n reads batch n - 1.
            good = "plan x: model y\nstep 1 loss %.9g\nstep 2 loss %.9g\ntime: 2 steps\n" % \
                tuple(losses)
            rc, out = compare(good, "--steps", "2")
            check(rc == 0 and out.count("ok  ") == 2, "matching losses rejected: %s" % out)
            f32 = "step 1 loss %.9g\nstep 2 loss %.9g\n" % tuple(float(np.float32(x))
                                                                for x in losses)
            rc, out = compare(f32, "--steps", "2")
            check(rc == 0, "fp32-rounded losses rejected: %s" % out)
            zero_based = "step 0 loss %.9g\nstep 1 loss %.9g\n" % tuple(losses)
            check(compare(zero_based, "--steps", "2")[0] == 1, "0-based steps passed as 1-based")
            check(compare(zero_based, "--steps", "2", "--first-step", "0")[0] == 0,
                  "--first-step 0 rejected 0-based steps")
            off = "step 1 loss %.9g\nstep 2 loss %.9g\n" % (losses[0], losses[1] * (1 + 3e-5))
            rc, out = compare(off, "--steps", "2")
            check(rc == 1 and "FAIL" in out and "%.9g" % losses[0] in out,
                  "a 3e-5 error passed: %s" % out)
            swapped = "step 1 loss %.9g\nstep 2 loss %.9g\n" % (losses[1], losses[0])
            check(compare(swapped)[0] == 1, "swapped steps passed")
            check(compare("step 1 loss %.9g\n" % losses[0], "--steps", "2")[0] == 1,
                  "a missing step passed")
            check(compare("")[0] == 1, "an empty output passed")
            check(compare("step 1 loss nan\nstep 2 loss nan\n")[0] == 1, "NaN passed")


# ----------------------------------------------------------------------------------------------
# Backward (reference_grad.py)
# ----------------------------------------------------------------------------------------------

def _tiny_config(arch, tied=False):
    """A config small enough for finite differences of every parameter; Llama keeps GQA
    (4 query heads on 2 kv heads)."""
    _, base = ref.MODELS["tiny_llama" if arch == ref.LLAMA else "tiny_gpt2"]
    c = dict(base, vocab=11, hidden=8, layers=2, heads=4, intermediate=12, positions=7)
    if arch == ref.LLAMA:
        c.update(kv_heads=2, tied=tied)
    return c


def _tiny_case(arch, c, seed):
    """Weights with matrices of std 0.4 (peaked attention, activations off their linear part),
    norm weights 1 + 0.2 N(0, 1), biases 0.2 N(0, 1); ids [2, 6] and labels with two ignored."""
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in ref.param_shapes(arch, c).items():
        if name.endswith(".bias"):
            w[name] = 0.2 * rng.standard_normal(shape)
        elif len(shape) == 1:
            w[name] = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            w[name] = 0.4 * rng.standard_normal(shape)
    ids = rng.integers(0, c["vocab"], size=(2, 6))
    labels = rng.integers(0, c["vocab"], size=(2, 6))
    labels[0, 1] = labels[1, 4] = -100
    return w, ids, labels


TINY_CASES = (("llama gqa", ref.LLAMA, False), ("llama tied", ref.LLAMA, True),
              ("gpt2 tied wte", ref.GPT2, False))


@test
def backward_matches_finite_differences():
    # Central differences of reference.py's loss (float64, h = 1e-5: truncation ~h^2 ~ 1e-10,
    # rounding ~1e-16 / h ~ 1e-11) at 5 random coordinates of every parameter, and along one
    # random direction of all parameters at once. Any wrong term is off by far more than 1e-5.
    h = 1e-5
    for what, arch, tied in TINY_CASES:
        c = _tiny_config(arch, tied)
        w, ids, labels = _tiny_case(arch, c, seed=len(what))
        loss, g = rg.loss_and_grads(arch, c, w, ids, labels)
        check(abs(loss - ref.loss(arch, c, w, ids, labels)) < 1e-12, "%s: forward" % what)
        check(sorted(g) == sorted(ref.param_shapes(arch, c)), "%s: parameters %s" % (what, sorted(g)))
        rng = np.random.default_rng(99)
        for name, shape in ref.param_shapes(arch, c).items():
            check(g[name].shape == tuple(shape), "%s: %s shape %s" % (what, name, g[name].shape))
            check(np.abs(g[name]).max() > 0, "%s: %s has a zero gradient" % (what, name))
            for _ in range(5):
                idx = tuple(int(rng.integers(0, d)) for d in shape)
                plus, minus = dict(w), dict(w)
                plus[name], minus[name] = w[name].copy(), w[name].copy()
                plus[name][idx] += h
                minus[name][idx] -= h
                fd = (ref.loss(arch, c, plus, ids, labels) -
                      ref.loss(arch, c, minus, ids, labels)) / (2 * h)
                check(abs(fd - g[name][idx]) <= 1e-7 + 1e-5 * abs(fd),
                      "%s: d loss / d %s%s = %.10g by finite differences, %.10g by the backward"
                      % (what, name, list(idx), fd, g[name][idx]))
        u = {n: rng.standard_normal(v.shape) for n, v in w.items()}
        fd = (ref.loss(arch, c, {n: w[n] + h * u[n] for n in w}, ids, labels) -
              ref.loss(arch, c, {n: w[n] - h * u[n] for n in w}, ids, labels)) / (2 * h)
        dot = sum(float(np.sum(g[n] * u[n])) for n in w)
        check(abs(fd - dot) <= 1e-6 * abs(fd), "%s: directional derivative %.10g vs %.10g"
              % (what, fd, dot))


@test
def backward_of_the_example_models():
    # At full size (seq 64, vocab 256) and both inits: the forward equals reference.py's, and
    # the gradient agrees with a central difference along a random direction.
    for name in ("tiny_llama", "tiny_gpt2"):
        arch, c = ref.MODELS[name]
        for std in (0.02, 0.1):
            w = {k: v.astype(np.float64) for k, v in make_case.random_weights(name, std=std).items()}
            toks = make_case.random_tokens(name)
            ids, labels = tokens_np.batch(toks, 1, c["batch"], c["seq"])
            loss, g = rg.loss_and_grads(arch, c, w, ids, labels)
            want = ref.loss(arch, c, w, ids, labels)
            check(abs(loss - want) <= 1e-12 * want, "%s std %g: loss %r vs reference.py %r"
                  % (name, std, loss, want))
            rng = np.random.default_rng(5)
            u = {n: rng.standard_normal(v.shape) * 0.01 for n, v in w.items()}
            h = 1e-4
            fd = (ref.loss(arch, c, {n: w[n] + h * u[n] for n in w}, ids, labels) -
                  ref.loss(arch, c, {n: w[n] - h * u[n] for n in w}, ids, labels)) / (2 * h)
            dot = sum(float(np.sum(g[n] * u[n])) for n in w)
            check(abs(fd - dot) <= 1e-6 * abs(fd), "%s std %g: directional derivative %.10g "
                  "vs %.10g" % (name, std, fd, dot))


@test
def backward_shared_weights_accumulate():
    # A tied Llama's embed_tokens gradient is the sum of the embedding's and the LM head's, i.e.
    # of an untied model's two gradients when lm_head = embed_tokens; GPT-2's wte likewise.
    arch, c = ref.MODELS["tiny_llama"]
    w = make_case.random_weights("tiny_llama", seed=5, std=0.1)
    w["lm_head.weight"] = w["model.embed_tokens.weight"]
    ids, labels = small_batch("tiny_llama")
    _, untied = rg.loss_and_grads(arch, c, w, ids, labels)
    tied_w = {k: v for k, v in w.items() if k != "lm_head.weight"}
    _, tied = rg.loss_and_grads(arch, dict(c, tied=True), tied_w, ids, labels)
    both = untied["model.embed_tokens.weight"] + untied["lm_head.weight"]
    check("lm_head.weight" not in tied, "a tied model has no lm_head gradient")
    check(np.allclose(tied["model.embed_tokens.weight"], both, rtol=0, atol=1e-15),
          "tied embed_tokens gradient is not the sum of both uses")
    # GPT-2: rows of tokens that never occur get the LM head's part only, and it is not zero.
    arch, c = ref.MODELS["tiny_gpt2"]
    w = make_case.random_weights("tiny_gpt2", seed=5)
    ids, labels = small_batch("tiny_gpt2")
    ids = ids % 128  # rows 128.. are used by the LM head only
    _, g = rg.loss_and_grads(arch, c, w, ids, labels)
    head_only = np.abs(g["transformer.wte.weight"][128:]).max()
    check(head_only > 0, "unused wte rows get no LM-head gradient")
    saved = rg.embedding_bwd
    try:
        rg.embedding_bwd = lambda dy, ids, vocab: np.zeros((vocab, dy.shape[-1]), dy.dtype)
        _, head = rg.loss_and_grads(arch, c, w, ids, labels)
    finally:
        rg.embedding_bwd = saved
    diff = np.abs(g["transformer.wte.weight"] - head["transformer.wte.weight"])
    check(diff[:128].max() > 0.1 * np.abs(g["transformer.wte.weight"]).max() and
          diff[128:].max() == 0, "the embedding's part of wte is not added where tokens occur")


def _grad_errors(got, want):
    return {k: float(np.abs(got[k] - want[k]).max() / np.abs(want[k]).max()) for k in want}


def _gelu_erf_bwd(dy, x):
    erf = np.vectorize(math.erf)
    return dy * (0.5 * (1.0 + erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x)
                 / math.sqrt(2.0 * math.pi))


@test
def gradient_tolerance_separates_fp32_from_bugs():
    # compare_grads.py's tolerance (max |diff| <= 1e-4 max |ref| per tensor): the same backward
    # in float32 stays 20x below it, and each plausible backward bug exceeds it 4x on the
    # std 0.1 case of gradients.test (the std 0.02 case also catches all but the gelu form).
    rtol = compare_grads.DEFAULT_RTOL
    attention_bwd = rg.attention_bwd

    def first_head_only(do, q, k, v, o, p, scale):  # GQA: dk, dv from one query head per group
        B, S, H, D = q.shape
        G = H // k.shape[2]
        do1 = do.reshape(B, S, k.shape[2], G, -1).copy()
        do1[:, :, :, 1:] = 0
        dq, _, _ = attention_bwd(do, q, k, v, o, p, scale)
        _, dk, dv = attention_bwd(do1.reshape(do.shape), q, k, v, o, p, scale)
        return dq, dk, dv

    def no_row_sum(do, q, k, v, o, p, scale):  # dS = P dP, without - rowsum(dO O)
        return attention_bwd(do, q, k, v, np.zeros_like(o), p, scale)

    def rms_no_projection(dy, w, cache):
        n, r = cache
        return r * dy * w, (dy * n).reshape(-1, dy.shape[-1]).sum(axis=0)

    def ln_no_mean(dy, w, cache):
        n, r = cache
        dn = dy * w
        return (r * (dn - n * np.mean(dn * n, axis=-1, keepdims=True)),
                (dy * n).reshape(-1, dy.shape[-1]).sum(axis=0),
                dy.reshape(-1, dy.shape[-1]).sum(axis=0))

    bugs = {
        "tiny_llama": {"rope not inverted": ("rope_bwd", lambda dy, theta: rg.rope_fwd(dy, theta)),
                       "rope skipped": ("rope_bwd", lambda dy, theta: dy),
                       "gqa one head": ("attention_bwd", first_head_only),
                       "softmax row sum": ("attention_bwd", no_row_sum),
                       "rms_norm projection": ("rms_norm_bwd", rms_no_projection),
                       "swiglu as silu": ("swiglu_bwd", lambda dy, g, u:
                                          (dy * u * rg._sigmoid(g), dy * g * rg._sigmoid(g)))},
        "tiny_gpt2": {"gelu erf form": ("gelu_bwd", _gelu_erf_bwd),
                      "softmax row sum": ("attention_bwd", no_row_sum),
                      "layer_norm mean": ("layer_norm_bwd", ln_no_mean),
                      "embedding dropped": ("embedding_bwd", lambda dy, ids, vocab:
                                            np.zeros((vocab, dy.shape[-1]), dy.dtype))},
    }
    for name, cases in bugs.items():
        toks = make_case.random_tokens(name)
        for std in (0.02, 0.1):
            w = make_case.random_weights(name, std=std)
            _, want = rg.step_grads(name, w, toks, 0)
            _, f32 = rg.step_grads(name, w, toks, 0, dtype=np.float32)
            errs = _grad_errors(f32, want)
            worst = max(errs, key=errs.get)
            check(errs[worst] < rtol / 20, "%s std %g: float32 %s off by %.3g"
                  % (name, std, worst, errs[worst]))
        # The bugs, on the std 0.1 case (w and want of the loop's last iteration).
        for what, (attr, impl) in cases.items():
            saved = getattr(rg, attr)
            try:
                setattr(rg, attr, impl)
                _, bad = rg.step_grads(name, w, toks, 0)
            finally:
                setattr(rg, attr, saved)
            errs = _grad_errors(bad, want)
            worst = max(errs, key=errs.get)
            check(errs[worst] > 4 * rtol, "%s, %s: gradients move by only %.3g" %
                  (name, what, errs[worst]))


@test
def compare_grads_command_line():
    with tempfile.TemporaryDirectory() as d:
        name = "tiny_gpt2"
        wpath, tpath = make_case.write_case(name, d)
        gpath = os.path.join(d, "g.safetensors")
        rc, out = _run([os.path.join(HERE, "reference_grad.py"), "--model", name, "--weights",
                        wpath, "--data", tpath, "--out", gpath])
        check(rc == 0 and "loss" in out, "reference_grad.py: %s" % out)
        good, _, _ = st.read(gpath)

        def compare(tensors, *extra):
            path = os.path.join(d, "dump.safetensors")
            st.write(path, tensors)
            return _run([os.path.join(HERE, "compare_grads.py"), "--model", name, "--weights",
                         wpath, "--data", tpath, "--gradients", path] + list(extra))

        rc, out = compare(good)
        check(rc == 0 and out.count(" ok") == len(good), "an exact fp32 dump failed: %s" % out)
        wte = "transformer.wte.weight"
        # An error of 2e-4 of the tensor's largest entry, on one small entry.
        bad = dict(good)
        bad[wte] = good[wte].copy()
        bad[wte][200, 3] += np.float32(2e-4 * np.abs(good[wte]).max())
        rc, out = compare(bad)
        check(rc == 1 and "FAIL at [200, 3]" in out, "a 2e-4 error passed: %s" % out)
        rc, out = compare(dict(good, **{wte: good[wte] * np.float32(1 + 5e-5)}))
        check(rc == 0, "a 5e-5 relative error failed: %s" % out)
        doubled = {k: v * np.float32(2) for k, v in good.items()}
        check(compare(doubled, "--scale", "2")[0] == 0 and compare(doubled)[0] == 1, "--scale")
        missing = {k: v for k, v in good.items() if k != wte}
        rc, out = compare(missing)
        check(rc == 1 and "FAIL missing" in out, "a missing gradient passed: %s" % out)
        rc, out = compare(dict(good, extra=np.zeros(3, np.float32)))
        check(rc == 1 and "not a parameter" in out, "an extra tensor passed: %s" % out)
        rc, out = compare(dict(good, **{wte: good[wte].T.copy()}))
        check(rc == 1 and "FAIL shape" in out, "a transposed gradient passed: %s" % out)
        nan = dict(good, **{wte: good[wte].copy()})
        nan[wte][0, 0] = np.nan
        check(compare(nan)[0] == 1, "a NaN passed")
        # Window 1 is another batch: its gradients differ.
        check(compare(good, "--window", "1")[0] == 1, "the window is ignored")


# ----------------------------------------------------------------------------------------------
# Training (train_reference.py)
# ----------------------------------------------------------------------------------------------

# The recipes of training.test (the same text, written there with printf).
RECIPE_PLAIN = 'bonsai.recipe @train {\n  bonsai.optimizer "adamw" lr 1.000000e-03\n}\n'
RECIPE_ADAMW = ('bonsai.recipe @train {\n  bonsai.optimizer "adamw" lr 5.000000e-03 '
                '{weight_decay = 1.000000e+00 : f64, grad_clip = 1.000000e-01 : f64, '
                'schedule = "cosine", warmup_steps = 2 : i64, total_steps = 5 : i64, '
                'min_lr_ratio = 1.000000e-01 : f64, micro_batches = 2 : i64}\n}\n')
RECIPE_SGD = ('bonsai.recipe @train {\n  bonsai.optimizer "sgd" lr 5.000000e-01 '
              '{momentum = 9.000000e-01 : f64, weight_decay = 1.000000e-01 : f64, '
              'grad_clip = 2.000000e-01 : f64, micro_batches = 2 : i64}\n}\n')
RECIPE_LONG = ('bonsai.recipe @train {\n  bonsai.optimizer "adamw" lr 1.000000e-02 '
               '{warmup_steps = 10 : i64}\n}\n')


@test
def recipe_hyper_parameters_and_schedule():
    hp = tr.parse_recipe(RECIPE_ADAMW)
    check(hp == dict(tr.DEFAULTS, lr=5e-3, weight_decay=1.0, grad_clip=0.1, schedule="cosine",
                     warmup_steps=2, total_steps=5, min_lr_ratio=0.1, micro_batches=2),
          "parsed %r" % hp)
    check(tr.parse_recipe(RECIPE_PLAIN) == dict(tr.DEFAULTS, lr=1e-3), "plain recipe")
    check(tr.parse_recipe(RECIPE_SGD)["optimizer"] == "sgd", "sgd recipe")
    lrs = [tr.learning_rate(hp, t) for t in range(1, 7)]
    # warmup t/2 lr for t <= 2, then cosine over t = 3..5 (p = 1/3, 2/3, 1), min 0.1 lr.
    want = [2.5e-3, 5e-3] + [5e-3 * (0.1 + 0.9 * (1 + math.cos(math.pi * p)) / 2)
                             for p in (1 / 3, 2 / 3, 1.0, 1.0)]
    check(np.allclose(lrs, want, rtol=1e-15, atol=0), "cosine schedule %s vs %s" % (lrs, want))
    check(abs(lrs[4] - 5e-4) < 1e-18 and lrs[5] == lrs[4], "ends at min_lr_ratio * lr")
    const = dict(tr.DEFAULTS, lr=1e-2, warmup_steps=10)
    check([tr.learning_rate(const, t) for t in (1, 5, 10, 11, 1000)] ==
          [1e-3, 5e-3, 1e-2, 1e-2, 1e-2], "constant with warmup")
    check(tr.learning_rate(dict(tr.DEFAULTS, lr=0.5), 1) == 0.5, "no warmup: lr from step 1")


@test
def adamw_and_sgd_follow_pytorch():
    # One AdamW and one SGD update checked against PyTorch's formulation of the same step
    # (torch.optim.AdamW's step_size = lr / bc1, denom = sqrt(v) / sqrt(bc2) + eps, decay
    # first; clip_grad_norm_'s coefficient), written independently here.
    rng = np.random.default_rng(3)
    p0 = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in p0.items()} for _ in range(3)]
    hp = dict(tr.DEFAULTS, lr=0.01, beta1=0.8, beta2=0.95, eps=1e-3, weight_decay=0.3,
              grad_clip=1.5)
    params = {k: v.copy() for k, v in p0.items()}
    opt = tr.AdamW(params, hp)
    want = {k: v.copy() for k, v in p0.items()}
    m = {k: np.zeros_like(v) for k, v in p0.items()}
    v2 = {k: np.zeros_like(v) for k, v in p0.items()}
    for t, g in enumerate(grads, start=1):
        norm = tr.global_norm(g)
        check(abs(norm - math.sqrt(sum((x ** 2).sum() for x in g.values()))) < 1e-12, "norm")
        opt.update(params, g, t, 0.01 * t, norm)
        coef = min(1.0, 1.5 / (norm + 1e-6))
        for k in want:
            gk = g[k] * coef
            want[k] *= 1 - 0.01 * t * 0.3
            m[k] = 0.8 * m[k] + 0.2 * gk
            v2[k] = 0.95 * v2[k] + 0.05 * gk * gk
            denom = np.sqrt(v2[k]) / math.sqrt(1 - 0.95 ** t) + 1e-3
            want[k] = want[k] - (0.01 * t / (1 - 0.8 ** t)) * m[k] / denom
        for k in want:
            check(np.allclose(params[k], want[k], rtol=1e-13, atol=1e-15), "adamw t=%d %s" % (t, k))
    check(tr.clip_coefficient(0.0, 1e9) == 1.0 and tr.clip_coefficient(2.0, 1.0) == 1.0,
          "clipping off / inactive")
    # SGD with momentum, L2 weight decay and clipping.
    hp = dict(tr.DEFAULTS, optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.01,
              grad_clip=0.5)
    params = {k: v.copy() for k, v in p0.items()}
    opt = tr.SGD(params, hp)
    want = {k: v.copy() for k, v in p0.items()}
    buf = {}
    for t, g in enumerate(grads, start=1):
        norm = tr.global_norm(g)
        opt.update(params, g, t, 0.1, norm)
        for k in want:
            d = g[k] * min(1.0, 0.5 / (norm + 1e-6)) + 0.01 * want[k]
            buf[k] = d if t == 1 else 0.9 * buf[k] + d  # torch.optim.SGD: buf = g at step 1
            want[k] = want[k] - 0.1 * buf[k]
        for k in want:
            check(np.allclose(params[k], want[k], rtol=1e-13, atol=1e-15), "sgd t=%d %s" % (t, k))


@test
def micro_batches_mean_losses_and_gradients():
    name = "tiny_llama"
    arch, c = ref.MODELS[name]
    w = make_case.random_weights(name, std=0.1)
    toks = make_case.random_tokens(name, steps=6)
    hp = dict(tr.DEFAULTS, optimizer="sgd", lr=0.1, micro_batches=3)
    records, params = tr.train(name, w, toks, 2, hp)
    # Step 1 reads windows 0, 1, 2; step 2 reads 3, 4, 5 (s * K + m).
    parts = [rg.step_grads(name, w, toks, m) for m in range(3)]
    loss = np.mean([p[0] for p in parts])
    check(abs(records[0][1] - loss) < 1e-12, "step 1 loss %r vs mean %r" % (records[0][1], loss))
    mean = {k: sum(p[1][k] for p in parts) / 3 for k in parts[0][1]}
    check(abs(records[0][2] - tr.global_norm(mean)) < 1e-12, "grad_norm of the mean gradient")
    after = {k: np.asarray(w[k], np.float64) - 0.1 * mean[k] for k in mean}
    want2 = np.mean([ref.step_loss(name, after, toks, m) for m in (3, 4, 5)])
    check(abs(records[1][1] - want2) < 1e-12, "step 2 loss %r vs %r" % (records[1][1], want2))
    check([r[0] for r in records] == [1, 2] and records[0][3] == 0.1, "records %r" % records)


def _run_records(name, hp, steps=5, dtype=np.float64, tokens=None):
    toks = make_case.random_tokens(name, steps=12) if tokens is None else tokens
    records, _ = tr.train(name, make_case.random_weights(name), toks, steps, hp, dtype=dtype)
    return records


class _AdamL2(tr.AdamW):
    """Adam with L2 regularisation (decay added to the gradient): not AdamW."""

    def update(self, params, grads, t, lr, norm):
        hp, c = self.hp, tr.clip_coefficient(self.hp["grad_clip"], norm)
        g = {k: grads[k] * c + hp["weight_decay"] * params[k] for k in grads}
        self.hp = dict(hp, weight_decay=0.0, grad_clip=0.0)
        try:
            super().update(params, g, t, lr, norm)
        finally:
            self.hp = hp


class _AdamNoBiasCorrection(tr.AdamW):
    """Adam without the bias corrections: p -= lr m / (sqrt(v) + eps)."""

    def update(self, params, grads, t, lr, norm):
        b1, b2, eps, wd = (self.hp[k] for k in ("beta1", "beta2", "eps", "weight_decay"))
        c = tr.clip_coefficient(self.hp["grad_clip"], norm)
        for name, p in params.items():
            g = grads[name] * c
            self.m[name] = b1 * self.m[name] + (1.0 - b1) * g
            self.v[name] = b2 * self.v[name] + (1.0 - b2) * g * g
            params[name] = p * (1.0 - lr * wd) - lr * self.m[name] / (np.sqrt(self.v[name]) + eps)


@test
def training_tolerance_separates_fp32_from_wrong_semantics():
    # training.test compares 5 steps of bonsai-run with train_reference.py: loss and grad_norm
    # within 1e-4 relative. The same training in float32 drifts from float64 by less than 1e-6
    # (loss) and 1e-5 (grad_norm) for both models and the three recipes; each wrong reading of
    # the optimizer's semantics fails the comparison (a step's loss or grad_norm off by more
    # than 1e-4) on tiny_llama (run on one model only, to keep the self-tests fast).
    mutations = {
        RECIPE_ADAMW: {"no weight decay": dict(weight_decay=0.0),
                       "no clipping": dict(grad_clip=0.0),
                       "one micro-batch": dict(micro_batches=1),
                       "constant lr": dict(schedule="constant", warmup_steps=0),
                       "beta2 0.99": dict(beta2=0.99),
                       "eps 1e-6": dict(eps=1e-6),
                       "L2 decay": _AdamL2,
                       "no bias correction": _AdamNoBiasCorrection},
        RECIPE_SGD: {"no weight decay": dict(weight_decay=0.0),
                     "no clipping": dict(grad_clip=0.0),
                     "no momentum": dict(momentum=0.0),
                     "one micro-batch": dict(micro_batches=1)},
    }
    quiet = open(os.devnull, "w")
    try:
        for name in ("tiny_llama", "tiny_gpt2"):
            for recipe in (RECIPE_PLAIN, RECIPE_ADAMW, RECIPE_SGD):
                hp = tr.parse_recipe(recipe)
                base = _run_records(name, hp)
                f32 = _run_records(name, hp, dtype=np.float32)
                drift = max(abs(a[1] - b[1]) / b[1] for a, b in zip(f32, base))
                norm_drift = max(abs(a[2] - b[2]) / b[2] for a, b in zip(f32, base))
                check(drift < 1e-6 and norm_drift < 1e-5, "%s %s: float32 drift loss %.2g "
                      "grad_norm %.2g" % (name, hp["optimizer"], drift, norm_drift))
                check(tr.compare_run(base, f32, 1e-4, 1e-4, 1e-5, quiet) == 0, "f32 run fails")
                for what, change in (mutations.get(recipe, {}).items()
                                     if name == "tiny_llama" else ()):
                    if isinstance(change, dict):
                        bad = _run_records(name, dict(hp, **change))
                    else:
                        saved = tr.AdamW
                        try:
                            tr.AdamW = change
                            bad = _run_records(name, hp)
                        finally:
                            tr.AdamW = saved
                    check(tr.compare_run(base, bad, 1e-4, 1e-4, 1e-5, quiet) > 0,
                          "%s %s, %s: passes the 1e-4 comparison" % (name, hp["optimizer"], what))
    finally:
        quiet.close()


@test
def training_loss_falls_on_repetitive_tokens():
    # training.test's long run: 60 steps of RECIPE_LONG on a period-24 token file must end
    # below 0.05; the reference gets below 0.5 within 20 steps (and to ~1e-3 by step 60).
    toks = tr.repetitive_tokens(24, 4096)
    check(np.array_equal(toks[:24], toks[24:48]) and len(set(toks[:24].tolist())) == 24,
          "a repeating pattern of 24 distinct ids")
    hp = tr.parse_recipe(RECIPE_LONG)
    for name in ("tiny_llama", "tiny_gpt2"):
        losses = [r[1] for r in _run_records(name, hp, steps=20, tokens=toks)]
        check(losses[0] > 5 and losses[-1] < 0.5, "%s: loss %.4g -> %.4g in 20 steps"
              % (name, losses[0], losses[-1]))
        # On one fixed batch (a token file of B*T + 1 tokens: every step reads window 0), plain
        # gradient descent and AdamW lower the loss at every step.
        _, c = ref.MODELS[name]
        fixed = make_case.random_tokens(name)[:c["batch"] * c["seq"] + 1]
        for fixed_hp in (dict(tr.DEFAULTS, optimizer="sgd", lr=0.5),
                         tr.parse_recipe(RECIPE_PLAIN)):
            losses = [r[1] for r in _run_records(name, fixed_hp, steps=4, tokens=fixed)]
            check(all(b < a for a, b in zip(losses, losses[1:])), "%s %s on one batch: %s"
                  % (name, fixed_hp["optimizer"], losses))


@test
def train_reference_command_line():
    with tempfile.TemporaryDirectory() as d:
        name = "tiny_llama"
        wpath, tpath = make_case.write_case(name, d)
        recipe = os.path.join(d, "recipe.mlir")
        with open(recipe, "w") as f:
            f.write(RECIPE_ADAMW)
        script = os.path.join(HERE, "train_reference.py")
        save = os.path.join(d, "final.safetensors")
        args = [script, "--model", name, "--weights", wpath, "--data", tpath, "--steps", "3",
                "--recipe", recipe]
        rc, out = _run(args + ["--save", save])
        check(rc == 0, "train_reference.py: %s" % out)
        lines = [l for l in out.splitlines() if l.startswith("step ")]
        check(len(lines) == 3 and all(tr.RUN_LINE.match(l) for l in lines), "output %r" % out)
        records, params = tr.train(name, make_case.random_weights(name), tokens_np.read(tpath),
                                   3, tr.parse_recipe(RECIPE_ADAMW))
        check(lines == ["step %d loss %.9g grad_norm %.9g lr %.9g" % r for r in records],
              "printed %r" % lines)
        final, dtypes, _ = st.read(save)
        check(set(dtypes.values()) == {"F32"} and
              all(np.array_equal(final[k], params[k].astype(np.float32)) for k in params),
              "--save wrote other weights")
        # --lr after --recipe overrides it.
        rc, out = _run(args + ["--lr", "1e-2", "--steps", "1"])
        check(rc == 0 and "lr 0.005" in out, "--lr 1e-2 with warmup 2: %s" % out)

        # --run-output, on 2 steps of one micro-batch (--micro-batches overrides the recipe).
        args = args + ["--steps", "2", "--micro-batches", "1"]
        records, _ = tr.train(name, make_case.random_weights(name), tokens_np.read(tpath), 2,
                              dict(tr.parse_recipe(RECIPE_ADAMW), micro_batches=1))

        def compare(text, *extra):
            path = os.path.join(d, "run.txt")
            with open(path, "w") as f:
                f.write(text)
            return _run(args + ["--run-output", path] + list(extra))

        good = "plan p\n" + "\n".join("step %d loss %.9g grad_norm %.6g lr %g tokens 512" % r
                                      for r in records) + "\ntime: 2 steps\n"
        rc, out = compare(good)
        check(rc == 0 and out.count("ok  ") == 2, "matching run rejected: %s" % out)
        off = good.replace("step 2 loss %.9g" % records[1][1],
                           "step 2 loss %.9g" % (records[1][1] * (1 + 2e-4)))
        check(compare(off)[0] == 1, "a 2e-4 loss error passed")
        off = good.replace("grad_norm %.6g" % records[1][2],
                           "grad_norm %.6g" % (records[1][2] * (1 + 3e-4)))
        check(compare(off)[0] == 1, "a 3e-4 grad_norm error passed")
        check(compare("\n".join(good.splitlines()[:2]))[0] == 1, "a missing step passed")
        rc, out = compare("\n".join("step %d loss %.9g" % r[:2] for r in records))
        check(rc == 1 and "grad_norm missing" in out, "lines without grad_norm passed: %s" % out)

        # The helpers of training.test and resume.test.
        toks_path = os.path.join(d, "rep.tokens")
        rc, out = _run([script, "repetitive-tokens", "--out", toks_path, "--count", "1000"])
        check(rc == 0 and np.array_equal(tokens_np.read(toks_path),
                                         tr.repetitive_tokens(24, 1000)), "repetitive-tokens")
        run = os.path.join(d, "long.txt")
        with open(run, "w") as f:
            f.write("step 1 loss 5.5 grad_norm 1 lr 0.001\nstep 2 loss 0.04 grad_norm 1 lr 0.001\n")
        conv = [script, "check-converged", "--run-output", run]
        check(_run(conv + ["--steps", "2", "--loss-below", "0.05"])[0] == 0, "converged")
        check(_run(conv + ["--steps", "2", "--loss-below", "0.01"])[0] == 1, "not below")
        check(_run(conv + ["--steps", "3", "--loss-below", "0.05"])[0] == 1, "a missing step")
        a, b = os.path.join(d, "a"), os.path.join(d, "b")
        for root in (a, b):
            os.makedirs(os.path.join(root, "step-00000020"))
            os.makedirs(os.path.join(root, "step-00000010"))
            for rel, data in (("step-00000020/model.safetensors", b"w"),
                              ("step-00000020/state.json", b"{}"),
                              ("step-00000010/model.safetensors", b"x" if root == a else b"y")):
                with open(os.path.join(root, rel), "wb") as f:
                    f.write(data)
        same = [script, "same-files", a, b, "--prefix"]
        check(_run(same + ["step-00000020"])[0] == 0, "identical checkpoints differ")
        check(_run(same + ["step-00000010"])[0] == 1, "different checkpoints are the same")
        check(_run(same + ["step-00000030"])[0] == 1, "no checkpoint at all passed")
        with open(os.path.join(b, "step-00000020", "extra"), "wb") as f:
            f.write(b"")
        check(_run(same + ["step-00000020"])[0] == 1, "an extra file passed")
        for root in (a, b):  # checkpoints as files rather than directories
            with open(os.path.join(root, "step-00000040.safetensors"), "wb") as f:
                f.write(b"z")
        check(_run(same + ["step-00000040"])[0] == 0, "identical checkpoint files differ")


def main(argv):
    verbose = "-v" in argv
    selected = [a for a in argv if a != "-v"]
    passed = failed = 0
    for fn in TESTS:
        if selected and not any(s in fn.__name__ for s in selected):
            continue
        try:
            fn()
        except Exception:  # noqa: BLE001 - every failure is reported, then counted
            failed += 1
            print("FAIL %s" % fn.__name__)
            text = traceback.format_exc()
            print("  " + (text if verbose else text.strip().splitlines()[-1]).replace("\n", "\n  "))
        else:
            passed += 1
            print("PASS %s" % fn.__name__)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
