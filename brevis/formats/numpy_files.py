"""NumPy's `.npy` (a magic, a header dict, one array's bytes) and `.npz`
(a zip of `.npy` members, as `np.savez` stores them).

An array is typed from its header's `descr` where that is a little-endian
(or one-byte) number: `<f4`, `<f2`, `<f8`, `<i8`, `|u1`, `|b1`, ...; a
big-endian, object, structured or string array stays bytes (discovery may
still type it). A Fortran-order array is typed with its shape reversed:
its bytes are those of its transpose in C order. Names: an `.npy`'s array
is `array`, an `.npz`'s is its member's name less `.npy`. Members that
`np.savez_compressed` deflated stay bytes.
"""

from __future__ import annotations

import ast
import math
import struct
from typing import BinaryIO

from .. import dtypes
from . import ParseError, Segment, fill_gaps
from .zip_reader import central_directory, data_start, read_at

NAME = "numpy"
MAGIC = b"\x93NUMPY"
MAX_HEADER = 10000  # numpy's own bound on what np.load parses (max_header_size)
DESCR = {"f2": "F16", "f4": "F32", "f8": "F64", "i1": "I8", "i2": "I16", "i4": "I32", "i8": "I64",
         "u1": "U8", "u2": "U16", "u4": "U32", "u8": "U64", "b1": "BOOL"}
STORED = 0


def detect(f: BinaryIO, size: int, name: str) -> bool:
    f.seek(0)
    head = f.read(6)
    return head == MAGIC or (head[:4] == b"PK\x03\x04" and name.lower().endswith(".npz"))


def parse(f: BinaryIO, size: int) -> list[Segment]:
    f.seek(0)
    if f.read(6) == MAGIC:
        seg = array(f, 0, size, "array")
        if seg is None:  # discovery may still find its numbers
            raise ParseError("not an array of little-endian numbers")
        return fill_gaps([seg], seg.offset, size)
    tensors = []
    for m in central_directory(f, size):
        if m.method == STORED and m.name.endswith(".npy") and m.usize == m.csize:
            seg = array(f, data_start(f, m, size), m.usize, m.name[:-len(".npy")])
            if seg is not None:
                tensors.append(seg)
    if not tensors:
        raise ParseError("no stored .npy member")
    return fill_gaps(tensors, 0, size)


def array(f: BinaryIO, at: int, length: int, name: str) -> Segment | None:
    """The typed data of the .npy at [at, at + length), or None where its
    array is not a plain little-endian number (ParseError: not an .npy)."""
    end = at + length
    head = read_at(f, at, 10, end)
    if head[:6] != MAGIC:
        raise ParseError(f"{name}: not an .npy")
    major = head[6]
    if major == 1:
        start, (n,) = at + 10, struct.unpack("<H", head[8:10])
    elif major in (2, 3):
        start, (n,) = at + 12, struct.unpack("<I", read_at(f, at + 8, 4, end))
    else:
        raise ParseError(f"{name}: .npy version {major}")
    if n > MAX_HEADER:
        raise ParseError(f"{name}: .npy header of {n} bytes")
    try:
        header = ast.literal_eval(read_at(f, start, n, end).decode("utf-8" if major == 3 else "latin-1"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        raise ParseError(f"{name}: the .npy header is not a Python literal") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ParseError(f"{name}: the .npy header is not descr, fortran_order and shape")
    descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
    if not (isinstance(shape, tuple) and all(type(d) is int and d >= 0 for d in shape)
            and isinstance(fortran, bool)):
        raise ParseError(f"{name}: malformed .npy shape")
    data = start + n
    dtype = dtypes.lookup(DESCR.get(descr[1:], "")) if isinstance(descr, str) and descr[:1] in "<|" else None
    if dtype is None or (dtype.itemsize > 1 and descr[0] != "<"):
        return None
    if math.prod(shape) * dtype.itemsize != end - data:
        return None  # not the plain array its header says
    return Segment(data, end - data, name, dtype, tuple(reversed(shape)) if fortran else shape)
