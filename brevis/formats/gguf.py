"""GGUF (v2, v3; little-endian): llama.cpp's single-file model format.

    magic "GGUF", u32 version, u64 tensor count, u64 metadata count
    metadata: key (u64 length + UTF-8), u32 value type, value
    tensor infos: name, u32 n_dims, u64 dims (fastest first), u32 ggml type, u64 offset
    padding to general.alignment (default 32), then the data section

Plain tensors (F32, F16, BF16, F64, I8..I64) become typed segments with the
numpy-order shape (dims reversed). Block-quantized tensors (Q4_0, Q8_0,
Q4_K, ...) interleave scales with quants, so each is one byte segment named
after the tensor. Large numeric metadata arrays (tokenizer scores, token
types) become typed segments too. Every count and length is checked
against the file before anything is read or allocated.
"""

from __future__ import annotations

import math
import struct
from typing import BinaryIO

from .. import dtypes
from . import ParseError, Segment, fill_gaps

try:
    from ..native import _layout
except ImportError:  # a source tree that was never built: the loop below
    _layout = None

NAME = "gguf"
MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 8  # ggml uses 4; leave room
MIN_ARRAY_SEGMENT = 64  # metadata arrays shorter than this stay in the header bytes
MAX_DEPTH = 8  # nested metadata arrays
# Smaller tensors stay in the bytes around them: cutting the surrounding bytes into
# more, shorter byte segments costs more than typing a few elements gains.
MIN_TENSOR_BYTES = 64

QK_K = 256
# ggml type -> (name, elements per block, bytes per block, dtype name for plain types)
GGML_TYPES: dict[int, tuple[str, int, int, str | None]] = {
    0: ("F32", 1, 4, "F32"),
    1: ("F16", 1, 2, "F16"),
    2: ("Q4_0", 32, 2 + 16, None),
    3: ("Q4_1", 32, 2 + 2 + 16, None),
    6: ("Q5_0", 32, 2 + 4 + 16, None),
    7: ("Q5_1", 32, 2 + 2 + 4 + 16, None),
    8: ("Q8_0", 32, 2 + 32, None),
    9: ("Q8_1", 32, 4 + 4 + 32, None),
    10: ("Q2_K", QK_K, 2 + 2 + QK_K // 16 + QK_K // 4, None),
    11: ("Q3_K", QK_K, 2 + QK_K // 4 + QK_K // 8 + 12, None),
    12: ("Q4_K", QK_K, 2 + 2 + QK_K // 2 + 12, None),
    13: ("Q5_K", QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12, None),
    14: ("Q6_K", QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16, None),
    15: ("Q8_K", QK_K, 4 + QK_K + QK_K // 8, None),
    16: ("IQ2_XXS", QK_K, 2 + QK_K // 4, None),
    17: ("IQ2_XS", QK_K, 2 + QK_K // 4 + QK_K // 32, None),
    18: ("IQ3_XXS", QK_K, 2 + QK_K // 4 + QK_K // 8, None),
    19: ("IQ1_S", QK_K, 2 + QK_K // 8 + QK_K // 16, None),
    20: ("IQ4_NL", 32, 2 + 16, None),
    21: ("IQ3_S", QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4, None),
    22: ("IQ2_S", QK_K, 2 + QK_K // 4 + QK_K // 16, None),
    23: ("IQ4_XS", QK_K, 2 + 2 + QK_K // 2 + QK_K // 64, None),
    24: ("I8", 1, 1, "I8"),
    25: ("I16", 1, 2, "I16"),
    26: ("I32", 1, 4, "I32"),
    27: ("I64", 1, 8, "I64"),
    28: ("F64", 1, 8, "F64"),
    29: ("IQ1_M", QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32, None),
    30: ("BF16", 1, 2, "BF16"),
    34: ("TQ1_0", QK_K, 2 + 4 * 13, None),
    35: ("TQ2_0", QK_K, 2 + 64, None),
    39: ("MXFP4", 32, 1 + 16, None),
}

# Field layout of quantized blocks, as [count, width in bytes] in storage order
# (ggml's block_* structs); the `records` operator splits blocks by it.
BLOCK_FIELDS: dict[str, tuple[tuple[int, int], ...]] = {
    "Q4_0": ((1, 2), (16, 1)),
    "Q4_1": ((1, 2), (1, 2), (16, 1)),
    "Q5_0": ((1, 2), (4, 1), (16, 1)),
    "Q5_1": ((1, 2), (1, 2), (4, 1), (16, 1)),
    "Q8_0": ((1, 2), (32, 1)),
    "Q2_K": ((16, 1), (64, 1), (1, 2), (1, 2)),
    "Q3_K": ((32, 1), (64, 1), (12, 1), (1, 2)),
    "Q4_K": ((1, 2), (1, 2), (12, 1), (128, 1)),
    "Q5_K": ((1, 2), (1, 2), (12, 1), (32, 1), (128, 1)),
    "Q6_K": ((128, 1), (64, 1), (16, 1), (1, 2)),
    "Q8_K": ((1, 4), (256, 1), (16, 2)),
    "IQ4_NL": ((1, 2), (16, 1)),
    "IQ4_XS": ((1, 2), (1, 2), (4, 1), (128, 1)),
}

# metadata value type -> (struct format, dtype name); 8 STRING and 9 ARRAY are special
VALUE_TYPES: dict[int, tuple[str, str]] = {
    0: ("B", "U8"), 1: ("b", "I8"), 2: ("H", "U16"), 3: ("h", "I16"), 4: ("I", "U32"),
    5: ("i", "I32"), 6: ("f", "F32"), 7: ("?", "BOOL"), 10: ("Q", "U64"), 11: ("q", "I64"),
    12: ("d", "F64"),
}
STRING, ARRAY = 8, 9


def detect(f: BinaryIO, size: int, name: str) -> bool:
    if size < 24:
        return False
    f.seek(0)
    head = f.read(8)
    return head[:4] == MAGIC and struct.unpack_from("<I", head, 4)[0] in (2, 3)


_U64 = struct.Struct("<Q")


class _Reader:
    """Sequential little-endian reads through a window, checked against the file size."""

    WINDOW = 1 << 20

    def __init__(self, f: BinaryIO, size: int):
        self.f, self.size = f, size
        self.buf, self.base, self.pos = b"", 0, 0

    def _need(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > self.size:
            raise ParseError("GGUF header runs past the end of the file")
        off = self.pos - self.base
        if off < 0 or off + n > len(self.buf):
            self.f.seek(self.pos)
            self.buf = self.f.read(max(n, self.WINDOW))
            self.base, off = self.pos, 0
            if len(self.buf) < n:
                raise ParseError("file shorter than its size")
        self.pos += n
        return memoryview(self.buf)[off:off + n]

    def unpack(self, fmt: str):
        return struct.unpack_from("<" + fmt, self._need(struct.calcsize("<" + fmt)))

    def u32(self) -> int:
        return self.unpack("I")[0]

    def u64(self) -> int:
        return self.unpack("Q")[0]

    def string(self) -> bytes:
        return bytes(self._need(self.u64()))

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ParseError("GGUF header runs past the end of the file")
        self.pos += n

    def skip_strings(self, count: int) -> None:
        """Skip `count` length-prefixed strings: token vocabularies hold hundreds
        of thousands (gemma3: 262,144), so the strings whose length lies in the
        window are walked in one call (_layout.skip_strings: gemma3's in 0.5 ms,
        where this loop, one unpack and one add a string, took 25)."""
        while count:
            off, done = _walk_strings(self.buf, self.pos - self.base, count)
            # Positions only grow: checking the last one checks them all.
            self.pos = self.base + off
            if self.pos > self.size:
                raise ParseError("GGUF header runs past the end of the file")
            count -= done
            if count:
                self.skip(self.u64())
                count -= 1


def _walk_strings_py(buf: bytes, off: int, count: int) -> tuple[int, int]:
    """_layout.skip_strings's walk in Python: where it got to, how many it skipped."""
    u64, done = _U64.unpack_from, 0
    try:
        for done in range(count):
            off += 8 + u64(buf, off)[0]
        done = count
    except (struct.error, OverflowError):  # this length is not (all) in the window
        pass
    return off, done


# (an extension built before skip_strings, in a tree not rebuilt: the loop)
_walk_strings = getattr(_layout, "skip_strings", None) or _walk_strings_py


def _value(r: _Reader, vtype: int, key: str, arrays: list[Segment], depth: int = 0):
    """Read (or skip) one metadata value; returns scalars, None for the rest."""
    if vtype in VALUE_TYPES:
        return r.unpack(VALUE_TYPES[vtype][0])[0]
    if vtype == STRING:
        r.skip(r.u64())
        return None
    if vtype != ARRAY or depth >= MAX_DEPTH:
        raise ParseError(f"metadata {key!r} has an unknown value type {vtype}")
    etype, count = r.u32(), r.u64()
    if etype in VALUE_TYPES:
        fmt, dname = VALUE_TYPES[etype]
        itemsize = struct.calcsize(fmt)
        if count > (r.size - r.pos) // itemsize:
            raise ParseError(f"metadata array {key!r} runs past the end of the file")
        if count >= MIN_ARRAY_SEGMENT:
            arrays.append(Segment(r.pos, count * itemsize, f"metadata/{key}", dtypes.lookup(dname), (count,)))
        r.skip(count * itemsize)
        return None
    # strings take >= 8 bytes each, arrays >= 12: a count the file cannot hold is malformed
    if count > (r.size - r.pos) // 8:
        raise ParseError(f"metadata array {key!r} runs past the end of the file")
    if etype == STRING:
        r.skip_strings(count)
        return None
    for _ in range(count):
        _value(r, etype, key, arrays, depth + 1)
    return None


def parse(f: BinaryIO, size: int) -> list[Segment]:
    r = _Reader(f, size)
    magic = bytes(r._need(4))
    version = r.u32()
    if magic != MAGIC or version not in (2, 3):
        raise ParseError("not GGUF v2/v3")
    n_tensors, n_kv = r.u64(), r.u64()
    # each metadata entry takes >= 13 bytes, each tensor info >= 24
    if n_kv > size // 13 or n_tensors > size // 24:
        raise ParseError("GGUF counts exceed the file")
    alignment = DEFAULT_ALIGNMENT
    arrays: list[Segment] = []
    for _ in range(n_kv):
        key = r.string().decode("utf-8", "replace")
        vtype = r.u32()
        v = _value(r, vtype, key, arrays)
        if key == "general.alignment":
            if not (isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0):
                raise ParseError(f"bad general.alignment {v!r}")
            alignment = v
    infos = []
    for _ in range(n_tensors):
        name = r.string().decode("utf-8", "replace")
        n_dims = r.u32()
        if n_dims > MAX_DIMS:
            raise ParseError(f"tensor {name!r} has {n_dims} dims")
        dims = r.unpack(f"{n_dims}Q") if n_dims else ()
        gtype, offset = r.u32(), r.u64()
        infos.append((name, dims, gtype, offset))
    data_start = -(-r.pos // alignment) * alignment
    if data_start > size:
        raise ParseError("GGUF data section starts past the end of the file")
    tensors: list[Segment] = []
    for name, dims, gtype, offset in infos:
        if gtype not in GGML_TYPES:
            continue  # unknown type: its bytes stay in a gap
        tname, block, block_bytes, dname = GGML_TYPES[gtype]
        n = math.prod(dims)
        if dims and dims[0] % block:
            raise ParseError(f"tensor {name!r}: rows are not whole blocks")
        length = n // block * block_bytes
        start = data_start + offset
        if start + length > size:
            raise ParseError(f"tensor {name!r} leaves the file")
        if dname:
            tensors.append(Segment(start, length, name, dtypes.lookup(dname), tuple(reversed(dims))))
        else:
            fields = BLOCK_FIELDS.get(tname)
            if fields and sum(c * w for c, w in fields) != block_bytes:
                fields = None  # a table disagreement: keep plain bytes rather than guess
            tensors.append(Segment(start, length, name, records=fields))
    # metadata arrays lie in the header, before every tensor
    return fill_gaps([t for t in arrays + tensors if t.length >= MIN_TENSOR_BYTES], 0, size)
