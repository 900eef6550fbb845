"""PyTorch checkpoints: zip archives (torch.save, TorchScript) and legacy pickles.

Nothing here unpickles: pickles are walked opcode by opcode (the common
ones decoded here, the rest by pickletools.genops) on a small symbolic
stack that only knows strings, numbers, tuples, lists, class names and
persistent ids. That is enough to find each storage's key, element type
and element count, and usually the shape of the one tensor that covers it.

Zip (torch >= 1.6, TorchScript): `<prefix>/data.pkl` names storages that
live in members `<prefix>/data/<key>` (TorchScript constants: `constants.pkl`
and `constants/<key>`). The zip's central directory is read here, not by
zipfile, so that every offset is checked against the file; only STORED
members can be tensor segments, at the data start that their local header
gives.

Legacy (torch.save before 1.6): five pickles back to back (magic number,
protocol version, system info, the object, the list of storage keys), then
each storage in that order as an int64 element count and the raw elements.
"""

from __future__ import annotations

import io
import math
import pickletools
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import BinaryIO

from .. import dtypes
from ..dtypes import DType
from . import ParseError, Segment, fill_gaps

NAME = "pytorch"

MAX_PICKLE = 256 << 20  # bytes of one pickle we are willing to walk
MAX_DIRECTORY = 128 << 20  # bytes of zip central directory
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


# ----------------------------------------------------------- pickle walking


# These records (and _Member) are built once per tensor, storage or zip member: slotted
# dataclasses, as frozen ones take three times as long to build.


class _Opaque:
    """A value the walker does not follow (dicts, objects, results of calls)."""


OPAQUE = _Opaque()
MARK = object()


@dataclass(slots=True)
class _Global:
    name: str  # "module qualname", as GLOBAL spells it


@dataclass(slots=True)
class _StorageRef:
    key: str
    cls: str
    numel: int


@dataclass
class _Walk:
    storages: dict[str, _StorageRef] = field(default_factory=dict)
    conflicts: set[str] = field(default_factory=set)
    views: dict[str, list[tuple]] = field(default_factory=dict)  # key -> [(offset, size, stride)]
    names: dict[str, str] = field(default_factory=dict)  # storage key -> first state-dict key naming it
    result: object = OPAQUE
    end: int = 0  # offset just after STOP

    def add(self, ref: _StorageRef) -> None:
        old = self.storages.setdefault(ref.key, ref)
        if old != ref:
            self.conflicts.add(ref.key)


_STRINGS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE",
            "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8"}
_NUMBERS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT"}
_GETS = {"GET", "BINGET", "LONG_BINGET"}
_PUTS = {"PUT", "BINPUT", "LONG_BINPUT"}
_REBUILDERS = {"torch._utils _rebuild_tensor_v2", "torch._utils _rebuild_tensor"}
_U16, _I32, _U32 = struct.Struct("<H"), struct.Struct("<i"), struct.Struct("<I")


class _Machine:
    """The symbolic stack, memo and findings of one pickle walk."""

    def __init__(self):
        self.w = _Walk()
        self.stack: list = []
        self.memo: dict[int, object] = {}

    def pop(self):
        stack = self.stack
        if not stack or stack[-1] is MARK:
            raise ParseError("pickle stack underflow")
        return stack.pop()

    def pop_mark(self) -> list:
        stack = self.stack
        items = []
        while True:
            if not stack:
                raise ParseError("pickle MARK missing")
            v = stack.pop()
            if v is MARK:
                return items[::-1]
            items.append(v)

    def step(self, op: pickletools.OpcodeInfo, arg, pos: int) -> bool:
        """Apply one opcode as genops decoded it; True at STOP."""
        w, stack, memo, pop, pop_mark = self.w, self.stack, self.memo, self.pop, self.pop_mark
        name = op.name
        if name in _STRINGS:
            stack.append(arg)
        elif name in _NUMBERS:
            stack.append(arg)
        elif name in ("NEWTRUE", "NEWFALSE", "NONE"):
            stack.append({"NEWTRUE": True, "NEWFALSE": False, "NONE": None}[name])
        elif name == "MARK":
            stack.append(MARK)
        elif name == "GLOBAL":
            stack.append(_Global(arg))
        elif name == "STACK_GLOBAL":
            qual, module = pop(), pop()
            ok = isinstance(qual, str) and isinstance(module, str)
            stack.append(_Global(f"{module} {qual}") if ok else OPAQUE)
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            items = [pop() for _ in range(n)][::-1]
            stack.append(tuple(items))
        elif name == "TUPLE":
            stack.append(tuple(pop_mark()))
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "LIST":
            stack.append(pop_mark())
        elif name == "APPEND":
            v = pop()
            if stack and isinstance(stack[-1], list):
                stack[-1].append(v)
        elif name == "APPENDS":
            items = pop_mark()
            if stack and isinstance(stack[-1], list):
                stack[-1].extend(items)
        elif name in _PUTS:
            if not stack or stack[-1] is MARK:
                raise ParseError("pickle memoizes nothing")
            memo[arg] = stack[-1]
        elif name == "MEMOIZE":
            if not stack or stack[-1] is MARK:
                raise ParseError("pickle memoizes nothing")
            memo[len(memo)] = stack[-1]
        elif name in _GETS:
            if arg not in memo:
                raise ParseError("pickle reads an unset memo slot")
            stack.append(memo[arg])
        elif name == "BINPERSID":
            stack.append(_persistent(w, pop()))
        elif name == "REDUCE":
            args, fn = pop(), pop()
            if isinstance(fn, _Global) and fn.name in _REBUILDERS:
                stack.append(_rebuilt(w, args))
            else:
                stack.append(OPAQUE)
        elif name in ("SETITEM", "SETITEMS"):
            # dict[key] = tensor: the key names the tensor's storage.
            items = [pop(), pop()][::-1] if name == "SETITEM" else pop_mark()
            pop()  # the dict
            for key, value in zip(items[::2], items[1::2]):
                if isinstance(key, str) and isinstance(value, _TensorRef):
                    w.names.setdefault(value.key, key)
            stack.append(OPAQUE)
        elif name == "STOP":
            w.result = pop()
            w.end = pos + 1
            return True
        else:  # everything else only by its stack effect
            before = op.stack_before
            if pickletools.markobject in before:
                pop_mark()
                for _ in range(before.index(pickletools.markobject)):
                    pop()
            else:
                for _ in before:
                    pop()
            stack.extend(OPAQUE for _ in op.stack_after)
        return False

    def run(self, data: bytes, i: int) -> int:
        """Apply the opcodes that PyTorch pickles are made of, decoded straight from the
        bytes, from data[i] on; returns the index of the first opcode left to step():
        STOP, a rarer opcode, or one that is cut off or would raise (whose effect is then
        step()'s, error included). Each branch is step() for that opcode, checked before
        it changes anything."""
        w, stack, memo = self.w, self.stack, self.memo
        push = stack.append
        u16, i32, u32 = _U16.unpack_from, _I32.unpack_from, _U32.unpack_from
        n = len(data)
        while i < n:
            c = data[i]
            if c == 0x72:  # LONG_BINPUT
                if i + 5 > n or not stack or stack[-1] is MARK:
                    break
                memo[u32(data, i + 1)[0]] = stack[-1]
                i += 5
            elif c == 0x68:  # BINGET
                if i + 2 > n or data[i + 1] not in memo:
                    break
                push(memo[data[i + 1]])
                i += 2
            elif c == 0x4B:  # BININT1
                if i + 2 > n:
                    break
                push(data[i + 1])
                i += 2
            elif c == 0x58:  # BINUNICODE
                if i + 5 > n:
                    break
                end = i + 5 + u32(data, i + 1)[0]
                if end > n:
                    break
                try:
                    push(str(data[i + 5:end], "utf-8", "surrogatepass"))
                except UnicodeDecodeError:
                    break
                i = end
            elif c == 0x28:  # MARK
                push(MARK)
                i += 1
            elif c == 0x74:  # TUPLE
                k = _last_mark(stack)
                if k < 0:
                    break
                items = tuple(stack[k + 1:])
                del stack[k:]
                push(items)
                i += 1
            elif c == 0x52:  # REDUCE
                if len(stack) < 2 or stack[-1] is MARK or stack[-2] is MARK:
                    break
                args = stack.pop()
                fn = stack.pop()
                if isinstance(fn, _Global) and fn.name in _REBUILDERS:
                    push(_rebuilt(w, args))
                else:
                    push(OPAQUE)
                i += 1
            elif c == 0x71:  # BINPUT
                if i + 2 > n or not stack or stack[-1] is MARK:
                    break
                memo[data[i + 1]] = stack[-1]
                i += 2
            elif c == 0x4D:  # BININT2
                if i + 3 > n:
                    break
                push(u16(data, i + 1)[0])
                i += 3
            elif c == 0x29:  # EMPTY_TUPLE
                push(())
                i += 1
            elif c == 0x85:  # TUPLE1
                if not stack or stack[-1] is MARK:
                    break
                stack[-1] = (stack[-1],)
                i += 1
            elif c == 0x89:  # NEWFALSE
                push(False)
                i += 1
            elif c == 0x51:  # BINPERSID
                if not stack or stack[-1] is MARK:
                    break
                stack[-1] = _persistent(w, stack[-1])
                i += 1
            elif c == 0x7D:  # EMPTY_DICT
                push(OPAQUE)
                i += 1
            elif c == 0x73:  # SETITEM
                if len(stack) < 3 or stack[-1] is MARK or stack[-2] is MARK or stack[-3] is MARK:
                    break
                value = stack.pop()
                key = stack.pop()
                if isinstance(key, str) and isinstance(value, _TensorRef):
                    w.names.setdefault(value.key, key)
                stack[-1] = OPAQUE
                i += 1
            elif c == 0x6A:  # LONG_BINGET
                if i + 5 > n or u32(data, i + 1)[0] not in memo:
                    break
                push(memo[u32(data, i + 1)[0]])
                i += 5
            elif c == 0x86:  # TUPLE2
                if len(stack) < 2 or stack[-1] is MARK or stack[-2] is MARK:
                    break
                b = stack.pop()
                stack[-1] = (stack[-1], b)
                i += 1
            elif c == 0x4A:  # BININT
                if i + 5 > n:
                    break
                push(i32(data, i + 1)[0])
                i += 5
            elif c == 0x4E:  # NONE
                push(None)
                i += 1
            elif c == 0x88:  # NEWTRUE
                push(True)
                i += 1
            else:
                break
        return i


def _last_mark(stack: list) -> int:
    """The index of the topmost MARK on the stack; -1 if there is none."""
    k = len(stack) - 1
    while k >= 0 and stack[k] is not MARK:
        k -= 1
    return k


def _walk(data: bytes, start: int = 0, fast: bool = True) -> _Walk:
    """Follow one pickle that begins at data[start]; raises ParseError if malformed.

    `fast` decodes the common opcodes in _Machine.run, about three times quicker than genops,
    with the same result; fast=False walks with genops alone (the reference, for tests).
    """
    m = _Machine()
    stream = io.BytesIO(data)
    stream.seek(start)
    if not fast:
        for op, arg, pos in pickletools.genops(stream):
            if m.step(op, arg, pos):
                return m.w
        raise ParseError("pickle has no STOP")
    i = start
    while True:
        i = m.run(data, i)
        stream.seek(i)
        # genops raises ValueError itself where the pickle is cut or the opcode unknown
        op, arg, pos = next(pickletools.genops(stream))
        if m.step(op, arg, pos):
            return m.w
        i = stream.tell()


def _persistent(w: _Walk, pid) -> object:
    # ('storage', StorageClass, key, location, numel[, view_metadata])
    if (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"
            and isinstance(pid[1], _Global) and isinstance(pid[2], str)
            and isinstance(pid[4], int) and not isinstance(pid[4], bool) and pid[4] >= 0):
        ref = _StorageRef(pid[2], pid[1].name, pid[4])
        w.add(ref)
        return ref
    return OPAQUE


@dataclass(slots=True)
class _TensorRef:
    key: str  # the storage it views


def _rebuilt(w: _Walk, args) -> object:
    # _rebuild_tensor_v2(storage, storage_offset, size, stride, ...)
    if not (isinstance(args, tuple) and len(args) >= 4 and isinstance(args[0], _StorageRef)):
        return OPAQUE
    ref, offset, size, stride = args[:4]
    w.views.setdefault(ref.key, []).append((offset, size, stride))
    return _TensorRef(ref.key)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _shape(w: _Walk, ref: _StorageRef, numel: int) -> tuple[int, ...]:
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


def _segment(w: _Walk, key: str, offset: int, length: int, name: str, big_endian: bool) -> Segment:
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


@dataclass(slots=True)
class _Member:
    name: str
    method: int
    csize: int
    usize: int
    header: int  # local header offset


def _read_at(f: BinaryIO, offset: int, n: int, size: int) -> bytes:
    if offset < 0 or n < 0 or offset + n > size:
        raise ParseError("read past the end of the file")
    f.seek(offset)
    data = f.read(n)
    if len(data) != n:
        raise ParseError("file shorter than its size")
    return data


def _central_directory(f: BinaryIO, size: int) -> list[_Member]:
    tail_len = min(size, 22 + 0xFFFF)
    tail = _read_at(f, size - tail_len, tail_len, size)
    eocd = -1
    i = tail.rfind(b"PK\x05\x06")
    while i >= 0:
        if i + 22 <= len(tail):
            (clen,) = struct.unpack_from("<H", tail, i + 20)
            if i + 22 + clen == len(tail):
                eocd = i
                break
        i = tail.rfind(b"PK\x05\x06", 0, i)
    if eocd < 0:
        raise ParseError("no zip end of central directory")
    _, _, _, count, cd_size, cd_offset, _ = struct.unpack_from("<HHHHIIH", tail, eocd + 4)
    eocd_at = size - tail_len + eocd
    if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        loc = _read_at(f, eocd_at - 20, 20, size)
        if loc[:4] != b"PK\x06\x07":
            raise ParseError("zip64 locator missing")
        (z64_at,) = struct.unpack_from("<Q", loc, 8)
        z64 = _read_at(f, z64_at, 56, size)
        if z64[:4] != b"PK\x06\x06":
            raise ParseError("zip64 end of central directory missing")
        count, cd_size, cd_offset = struct.unpack_from("<QQQ", z64, 32)
    if cd_offset + cd_size > size or count > cd_size // 46:
        raise ParseError("zip central directory leaves the file")
    if cd_size > MAX_DIRECTORY:
        raise ParseError("zip central directory too large")
    cd = _read_at(f, cd_offset, cd_size, size)
    members = []
    p = 0
    for _ in range(count):
        if cd[p:p + 4] != b"PK\x01\x02" or p + 46 > len(cd):
            raise ParseError("bad zip central directory entry")
        (method, csize, usize, nlen, elen, clen, header) = struct.unpack_from("<10xH8xIIHHH8xI", cd, p)
        name_b = cd[p + 46:p + 46 + nlen]
        extra = cd[p + 46 + nlen:p + 46 + nlen + elen]
        p += 46 + nlen + elen + clen
        if p > len(cd):
            raise ParseError("zip central directory entry leaves the directory")
        if 0xFFFFFFFF in (csize, usize, header):
            usize, csize, header = _zip64_extra(extra, usize, csize, header)
        members.append(_Member(name_b.decode("utf-8", "replace"), method, csize, usize, header))
    return members


def _zip64_extra(extra: bytes, usize: int, csize: int, header: int) -> tuple[int, int, int]:
    q = 0
    while q + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, q)
        body = extra[q + 4:q + 4 + n]
        q += 4 + n
        if tag != 1:
            continue
        vals = [v for v in struct.unpack_from(f"<{len(body) // 8}Q", body)] if len(body) >= 8 else []
        it = iter(vals)
        try:
            if usize == 0xFFFFFFFF:
                usize = next(it)
            if csize == 0xFFFFFFFF:
                csize = next(it)
            if header == 0xFFFFFFFF:
                header = next(it)
        except StopIteration:
            raise ParseError("short zip64 extra field") from None
        return usize, csize, header
    raise ParseError("zip64 sizes without a zip64 extra field")


def _data_start(f: BinaryIO, m: _Member, size: int) -> int:
    lh = _read_at(f, m.header, 30, size)
    if lh[:4] != b"PK\x03\x04":
        raise ParseError(f"bad local header for {m.name!r}")
    nlen, elen = struct.unpack_from("<HH", lh, 26)
    start = m.header + 30 + nlen + elen
    if start + m.csize > size:
        raise ParseError(f"zip member {m.name!r} leaves the file")
    return start


def _member_bytes(f: BinaryIO, m: _Member, size: int) -> bytes:
    if m.usize > MAX_PICKLE:
        raise ParseError(f"{m.name!r} is too large to walk")
    raw = _read_at(f, _data_start(f, m, size), m.csize, size)
    if m.method == 0:
        if m.csize != m.usize:
            raise ParseError(f"stored member {m.name!r} has two sizes")
        return raw
    if m.method != 8:
        raise ParseError(f"{m.name!r} uses compression method {m.method}")
    d = zlib.decompressobj(-15)
    out = d.decompress(raw, m.usize + 1)
    if len(out) != m.usize:
        raise ParseError(f"{m.name!r} inflates to the wrong size")
    return out


def _parse_zip(f: BinaryIO, size: int) -> list[Segment]:
    members = _central_directory(f, size)
    by_name: dict[str, _Member] = {}
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
            big_endian = _member_bytes(f, m, size).strip() == b"big"
    tensors: list[Segment] = []
    seen: set[str] = set()
    for pm in pickles:
        w = _walk(_member_bytes(f, pm, size))
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
            tensors.append(_segment(w, key, _data_start(f, m, size), m.usize, m.name, big_endian))
    return fill_gaps([t for t in tensors if t.length >= MIN_TENSOR_BYTES], 0, size)


# ------------------------------------------------------------------- legacy


def _little_endian(data: bytes, start: int) -> bool:
    """Whether the system-info pickle says little_endian: True."""
    after = False
    stream = io.BytesIO(data)
    stream.seek(start)
    for op, arg, _ in pickletools.genops(stream):
        if after and op.name not in _PUTS and op.name != "MEMOIZE":
            return op.name == "NEWTRUE" or (op.name == "INT" and arg is True)
        if op.name in _STRINGS and arg == "little_endian":
            after = True
        if op.name == "STOP":
            break
    return False


def _parse_legacy(f: BinaryIO, size: int) -> list[Segment]:
    # The pickles are small next to the storages; read a growing prefix until all five parse.
    n = min(size, LEGACY_PREFIX)
    while True:
        head = _read_at(f, 0, n, size)
        try:
            walks = []
            pos = 0
            for i in range(5):
                if i == 2 and not _little_endian(head, pos):
                    raise ParseError("legacy checkpoint is not little-endian")
                walks.append(_walk(head, pos))
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
        (numel,) = struct.unpack("<q", _read_at(f, pos, 8, size))
        if numel != ref.numel or pos + 8 + numel * dtype.itemsize > size:
            raise ParseError(f"legacy storage {key!r} disagrees with its pickle")
        length = numel * dtype.itemsize
        name = main.names.get(key, f"storage/{key}")
        tensors.append(Segment(pos + 8, length, name, dtype, _shape(main, ref, numel)))
        pos += 8 + length
    return fill_gaps([t for t in tensors if t.length >= MIN_TENSOR_BYTES], 0, size)
