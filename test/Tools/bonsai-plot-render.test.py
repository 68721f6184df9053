"""Writes a metrics file, then checks bonsai-plot's SVG as rsvg-convert rendered it.

  make METRICS.jsonl            a 40-step run with warmup, evaluations every 10 steps and a resume
  check METRICS.jsonl SVG PNG   the curves' pixels are where the data puts them

Each panel's plot area carries its data range (data-x0/x1/y0/y1); from it and the records this
script wrote, it computes where each value must be drawn and reads the rendered pixels there: in
the pixel column of a step, the series' colour must appear within a few pixels of the value and
nowhere else in the plot area. The PNG is decoded with zlib and struct (no PIL).
"""
import json
import math
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

# The series colours bonsai-plot documents (docs/training.md, "Seeing a run").
COLORS = {
    "loss": (0x1F, 0x77, 0xB4),
    "val_loss": (0xFF, 0x7F, 0x0E),
    "lr": (0x2C, 0xA0, 0x2C),
    "tokens_per_s": (0x94, 0x67, 0xBD),
    "memory_measured_bytes": (0xD6, 0x27, 0x28),
    "memory_planned_bytes": (0x7F, 0x7F, 0x7F),
}
# The panel (in document order) each series is drawn in.
PANEL = {"loss": 0, "val_loss": 0, "lr": 1, "tokens_per_s": 2,
         "memory_measured_bytes": 3, "memory_planned_bytes": 3}
DASHED = {"memory_planned_bytes"}
STEPS = 40


def record(step, resumed_from=None):
    r = {
        "step": step,
        "loss": 1.0 + 5.5 * math.exp(-step / 12.0),
        "grad_norm": 0.5 / step,
        "lr": 3e-4 * min(1.0, step / 10.0),
        "tokens_per_s": 60000.0 + 40000.0 * math.sin(step / 7.0) ** 2,
        "memory_planned_bytes": 320 * 1024 * 1024,
        "memory_measured_bytes": (100 + 4 * step) * 1024 * 1024,
        "micro_batches": 2,
        "tokens": 4096,
        "elapsed_s": 0.25 * step,
    }
    if step % 10 == 0:
        r["val_loss"] = r["loss"] + 0.6
    return r


def make(path):
    with open(path, "w") as f:
        # A first run that stops after step 25, with its steps 21-25 far off the curve ...
        for step in range(1, 26):
            r = record(step)
            if step > 20:
                r["loss"] += 3.0
            f.write(json.dumps(r) + "\n")
        f.write("\n")  # a blank line is skipped
        # ... resumed from the checkpoint of step 20: the later records of a step win.
        for step in range(21, STEPS + 1):
            f.write(json.dumps(record(step)) + "\n")


def read_png(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            bpp = 4 if color == 6 else 3
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line

    def pixel(x, y):
        o = x * bpp
        return tuple(rows[y][o:o + 3])

    return width, height, pixel


def close(rgb, want, tolerance=40):
    return sum((p - q) ** 2 for p, q in zip(rgb, want)) <= tolerance ** 2


def check(metrics, svg_path, png_path):
    series = {key: {} for key in COLORS}
    with open(metrics) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                for key in series:
                    if r.get(key) is not None:
                        series[key][r["step"]] = float(r[key])

    ns = {"svg": "http://www.w3.org/2000/svg"}
    root = ET.parse(svg_path).getroot()
    areas = [a for a in root.iter("{http://www.w3.org/2000/svg}rect") if a.get("class") == "plot-area"]
    assert len(areas) == 4, "expected 4 plot areas, found %d" % len(areas)
    width, height, pixel = read_png(png_path)
    assert (width, height) == (int(root.get("width")), int(root.get("height"))), (width, height)

    checked = 0
    for key, points in series.items():
        area = areas[PANEL[key]]
        left, top = float(area.get("x")), float(area.get("y"))
        w, h = float(area.get("width")), float(area.get("height"))
        x0, x1 = float(area.get("data-x0")), float(area.get("data-x1"))
        y0, y1 = float(area.get("data-y0")), float(area.get("data-y1"))
        assert 0 <= left and left + w <= width and 0 <= top and top + h <= height, key
        assert x0 <= min(points) and max(points) <= x1, (key, x0, x1)
        assert y0 <= min(points.values()) and max(points.values()) <= y1, (key, y0, y1)
        want = COLORS[key]
        steps = sorted(points) if key == "val_loss" else [1, 7, 16, 23, 30, 37, STEPS]
        for step in steps:
            px = left + (step - x0) / (x1 - x0) * w
            py = top + (y1 - points[step]) / (y1 - y0) * h
            # The colour is drawn at the value: a dashed line may be in a gap at one column, so it
            # is looked for within a dash's length.
            dx = range(-6, 7) if key in DASHED else range(-1, 2)
            found = any(close(pixel(int(px) + i, int(py) + j), want)
                        for i in dx for j in range(-2, 3))
            assert found, "%s at step %d: no %s pixel near (%d, %d)" % (key, step, want, px, py)
            # ... and nowhere else in the plot area's column (a far-off curve, say the first
            # run's records of steps 21-25, would show here).
            if key not in DASHED and key != "val_loss":
                for y in range(int(top) + 2, int(top + h) - 1):
                    if abs(y - py) > 5 and close(pixel(int(px), y), want):
                        raise AssertionError("%s at step %d: a %s pixel at (%d, %d), %d px off "
                                             "the value" % (key, step, want, px, y, y - py))
            checked += 1
    print("checked %d curve points in %dx%d pixels" % (checked, width, height))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        check(*sys.argv[2:5])
