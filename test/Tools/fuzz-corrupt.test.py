"""Mutation fuzzing of bonsai-opt's parser and verifiers (truncations, byte flips, deletions)."""
import random
import subprocess
import sys

bonsai_opt, paths = sys.argv[1], sys.argv[2:]
rng = random.Random(20261129)
# Bytes that tend to reach deep parser and verifier paths when they replace something.
interesting = [b"0", b"1", b"-1", b"x", b"?", b"%", b"<", b">", b"{", b"}", b"\"", b"\x00",
               b"99999999999999999999", b"f8E4M3FN", b"i64", b"nf4", b"trainable", b"frozen"]


def mutants(data):
    for cut in sorted(rng.sample(range(1, len(data)), min(60, len(data) - 1))):
        yield "truncate at %d" % cut, data[:cut]
    for _ in range(120):
        pos = rng.randrange(len(data))
        kind = rng.randrange(3)
        if kind == 0:
            yield "flip byte %d" % pos, data[:pos] + bytes([data[pos] ^ (1 << rng.randrange(8))]) + data[pos + 1:]
        elif kind == 1:
            n = rng.randrange(1, 16)
            yield "delete %d bytes at %d" % (n, pos), data[:pos] + data[pos + n:]
        else:
            token = rng.choice(interesting)
            yield "insert %r at %d" % (token, pos), data[:pos] + token + data[pos + 1:]


runs = failed = 0
for path in paths:
    with open(path, "rb") as f:
        data = f.read()
    for what, text in mutants(data):
        p = subprocess.run([bonsai_opt, "--bonsai-verify-model", "-", "-o", "/dev/null"],
                           input=text, capture_output=True)
        runs += 1
        ok = p.returncode == 0 or (p.returncode == 1 and b"error" in p.stderr)
        if not ok:
            failed += 1
            print("FAILED %s: %s -> exit %d\n%s" % (path, what, p.returncode,
                                                    p.stderr.decode("utf-8", "replace")[-1500:]))
print("%d mutants, %d crashed or failed without an error" % (runs, failed))
sys.exit(1 if failed else 0)
