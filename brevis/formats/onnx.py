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
large model is never held in memory; a nested message that fits in the
window (a node, a small tensor) is walked there in one loop. Every length
is checked against its enclosing message, and nesting is bounded.
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
MAX_PACKED_DIMS = 10 * 64  # bytes of packed dims: more dims than any tensor has
# Smaller tensors stay in the bytes around them: cutting the surrounding bytes into
# more, shorter byte segments costs more than typing a few elements gains.
MIN_TENSOR_BYTES = 64
# Bytes of a message walked in memory at a time by _held, several times faster than field
# by field through _Reader: a nested message up to this size (as much as the reader's
# window), or a run of fields of a larger one. -1 walks everything through _Reader.
MAX_HELD = 64 << 10

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

    def hold(self, n: int) -> tuple[bytes, int, int]:
        """The next n bytes without a copy, as (buf, i, base): buf[i:i + n], where buf[0] is at
        file offset base; the reader moves past them."""
        self._fill(n)
        off = self.pos - self.base
        if off + n > len(self.buf):
            raise ParseError("file shorter than its size")
        self.pos += n
        return self.buf, off, self.base

    def field(self, end: int) -> tuple[int, int, int]:
        """The next field of a message that ends at `end`: (field number, wire type, value),
        with the reader past the value; for a LEN field the value is the length, checked
        against `end`, and the reader is at the payload."""
        off = self.pos - self.base
        buf = self.buf
        if 0 <= off < len(buf) and buf[off] < 0x80:  # a one-byte tag (field numbers 1..15)
            tag = buf[off]
            self.pos += 1  # within the message: pos < end
        else:
            tag = self.varint(end)
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
                v = self.varint(end)
            if wire == LEN and self.pos + v > end:
                raise ParseError("length-delimited field runs past its message")
            return number, wire, v
        if wire == I64 or wire == I32:
            n = 8 if wire == I64 else 4
            if self.pos + n > end:
                raise ParseError("fixed-width field runs past its message")
            self.pos += n
            return number, wire, 0
        raise ParseError(f"protobuf wire type {wire} not supported")

    def fields(self, end: int) -> Iterator[tuple[int, int, int]]:
        """The fields up to `end`, as field() gives them; after a LEN field the caller must
        leave the reader at the payload or at its end."""
        while self.pos < end:
            number, wire, v = self.field(end)
            stop = self.pos + v if wire == LEN else self.pos
            yield number, wire, v
            if self.pos != stop:  # the caller did not descend: skip the payload
                if self.pos > stop:
                    raise ParseError("nested message overran its field")
                self.pos = stop
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


class _TensorFields:
    """What a TensorProto says about its data: dims, element type, name, payloads."""

    def __init__(self):
        self.dims: list[int] = []
        self.data_type = 0
        self.name = ""
        self.payloads: list[tuple[int, int, int]] = []  # (field, file offset, length)

    def packed_dims(self, data: bytes) -> None:
        if len(data) > MAX_PACKED_DIMS:
            raise ParseError("too many dims")
        self.dims.extend(_signed64(d) for d in _packed_varints(data))

    def segments(self, out: list[Segment]) -> None:
        """Append a typed segment for each payload that holds exactly the elements."""
        dims = self.dims
        if any(d < 0 for d in dims) or len(dims) > 64:
            return
        dname = DATA_TYPES.get(self.data_type)
        dtype: DType | None = dtypes.lookup(dname) if dname else None
        if dtype is None:
            return
        n = math.prod(dims)
        for number, offset, length in self.payloads:
            fits = (number == 9 or (number == 4 and dname == "F32") or (number == 10 and dname == "F64"))
            if fits and length and length == n * dtype.itemsize:
                out.append(Segment(offset, length, self.name, dtype, tuple(dims)))


def _tensor(r: _Reader, end: int, out: list[Segment]) -> None:
    t = _TensorFields()
    for number, wire, v in r.fields(end):
        if number == 1 and wire == VARINT:
            t.dims.append(_signed64(v))
        elif number == 1 and wire == LEN:
            t.packed_dims(r.read(min(v, MAX_PACKED_DIMS + 1)))  # more is an error: read no further
        elif number == 2 and wire == VARINT:
            t.data_type = v
        elif number == 8 and wire == LEN:
            t.name = r.read(min(v, 4096)).decode("utf-8", "replace")
        elif number in (4, 9, 10) and wire == LEN:
            t.payloads.append((number, r.pos, v))
    t.segments(out)


def _message(r: _Reader, kind: int, end: int, out: list[Segment], depth: int) -> None:
    """Walk a message through the reader: the fields in its window by _held, in memory; a
    field that the window cuts, or a child message beyond it, through the reader."""
    if depth > MAX_DEPTH:
        raise ParseError("ONNX messages nested too deeply")
    children = CHILDREN[kind]
    while r.pos < end:
        buf, base = r.buf, r.base
        try:
            limit = min(len(buf), end - base, r.pos - base + MAX_HELD)
            i = _held(buf, r.pos - base, end - base, base, kind, out, depth, limit)
        except IndexError:  # a varint cut by the end of the file
            raise ParseError("varint runs past its message") from None
        r.pos = base + i
        if r.pos == end:
            break
        number, wire, v = r.field(end)
        if wire == LEN and number in children:
            _child(r, children[number], v, out, depth + 1)
        elif wire == LEN:
            r.pos += v


def _child(r: _Reader, kind: int, length: int, out: list[Segment], depth: int) -> None:
    """Walk the nested message at the reader, held in memory if it is small enough."""
    if length <= MAX_HELD:
        buf, i, base = r.hold(length)
        try:
            _held(buf, i, i + length, base, kind, out, depth)
        except IndexError:  # a varint cut by the end of the file
            raise ParseError("varint runs past its message") from None
    elif kind == TENSOR:
        _tensor(r, r.pos + length, out)
    else:
        _message(r, kind, r.pos + length, out, depth)


def _held(buf: bytes, i: int, end: int, base: int, kind: int, out: list[Segment], depth: int,
          limit: int | None = None) -> int:
    """_message, or _tensor for kind TENSOR, on a message held in memory: buf[i:end], where
    buf[0] is at file offset `base`. The same fields are checked the same way, in one loop
    without a generator. Raises IndexError for a varint that runs off the end of buf.

    With a `limit` before `end` (the end of the reader's window), returns the index of the
    first field that may not lie wholly before it, with its child message if it has one;
    else returns `end`."""
    tensor = _TensorFields() if kind == TENSOR else None
    if tensor is None and depth > MAX_DEPTH:
        raise ParseError("ONNX messages nested too deeply")
    children = CHILDREN.get(kind, {})
    if limit is None:
        limit = end
    while i < end:
        start = i
        if i + 20 > limit and limit < end:  # a tag and a value take up to 20 bytes
            return start
        tag = buf[i]
        if tag < 0x80:
            i += 1
        else:
            tag, i = _varint(buf, i)
            if i > end:
                raise ParseError("varint runs past its message")
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ParseError("protobuf field number 0")
        if wire == VARINT or wire == LEN:
            if i >= end:
                raise ParseError("varint runs past its message")
            v = buf[i]
            if v < 0x80:
                i += 1
            else:
                v, i = _varint(buf, i)
                if i > end:
                    raise ParseError("varint runs past its message")
            if wire == VARINT:
                if tensor is not None:
                    if number == 1:
                        tensor.dims.append(_signed64(v))
                    elif number == 2:
                        tensor.data_type = v
                continue
            if i + v > end:
                raise ParseError("length-delimited field runs past its message")
            if tensor is not None:
                if number == 1:
                    tensor.packed_dims(buf[i:i + v])
                elif number == 8:
                    tensor.name = buf[i:i + min(v, 4096)].decode("utf-8", "replace")
                elif number in (4, 9, 10):
                    tensor.payloads.append((number, base + i, v))
            elif number in children:
                if i + v > limit:
                    return start
                _held(buf, i, i + v, base, children[number], out, depth + 1)
            i += v
        elif wire == I64 or wire == I32:
            i += 8 if wire == I64 else 4
            if i > end:
                raise ParseError("fixed-width field runs past its message")
        else:
            raise ParseError(f"protobuf wire type {wire} not supported")
    if tensor is not None:
        tensor.segments(out)
    return i


def parse(f: BinaryIO, size: int) -> list[Segment]:
    r = _Reader(f, size)
    tensors: list[Segment] = []
    _message(r, MODEL, size, tensors, 0)
    return fill_gaps([t for t in tensors if t.length >= MIN_TENSOR_BYTES], 0, size)
