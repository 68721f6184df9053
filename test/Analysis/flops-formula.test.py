"""Checks the cost report of each example model against formulas evaluated on its config."""
import importlib.util
import os
import re
import subprocess
import sys

src, bonsai_opt = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("gen_models",
                                              os.path.join(src, "scripts", "gen_models.py"))
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)


def expected(arch, c):
    D, L, V, S = c["hidden"], c["layers"], c["vocab"], c["seq"]
    if arch == gen.LLAMA:
        kv = D // c["heads"] * c["kv_heads"]
        block = 2 * D * D + 2 * D * kv + 3 * D * c["intermediate"]
        gemm = L * block + V * D
        total = L * (block + 2 * D) + D + V * D * (1 if c["tied"] else 2)
    else:
        block = 12 * D * D
        gemm = L * block + V * D
        total = L * (block + 13 * D) + 2 * D + V * D + c["positions"] * D
    attention = 12 * L * D * (S + 1) // 2
    return total, gemm, 6 * gemm + attention, attention


def number(pattern, text):
    m = re.search(pattern, text)
    if not m:
        raise SystemExit("pattern %r not found in report:\n%s" % (pattern, text))
    return int(m.group(1).replace(",", ""))


failures = 0
for name, (arch, config) in sorted(gen.MODELS.items()):
    path = os.path.join(src, "examples", "models", name + ".mlir")
    report = subprocess.run([bonsai_opt, "--bonsai-print-cost=per-layer=0", path, "-o",
                             os.devnull], check=True, capture_output=True, text=True).stdout
    total, gemm, training, attention = expected(arch, config)
    got = (number(r"total\s+([\d,]+)", report), number(r"GEMM weights \(N\)\s+([\d,]+)", report),
           number(r"training\s+[\d,]+; GEMM ([\d,]+)", report),
           number(r"training\s+[\d,]+; GEMM [\d,]+ \(attention ([\d,]+)\)", report))
    want = (total, gemm, training, attention)
    status = "ok" if got == want else "MISMATCH"
    failures += got != want
    print("%-16s params %s N %s training GEMM/token %s attention %s: %s" % (
        name, *("{:,}".format(v) for v in got), status))
    if got != want:
        print("    expected params %s N %s training GEMM/token %s attention %s" %
              tuple("{:,}".format(v) for v in want))
sys.exit(1 if failures else 0)
