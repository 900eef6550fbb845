"""safetensors: an 8-byte header length, a JSON header, then tensor data.

The header bytes are kept verbatim as a byte segment, so key order, spacing
and metadata come back exactly; only the tensors' places are read from it.
"""

from __future__ import annotations

import json
import math
import struct
from typing import BinaryIO

from .. import dtypes
from . import ParseError, Segment, fill_gaps

NAME = "safetensors"
MAX_HEADER = 100 << 20  # the reference implementation's cap


def detect(f: BinaryIO, size: int, name: str) -> bool:
    if size < 10:
        return False
    f.seek(0)
    head = f.read(9)
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n <= min(MAX_HEADER, size - 8) and head[8:9] == b"{"


def parse(f: BinaryIO, size: int) -> list[Segment]:
    f.seek(0)
    (n,) = struct.unpack("<Q", f.read(8))
    try:
        header = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ParseError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ParseError("header is not an object")
    base = 8 + n
    tensors = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype = dtypes.lookup(info["dtype"])
            shape = tuple(info["shape"])
            begin, end = info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ParseError(f"tensor {key!r} has a malformed entry") from None
        if dtype is None:
            raise ParseError(f"tensor {key!r} has an unknown dtype {info['dtype']!r}")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ParseError(f"tensor {key!r} has a malformed shape")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise ParseError(f"tensor {key!r} has malformed offsets")
        if math.prod(shape) * dtype.itemsize != end - begin:
            raise ParseError(f"tensor {key!r}: shape and offsets disagree")
        tensors.append(Segment(base + begin, end - begin, key, dtype, shape))
    return fill_gaps(tensors, base, size)
