"""PyTorch checkpoints: zip archives (torch.save, TorchScript) and legacy pickles.

Nothing here unpickles: pickles are walked opcode by opcode (pickle_walk)
on a small symbolic stack that only knows strings, numbers, tuples, lists,
class names and persistent ids. That is enough to find each storage's key,
element type and element count, and usually the shape of the one tensor
that covers it; segments are named by the state-dict key that holds it.

Zip (torch >= 1.6, TorchScript): `<prefix>/data.pkl` names storages that
live in members `<prefix>/data/<key>` (TorchScript constants: `constants.pkl`
and `constants/<key>`). The zip is read by zip_reader, not by zipfile, so
that every offset is checked against the file; only STORED members can be
tensor segments, at the data start that their local header gives.

Legacy (torch.save before 1.6): five pickles back to back (magic number,
protocol version, system info, the object, the list of storage keys), then
each storage in that order as an int64 element count and the raw elements.
"""

from __future__ import annotations

import io
import pickletools
import re
import struct
import zlib
from typing import BinaryIO

from .. import dtypes
from ..dtypes import DType
from . import ParseError, Segment, fill_gaps
from .pickle_walk import PUTS, STRINGS, StorageRef, Walk, walk
from .zip_reader import Member, central_directory, data_start, member_bytes, read_at

NAME = "pytorch"

MAX_PICKLE = 256 << 20  # bytes of one pickle we are willing to walk
MAX_PICKLES = 16  # pickles walked in one archive (real ones have one or two)
LEGACY_PREFIX = 1 << 20  # first read of a legacy file; grows until its pickles fit
# Smaller tensors stay in the bytes around them: cutting the surrounding bytes into
# more, shorter byte segments costs more than typing a few elements gains.
MIN_TENSOR_BYTES = 64
ZIP_EXTENSIONS = (".pt", ".pth", ".bin", ".ckpt", ".jit", ".ptl", ".pt2")
LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"  # PROTO 2, LONG1 0x1950a86a20f9469cfc6c
_TORCH_MEMBER = re.compile(rb"^[^/]+/(data\.pkl|data/|constants\.pkl|constants/|code/|\.data/|"
                           rb"version|byteorder|\.format_version|\.storage_alignment|bytecode\.pkl|extra/)")
_PICKLE_MEMBER = re.compile(r"[^/]+/(data|constants)\.pkl")

STORAGE_DTYPES: dict[str, str] = {
    "HalfStorage": "F16",
    "BFloat16Storage": "BF16",
    "FloatStorage": "F32",
    "DoubleStorage": "F64",
    "ByteStorage": "U8",
    "CharStorage": "I8",
    "ShortStorage": "I16",
    "IntStorage": "I32",
    "LongStorage": "I64",
    "BoolStorage": "BOOL",
    "UInt16Storage": "U16",
    "UInt32Storage": "U32",
    "UInt64Storage": "U64",
    "Float8_e4m3fnStorage": "F8_E4M3",
    "Float8_e5m2Storage": "F8_E5M2",
    "QInt8Storage": "I8",
    "QUInt8Storage": "U8",
    "QInt32Storage": "I32",
}


def storage_dtype(cls: str) -> DType | None:
    """'torch HalfStorage' (or 'torch.cuda HalfStorage') -> F16; None if unknown."""
    name = STORAGE_DTYPES.get(cls.rsplit(" ", 1)[-1].rsplit(".", 1)[-1])
    return dtypes.lookup(name) if name else None


# ---------------------------------------------------------------- detection


def detect(f: BinaryIO, size: int, name: str) -> bool:
    if size < 30:
        return False
    f.seek(0)
    head = f.read(30 + 256)
    if head.startswith(LEGACY_MAGIC):
        return True
    if not head.startswith(b"PK\x03\x04"):
        return False
    if name.lower().endswith(ZIP_EXTENSIONS):
        return True
    (nlen,) = struct.unpack_from("<H", head, 26)
    return bool(_TORCH_MEMBER.match(head[30:30 + nlen]))


def parse(f: BinaryIO, size: int) -> list[Segment]:
    f.seek(0)
    head = f.read(len(LEGACY_MAGIC))
    try:
        if head == LEGACY_MAGIC:
            return _parse_legacy(f, size)
        return _parse_zip(f, size)
    except (ValueError, struct.error, IndexError, KeyError, TypeError, OverflowError,
            RecursionError, MemoryError, zlib.error, EOFError) as e:
        raise ParseError(f"malformed PyTorch checkpoint: {type(e).__name__}: {e}") from None


# ------------------------------------------------------------------- layout


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shape(w: Walk, ref: StorageRef, numel: int) -> tuple[int, ...]:
    """The one tensor's shape if it covers the storage contiguously, else (numel,)."""
    views = w.views.get(ref.key)
    if views is None or len(views) != 1:
        return (numel,)
    offset, size, stride = views[0]
    if not (offset == 0 and isinstance(size, tuple) and isinstance(stride, tuple)
            and len(size) == len(stride) <= 64):
        return (numel,)
    expect = 1  # the stride of a contiguous tensor, innermost first; in the end, numel
    for d, s in zip(reversed(size), reversed(stride)):
        if not (_is_int(d) and d > 0 and _is_int(s)) or (d != 1 and s != expect):
            return (numel,)
        expect *= d
    return size if expect == numel else (numel,)


def _segment(w: Walk, key: str, offset: int, length: int, name: str, big_endian: bool) -> Segment:
    """A storage's bytes, typed if its class, count and length agree."""
    ref = w.storages.get(key)
    dtype = storage_dtype(ref.cls) if ref and key not in w.conflicts else None
    name = w.names.get(key, name)  # the state-dict key, where the pickle gives one
    if dtype is None or (big_endian and dtype.itemsize > 1) or length % dtype.itemsize:
        return Segment(offset, length, name)
    numel = length // dtype.itemsize
    shape = _shape(w, ref, numel) if numel == ref.numel else (numel,)
    return Segment(offset, length, name, dtype, shape)


# ---------------------------------------------------------------------- zip


def _parse_zip(f: BinaryIO, size: int) -> list[Segment]:
    members = central_directory(f, size)
    by_name: dict[str, Member] = {}
    for m in members:
        by_name.setdefault(m.name, m)
    pickles = [m for m in members if _PICKLE_MEMBER.fullmatch(m.name)]
    if not pickles:
        raise ParseError("zip has no data.pkl: not a PyTorch archive")
    if len(pickles) > MAX_PICKLES:
        raise ParseError("too many pickles in one archive")
    big_endian = False
    for m in members:
        if m.name.endswith("/byteorder") and m.usize <= 16:
            big_endian = member_bytes(f, m, size, MAX_PICKLE).strip() == b"big"
    tensors: list[Segment] = []
    seen: set[str] = set()
    for pm in pickles:
        w = walk(member_bytes(f, pm, size, MAX_PICKLE))
        prefix, base = pm.name.rsplit("/", 1)
        dirs = [f"{prefix}/{base[:-4]}/", f"{prefix}/data/", f"{prefix}/.data/"]
        for key in w.storages:
            m = None
            for d in dirs:
                m = by_name.get(d + key)
                if m is not None:
                    break
            if m is None or m.name in seen or m.method != 0 or m.csize != m.usize:
                continue
            seen.add(m.name)
            tensors.append(_segment(w, key, data_start(f, m, size), m.usize, m.name, big_endian))
    return fill_gaps([t for t in tensors if t.length >= MIN_TENSOR_BYTES], 0, size)


# ------------------------------------------------------------------- legacy


def _little_endian(data: bytes, start: int) -> bool:
    """Whether the system-info pickle says little_endian: True."""
    after = False
    stream = io.BytesIO(data)
    stream.seek(start)
    for op, arg, _ in pickletools.genops(stream):
        if after and op.name not in PUTS and op.name != "MEMOIZE":
            return op.name == "NEWTRUE" or (op.name == "INT" and arg is True)
        if op.name in STRINGS and arg == "little_endian":
            after = True
        if op.name == "STOP":
            break
    return False


def _parse_legacy(f: BinaryIO, size: int) -> list[Segment]:
    # The pickles are small next to the storages; read a growing prefix until all five parse.
    n = min(size, LEGACY_PREFIX)
    while True:
        head = read_at(f, 0, n, size)
        try:
            walks = []
            pos = 0
            for i in range(5):
                if i == 2 and not _little_endian(head, pos):
                    raise ParseError("legacy checkpoint is not little-endian")
                walks.append(walk(head, pos))
                pos = walks[-1].end
            break
        except ValueError as e:  # pickletools ran off the prefix, or the pickle is malformed
            cut = any(w in str(e) for w in ("remain", "exhausted", "newline"))
            if not cut or n == size or n >= MAX_PICKLE:
                raise
            n = min(size, n * 4, MAX_PICKLE)
    main, keys = walks[3], walks[4].result
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ParseError("legacy checkpoint has no list of storage keys")
    tensors = []
    for key in keys:
        ref = main.storages.get(key)
        dtype = storage_dtype(ref.cls) if ref else None
        if dtype is None or key in main.conflicts or pos + 8 > size:
            break  # cannot know its length; the rest stays bytes
        (numel,) = struct.unpack("<q", read_at(f, pos, 8, size))
        if numel != ref.numel or pos + 8 + numel * dtype.itemsize > size:
            raise ParseError(f"legacy storage {key!r} disagrees with its pickle")
        length = numel * dtype.itemsize
        name = main.names.get(key, f"storage/{key}")
        tensors.append(Segment(pos + 8, length, name, dtype, _shape(main, ref, numel)))
        pos += 8 + length
    return fill_gaps([t for t in tensors if t.length >= MIN_TENSOR_BYTES], 0, size)
