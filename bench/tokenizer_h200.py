#!/usr/bin/env python3
"""bench/tokenizer_h200.py - bonsai-tokenize against Hugging Face tokenizers and sentencepiece.

Runs where the Python libraries are (the H200 machine; nothing is downloaded):

1. builds a mixed corpus of several MB from local material: the repository's docs and sources,
   and generated text (accented Latin in composed and decomposed form, CJK, Cyrillic, Greek,
   Arabic, Devanagari, emoji with modifiers and ZWJ sequences, unusual whitespace, long numbers,
   contractions, and each tokenizer's special and added tokens in varied company);
2. trains four small tokenizers on it with the Python libraries (or, with --tokenizers DIR,
   takes those saved earlier): a Llama-3-style byte-level BPE (the Llama-3 split regex,
   ignore_merges, BOS/EOS and a post-processor), a GPT-2-style one (ByteLevel's own regex, merges
   written as "a b" strings, an rstrip and a single_word added token), a Qwen2-style one (NFC,
   the Qwen2 regex, an lstrip added token), and a SentencePiece BPE with byte fallback as
   Llama 2's;
3. encodes the corpus with the Python libraries, whole (one document) and line by line, and
   with bonsai-tokenize (whole, and --lines with --bos/--eos where the tokenizer has them), and
   compares every id;
4. times encoding, line by line, with bonsai-tokenize (1 thread, all threads) next to
   tokenizers' encode_batch and sentencepiece's batch encode (1 thread, all threads), and prints
   one table.

With --save-inputs DIR it also writes the tokenizer files, a small sample text and the ids the
Python libraries give for it (expected.json), which test/runtime/TokenizerTest.cpp checks in CI.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tarfile
import time
import unicodedata

import numpy as np

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]
GPT2_SPECIALS = ["<|endoftext|>"]
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added tokens with matching rules (GPT-2: rstrip, single_word; Qwen2: lstrip).
EXTRA_TOKENS = ["<mask>", "zyzzyva", "<tool_call>"]
NAMES = ["llama3", "gpt2", "qwen2", "sp"]

#---------------------------------------------------------------------------------------------
# The corpus.
#---------------------------------------------------------------------------------------------

WORDS = {
    "fr": "été élève crème brûlée déjà façon naïve où Noël cœur garçon fenêtre hôpital".split(),
    "de": "Größe Straße müssen Äpfel Übergröße Fußgänger schön Mädchen Käse öffentlich".split(),
    "es": "año niño corazón mañana pingüino acción canción búsqueda árbol señor".split(),
    "pl": "zażółć gęślą jaźń źdźbło łódź żółw świat księżyc".split(),
    "vi": "Tiếng Việt người được những chữ quốc ngữ học sinh tương lai".split(),
    "ru": "Привет мир как дела спасибо большое хорошо книга программа".split(),
    "el": "Καλημέρα κόσμε ευχαριστώ πολύ γλώσσα αλφάβητο".split(),
    "ar": "مرحبا بالعالم شكرا جزيلا اللغة العربية".split(),
    "hi": "नमस्ते दुनिया धन्यवाद भाषा हिन्दी".split(),
    "zh": "我们 今天 学习 中文 人工智能 模型 训练 数据 北京 大学 语言".split(),
    "ja": "こんにちは 世界 日本語 カタカナ ひらがな 東京 機械学習 トークン".split(),
    "ko": "안녕하세요 세계 한국어 감사합니다 토큰화 모델".split(),
}
EMOJI = ["😀", "🚀", "🎉", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "✨", "🤖", "1️⃣",
         "👩🏿‍💻", "🧑‍🚀", "🙂", "🔥"]
SPACES = [" ", "  ", "\t", " \t ", "\u00a0", "\u2003", "\u3000", "   ", " \u00a0 "]
ENGLISH = ("The model's loss fell quickly; we'll see whether it'd hold. They're training it, "
           "aren't they? I'm sure you've noticed: it's 3.14159 times faster, costs $1,234,567.89 "
           "and ran 2026-12-02T10:15:00Z. SHE'LL SAY IT'S DONE.").split(" ")
CODE = [
    "def f(x):\n    return x ** 2 + 1  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\n",
    "    if (!ok) {\n        throw std::runtime_error(\"bad\");\n    }\n",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;\n",
    "x = {'a': [1, 2, 3], \"b\": None}  // 0x1F 0b1010 1e-9\n",
    "<div class=\"main\">&nbsp;Hello&amp;world</div>\n",
]


def repo_text(root, limit):
    """Text files of the repository, in a fixed order, up to `limit` bytes."""
    suffixes = (".md", ".cpp", ".h", ".td", ".py", ".mlir", ".sh", ".def", ".fbs", ".cu", ".txt")
    skip = ("build", ".git", "Inputs", "__pycache__", ".gpu")
    out, size = [], 0
    for top in ["docs", "README.md", "runtime", "lib", "include", "tools", "dialects", "test",
                "bench", "examples", "scripts"]:
        path = os.path.join(root, top)
        files = [path] if os.path.isfile(path) else []
        for d, dirs, names in os.walk(path):
            dirs[:] = sorted(x for x in dirs if not x.startswith(skip))
            files += [os.path.join(d, n) for n in sorted(names) if n.endswith(suffixes)]
        for f in files:
            try:
                text = open(f, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            if len(text) > 200_000:
                continue
            out.append(text)
            size += len(text.encode())
            if size >= limit:
                return "".join(out)
    return "".join(out)


def generated_line(rng):
    """One line of mixed text: words of several scripts, emoji, numbers, code, tokens."""
    parts = []
    for _ in range(rng.randint(3, 40)):
        kind = rng.random()
        if kind < 0.30:
            parts.append(rng.choice(ENGLISH))
        elif kind < 0.55:
            lang = rng.choice(list(WORDS))
            w = rng.choice(WORDS[lang])
            if lang in ("fr", "de", "es", "pl", "vi") and rng.random() < 0.3:
                w = unicodedata.normalize("NFD", w)  # decomposed accents: Qwen2's NFC sees them
            parts.append(w.upper() if rng.random() < 0.1 else w)
        elif kind < 0.63:
            parts.append("".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 3))))
        elif kind < 0.70:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
        elif kind < 0.76:
            parts.append(rng.choice(LLAMA3_SPECIALS + GPT2_SPECIALS + QWEN2_SPECIALS))
        elif kind < 0.82:
            tok = rng.choice(EXTRA_TOKENS)
            parts.append(rng.choice([tok, tok + "s", "a" + tok, tok + ".", " " + tok + "  "]))
        elif kind < 0.86:
            parts.append(rng.choice(["'s", "'LL", "'Re", "n't", "'d", "''", "'"]))
        else:
            parts.append(rng.choice(["...", "!?", "—", "–", "«", "»", "“", "”", "(", ")", "[]",
                                     "#", "@", "%", "&&", "->", "::", "\\", "/", "*", "~"]))
    line = ""
    for p in parts:
        line += p + (rng.choice(SPACES) if rng.random() < 0.3 else " ")
    if rng.random() < 0.1:
        line += "\r"  # a CRLF line end
    return line.rstrip(" ") if rng.random() < 0.8 else line


def generated_text(rng, size):
    lines, total = [], 0
    while total < size:
        if rng.random() < 0.1:
            line = rng.choice(CODE).rstrip("\n")
        else:
            line = generated_line(rng)
        if rng.random() < 0.05:
            line += "\n"  # an empty line
        lines.append(line)
        total += len(line.encode()) + 1
    return "\n".join(lines) + "\n"


def build_corpus(root, megabytes):
    rng = random.Random(20261202)
    half = int(megabytes * 1e6 / 2)
    repo = repo_text(root, half)
    gen = generated_text(rng, half)
    # Interleave blocks of both, so every part of the corpus is mixed.
    repo_lines, gen_lines = repo.split("\n"), gen.split("\n")
    out, i, j = [], 0, 0
    while i < len(repo_lines) or j < len(gen_lines):
        out += repo_lines[i:i + 40]
        out += gen_lines[j:j + 25]
        i, j = i + 40, j + 25
    return "\n".join(out)


def sample_text():
    """The small text whose ids the CI test checks: every kind of content above."""
    rng = random.Random(7)
    lines = [
        "Hello, world! The tokenizer's ids must match; they'll be checked.",
        "Accents: été, Größe, año, zażółć, Tiếng Việt; decomposed: " +
        unicodedata.normalize("NFD", "été Größe año") + ".",
        "CJK: 我们今天学习中文。日本語のテキスト、カタカナ。한국어 토큰화.",
        "Emoji: 😀🚀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 1️⃣ ❤️",
        "Specials: <|begin_of_text|>Hi<|eot_id|> <|endoftext|> <|im_start|>user\nhey<|im_end|>",
        "Added: <mask>  x a<mask>b zyzzyva zyzzyvas, a zyzzyva. text  <tool_call> y",
        "Numbers 1234567890 3.14159 1e-9 0x1F; spaces:\t\u00a0\u2003\u3000end  ",
        "def f(x):\n    return x ** 2  # code\r",
        "",
        "SHE'LL say IT'S done; we'd've known.",
    ]
    lines += [generated_line(rng) for _ in range(12)]
    return "\n".join(lines) + "\n"


def lines_of(text):
    """The documents bonsai-tokenize --lines reads: non-empty lines without '\\n' or a final
    '\\r'."""
    out = []
    for line in text.split("\n"):
        if line.endswith("\r"):
            line = line[:-1]
        if line:
            out.append(line)
    return out

#---------------------------------------------------------------------------------------------
# Training.
#---------------------------------------------------------------------------------------------


def train(corpus_path, lines, outdir):
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers,
                            normalizers, processors, trainers)
    import sentencepiece as spm

    def byte_level_bpe(regex, specials, vocab, ignore_merges, nfc):
        tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
        if nfc:
            tok.normalizer = normalizers.NFC()
        if regex:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(lines, trainer=trainer)
        return tok

    paths = {}
    llama3 = byte_level_bpe(LLAMA3_REGEX, LLAMA3_SPECIALS, 2048, True, False)
    bos = llama3.token_to_id("<|begin_of_text|>")
    llama3.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    paths["llama3"] = os.path.join(outdir, "llama3.json")
    llama3.save(paths["llama3"])

    gpt2 = byte_level_bpe(None, GPT2_SPECIALS, 1024, False, False)
    gpt2.add_tokens([AddedToken("<mask>", rstrip=True, normalized=False),
                     AddedToken("zyzzyva", single_word=True)])
    paths["gpt2"] = os.path.join(outdir, "gpt2.json")
    gpt2.save(paths["gpt2"])
    # GPT-2's own files write merges as "a b" strings: save this one that way.
    data = json.load(open(paths["gpt2"], encoding="utf-8"))
    data["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                               for m in data["model"]["merges"]]
    json.dump(data, open(paths["gpt2"], "w", encoding="utf-8"), ensure_ascii=False, indent=1)

    qwen2 = byte_level_bpe(QWEN2_REGEX, QWEN2_SPECIALS, 1536, False, True)
    qwen2.add_tokens([AddedToken("<tool_call>", lstrip=True, normalized=False)])
    paths["qwen2"] = os.path.join(outdir, "qwen2.json")
    qwen2.save(paths["qwen2"])

    prefix = os.path.join(outdir, "sp")
    spm.SentencePieceTrainer.train(
        input=corpus_path, model_prefix=prefix, vocab_size=1000, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_digits=True, add_dummy_prefix=True, allow_whitespace_only_pieces=True,
        character_coverage=0.9995, max_sentence_length=1 << 16, input_sentence_size=200000,
        shuffle_input_sentence=False, num_threads=16)
    os.remove(prefix + ".vocab")
    paths["sp"] = prefix + ".model"
    return paths

#---------------------------------------------------------------------------------------------
# Encoding with the Python libraries.
#---------------------------------------------------------------------------------------------


class Py:
    """A tokenizer through its Python library."""

    def __init__(self, name, path):
        self.name = name
        self.path = path
        if name == "sp":
            import sentencepiece as spm
            self.sp = spm.SentencePieceProcessor(model_file=path)
            self.bos, self.eos = self.sp.bos_id(), self.sp.eos_id()
        else:
            from tokenizers import Tokenizer
            self.tok = Tokenizer.from_file(path)
            specials = {"llama3": ("<|begin_of_text|>", "<|end_of_text|>"),
                        "gpt2": (None, "<|endoftext|>"), "qwen2": (None, "<|endoftext|>")}[name]
            self.bos, self.eos = [self.tok.token_to_id(s) if s else None for s in specials]

    def document(self, text):
        if self.name == "sp":
            return self.sp.encode(text)
        return self.tok.encode(text, add_special_tokens=False).ids

    def lines(self, lines, bos, eos):
        if self.name == "sp":
            enc = self.sp.encode(lines)
        else:
            enc = [e.ids for e in self.tok.encode_batch(lines, add_special_tokens=False)]
        out = []
        for ids in enc:
            out += ([self.bos] if bos else []) + ids + ([self.eos] if eos else [])
        return out

    def decode(self, ids):
        if self.name == "sp":
            return self.sp.decode(ids)
        return self.tok.decode(ids, skip_special_tokens=False)

#---------------------------------------------------------------------------------------------
# bonsai-tokenize.
#---------------------------------------------------------------------------------------------


def bonsai(tool, tokenizer, inputs, out, *flags):
    cmd = [tool, *inputs, "-o", out, "--tokenizer", tokenizer, *flags]
    start = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"bonsai-tokenize failed: {' '.join(cmd)}\n{r.stderr}")
    data = open(out, "rb").read()
    width = int.from_bytes(data[12:16], "little")
    ids = np.frombuffer(data[24:], dtype=np.uint16 if width == 2 else np.uint32)
    return ids.astype(np.int64), seconds, r.stdout


def compare(what, got, want, py):
    want = np.asarray(want, dtype=np.int64)
    if len(got) == len(want) and np.array_equal(got, want):
        return True
    n = min(len(got), len(want))
    diff = np.nonzero(got[:n] != want[:n])[0]
    at = int(diff[0]) if len(diff) else n
    lo = max(0, at - 8)
    print(f"MISMATCH {what}: {len(got)} ids vs {len(want)}, first difference at {at}")
    print(f"  bonsai: {got[lo:at + 8].tolist()}\n  python: {want[lo:at + 8].tolist()}")
    print(f"  python text there: {py.decode(want[lo:at + 8].tolist())!r}")
    return False

#---------------------------------------------------------------------------------------------
# Throughput.
#---------------------------------------------------------------------------------------------

PY_TIMER = r"""
import sys, time
name, path, corpus, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
text = open(corpus, encoding="utf-8", newline="").read()
lines = [l[:-1] if l.endswith("\r") else l for l in text.split("\n")]
lines = [l for l in lines if l]
best = 1e9
if name == "sp":
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=path)
    for _ in range(2):
        t = time.perf_counter(); sp.encode(lines, num_threads=threads); best = min(best, time.perf_counter() - t)
else:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(path)
    for _ in range(2):
        t = time.perf_counter(); tok.encode_batch(lines, add_special_tokens=False); best = min(best, time.perf_counter() - t)
print(best)
"""


def py_seconds(name, path, corpus, threads):
    env = dict(os.environ)
    if name != "sp":
        if threads == 1:
            env["TOKENIZERS_PARALLELISM"] = "false"
        else:
            env["TOKENIZERS_PARALLELISM"] = "true"
            env["RAYON_NUM_THREADS"] = str(threads)
    r = subprocess.run([sys.executable, "-c", PY_TIMER, name, path, corpus, str(threads)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"python timing failed for {name}:\n{r.stderr}")
    return float(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bonsai-tokenize", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--root", default=".")
    ap.add_argument("--corpus-mb", type=float, default=4.0)
    ap.add_argument("--tokenizers", help="use the tokenizer files in this folder, no training")
    ap.add_argument("--save-inputs", help="write tokenizers, sample.txt and expected.json here")
    ap.add_argument("--bench-repeat", type=int, default=4,
                    help="the throughput corpus is the corpus this many times (0: no timing)")
    ap.add_argument("--pack", help="also write the corpus and the Python ids into this .tar.gz")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    threads = os.cpu_count()

    corpus = build_corpus(args.root, args.corpus_mb)
    corpus_path = os.path.join(args.workdir, "corpus.txt")
    open(corpus_path, "w", encoding="utf-8").write(corpus)
    corpus_bytes = len(corpus.encode())
    lines = lines_of(corpus)
    print(f"corpus: {corpus_bytes} bytes, {len(lines)} non-empty lines")

    if args.tokenizers:
        paths = {n: os.path.join(args.tokenizers, n + (".model" if n == "sp" else ".json"))
                 for n in NAMES}
        # The repository keeps the SentencePiece model as base64 text (it is binary).
        if not os.path.exists(paths["sp"]) and os.path.exists(paths["sp"] + ".b64"):
            import base64
            decoded = os.path.join(args.workdir, "sp.model")
            with open(paths["sp"] + ".b64") as f, open(decoded, "wb") as out:
                out.write(base64.b64decode(f.read()))
            paths["sp"] = decoded
    else:
        t = time.perf_counter()
        paths = train(corpus_path, lines, args.workdir)
        print(f"trained the four tokenizers in {time.perf_counter() - t:.1f} s")

    import tokenizers
    import sentencepiece
    print(f"tokenizers {tokenizers.__version__}, sentencepiece {sentencepiece.__version__}, "
          f"{threads} CPUs")

    ok = True
    py_ids = {}
    for name in NAMES:
        py = Py(name, paths[name])
        bos, eos = py.bos is not None and py.bos >= 0, py.eos is not None and py.eos >= 0
        flags = (["--bos"] if bos else []) + (["--eos"] if eos else [])
        whole = py.document(corpus)
        per_line = py.lines(lines, bos, eos)
        py_ids[name] = (whole, per_line)
        out = os.path.join(args.workdir, name + ".bin")
        got, _, stdout = bonsai(args.bonsai_tokenize, paths[name], [corpus_path], out,
                                "--threads", str(threads))
        print(stdout.splitlines()[0])
        same_whole = compare(f"{name} whole corpus", got, whole, py)
        got, _, _ = bonsai(args.bonsai_tokenize, paths[name], [corpus_path], out, "--lines",
                           "--threads", str(threads), *flags)
        same_lines = compare(f"{name} --lines {' '.join(flags)}", got, per_line, py)
        ok &= same_whole and same_lines
        print(f"{name:7s} ids identical: whole corpus ({len(whole)} ids) {same_whole}, "
              f"--lines {' '.join(flags)} ({len(per_line)} ids) {same_lines}, "
              f"on {corpus_bytes} bytes")

    if args.save_inputs:
        os.makedirs(args.save_inputs, exist_ok=True)
        sample = sample_text()
        open(os.path.join(args.save_inputs, "sample.txt"), "w", encoding="utf-8",
             newline="").write(sample)
        expected = {}
        for name in NAMES:
            py = Py(name, paths[name])
            doc = py.document(sample)
            expected[name] = {"document": doc, "decoded": py.decode(doc),
                              "lines": [py.document(l) for l in lines_of(sample)]}
            dest = os.path.join(args.save_inputs, os.path.basename(paths[name]))
            if os.path.abspath(dest) != os.path.abspath(paths[name]):
                open(dest, "wb").write(open(paths[name], "rb").read())
        with open(os.path.join(args.save_inputs, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
        print(f"wrote the test inputs to {args.save_inputs}")

    if args.pack:
        npz = os.path.join(args.workdir, "python_ids.npz")
        np.savez_compressed(npz, **{f"{n}_whole": np.asarray(w, np.uint32)
                                    for n, (w, _) in py_ids.items()},
                            **{f"{n}_lines": np.asarray(l, np.uint32)
                               for n, (_, l) in py_ids.items()})
        with tarfile.open(args.pack, "w:gz") as tar:
            tar.add(corpus_path, "corpus.txt")
            tar.add(npz, "python_ids.npz")
            for name in NAMES:
                tar.add(paths[name], os.path.basename(paths[name]))
            if args.save_inputs:
                tar.add(args.save_inputs, "inputs")

    if args.bench_repeat > 0:
        bench_path = os.path.join(args.workdir, "bench.txt")
        open(bench_path, "w", encoding="utf-8").write(corpus * args.bench_repeat)
        size = corpus_bytes * args.bench_repeat
        print(f"\nencoding throughput, line by line, {size / 1e6:.1f} MB "
              f"(the corpus {args.bench_repeat} times), MB/s (best of 2):")
        print(f"| tokenizer | bonsai-tokenize 1 thread | bonsai-tokenize {threads} threads | "
              f"Python 1 thread | Python {threads} threads |")
        print("|---|---|---|---|---|")
        for name in NAMES:
            row = []
            for th in (1, threads):
                best = min(bonsai(args.bonsai_tokenize, paths[name], [bench_path],
                                  os.path.join(args.workdir, "bench.bin"), "--lines",
                                  "--threads", str(th))[1] for _ in range(2))
                row.append(size / 1e6 / best)
            for th in (1, threads):
                row.append(size / 1e6 / py_seconds(name, paths[name], bench_path, th))
            lib = "sentencepiece" if name == "sp" else "tokenizers"
            print(f"| {name} | {row[0]:.1f} | {row[1]:.1f} | {lib} {row[2]:.1f} | "
                  f"{lib} {row[3]:.1f} |")
        print("(bonsai-tokenize: the whole process, loading and writing included; Python: "
              "encode_batch / encode(list) alone, the file already read)")

    print("ALL IDS IDENTICAL" if ok else "IDS DIFFER")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
