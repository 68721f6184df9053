#!/usr/bin/env python3
"""bench/chat_format_h200.py - bonsai-tokenize --jsonl against transformers' apply_chat_template.

Two halves, because transformers is installed on the H200 machine and bonsai-tokenize is built
on the CI machine:

  python3 bench/chat_format_h200.py render --tokenizers test/runtime/Inputs/tokenizers --out hf.json
      (where transformers is) renders the conversations below with the published chat templates
      of Meta-Llama-3-8B-Instruct, Qwen2-7B-Instruct and Mistral-7B-Instruct-v0.1 on the test
      tokenizers: apply_chat_template(messages, tokenize=False), and the ids of
      tokenizer(text, add_special_tokens=False);

  python3 bench/chat_format_h200.py compare --hf hf.json --bonsai-tokenize build/bin/bonsai-tokenize \
      --tokenizers test/runtime/Inputs/tokenizers
      runs bonsai-tokenize --jsonl on the same conversations and compares every rendered string
      (through --decode) and every id. Exit status 1 on any difference.
"""

import argparse
import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
           "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
           "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
           "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
           "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
           "roles are supported!') }}{% endif %}{% endfor %}")

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": " Hello! How can I help? "}, {"role": "user", "content": "Bye"},
     {"role": "assistant", "content": "Bye.\n\nSee you."}],
    [{"role": "user", "content": "Write code:\n  x = 1\n"},
     {"role": "assistant", "content": "```python\nprint('héllo wörld')\n```"}],
    [{"role": "user", "content": "Ünïcödé and 数字 123456"}, {"role": "assistant", "content": "  spaces  "}],
]

# format -> (tokenizer file in the test inputs, template, BOS, EOS)
FORMATS = {
    "llama3": ("llama3.json", LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    "chatml": ("qwen2.json", QWEN2, None, "<|im_end|>"),
    "mistral": ("sp.model", MISTRAL, "<s>", "</s>"),
}


def conversations_for(fmt):
    if fmt == "mistral":  # no system role
        return [[m for m in c if m["role"] != "system"] for c in CONVERSATIONS]
    return CONVERSATIONS


def sp_model(tokenizers, directory):
    path = os.path.join(directory, "tokenizer.model")
    with open(os.path.join(tokenizers, "sp.model.b64")) as f, open(path, "wb") as out:
        out.write(base64.b64decode("".join(f.read().split())))
    return path


def mistral_tokenizer(tokenizers, work, bos, eos, entry):
    """Mistral v0.1's tokenizer as transformers loads it from a directory with tokenizer.model
    (legacy=True, as its tokenizer_config.json says). Constructions differ between transformers
    versions; the first that encodes text (not just the special tokens) is used, and which one is
    recorded."""
    import transformers
    directory = os.path.join(work, "mistral")
    os.makedirs(directory, exist_ok=True)
    sp_model(tokenizers, directory)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "legacy": True, "bos_token": bos,
                   "eos_token": eos, "add_bos_token": True, "add_eos_token": False}, f)
    attempts = [
        ("AutoTokenizer.from_pretrained(use_fast=False)",
         lambda: transformers.AutoTokenizer.from_pretrained(directory, use_fast=False, legacy=True)),
        ("AutoTokenizer.from_pretrained",
         lambda: transformers.AutoTokenizer.from_pretrained(directory, legacy=True)),
        ("LlamaTokenizer(vocab_file)",
         lambda: transformers.LlamaTokenizer(vocab_file=os.path.join(directory, "tokenizer.model"),
                                             legacy=True, bos_token=bos, eos_token=eos)),
    ]
    entry["attempts"] = {}
    for name, make in attempts:
        try:
            tok = make()
            ids = tok("[INST] Hi [/INST]Hello", add_special_tokens=False)["input_ids"]
            entry["attempts"][name] = "%s: %s" % (type(tok).__name__, ids)
            if len(ids) > 3:
                entry["tokenizer"] = name + " -> " + type(tok).__name__
                return tok
        except Exception as e:
            entry["attempts"][name] = repr(e)
    raise RuntimeError("no construction encodes text: %s" % entry["attempts"])


def render(args):
    import transformers
    from transformers import PreTrainedTokenizerFast
    result = {"transformers": transformers.__version__, "formats": {}}
    work = tempfile.mkdtemp()
    for fmt, (name, template, bos, eos) in FORMATS.items():
        entry = {}
        try:
            if fmt == "mistral":
                tok = mistral_tokenizer(args.tokenizers, work, bos, eos, entry)
            else:
                tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(args.tokenizers, name),
                                              bos_token=bos, eos_token=eos)
            tok.chat_template = template
            entry["texts"], entry["ids"] = [], []
            for messages in conversations_for(fmt):
                text = tok.apply_chat_template(messages, tokenize=False)
                entry["texts"].append(text)
                entry["ids"].append(tok(text, add_special_tokens=False)["input_ids"])
        except Exception as e:  # one format's failure must not hide the others
            entry["error"] = repr(e)
        result["formats"][fmt] = entry
        print(fmt, "error: " + entry["error"] if "error" in entry else "ok")
    with open(args.out, "w") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)


def read_v2_tokens(path):
    data = open(path, "rb").read()
    _, version, width, count = struct.unpack_from("<8sIIQ", data, 0)
    assert version == 2
    vocab, pad, fingerprint, docs = struct.unpack_from("<IIQQ", data, 24)
    tokens = list(struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), data, 48))
    ends = list(struct.unpack_from("<%dQ" % docs, data, 48 + count * width))
    return [tokens[(ends[i - 1] if i else 0):e] for i, e in enumerate(ends)]


def compare(args):
    hf = json.load(open(args.hf))
    print("transformers", hf.get("transformers"))
    failures = 0
    work = tempfile.mkdtemp()
    for fmt, (name, template, bos, eos) in FORMATS.items():
        entry = hf["formats"].get(fmt, {})
        if "error" in entry or "texts" not in entry:
            print("%-8s no reference: %s" % (fmt, entry.get("error")))
            failures += 1
            continue
        model = os.path.join(work, fmt)
        os.makedirs(model)
        if fmt == "mistral":
            sp_model(args.tokenizers, model)
        else:
            shutil.copy(os.path.join(args.tokenizers, name), os.path.join(model, "tokenizer.json"))
        config = {"chat_template": template, "bos_token": bos, "eos_token": eos}
        with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        for i, messages in enumerate(conversations_for(fmt)):
            jsonl = os.path.join(work, "%s-%d.jsonl" % (fmt, i))
            with open(jsonl, "w") as f:
                f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
            out = jsonl + ".bin"
            subprocess.run([args.bonsai_tokenize, "--jsonl", jsonl, "--tokenizer", model, "-o", out],
                           check=True, capture_output=True)
            subprocess.run([args.bonsai_tokenize, "--decode", out, "--tokenizer", model, "-o", out + ".txt"],
                           check=True, capture_output=True)
            text = open(out + ".txt", encoding="utf-8").read()
            ids = read_v2_tokens(out)[0]
            same_text, same_ids = text == entry["texts"][i], ids == entry["ids"][i]
            print("%-8s conversation %d: text %s, ids %s" % (fmt, i, "same" if same_text else "DIFFERENT",
                                                            "same" if same_ids else "DIFFERENT"))
            if not same_text:
                print("   bonsai: %r\n   hf:     %r" % (text, entry["texts"][i]))
            if not same_ids:
                print("   bonsai: %s\n   hf:     %s" % (ids, entry["ids"][i]))
            failures += (not same_text) + (not same_ids)
    print("%d difference(s)" % failures)
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render")
    r.add_argument("--tokenizers", required=True)
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--hf", required=True)
    c.add_argument("--bonsai-tokenize", required=True)
    c.add_argument("--tokenizers", required=True)
    args = parser.parse_args()
    if args.command == "render":
        render(args)
        return 0
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
