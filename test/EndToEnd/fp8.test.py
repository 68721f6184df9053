"""Checks of fp8.test: the metrics lines of an FP8 run and of the same model without FP8."""
import json
import math
import sys


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def main():
    fp8, ref = load(sys.argv[1]), load(sys.argv[2])
    assert len(fp8) == len(ref) == 60, (len(fp8), len(ref))
    for name, rows in (("fp8", fp8), ("ref", ref)):
        losses = [r["loss"] for r in rows]
        assert all(math.isfinite(x) for x in losses), name + ": a loss is not finite"
        first, last = sum(losses[:5]) / 5, sum(losses[-10:]) / 10
        assert last < first - 0.5, "%s: the loss did not fall: %.4f -> %.4f" % (name, first, last)
    mf = sum(r["loss"] for r in fp8[-10:]) / 10
    mr = sum(r["loss"] for r in ref[-10:]) / 10
    difference = abs(mf - mr) / mr
    assert difference < 0.02, "FP8 mean loss %.5f vs %.5f: %.2f%%" % (mf, mr, 100 * difference)

    with_fp8 = [r for r in fp8 if r.get("fp8")]
    assert [r["step"] for r in with_fp8] == [10, 20, 30, 40, 50, 60], \
        [r["step"] for r in with_fp8]
    assert not any(r.get("fp8") for r in ref), "the sm_80 run reports FP8 telemetry"
    for row in with_fp8:
        summary = row["fp8"]
        entries = summary["per_tensor"]
        assert summary["tensors"] == 14, summary["tensors"]
        assert len(entries) == 42, len(entries)
        operands = sorted({e["operand"] for e in entries})
        assert operands == ["grad_output", "input", "weight"], operands
        for e in entries:
            assert e["scale"] is not None and e["scale"] > 0, e
            assert 0 <= e["underflow"] <= 1 and 0 <= e["saturation"] <= 1, e
            assert e["amax"] is not None and e["amax"] > 0, e
    print("fp8 %.5f ref %.5f (%.2f%%); telemetry at steps %s" % (
        mf, mr, 100 * difference, [r["step"] for r in with_fp8]))


if __name__ == "__main__":
    main()
