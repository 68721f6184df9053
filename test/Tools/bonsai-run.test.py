"""Corrupts a compiled plan and a checkpoint in many ways and runs bonsai-run on each."""
import os
import random
import struct
import subprocess
import sys

plan_path = sys.argv[1]
work = os.path.dirname(plan_path)
rng = random.Random(20261129)
with open(plan_path, "rb") as f:
    plan = f.read()


def run(args):
    p = subprocess.run(["bonsai-run", *args], capture_output=True)
    err = p.stderr.decode("utf-8", "replace")
    ok = p.returncode == 0 or (p.returncode == 1 and "bonsai-run: error:" in err)
    return ok, p.returncode, err


# A valid checkpoint for the plan, written by hand: every parameter of the tiny Llama, f32.
def tiny_llama_checkpoint():
    import json
    names = {"model.embed_tokens.weight": [256, 64], "model.norm.weight": [64],
             "lm_head.weight": [256, 64]}
    for i in range(2):
        p = "model.layers.%d." % i
        names.update({p + "input_layernorm.weight": [64], p + "post_attention_layernorm.weight": [64],
                      p + "self_attn.q_proj.weight": [64, 64], p + "self_attn.k_proj.weight": [32, 64],
                      p + "self_attn.v_proj.weight": [32, 64], p + "self_attn.o_proj.weight": [64, 64],
                      p + "mlp.gate_proj.weight": [176, 64], p + "mlp.up_proj.weight": [176, 64],
                      p + "mlp.down_proj.weight": [64, 176]})
    header, data, offset = {}, bytearray(), 0
    for name, shape in sorted(names.items()):
        n = 1
        for d in shape:
            n *= d
        values = [rng.gauss(0, 0.02) for _ in range(n)]
        blob = struct.pack("<%df" % n, *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        data += blob
        offset += len(blob)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + bytes(data)


ckpt = tiny_llama_checkpoint()
ckpt_path = os.path.join(work, "ok.safetensors")
with open(ckpt_path, "wb") as f:
    f.write(ckpt)
ok, code, err = run([plan_path, "--weights", ckpt_path])
if not ok or code != 0:
    sys.exit("the valid checkpoint did not load: exit %d\n%s" % (code, err))

failures = runs = 0
bad = os.path.join(work, "bad.bin")
for target, data in (("plan", plan), ("checkpoint", ckpt)):
    cuts = sorted(rng.sample(range(len(data)), 40)) + [0, 1, 7, 8, 15]
    mutants = [("truncate at %d" % c, data[:c]) for c in cuts]
    for _ in range(120):
        pos = rng.randrange(len(data) if target == "plan" else min(len(data), 4096))
        flipped = data[:pos] + bytes([data[pos] ^ (1 << rng.randrange(8))]) + data[pos + 1:]
        mutants.append(("flip bit at %d" % pos, flipped))
    for what, mutant in mutants:
        with open(bad, "wb") as f:
            f.write(mutant)
        args = [bad] if target == "plan" else [plan_path, "--weights", bad]
        ok, code, err = run(args)
        runs += 1
        if not ok:
            failures += 1
            print("FAILED %s, %s: exit %d\n%s" % (target, what, code, err[-1500:]))
print("%d corrupted runs, %d crashed or failed without an error line" % (runs, failures))
sys.exit(1 if failures else 0)
