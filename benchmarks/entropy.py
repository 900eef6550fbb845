"""Order-0 per-field entropy of a checkpoint (see README.md for the definition).

Each file is cut into segments by brevis.formats.layout. A float tensor's
elements are split into fields: the sign bit, the exponent bits, and the
mantissa bits cut into bytes from the least significant end (F32: 7+8+8,
BF16: 7, F16: 2+8). A field costs its order-0 (empirical, memoryless)
entropy over the tensor times the tensor's element count. Every other byte
(integer tensors, headers, files that do not parse) costs the order-0
entropy of its segment's bytes. The total, in bytes, is the figure; divided
by the original size it is comparable to a compression ratio.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from brevis.formats import layout

BLOCK = 64 << 20  # bytes of a segment read at once (histograms are additive)


def entropy_bits(counts: np.ndarray) -> float:
    """n times the order-0 entropy, in bits, of a histogram."""
    counts = counts[counts > 0].astype(np.float64)
    n = counts.sum()
    if n == 0:
        return 0.0
    return float(-(counts * np.log2(counts / n)).sum())


def float_fields(exponent_bits: int, mantissa_bits: int) -> list[tuple[int, int]]:
    """(shift, width) of each field of a float: sign, exponent, mantissa bytes."""
    fields = [(exponent_bits + mantissa_bits, 1), (mantissa_bits, exponent_bits)]
    low = 0
    while low < mantissa_bits:
        width = min(8, mantissa_bits - low)
        fields.append((low, width))
        low += width
    return fields


def _read(f, offset: int, length: int, dtype) -> np.ndarray:
    f.seek(offset)
    return np.frombuffer(f.read(length), dtype=dtype)


def segment_bits(f, seg) -> float:
    dt = seg.dtype
    if dt is not None and dt.is_float and seg.length % dt.itemsize == 0:
        fields = float_fields(dt.exponent_bits, dt.mantissa_bits)
        hists = [np.zeros(1 << w, dtype=np.int64) for _, w in fields]
        step = BLOCK - BLOCK % dt.itemsize
        for start in range(0, seg.length, step):
            x = _read(f, seg.offset + start, min(step, seg.length - start), dt.uint)
            for (shift, width), h in zip(fields, hists):
                v = (x >> np.asarray(shift, dtype=x.dtype)) & np.asarray((1 << width) - 1, dtype=x.dtype)
                h += np.bincount(v.astype(np.intp, copy=False), minlength=1 << width)
        return sum(entropy_bits(h) for h in hists)
    hist = np.zeros(256, dtype=np.int64)
    for start in range(0, seg.length, BLOCK):
        hist += np.bincount(_read(f, seg.offset + start, min(BLOCK, seg.length - start), np.uint8),
                            minlength=256)
    return entropy_bits(hist)


def file_entropy(path: Path) -> dict:
    """Entropy bytes of one file, and how many of its bytes were float tensors."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        fmt, segments = layout(f, size, path.name)
        bits = 0.0
        float_bytes = 0
        for seg in segments:
            bits += segment_bits(f, seg)
            if seg.dtype is not None and seg.dtype.is_float:
                float_bytes += seg.length
    return {"format": fmt, "bytes": size, "entropy_bytes": bits / 8, "float_tensor_bytes": float_bytes}


def file_dtypes(path: Path) -> dict[str, int]:
    """Tensor bytes per dtype as brevis.formats sees the file (empty if opaque)."""
    out: dict[str, int] = {}
    with open(path, "rb") as f:
        _, segments = layout(f, path.stat().st_size, path.name)
    for seg in segments:
        if seg.dtype is not None:
            out[seg.dtype.name] = out.get(seg.dtype.name, 0) + seg.length
    return out
