"""Compares two --dump-gradients files and two `bonsai-run --steps` outputs within tolerances.

    flash-attention-equivalence.test.py GRADS_A GRADS_B STEPS_A STEPS_B

Used by flash-attention-equivalence.test (A is the plan with the flash-attention fusion, B the
one compiled with --fuse=false) and tile-sequence.test (A the plan whose MLPs run in chunks of
the sequence, B the untiled one). Every f32 tensor must match within
    |a - b| <= 1e-5 * max|b| + 1e-5 * |b|     (per element, max over the tensor)
the first step's loss must be identical (the forward is bit for bit the same), and every later
loss, grad_norm and lr within a relative 1e-5. Prints one line per check and the largest error
seen, so the log says how close the two are. Standard library only (no numpy).
"""

import json
import struct
import sys
from array import array


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {info['dtype']}, expected F32")
        begin, end = info["data_offsets"]
        values = array("f")
        values.frombytes(data[begin:end])
        if sys.byteorder != "little":
            values.byteswap()
        tensors[name] = values
    return tensors


def parse_steps(path):
    steps = []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if fields and fields[0] == "step":
                steps.append({fields[i]: fields[i + 1] for i in range(0, len(fields) - 1, 2)})
    return steps


def main():
    grads_a, grads_b, steps_a, steps_b = sys.argv[1:5]
    a, b = read_safetensors(grads_a), read_safetensors(grads_b)
    if sorted(a) != sorted(b):
        sys.exit(f"different gradient names: {sorted(set(a) ^ set(b))}")
    worst, worst_name, identical = 0.0, "", 0
    for name in sorted(a):
        x, y = a[name], b[name]
        if len(x) != len(y):
            sys.exit(f"{name}: {len(x)} elements against {len(y)}")
        scale = max((abs(v) for v in y), default=0.0)
        if x == y:
            identical += 1
        for u, v in zip(x, y):
            err = abs(u - v)
            bound = 1e-5 * scale + 1e-5 * abs(v)
            if err > bound:
                sys.exit(f"{name}: {u!r} against {v!r} (max |unfused| {scale!r})")
            if scale > 0 and err / scale > worst:
                worst, worst_name = err / scale, name
    print(f"gradients within tolerance: {len(a)} tensors, {identical} bit-identical, "
          f"largest error {worst:.1e} of the tensor's max ({worst_name or 'none'})")

    sa, sb = parse_steps(steps_a), parse_steps(steps_b)
    if not sa or len(sa) != len(sb):
        sys.exit(f"step lines: {len(sa)} against {len(sb)}")
    if sa[0]["loss"] != sb[0]["loss"]:
        sys.exit(f"step 1 loss {sa[0]['loss']} against {sb[0]['loss']}: the forward differs")
    for x, y in zip(sa, sb):
        for key in ("loss", "grad_norm", "lr"):
            if key in y:
                u, v = float(x[key]), float(y[key])
                if abs(u - v) > 1e-5 * abs(v):
                    sys.exit(f"step {y['step']} {key} {u} against {v}")
    print(f"steps within tolerance: {len(sa)} steps, step 1 loss identical ({sa[0]['loss']})")


if __name__ == "__main__":
    main()
