"""ONNX: a protobuf ModelProto, walked with a small wire-format reader.

Tensors live in TensorProto messages: graph initializers, Constant nodes'
attributes, sparse initializers' values, and the same inside subgraphs
(If/Loop/Scan bodies), training graphs and functions. A TensorProto's
raw_data (field 9) is little-endian elements back to back; when its length
is exactly prod(dims) * itemsize it becomes a typed segment at the payload's
byte offset. Packed float_data / double_data of FLOAT / DOUBLE tensors are
laid out the same way and are used too. Everything else (the graph,
names, external-data references) stays in the bytes around them.

The walk reads forward through a window and seeks over payloads, so a
large model is never held in memory; every length is checked against its
enclosing message, and nesting is bounded.
"""

from __future__ import annotations

import math
from typing import BinaryIO, Iterator

from .. import dtypes
from ..dtypes import DType
from . import ParseError, Segment, fill_gaps

NAME = "onnx"
MAX_DEPTH = 32  # nested messages (graphs within nodes within graphs ...)
MAX_IR_VERSION = 64
# Smaller tensors stay in the bytes around them: cutting the surrounding bytes into
# more, shorter byte segments costs more than typing a few elements gains.
MIN_TENSOR_BYTES = 64

VARINT, I64, LEN, I32 = 0, 1, 2, 5

# TensorProto.DataType -> brevis dtype
DATA_TYPES: dict[int, str] = {
    1: "F32", 2: "U8", 3: "I8", 4: "U16", 5: "I16", 6: "I32", 7: "I64", 9: "BOOL",
    10: "F16", 11: "F64", 12: "U32", 13: "U64", 16: "BF16", 17: "F8_E4M3", 19: "F8_E5M2",
}

# (message, field) -> message kind of a length-delimited field we descend into
MODEL, GRAPH, NODE, ATTRIBUTE, TENSOR, SPARSE, TRAINING, FUNCTION = range(8)
CHILDREN: dict[int, dict[int, int]] = {
    MODEL: {7: GRAPH, 20: TRAINING, 25: FUNCTION},
    GRAPH: {1: NODE, 5: TENSOR, 15: SPARSE},
    NODE: {5: ATTRIBUTE},
    ATTRIBUTE: {5: TENSOR, 6: GRAPH, 10: TENSOR, 11: GRAPH, 22: SPARSE, 23: SPARSE},
    SPARSE: {1: TENSOR, 2: TENSOR},
    TRAINING: {1: GRAPH, 3: GRAPH},
    FUNCTION: {7: NODE},
}
# ModelProto fields, for detection: number -> wire type
MODEL_FIELDS = {1: VARINT, 2: LEN, 3: LEN, 4: LEN, 5: VARINT, 6: LEN, 7: LEN, 8: LEN, 14: LEN,
                20: LEN, 25: LEN}


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """Decode a varint at buf[i]; (value, next index). Raises IndexError if cut."""
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift >= 70:
            raise ParseError("varint too long")


def detect(f: BinaryIO, size: int, name: str) -> bool:
    """A ModelProto's first two fields: ir_version (or any model field in a .onnx file), then
    another model field with the right wire type."""
    if size < 8:
        return False
    f.seek(0)
    head = f.read(64)
    try:
        tag, i = _varint(head, 0)
        if tag == (1 << 3 | VARINT):
            ir_version, i = _varint(head, i)
            if not 1 <= ir_version <= MAX_IR_VERSION:
                return False
        elif name.lower().endswith(".onnx") and MODEL_FIELDS.get(tag >> 3) == tag & 7:
            if tag & 7 == VARINT:
                _, i = _varint(head, i)
            else:
                n, i = _varint(head, i)
                i += n
        else:
            return False
        if i >= min(size, len(head)):
            return i == size or len(head) == 64  # the first field alone fills what we read
        tag, _ = _varint(head, i)
        return MODEL_FIELDS.get(tag >> 3) == tag & 7
    except (IndexError, ParseError):
        return False


class _Reader:
    """Forward reads through a window over the file, seeking over skipped payloads."""

    WINDOW = 64 << 10

    def __init__(self, f: BinaryIO, size: int):
        self.f, self.size = f, size
        self.buf, self.base, self.pos = b"", 0, 0

    def _fill(self, n: int) -> None:
        if self.pos - self.base < 0 or self.pos - self.base + n > len(self.buf):
            self.f.seek(self.pos)
            self.buf = self.f.read(min(max(n, self.WINDOW), self.size - self.pos))
            self.base = self.pos

    def varint(self, end: int) -> int:
        # Inlined window check and a one-byte fast path: most tags and lengths are one
        # byte, and this runs once or twice per protobuf field.
        off = self.pos - self.base
        buf = self.buf
        if off < 0 or off + 10 > len(buf):
            self._fill(10)
            off = self.pos - self.base
            buf = self.buf
        try:
            b = buf[off]
            if b < 0x80:
                value, i = b, off + 1
            else:
                value, i = _varint(buf, off)
        except IndexError:
            raise ParseError("varint cut by the end of the file") from None
        pos = self.base + i
        if pos > end:
            raise ParseError("varint runs past its message")
        self.pos = pos
        return value

    def read(self, n: int) -> bytes:
        self._fill(n)
        off = self.pos - self.base
        data = self.buf[off:off + n]
        if len(data) != n:
            raise ParseError("file shorter than its size")
        self.pos += n
        return data

    def fields(self, end: int) -> Iterator[tuple[int, int, int]]:
        """(field number, wire type, value) up to `end`; LEN fields give their length
        with the reader at the payload, and the caller must leave it at the payload's end."""
        varint = self.varint
        while self.pos < end:
            off = self.pos - self.base
            buf = self.buf
            if 0 <= off < len(buf) and buf[off] < 0x80:  # a one-byte tag (field numbers 1..15)
                tag = buf[off]
                self.pos += 1  # within the message: pos < end
            else:
                tag = varint(end)
            number, wire = tag >> 3, tag & 7
            if number == 0:
                raise ParseError("protobuf field number 0")
            if wire == VARINT or wire == LEN:
                # The value or length, with the same one-byte fast path as the tag.
                off = self.pos - self.base
                buf = self.buf
                if self.pos < end and 0 <= off < len(buf) and buf[off] < 0x80:
                    v = buf[off]
                    self.pos += 1
                else:
                    v = varint(end)
                if wire == VARINT:
                    yield number, wire, v
                    continue
                if self.pos + v > end:
                    raise ParseError("length-delimited field runs past its message")
                stop = self.pos + v
                yield number, wire, v
                if self.pos != stop:  # the caller did not descend: skip the payload
                    if self.pos > stop:
                        raise ParseError("nested message overran its field")
                    self.pos = stop
            elif wire == I64 or wire == I32:
                n = 8 if wire == I64 else 4
                if self.pos + n > end:
                    raise ParseError("fixed-width field runs past its message")
                self.pos += n
                yield number, wire, 0
            else:
                raise ParseError(f"protobuf wire type {wire} not supported")
        if self.pos != end:
            raise ParseError("message overran its length")


def _packed_varints(data: bytes) -> list[int]:
    out, i = [], 0
    try:
        while i < len(data):
            v, i = _varint(data, i)
            out.append(v)
    except IndexError:
        raise ParseError("packed varints cut short") from None
    return out


def _signed64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


def _tensor(r: _Reader, end: int, out: list[Segment]) -> None:
    dims: list[int] = []
    data_type = 0
    name = ""
    payloads: list[tuple[int, int, int]] = []  # (field, offset, length)
    for number, wire, v in r.fields(end):
        if number == 1 and wire == VARINT:
            dims.append(_signed64(v))
        elif number == 1 and wire == LEN:
            if v > 10 * 64:  # more dims than any tensor has
                raise ParseError("too many dims")
            dims.extend(_signed64(d) for d in _packed_varints(r.read(v)))
        elif number == 2 and wire == VARINT:
            data_type = v
        elif number == 8 and wire == LEN:
            name = r.read(min(v, 4096)).decode("utf-8", "replace")
        elif number in (4, 9, 10) and wire == LEN:
            payloads.append((number, r.pos, v))
    if any(d < 0 for d in dims) or len(dims) > 64:
        return
    dname = DATA_TYPES.get(data_type)
    dtype: DType | None = dtypes.lookup(dname) if dname else None
    if dtype is None:
        return
    n = math.prod(dims)
    for number, offset, length in payloads:
        fits = (number == 9 or (number == 4 and dname == "F32") or (number == 10 and dname == "F64"))
        if fits and length and length == n * dtype.itemsize:
            out.append(Segment(offset, length, name, dtype, tuple(dims)))


def _message(r: _Reader, kind: int, end: int, out: list[Segment], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ParseError("ONNX messages nested too deeply")
    children = CHILDREN[kind]
    for number, wire, v in r.fields(end):
        if wire != LEN or number not in children:
            continue
        child = children[number]
        if child == TENSOR:
            _tensor(r, r.pos + v, out)
        else:
            _message(r, child, r.pos + v, out, depth + 1)


def parse(f: BinaryIO, size: int) -> list[Segment]:
    r = _Reader(f, size)
    tensors: list[Segment] = []
    _message(r, MODEL, size, tensors, 0)
    return fill_gaps([t for t in tensors if t.length >= MIN_TENSOR_BYTES], 0, size)
