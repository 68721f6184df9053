"""bonsai-tokenize --jsonl and version-2 token files, end to end (see the .test file).

The expected renderings are written from the published chat templates (Meta-Llama-3-8B-Instruct,
Qwen2-7B-Instruct); the .test file also compares with what transformers gave on the H200 machine.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

tokenize, run, plan, tokenizers, tmp = sys.argv[1:6]
failures = []


def check(ok, what):
    print(("ok      " if ok else "FAILED  ") + what)
    if not ok:
        failures.append(what)


LLAMA3_TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
                   "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
                   "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
                   "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}")
QWEN2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                  "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
                  "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
                  "{% endfor %}")


def model_dir(name, source, template=None):
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(tokenizers, source), os.path.join(d, "tokenizer.json"))
    if template is not None:
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"chat_template": template}, f)
    return d


def read_v2(path):
    data = open(path, "rb").read()
    magic, version, width, count = struct.unpack_from("<8sIIQ", data, 0)
    assert magic == b"BONSAITK" and version == 2, (magic, version)
    vocab, pad, fingerprint, docs = struct.unpack_from("<IIQQ", data, 24)
    at = 48
    fmt = "<%d%s" % (count, "H" if width == 2 else "I")
    tokens = list(struct.unpack_from(fmt, data, at))
    at += count * width
    ends = list(struct.unpack_from("<%dQ" % docs, data, at))
    at += docs * 8
    mask_bytes = data[at:]
    assert len(mask_bytes) == (count + 7) // 8
    mask = [(mask_bytes[i // 8] >> (i % 8)) & 1 for i in range(count)]
    return dict(vocab=vocab, pad=pad, fingerprint=fingerprint, tokens=tokens, ends=ends, mask=mask)


def write_v2(path, vocab, fingerprint, docs):
    """A version-2 file written independently of the C++ writer: docs is [(tokens, mask)]."""
    tokens, mask, ends = [], [], []
    for t, m in docs:
        tokens += t
        mask += m
        ends.append(len(tokens))
    bits = bytearray((len(tokens) + 7) // 8)
    for i, b in enumerate(mask):
        if b:
            bits[i // 8] |= 1 << (i % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<8sIIQIIQQ", b"BONSAITK", 2, 2, len(tokens), vocab, 0, fingerprint, len(ends)))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))
        f.write(struct.pack("<%dQ" % len(ends), *ends))
        f.write(bytes(bits))


def tool(*args):
    p = subprocess.run(list(args), capture_output=True)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


# --- Good input: two formats, decoded back to the templates' renderings. ---
lines = [
    {"prompt": "What is 2+2?", "response": "4."},
    None,  # a blank line: no record
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hi there"},
                  {"role": "assistant", "content": " Hello! "},
                  {"role": "user", "content": "Bye"},
                  {"role": "assistant", "content": "Bye."}]},
    {"system": "S", "prompt": "p", "response": "r"},
]
good = os.path.join(tmp, "good.jsonl")
with open(good, "w") as f:
    for line in lines:
        f.write(("" if line is None else json.dumps(line)) + "\n")

expected = {
    "llama3": (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n4.<|eot_id|>"
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nBye.<|eot_id|>"
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\np<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nr<|eot_id|>"),
    "chatml": (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4.<|im_end|>\n"
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\nBye.<|im_end|>\n"
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\np<|im_end|>\n"
        "<|im_start|>assistant\nr<|im_end|>\n"),
}
dirs = {"llama3": model_dir("l3", "llama3.json", LLAMA3_TEMPLATE),
        "chatml": model_dir("qw", "qwen2.json", QWEN2_TEMPLATE)}
files = {}
for fmt, d in dirs.items():
    out = os.path.join(tmp, fmt + ".bin")
    rc, stdout, stderr = tool(tokenize, "--jsonl", good, "--tokenizer", d, "-o", out, "--threads", "2")
    check(rc == 0 and "chat format: %s (from chat_template of" % fmt in stdout and
          "3 conversations" in stdout, "%s: encodes (%s%s)" % (fmt, stdout.strip()[-120:], stderr.strip()))
    if rc:
        continue
    files[fmt] = out
    v2 = read_v2(out)
    check(len(v2["ends"]) == 3 and v2["ends"][-1] == len(v2["tokens"]), "%s: 3 documents" % fmt)
    trained = sum(v2["mask"])
    check(0 < trained < len(v2["tokens"]), "%s: %d of %d tokens trained" % (fmt, trained, len(v2["tokens"])))
    check(all(t < v2["vocab"] for t in v2["tokens"]), "%s: ids below the vocabulary %d" % (fmt, v2["vocab"]))
    rc, _, _ = tool(tokenize, "--decode", out, "--tokenizer", d, "-o", out + ".txt")
    text = open(out + ".txt", encoding="utf-8").read() if rc == 0 else ""
    check(text == expected[fmt], "%s: decodes to the template's rendering" % fmt)
    if text != expected[fmt]:
        print("  got:      %r\n  expected: %r" % (text, expected[fmt]))
    # The ids do not depend on the thread count.
    one = os.path.join(tmp, fmt + "-1.bin")
    tool(tokenize, "--jsonl", good, "--tokenizer", d, "-o", one, "--threads", "1")
    check(open(one, "rb").read() == open(out, "rb").read(), "%s: same bytes with 1 thread" % fmt)
    # --chat-format overrides what the config says (here: the same format).
    rc, stdout, _ = tool(tokenize, "--jsonl", good, "--tokenizer", d, "-o", one, "--chat-format", fmt)
    check(rc == 0 and "(from --chat-format)" in stdout, "%s: --chat-format %s" % (fmt, fmt))


# --- Bad inputs: one error line naming file:line, exit 1, no output. ---
def expect_error(what, args, message):
    out = os.path.join(tmp, "bad-out.bin")
    if os.path.exists(out):
        os.remove(out)
    rc, stdout, stderr = tool(tokenize, *args, "-o", out)
    first = stderr.splitlines()[0] if stderr else ""
    ok = (rc == 1 and first.startswith("bonsai-tokenize: error: ") and message in first and
          not os.path.exists(out) and not [n for n in os.listdir(tmp) if n.startswith("bad-out.bin")])
    check(ok, "%s: %s" % (what, first or "(no error; exit %d)" % rc))


def write(name, text):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


l3 = dirs["llama3"]
bad_json = write("bad-json.jsonl", json.dumps(lines[0]) + "\n\n{\"prompt\": \"x\",\n")
expect_error("bad JSON", ["--jsonl", bad_json, "--tokenizer", l3],
             "bad-json.jsonl:3: invalid JSON at byte 15")
missing = write("missing.jsonl", '{"prompt": "p"}\n')
expect_error("missing field", ["--jsonl", missing, "--tokenizer", l3],
             'missing.jsonl:1: the object has no "response"')
wrong_type = write("wrong-type.jsonl", json.dumps(lines[0]) + '\n{"messages": [{"role": "user", "content": 7}]}\n')
expect_error("content not a string", ["--jsonl", wrong_type, "--tokenizer", l3],
             'wrong-type.jsonl:2: message 0 "content" is a number, expected a string')
no_answer = write("no-answer.jsonl", '{"messages": [{"role": "user", "content": "q"}]}\n')
expect_error("no assistant message", ["--jsonl", no_answer, "--tokenizer", l3],
             "no-answer.jsonl:1: the conversation has no assistant message")
# An error far into a large file (many units, several threads) still names its line.
big = write("big.jsonl", "".join(json.dumps(lines[0]) + "\n" for _ in range(14999)) + "oops\n" +
            "".join(json.dumps(lines[0]) + "\n" for _ in range(3000)))
expect_error("bad line 15000 of a large file", ["--jsonl", big, "--tokenizer", l3, "--threads", "2"],
             "big.jsonl:15000: invalid JSON at byte 0")
expect_error("unknown chat format", ["--jsonl", good, "--tokenizer", l3, "--chat-format", "vicuna"],
             "--chat-format must be auto, llama3, chatml or mistral, got 'vicuna'")
gpt2 = model_dir("g2", "gpt2.json")
expect_error("format not told", ["--jsonl", good, "--tokenizer", gpt2], "cannot tell the chat format")
expect_error("format unknown to the model", ["--jsonl", good, "--tokenizer", gpt2, "--chat-format", "chatml"],
             "has no token <|im_start|>: it does not know the chatml chat format")
expect_error("--jsonl without --tokenizer", ["--jsonl", good], "--jsonl needs --tokenizer")
expect_error("--chat-format without --jsonl", [good, "--tokenizer", l3, "--chat-format", "llama3"],
             "--chat-format is for --jsonl")

# --- bonsai-run: packing trains; a tokenizer mismatch is refused. ---
docs = [([(7 * i + j) % 256 for j in range(n)], [0] * (n // 2) + [1] * (n - n // 2))
        for i, n in enumerate([30, 70, 5, 64, 100, 41, 12, 90] * 6)]
data = os.path.join(tmp, "data-v2.bin")
write_v2(data, 256, 0x1111, docs)
rc, stdout, stderr = tool(run, plan, "--data", data, "--steps", "2", "--seed", "3")
check(rc == 0 and "step 2 loss" in stdout, "bonsai-run trains on a packed version-2 file (%s)" %
      (stderr.strip() or [l for l in stdout.splitlines() if l.startswith("step")]))
# The unpacked plan attends across the packed documents: warned once, with the fix.
check("warning: '%s' holds 48 documents, packed several to a row, but the plan has no "
      "positions / segment_ids inputs" % data in stderr and "--packed" in stderr,
      "bonsai-run warns that an unpacked plan attends across packed documents (%s)" % stderr)
rc2, stdout2, _ = tool(run, plan, "--data", data, "--steps", "2", "--seed", "3", "--no-shuffle")
check(rc2 == 0 and [l for l in stdout.splitlines() if l.startswith("step 1")] !=
      [l for l in stdout2.splitlines() if l.startswith("step 1")],
      "--no-shuffle reads another order")
# A resume reads the packed batches it would have read: steps 3-4 after a checkpoint at step 2
# give the losses of an uninterrupted run, bit for bit.
steps = lambda out: [l.split(" time")[0] for l in out.splitlines() if l.startswith("step ")]
ck = os.path.join(tmp, "ck")
_, straight, _ = tool(run, plan, "--data", data, "--steps", "4", "--seed", "5")
_, first, _ = tool(run, plan, "--data", data, "--steps", "2", "--seed", "5", "--save-every", "2", "--ckpt-dir", ck)
rc, resumed, stderr = tool(run, plan, "--data", data, "--steps", "2", "--resume", ck)
check(rc == 0 and len(steps(straight)) == 4 and steps(first) + steps(resumed) == steps(straight),
      "resume continues the packed batches bit for bit (%s)" % (stderr.strip() or steps(resumed)))
other = os.path.join(tmp, "eval-other.bin")
write_v2(other, 256, 0x2222, docs)
rc, _, stderr = tool(run, plan, "--data", data, "--eval-data", other, "--eval-every", "1")
check(rc == 1 and "--eval-data: token files" in stderr and "were made with different tokenizers" in stderr,
      "eval file of another tokenizer: %s" % stderr.strip())
same = os.path.join(tmp, "eval-same.bin")
write_v2(same, 256, 0x1111, docs[:20])
rc, stdout, stderr = tool(run, plan, "--data", data, "--eval-data", same, "--eval-every", "1")
check(rc == 0 and "val_loss" in stdout, "eval file of the same tokenizer (%s)" % stderr.strip())
if "llama3" in files:
    rc, _, stderr = tool(run, plan, "--data", files["llama3"])
    check(rc == 1 and "was made with a tokenizer of vocabulary 2048, larger than the plan's vocab_size 256"
          in stderr, "data of a larger vocabulary: %s" % stderr.strip())

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
