#!/usr/bin/python3
"""test/EndToEnd/finetune-doc.test.py - run docs/finetune.md's commands, as a user would.

Makes, in WORK, what the page starts from, in place of a download: `hf/`, a Hugging Face
directory of a tiny Llama-3.2-shaped model (tied embeddings, rope_scaling "llama3", random fp32
weights) with the Llama-3-style byte-level BPE tokenizer of the tokenizer tests
(test/runtime/Inputs/tokenizers/llama3.json, 2048 ids) and a tokenizer_config.json whose chat
template is Meta-Llama-3-8B-Instruct's (bench/chat_format_h200.py); and `train.jsonl` / `eval.jsonl`, instruction data in both of the page's
forms (prompt/response and chat messages). Then it runs every ```sh block of the page, in
order, in WORK, with bash -e, and prints their output. Blocks fenced ```python need
transformers and run on the GPU machine (bench/finetune_h200.sh), not here.

    finetune-doc.test.py DOC WORK
"""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "test", "reference"))
import safetensors_np  # noqa: E402

sys.path.insert(0, os.path.join(SRC, "bench"))
from chat_format_h200 import LLAMA3 as LLAMA3_TEMPLATE  # noqa: E402  Meta-Llama-3-8B-Instruct's

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=2048,
              hidden_size=64, intermediate_size=176, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu",
              tie_word_embeddings=True, torch_dtype="float32", bos_token_id=0, eos_token_id=4,
              rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                high_freq_factor=4.0, original_max_position_embeddings=64))

SUBJECTS = ["the sea", "a small garden", "trains", "winter light", "bread", "old maps",
            "bees", "a quiet library", "rivers", "the night sky", "clocks", "mountains"]


def make_model(hf):
    os.makedirs(hf, exist_ok=True)
    c = CONFIG
    D, V, I, H, KV = (c["hidden_size"], c["vocab_size"], c["intermediate_size"],
                      c["num_attention_heads"], c["num_key_value_heads"])
    hd = D // H
    rng = np.random.default_rng(0)
    mat = lambda *shape: (0.05 * rng.standard_normal(shape)).astype(np.float32)
    norm = lambda n: (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    w = {"model.embed_tokens.weight": mat(V, D), "model.norm.weight": norm(D)}
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        w[p + "input_layernorm.weight"] = norm(D)
        w[p + "post_attention_layernorm.weight"] = norm(D)
        w[p + "self_attn.q_proj.weight"] = mat(H * hd, D)
        w[p + "self_attn.k_proj.weight"] = mat(KV * hd, D)
        w[p + "self_attn.v_proj.weight"] = mat(KV * hd, D)
        w[p + "self_attn.o_proj.weight"] = mat(D, H * hd)
        w[p + "mlp.gate_proj.weight"] = mat(I, D)
        w[p + "mlp.up_proj.weight"] = mat(I, D)
        w[p + "mlp.down_proj.weight"] = mat(D, I)
    safetensors_np.write(os.path.join(hf, "model.safetensors"), w, None,
                         metadata={"format": "pt"})
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    shutil.copy(os.path.join(SRC, "test", "runtime", "Inputs", "tokenizers", "llama3.json"),
                os.path.join(hf, "tokenizer.json"))
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
        json.dump(dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                       chat_template=LLAMA3_TEMPLATE,
                       tokenizer_class="PreTrainedTokenizerFast"), f, indent=2)


def make_data(work):
    rng = np.random.default_rng(1)
    for name, count in (("train.jsonl", 96), ("eval.jsonl", 16)):
        with open(os.path.join(work, name), "w") as f:
            for i in range(count):
                s = SUBJECTS[int(rng.integers(len(SUBJECTS)))]
                n = int(rng.integers(2, 5))
                answer = " ".join(["Here is a line about %s." % s] * n)
                if i % 2:
                    row = {"prompt": "Write %d lines about %s." % (n, s), "response": answer}
                else:
                    row = {"messages": [
                        {"role": "system", "content": "You answer briefly."},
                        {"role": "user", "content": "Write %d lines about %s." % (n, s)},
                        {"role": "assistant", "content": answer}]}
                f.write(json.dumps(row) + "\n")


def blocks(doc):
    text = open(doc).read()
    return re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M)


def main():
    doc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    make_model(os.path.join(work, "hf"))
    make_data(work)
    found = blocks(doc)
    if not found:
        sys.exit("%s has no ```sh blocks" % doc)
    for i, block in enumerate(found):
        print("== block %d ==" % (i + 1), flush=True)
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=work,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        print(p.stdout, flush=True)
        if p.returncode != 0:
            sys.exit("block %d of %s failed (exit %d):\n%s" % (i + 1, doc, p.returncode, block))
    print("ran %d blocks" % len(found))


if __name__ == "__main__":
    main()
