#!/usr/bin/env python3
"""bench/remat_compile_bench.py - how long `bonsai.remat "auto"` takes to fit a budget.

Compiles every example model (and a Llama-2-70B-shaped model generated for it) with three
recipes (plain AdamW, QLoRA r16 on every linear of the blocks, GaLore on the attention and MLP
matrices), each under ten budgets from the planned peak without recomputation down to the
smallest peak any recomputation reaches (the compiler's own report of it: a budget of 1 byte
is an error that names it), and prints one table: the compile's wall time, what the search
chose (the recomputed share of the step's FLOPs, the planned peak, the trial plans it made) or
its error. A compile-time benchmark, run on the build machine (no GPU): the issue's bar is
every compile under 10 s on 2 cores, the 70B shape under 60 s.

    bench/remat_compile_bench.py [--bonsai-compile build/bin/bonsai-compile] [--models a,b]
        [--recipes adamw,qlora,galore] [--steps 10] [--time-limit S]

Uses only the Python standard library.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MODELS = ["tiny_llama", "gpt2_124m", "llama_124m", "tinyllama_1_1b", "llama2_7b", "llama3_8b",
          "llama2_70b"]
# Llama-2-70B's published config, at batch 1 x 2048.
LLAMA2_70B = ["hidden=8192", "layers=80", "heads=64", "kv_heads=8", "intermediate=28672"]

LLAMA_LINEARS = '["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]'
GPT2_LINEARS = '["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"]'


def recipe(name, model):
    gpt2 = model.startswith("gpt2")
    linears = GPT2_LINEARS if gpt2 else LLAMA_LINEARS
    tiny = model.startswith("tiny_")
    lines = ['  bonsai.target "sm_90"']
    if name == "adamw":
        lines.append('  bonsai.optimizer "adamw" lr 3.000000e-04')
    elif name == "qlora":
        block = 32 if tiny else 64
        lines.append('  bonsai.quantize "nf4" block %d double_quant 256 targets %s'
                     % (block, linears))
        lines.append('  bonsai.lora rank 16 alpha 3.200000e+01 targets %s' % linears)
        lines.append('  bonsai.optimizer "adamw" lr 2.000000e-04')
    elif name == "galore":
        rank = 16 if tiny else 128
        targets = '["c_fc", "mlp.c_proj"]' if gpt2 else '["q_proj", "o_proj", "*.mlp.*_proj*"]'
        lines.append('  bonsai.optimizer "adamw" lr 1.000000e-03')
        lines.append('  bonsai.galore rank %d update_proj_gap 200 scale 2.500000e-01 '
                     'projector "randomized" targets %s' % (rank, targets))
    else:
        raise ValueError(name)
    lines.append('  bonsai.remat "auto"')
    return "bonsai.recipe @bench {\n" + "\n".join(lines) + "\n}\n"


def compile_once(compiler, model_path, recipe_path, budget, extra):
    out = os.path.join(tempfile.gettempdir(), "remat_compile_bench.plan")
    cmd = [compiler, model_path, recipe_path, "--device-memory=%d" % budget, "-o", out] + extra
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - start
    return proc.returncode, proc.stdout + proc.stderr, seconds


GIB = 1024 ** 3


def format_bytes(n):
    return "%.2f GiB" % (n / GIB) if n >= GIB else "%.2f MiB" % (n / 2 ** 20)


def parse_bytes(text):
    """"7.21 GiB" as bytes, and the most its two-decimal rounding can hide."""
    value, unit = text.split()
    scale = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": GIB, "TiB": 1024 * GIB}[unit]
    return int(float(value) * scale), int(0.006 * scale) + 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bonsai-compile", default=os.path.join(ROOT, "build", "bin",
                                                                 "bonsai-compile"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--recipes", default="adamw,qlora,galore")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--time-limit", type=float, default=0,
                        help="pass --remat-time-limit (0: the compiler's default)")
    args = parser.parse_args()
    extra = ["--remat-time-limit=%g" % args.time_limit] if args.time_limit else []
    tmp = tempfile.mkdtemp(prefix="remat_compile_bench.")

    print("| model | recipe | budget | time | recomputed FLOPs | planned peak | result |")
    print("|---|---|---|---|---|---|---|")
    worst = {}
    for model in args.models.split(","):
        model_path = os.path.join(ROOT, "examples", "models", model + ".mlir")
        if model == "llama2_70b":
            model_path = os.path.join(tmp, "llama2_70b.mlir")
            text = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_models.py"),
                                   "--print", "llama2_7b"] + sum([["--set", s] for s in LLAMA2_70B], []),
                                  capture_output=True, text=True, check=True).stdout
            with open(model_path, "w") as f:
                f.write(text)
        for name in args.recipes.split(","):
            recipe_path = os.path.join(tmp, "%s.%s.mlir" % (model, name))
            with open(recipe_path, "w") as f:
                f.write(recipe(name, model))
            # The bounds: without recomputation (a budget nothing exceeds), and the smallest
            # peak any recomputation reaches (named by the error of a 1-byte budget).
            rc, out, _ = compile_once(args.bonsai_compile, model_path, recipe_path, 1 << 50, extra)
            top = re.search(r"peak device\s+([\d.]+ \w+)", out)
            if rc != 0 or not top:
                error = re.search(r"error: (.*)", out)
                print("| %s | %s | - | - | - | - | does not compile: %s |"
                      % (model, name, error.group(1)[:160] if error else "rc %d" % rc))
                continue
            rc, out, _ = compile_once(args.bonsai_compile, model_path, recipe_path, 1, extra)
            low = re.search(r"smallest planned device peak[^(]*\((\d+) bytes", out)
            if not low:
                print("| %s | %s | - | - | - | - | no lower bound: %s |"
                      % (model, name, out.strip().splitlines()[-1][:200]))
                continue
            # The report rounds to two decimals: a little above, so the top budget needs nothing.
            peak, rounding = parse_bytes(top.group(1))
            high, low = peak + rounding, int(low.group(1))
            for k in range(args.steps):
                budget = high - (high - low) * k // max(1, args.steps - 1)
                rc, out, seconds = compile_once(args.bonsai_compile, model_path, recipe_path,
                                                budget, extra)
                worst[model] = max(worst.get(model, 0), seconds)
                flops = re.search(r"FLOPs per step, ([\d.]+%) of the step", out)
                peak = re.search(r"peak device\s+([\d.]+ \w+)", out)
                plans = re.search(r"(\d+) trial plans in", out)
                if rc == 0:
                    result = "fits" if "without recomputation" in out else "%s trial plans" % (
                        plans.group(1) if plans else "?")
                else:
                    error = re.search(r"error: (.*)", out)
                    result = "error: " + (error.group(1)[:120] if error else "rc %d" % rc)
                print("| %s | %s | %s | %.2f s | %s | %s | %s |"
                      % (model, name, format_bytes(budget), seconds, flops.group(1) if flops else "-",
                         peak.group(1) if peak and rc == 0 else "-", result), flush=True)
    print()
    print("| model | slowest compile |")
    print("|---|---|")
    for model, seconds in worst.items():
        print("| %s | %.2f s |" % (model, seconds))


if __name__ == "__main__":
    sys.exit(main())
