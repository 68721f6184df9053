#!/usr/bin/python3
"""test/reference/nf4.py - NumPy reference of Bonsai's NF4 quantization (docs/quantization.md).

The same algorithm as runtime/cpu/Nf4.cpp, written independently in NumPy, so that the runtime's
bytes can be checked bit for bit:

  N elements, block size b, double-quantization block d; nb = ceil(N/b), nd = ceil(nb/d).
  a_k = max |x| over block k; code = index of the level nearest to fl32(x / a_k), ties to the
  lower index (a_k = 0: the code of 0.0). offset = fl32(sum_k a_k / nb), the sum in float64 left
  to right. Group j: s_j = max |fl32(a_k - offset)| (1 when 0);
  q_k = rint(fl32(fl32(fl32(a_k - offset) / s_j) * 127)) as int8.
  Dequantized: a'_k = fl32(fl32(fl32(q_k / 127) * s_j) + offset); x' = fl32(level[code] * a'_k).
  Bytes: codes[ceil(N/2)] (element 2i in the high nibble), absmax codes[nb], zero padding to a
  multiple of 4, scales[nd] (f32), offset (f32).

Command line (the end-to-end test test/EndToEnd/quantize.test):

    nf4.py check --weights W.safetensors --checkpoint model.safetensors --targets REGEX
                 [--block 64] [--double-block 256] [--dequantized-out D.safetensors]

checks that every tensor of the checkpoint whose name matches REGEX is the U8 storage of the
NumPy quantization of that tensor of W (bit for bit, layout size included), that the others are
not quantized, and writes W with the matched tensors replaced by their dequantized values.
    nf4.py selftest
checks the reference itself (levels, layout sizes, ties, zero blocks, round trip error).
"""

import argparse
import os
import re
import sys

sys.dont_write_bytecode = True

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import safetensors_np  # noqa: E402

# bitsandbytes' NF4 table (QLoRA, Dettmers et al. 2023), as float32.
LEVELS = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)
# Exact midpoints of consecutive float32 levels (float64 holds them exactly).
MIDPOINTS = (LEVELS[:-1].astype(np.float64) + LEVELS[1:].astype(np.float64)) / 2
ZERO_CODE = 7


def layout(n, block=64, double_block=256):
    """(absmax_offset, scales_offset, offset_offset, total_bytes, nb, nd)."""
    nb = -(-n // block)
    nd = -(-nb // double_block)
    absmax_offset = (n + 1) // 2
    scales_offset = -(-(absmax_offset + nb) // 4) * 4
    offset_offset = scales_offset + 4 * nd
    return absmax_offset, scales_offset, offset_offset, offset_offset + 4, nb, nd


def storage_bytes(n, block=64, double_block=256):
    return layout(n, block, double_block)[3]


def quantize(x, block=64, double_block=256):
    """float32 array (any shape, row-major) -> uint8 storage."""
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).reshape(-1)
    n = x.size
    a_off, s_off, o_off, total, nb, nd = layout(n, block, double_block)
    if not np.all(np.isfinite(x)):
        raise ValueError("non-finite input")
    padded = np.zeros(nb * block, dtype=np.float32)
    padded[:n] = x
    blocks = padded.reshape(nb, block)
    absmax = np.max(np.abs(blocks), axis=1).astype(np.float32)
    safe = np.where(absmax == 0, np.float32(1), absmax).astype(np.float32)
    ratio = (blocks / safe[:, None]).astype(np.float32)
    codes = np.searchsorted(MIDPOINTS, ratio.astype(np.float64), side="left").astype(np.uint8)
    codes[absmax == 0, :] = ZERO_CODE
    codes = codes.reshape(-1)[:n]
    if n % 2:
        codes = np.concatenate([codes, np.zeros(1, dtype=np.uint8)])
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8)

    # Sequential float64 sum: np.cumsum adds left to right (np.sum would pair).
    offset = np.float32(np.cumsum(absmax.astype(np.float64))[-1] / nb)
    centered = (absmax - offset).astype(np.float32)
    q = np.zeros(nb, dtype=np.int8)
    scales = np.zeros(nd, dtype=np.float32)
    for j in range(nd):
        group = centered[j * double_block:(j + 1) * double_block]
        s = np.float32(np.max(np.abs(group)))
        if s == 0:
            s = np.float32(1)
        scaled = ((group / s).astype(np.float32) * np.float32(127)).astype(np.float32)
        q[j * double_block:(j + 1) * double_block] = np.rint(scaled).astype(np.int8)
        scales[j] = s

    out = np.zeros(total, dtype=np.uint8)
    out[:a_off] = packed
    out[a_off:a_off + nb] = q.view(np.uint8)
    out[s_off:s_off + 4 * nd] = scales.view(np.uint8)
    out[o_off:o_off + 4] = np.array([offset], dtype=np.float32).view(np.uint8)
    return out


def dequantize(storage, n, block=64, double_block=256):
    """uint8 storage -> float32 array of n elements."""
    storage = np.asarray(storage, dtype=np.uint8).reshape(-1)
    a_off, s_off, o_off, total, nb, nd = layout(n, block, double_block)
    if storage.size != total:
        raise ValueError("%d bytes, the layout of %d elements has %d" % (storage.size, n, total))
    packed = storage[:a_off]
    codes = np.empty(2 * a_off, dtype=np.uint8)
    codes[0::2] = packed >> 4
    codes[1::2] = packed & 0xF
    codes = codes[:n]
    q = storage[a_off:a_off + nb].view(np.int8).astype(np.float32)
    scales = storage[s_off:s_off + 4 * nd].view(np.float32)
    offset = storage[o_off:o_off + 4].view(np.float32)[0]
    group_scale = scales[np.arange(nb) // double_block]
    absmax = (((q / np.float32(127)).astype(np.float32) * group_scale).astype(np.float32)
              + offset).astype(np.float32)
    per_element = absmax[np.arange(n) // block]
    return (LEVELS[codes] * per_element).astype(np.float32)


def check(args):
    weights, dtypes, _ = safetensors_np.read(args.weights)
    floats = safetensors_np.to_float(weights, dtypes)
    saved, saved_dtypes, _ = safetensors_np.read(args.checkpoint)
    pattern = re.compile(args.targets)
    failures, quantized = 0, 0
    dequantized = dict(weights)
    out_dtypes = dict(dtypes)
    for name in sorted(floats):
        if name not in saved:
            print("FAIL: %s is not in the checkpoint" % name)
            failures += 1
            continue
        if not pattern.search(name):
            if saved_dtypes[name] == "U8":
                print("FAIL: %s is quantized but not a target" % name)
                failures += 1
            continue
        quantized += 1
        x = floats[name]
        expected = quantize(x, args.block, args.double_block)
        got = saved[name]
        if saved_dtypes[name] != "U8" or got.shape != (expected.size,):
            print("FAIL: %s: checkpoint has %s %s, expected U8 [%d] (the NF4 layout of %d "
                  "elements)" % (name, saved_dtypes[name], list(got.shape), expected.size, x.size))
            failures += 1
            continue
        a_off, s_off, o_off, total, nb, nd = layout(x.size, args.block, args.double_block)
        for part, lo, hi in (("codes", 0, a_off), ("absmax codes", a_off, a_off + nb),
                             ("padding", a_off + nb, s_off), ("scales", s_off, o_off),
                             ("offset", o_off, total)):
            diff = np.nonzero(got[lo:hi] != expected[lo:hi])[0]
            if diff.size:
                print("FAIL: %s: %d of %d bytes of the %s differ (first at byte %d: %d, "
                      "expected %d)" % (name, diff.size, hi - lo, part, lo + diff[0],
                                        got[lo + diff[0]], expected[lo + diff[0]]))
                failures += 1
        values = dequantize(got, x.size, args.block, args.double_block).reshape(x.shape)
        err = float(np.max(np.abs(values - x)))
        absmax = float(np.max(np.abs(x)))
        print("%s: %d elements, %d bytes (%.3f bits each), bit-exact, max |x' - x| %.3g "
              "(absmax %.3g)" % (name, x.size, total, 8.0 * total / x.size, err, absmax))
        dequantized[name] = values.astype(np.float32)
        out_dtypes[name] = "F32"
    if quantized == 0:
        print("FAIL: no tensor matches %r" % args.targets)
        failures += 1
    if args.dequantized_out:
        safetensors_np.write(args.dequantized_out, dequantized, out_dtypes)
    print("%d quantized tensors checked, %d failures" % (quantized, failures))
    return 1 if failures else 0


def selftest(_args):
    failures = []
    if not (LEVELS[ZERO_CODE] == 0 and np.all(np.diff(LEVELS) > 0) and LEVELS[0] == -1
            and LEVELS[-1] == 1):
        failures.append("levels are not ascending from -1 to 1 with 0 at index 7")
    # 4 + 8/64 + 32/(64*256) bits per element, plus the offset and the padding.
    n = 4096 * 4096
    bits = 8.0 * storage_bytes(n) / n
    if abs(bits - 4.127) > 1e-3:
        failures.append("%.4f bits per element at 4096x4096" % bits)
    if storage_bytes(64 * 3) != 96 + 3 + 1 + 4 + 4:
        failures.append("padding: %d bytes for 192 elements" % storage_bytes(64 * 3))
    # A value exactly between two levels takes the lower code.
    mid = np.float32(MIDPOINTS[9])
    if mid == MIDPOINTS[9]:
        x = np.zeros(64, dtype=np.float32)
        x[0], x[1] = 1, mid
        code = quantize(x)[0] & 0xF
        if code != 9:
            failures.append("a tie went to code %d, expected 9" % code)
    # An all-zero block dequantizes to zeros.
    x = np.zeros(128, dtype=np.float32)
    x[64:] = np.linspace(-1, 1, 64, dtype=np.float32)
    y = dequantize(quantize(x), x.size)
    if np.any(y[:64] != 0):
        failures.append("a zero block does not dequantize to zeros")
    # Round trip of normal data: the level spacing bounds the error (absmax * 0.16 at most).
    rng = np.random.default_rng(0)
    x = rng.standard_normal(64 * 1000).astype(np.float32)
    y = dequantize(quantize(x), x.size)
    rel = np.max(np.abs(y - x).reshape(-1, 64) / np.abs(x).reshape(-1, 64).max(axis=1)[:, None])
    if not rel < 0.17:
        failures.append("round-trip error %.3f of the block absmax" % rel)
    for f in failures:
        print("FAIL: " + f)
    print("nf4 selftest: %s" % ("FAILED" if failures else "ok"))
    return 1 if failures else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check")
    c.add_argument("--weights", required=True)
    c.add_argument("--checkpoint", required=True)
    c.add_argument("--targets", required=True)
    c.add_argument("--block", type=int, default=64)
    c.add_argument("--double-block", type=int, default=256)
    c.add_argument("--dequantized-out")
    sub.add_parser("selftest")
    args = parser.parse_args(argv)
    return check(args) if args.command == "check" else selftest(args)


if __name__ == "__main__":
    sys.exit(main())
