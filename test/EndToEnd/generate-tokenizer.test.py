"""test/EndToEnd/generate-tokenizer.test.py - a byte-level BPE tokenizer.json without merges.

    generate-tokenizer.test.py OUT_DIR [--extra N]

Writes OUT_DIR/tokenizer.json: GPT-2's byte-level pre-tokenizer and decoder, a BPE model whose
vocabulary is the 256 byte symbols, byte b having id b, and no merges, so that its ids are the
bytes of the text; with --extra N, N more tokens ("<extra_k>") follow, ids 256 and up.
"""
import argparse
import json
import os


def bytes_to_unicode():
    # GPT-2's table (openai/gpt-2 encoder.py): printable bytes map to themselves, the others to
    # U+0100 upward, in byte order.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--extra", type=int, default=0)
    a = ap.parse_args()
    table = bytes_to_unicode()
    vocab = {table[b]: b for b in range(256)}
    for k in range(a.extra):
        vocab["<extra_%d>" % k] = 256 + k
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)


if __name__ == "__main__":
    main()
