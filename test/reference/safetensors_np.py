#!/usr/bin/python3
"""test/reference/safetensors_np.py - read and write safetensors files with NumPy only.

The format (https://huggingface.co/docs/safetensors): an 8-byte little-endian unsigned header
length N, then N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...}
with an optional "__metadata__" {str: str}, then the data section. Offsets are relative to the
start of the data section; tensors are dense, row-major, little-endian.

Supported dtypes: F32, F16, BF16, I32, I64 (and F64). BF16 has no NumPy type: a BF16 tensor is
a uint16 array of bit patterns; f32_to_bf16 / bf16_to_f32 convert (round to nearest even).

    tensors, dtypes, metadata = read(path)       # BF16 tensors come back as uint16 bits
    weights = load_float(path)                   # every float tensor as float32 (bf16 exact)
    write(path, {"w": a, "b": bits}, dtypes={"b": "BF16"}, metadata={"format": "pt"})
    tensors, dtypes = read_index("model.safetensors.index.json")   # sharded checkpoints
"""

import json
import os
import struct

import numpy as np

# safetensors dtype -> little-endian NumPy dtype of the stored elements.
_NUMPY = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # bit patterns
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U8": np.dtype("u1"),  # raw bytes (the runtime checkpoints NF4 tensors as their storage)
}
# NumPy dtype -> safetensors dtype, for write() without an explicit dtype (uint16 is ambiguous,
# so BF16 must be named).
_INFER = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32",
          np.dtype(np.float16): "F16", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
          np.dtype(np.uint8): "U8"}

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
MAX_HEADER = 100 * 1024 * 1024  # the limit of the reference implementation


class FormatError(ValueError):
    """A file that is not a valid safetensors file (the message says why)."""


# ----------------------------------------------------------------------------------------------
# bf16 <-> f32
# ----------------------------------------------------------------------------------------------

def f32_to_bf16(x):
    """float32 values -> bf16 bit patterns (uint16), round to nearest, ties to even.

    NaN stays NaN (quieted, sign kept); values that round past the largest bf16 become inf.
    """
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = x.view(np.uint32).astype(np.uint64)
    lsb = (u >> 16) & 1
    rounded = ((u + 0x7FFF + lsb) >> 16).astype(np.uint16)
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    quiet_nan = ((u >> 16) | 0x0040).astype(np.uint16)
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


def bf16_to_f32(bits):
    """bf16 bit patterns (uint16) -> float32 (exact)."""
    bits = np.ascontiguousarray(np.asarray(bits, dtype=np.uint16))
    return (bits.astype(np.uint32) << 16).view(np.float32)


# ----------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------

def _parse_header(raw, path):
    if len(raw) < 8:
        raise FormatError("%s: %d bytes, shorter than the 8-byte header length" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER or 8 + n > len(raw):
        raise FormatError("%s: header length %d does not fit the file (%d bytes)"
                          % (path, n, len(raw)))
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("%s: header is not JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise FormatError("%s: header is not a JSON object" % path)
    return header, 8 + n


def read_bytes(raw, path="<bytes>"):
    """Parses a whole safetensors file held in memory; see read()."""
    header, start = _parse_header(raw, path)
    data = memoryview(raw)[start:]
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and
                                     all(isinstance(v, str) for v in metadata.values())):
        raise FormatError("%s: __metadata__ must map strings to strings" % path)
    tensors, dtypes, spans = {}, {}, []
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise FormatError("%s: tensor %r: needs dtype, shape and data_offsets" % (path, name))
        if dtype not in _NUMPY:
            raise FormatError("%s: tensor %r: unsupported dtype %r" % (path, name, dtype))
        if not (isinstance(shape, list) and
                all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise FormatError("%s: tensor %r: bad shape %r" % (path, name, shape))
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(data)):
            raise FormatError("%s: tensor %r: data_offsets [%r, %r] outside the %d data bytes"
                              % (path, name, begin, end, len(data)))
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - begin != numel * _NUMPY[dtype].itemsize:
            raise FormatError("%s: tensor %r: %d bytes for %s %r" % (path, name, end - begin,
                                                                     dtype, shape))
        spans.append((begin, end, name))
        array = np.frombuffer(data[begin:end], dtype=_NUMPY[dtype]).reshape(shape)
        tensors[name] = array.astype(array.dtype.newbyteorder("="), copy=True)
        dtypes[name] = dtype
    # The data section is exactly covered by the tensors, without overlap.
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise FormatError("%s: tensor %r starts at %d, expected %d (gap or overlap)"
                              % (path, name, begin, position))
        position = end
    if position != len(data):
        raise FormatError("%s: %d data bytes after the last tensor" % (path, len(data) - position))
    return tensors, dtypes, metadata


def read(path):
    """Returns (tensors, dtypes, metadata): name -> ndarray (BF16 as uint16 bits), name ->
    safetensors dtype string, and the "__metadata__" dict (None when absent)."""
    with open(path, "rb") as f:
        raw = f.read()
    return read_bytes(raw, path)


def to_float(tensors, dtypes, out=np.float32):
    """Float tensors converted to `out` (BF16 decoded exactly); integer tensors unchanged."""
    result = {}
    for name, array in tensors.items():
        if dtypes[name] == "BF16":
            result[name] = bf16_to_f32(array).astype(out)
        elif dtypes[name] in FLOAT_DTYPES:
            result[name] = array.astype(out)
        else:
            result[name] = array
    return result


def load_float(path, out=np.float32):
    """All tensors of a safetensors file or a sharded index.json, floats as `out`."""
    if path.endswith(".json"):
        tensors, dtypes = read_index(path)
    else:
        tensors, dtypes, _ = read(path)
    return to_float(tensors, dtypes, out)


def read_index(path):
    """Reads a sharded checkpoint from its index.json ({"weight_map": {name: shard file}}).

    Every name of the weight map must be in the shard it names; a shard may not hold a tensor the
    map does not list, nor may two shards hold the same name. Returns (tensors, dtypes)."""
    with open(path) as f:
        index = json.load(f)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise FormatError("%s: no weight_map" % path)
    directory = os.path.dirname(os.path.abspath(path))
    tensors, dtypes = {}, {}
    for shard in sorted(set(weight_map.values())):
        shard_tensors, shard_dtypes, _ = read(os.path.join(directory, shard))
        for name in shard_tensors:
            if weight_map.get(name) != shard:
                raise FormatError("%s: shard %s holds %r, which the weight map puts in %r"
                                  % (path, shard, name, weight_map.get(name)))
        tensors.update(shard_tensors)
        dtypes.update(shard_dtypes)
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise FormatError("%s: not found in their shards: %s" % (path, ", ".join(missing)))
    return tensors, dtypes


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

def write_bytes(tensors, dtypes=None, metadata=None):
    """The bytes of a safetensors file; see write()."""
    dtypes = dict(dtypes or {})
    header, chunks, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        array = np.asarray(tensors[name])
        dtype = dtypes.get(name) or _INFER.get(array.dtype)
        if dtype is None:
            raise ValueError("tensor %r: cannot infer a safetensors dtype from %s (name it in "
                             "dtypes; BF16 is a uint16 array of bit patterns)" % (name, array.dtype))
        if dtype not in _NUMPY:
            raise ValueError("tensor %r: unsupported dtype %r" % (name, dtype))
        if dtype == "BF16" and array.dtype != np.uint16:
            raise ValueError("tensor %r: BF16 data must be uint16 bit patterns (f32_to_bf16)" % name)
        blob = np.ascontiguousarray(array, dtype=_NUMPY[dtype]).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        chunks.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # pad so the data section starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def write(path, tensors, dtypes=None, metadata=None):
    """Writes name -> ndarray as a safetensors file. The dtype of each tensor is dtypes[name] or
    inferred from the array (float32 -> F32, float16 -> F16, int32 -> I32, int64 -> I64,
    float64 -> F64); a BF16 tensor is a uint16 array named "BF16" in dtypes."""
    raw = write_bytes(tensors, dtypes, metadata)
    with open(path, "wb") as f:
        f.write(raw)


def write_sharded(directory, tensors, dtypes=None, shards=2, base="model"):
    """Writes tensors as `shards` safetensors files plus <base>.safetensors.index.json (round
    robin over the sorted names); returns the index path."""
    names = sorted(tensors)
    weight_map, groups = {}, [[] for _ in range(shards)]
    for i, name in enumerate(names):
        groups[i % shards].append(name)
    total = 0
    for i, group in enumerate(groups):
        fname = "%s-%05d-of-%05d.safetensors" % (base, i + 1, shards)
        write(os.path.join(directory, fname), {n: tensors[n] for n in group},
              {n: (dtypes or {}).get(n) for n in group if (dtypes or {}).get(n)})
        for n in group:
            weight_map[n] = fname
            total += np.asarray(tensors[n]).nbytes
    path = os.path.join(directory, base + ".safetensors.index.json")
    with open(path, "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return path
