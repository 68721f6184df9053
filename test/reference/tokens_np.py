#!/usr/bin/python3
"""test/reference/tokens_np.py - the token file of bonsai-run's data loader, with NumPy.

Layout (little-endian):
    bytes  0-7   magic b"BONSAITK"
    bytes  8-11  uint32 version = 1
    bytes 12-15  uint32 bytes per token: 2 (uint16 ids) or 4 (uint32 ids)
    bytes 16-23  uint64 token count
    bytes 24-    the tokens

The batch of step s (batch B, sequence T): p = (s*B*T) % (count - B*T), and for b < B, t < T
    inputs[b][t] = tok[p + b*T + t],  labels[b][t] = tok[p + b*T + t + 1].

    write(path, tokens, bytes_per_token=2)
    tokens = read(path)                       # uint16 or uint32 array
    ids, labels = batch(tokens, step, B, T)   # int64 arrays [B, T]
"""

import struct

import numpy as np

MAGIC = b"BONSAITK"
VERSION = 1
HEADER_BYTES = 24
_DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


class FormatError(ValueError):
    """A file that is not a valid token file (the message says why)."""


def write_bytes(tokens, bytes_per_token=2):
    tokens = np.asarray(tokens).reshape(-1)
    if bytes_per_token not in _DTYPES:
        raise ValueError("bytes per token must be 2 or 4, not %r" % (bytes_per_token,))
    limit = 1 << (8 * bytes_per_token)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= limit):
        raise ValueError("token ids must lie in [0, %d) for %d bytes per token"
                         % (limit, bytes_per_token))
    header = MAGIC + struct.pack("<IIQ", VERSION, bytes_per_token, tokens.size)
    return header + tokens.astype(_DTYPES[bytes_per_token]).tobytes()


def write(path, tokens, bytes_per_token=2):
    with open(path, "wb") as f:
        f.write(write_bytes(tokens, bytes_per_token))


def read_bytes(raw, path="<bytes>"):
    if len(raw) < HEADER_BYTES:
        raise FormatError("%s: %d bytes, shorter than the %d-byte header"
                          % (path, len(raw), HEADER_BYTES))
    if raw[:8] != MAGIC:
        raise FormatError("%s: bad magic %r (expected %r)" % (path, raw[:8], MAGIC))
    version, width, count = struct.unpack("<IIQ", raw[8:HEADER_BYTES])
    if version != VERSION:
        raise FormatError("%s: version %d, expected %d" % (path, version, VERSION))
    if width not in _DTYPES:
        raise FormatError("%s: %d bytes per token (2 or 4 expected)" % (path, width))
    if len(raw) - HEADER_BYTES != count * width:
        raise FormatError("%s: %d token bytes for %d tokens of %d bytes"
                          % (path, len(raw) - HEADER_BYTES, count, width))
    return np.frombuffer(raw, dtype=_DTYPES[width], offset=HEADER_BYTES, count=count).copy()


def read(path):
    """The tokens of a token file: a uint16 or uint32 array (as stored)."""
    with open(path, "rb") as f:
        raw = f.read()
    return read_bytes(raw, path)


def batch(tokens, step, batch_size, seq):
    """(ids, labels) of `step`, each an int64 array [batch_size, seq]."""
    count, span = len(tokens), batch_size * seq
    if count <= span:
        raise ValueError("%d tokens: need more than batch * seq = %d" % (count, span))
    p = (step * span) % (count - span)
    window = np.asarray(tokens[p:p + span + 1], dtype=np.int64)
    ids = np.empty((batch_size, seq), dtype=np.int64)
    labels = np.empty((batch_size, seq), dtype=np.int64)
    for b in range(batch_size):
        ids[b] = window[b * seq:b * seq + seq]
        labels[b] = window[b * seq + 1:b * seq + seq + 1]
    return ids, labels
