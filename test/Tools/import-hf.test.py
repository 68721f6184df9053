#!/usr/bin/env python3
"""test/Tools/import-hf.test.py - write a Hugging Face model directory for the import tests.

Writes OUT/config.json and OUT/model.safetensors (or two shards and
model.safetensors.index.json with --sharded) for a preset configuration, with the tensor names
and shapes of the Hugging Face implementation (LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM, GPT2LMHeadModel), written here from the transformers modules independently
of the importer. Tensor data is zeros, written as a sparse file, so the 1.1B preset costs no
disk space: the importer reads headers only (and bonsai-run then computes the loss of an
all-zero model, ln(vocab)).

    import-hf.test.py OUT --preset tiny_llama [--arch Qwen2ForCausalLM] [--set KEY=JSON]...
                      [--set-late KEY=JSON]... [--unset KEY]... [--drop NAME]...
                      [--shape NAME=2x3]... [--dtype-of NAME=U8]
                      [--add NAME=2x3]... [--tensor-dtype F32] [--sharded] [--no-prefix]

Standard library only (the python3 on PATH may have no numpy).
"""
import argparse
import json
import os
import struct

PRESETS = {
    # scripts/gen_models.py's models, as the config.json of the checkpoint they describe.
    "tiny_llama": dict(architectures=["LlamaForCausalLM"], vocab_size=256, hidden_size=64,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=176, rope_theta=10000.0, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, max_position_embeddings=64,
                       hidden_act="silu", torch_dtype="float32", attention_bias=False,
                       rope_scaling=None, model_type="llama"),
    "tinyllama_1_1b": dict(architectures=["LlamaForCausalLM"], vocab_size=32000,
                           hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, intermediate_size=5632, rope_theta=10000.0,
                           rms_norm_eps=1e-5, tie_word_embeddings=False,
                           max_position_embeddings=2048, hidden_act="silu",
                           torch_dtype="bfloat16", model_type="llama"),
    "tiny_gpt2": dict(architectures=["GPT2LMHeadModel"], vocab_size=256, n_embd=64, n_layer=2,
                      n_head=4, n_positions=64, layer_norm_epsilon=1e-5,
                      activation_function="gelu_new", n_inner=None, torch_dtype="float32",
                      model_type="gpt2"),
    "gpt2_124m": dict(architectures=["GPT2LMHeadModel"], vocab_size=50257, n_embd=768,
                      n_layer=12, n_head=12, n_positions=1024, layer_norm_epsilon=1e-5,
                      activation_function="gelu_new", model_type="gpt2"),
}


def llama_tensors(c):
    D, V, I = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    H = c["num_attention_heads"]
    KV = c.get("num_key_value_heads") or H
    hd = c.get("head_dim") or D // H
    arch = c["architectures"][0]
    bias = arch == "Qwen2ForCausalLM" or (arch == "Qwen3ForCausalLM" and
                                          c.get("attention_bias", False))
    t = {"model.embed_tokens.weight": [V, D], "model.norm.weight": [D]}
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = [D]
        t[p + "post_attention_layernorm.weight"] = [D]
        for name, out in (("q_proj", H * hd), ("k_proj", KV * hd), ("v_proj", KV * hd)):
            t[p + "self_attn.%s.weight" % name] = [out, D]
            if bias:
                t[p + "self_attn.%s.bias" % name] = [out]
        t[p + "self_attn.o_proj.weight"] = [D, H * hd]
        if arch == "Qwen3ForCausalLM":
            t[p + "self_attn.q_norm.weight"] = [hd]
            t[p + "self_attn.k_norm.weight"] = [hd]
        t[p + "mlp.gate_proj.weight"] = [I, D]
        t[p + "mlp.up_proj.weight"] = [I, D]
        t[p + "mlp.down_proj.weight"] = [D, I]
    if not c.get("tie_word_embeddings", False):
        t["lm_head.weight"] = [V, D]
    return t


def gpt2_tensors(c, prefix):
    D, V, P = c["n_embd"], c["vocab_size"], c["n_positions"]
    I = c.get("n_inner") or 4 * D
    t = {prefix + "wte.weight": [V, D], prefix + "wpe.weight": [P, D],
         prefix + "ln_f.weight": [D], prefix + "ln_f.bias": [D]}
    for i in range(c["n_layer"]):
        p = prefix + "h.%d." % i
        for ln in ("ln_1", "ln_2"):
            t[p + ln + ".weight"] = [D]
            t[p + ln + ".bias"] = [D]
        # Conv1D: weight [in, out].
        for name, fin, fout in (("attn.c_attn", D, 3 * D), ("attn.c_proj", D, D),
                                ("mlp.c_fc", D, I), ("mlp.c_proj", I, D)):
            t[p + name + ".weight"] = [fin, fout]
            t[p + name + ".bias"] = [fout]
    if c.get("tie_word_embeddings", True) is False:
        t["lm_head.weight"] = [V, D]
    return t


SIZES = {"F32": 4, "F16": 2, "BF16": 2, "U8": 1, "I64": 8}


def write_safetensors(path, tensors, dtypes):
    header, offset = {}, 0
    for name in sorted(tensors):
        n = 1
        for d in tensors[name]:
            n *= d
        size = n * SIZES[dtypes[name]]
        header[name] = {"dtype": dtypes[name], "shape": tensors[name],
                        "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)  # zeros, sparse


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("--arch", help="replace the architecture (Mistral/Qwen2 on a Llama preset)")
    ap.add_argument("--set", action="append", default=[], help="KEY=JSON config value")
    ap.add_argument("--set-late", action="append", default=[],
                    help="KEY=JSON config value that does not change the tensors written")
    ap.add_argument("--unset", action="append", default=[], help="remove a config key")
    ap.add_argument("--drop", action="append", default=[], help="leave a tensor out")
    ap.add_argument("--shape", action="append", default=[], help="NAME=AxB: change a shape")
    ap.add_argument("--dtype-of", action="append", default=[], help="NAME=DTYPE of one tensor")
    ap.add_argument("--add", action="append", default=[], help="NAME=AxB: an extra tensor")
    ap.add_argument("--tensor-dtype", help="dtype of every tensor (default: the config's)")
    ap.add_argument("--sharded", action="store_true")
    ap.add_argument("--no-prefix", action="store_true", help="GPT-2 names without transformer.")
    a = ap.parse_args()

    config = dict(PRESETS[a.preset])
    if a.arch:
        config["architectures"] = [a.arch]
    for item in a.set:
        key, value = item.split("=", 1)
        config[key] = json.loads(value)
    if config["architectures"][0] == "GPT2LMHeadModel":
        tensors = gpt2_tensors(config, "" if a.no_prefix else "transformer.")
    else:
        tensors = llama_tensors(config)
    for item in a.set_late:
        key, value = item.split("=", 1)
        config[key] = json.loads(value)
    for key in a.unset:
        config.pop(key, None)
    dtype = a.tensor_dtype or {"bfloat16": "BF16", "float16": "F16"}.get(
        config.get("torch_dtype"), "F32")
    for name in a.drop:
        del tensors[name]
    shape = lambda text: [int(d) for d in text.split("x")] if text else []
    for item in a.shape:
        name, dims = item.split("=")
        tensors[name] = shape(dims)
    for item in a.add:
        name, dims = item.split("=")
        tensors[name] = shape(dims)
    dtypes = {name: dtype for name in tensors}
    for item in a.dtype_of:
        name, d = item.split("=")
        dtypes[name] = d

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    if not a.sharded:
        write_safetensors(os.path.join(a.out, "model.safetensors"), tensors, dtypes)
        return
    names = sorted(tensors)
    weight_map = {}
    for k in range(2):
        shard = "model-%05d-of-00002.safetensors" % (k + 1)
        part = {n: tensors[n] for n in names[k::2]}
        write_safetensors(os.path.join(a.out, shard), part, dtypes)
        weight_map.update({n: shard for n in part})
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


if __name__ == "__main__":
    main()
