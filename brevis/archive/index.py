"""The archive index: files, their segments, programs and stream locations.

Stored as zstd-compressed JSON. Reading it validates every field: types,
ranges, that streams lie inside the stream region, that chunk sizes add up
to segment sizes and segment sizes to file sizes, that programs type-check,
and that paths cannot leave the output folder. Nothing read from an archive
is used before it passed these checks.
"""

from __future__ import annotations

import marshal
import math
from dataclasses import dataclass, field
from typing import Any

from .. import dtypes
from ..dsl.program import Program
from ..dsl.types import BYTES, Field, tensor
from ..dtypes import DType
from ..errors import FormatError, ProgramError
from .format import MAX_CHUNK_BYTES

DIGEST_BYTES = 16


@dataclass
class Chunk:
    program: int  # index into the segment's programs
    n: int  # elements
    streams: list[tuple[int, int, int]]  # (offset, length, CRC-32 of the stored bytes)
    digest: bytes  # first 16 bytes of the SHA-256 of the original bytes

    @property
    def stored(self) -> int:
        return sum(s[1] for s in self.streams)


@dataclass
class SegmentEntry:
    name: str
    dtype: DType | None
    shape: tuple[int, ...] | None
    length: int
    programs: list[Program] = field(default_factory=list)
    chunks: list[Chunk] = field(default_factory=list)
    search: dict = field(default_factory=dict)  # how the program was found (informative)
    base: dict | None = None  # {"file", "name", "sha256"}: the base tensor it is coded against

    @property
    def value_type(self) -> Field:
        return tensor(self.dtype) if self.dtype else BYTES

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize if self.dtype else 1

    @property
    def stored(self) -> int:
        return sum(c.stored for c in self.chunks)


@dataclass
class FileEntry:
    path: str
    size: int
    format: str
    segments: list[SegmentEntry] = field(default_factory=list)

    @property
    def stored(self) -> int:
        return sum(s.stored for s in self.segments)


@dataclass
class Index:
    files: list[FileEntry]
    dirs: list[str] = field(default_factory=list)
    created_by: str = ""
    prior: dict | None = None  # the production prior the programs were found with
    base: dict | None = None  # {"sha256", "tensors"}: identity of the base model used, if any

    @property
    def original_bytes(self) -> int:
        return sum(f.size for f in self.files)

    # ------------------------------------------------------------ writing
    def to_json(self) -> dict:
        return {
            "created_by": self.created_by,
            "prior": self.prior,
            "base": self.base,
            "dirs": self.dirs,
            "files": [
                {
                    "path": f.path,
                    "size": f.size,
                    "format": f.format,
                    "segments": [
                        {
                            "name": s.name,
                            "dtype": s.dtype.name if s.dtype else None,
                            "shape": list(s.shape) if s.shape is not None else None,
                            "length": s.length,
                            "programs": [p.to_json() for p in s.programs],
                            "chunks": [[c.program, c.n, [list(x) for x in c.streams], c.digest.hex()]
                                       for c in s.chunks],
                            "search": s.search,
                            "base": s.base,
                        }
                        for s in f.segments
                    ],
                }
                for f in self.files
            ],
        }

    # ------------------------------------------------------------ reading
    @staticmethod
    def from_json(obj: Any, stream_start: int, stream_end: int) -> "Index":
        v = _Validator(stream_start, stream_end)
        return v.index(obj)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_hex(x, length: int) -> bool:
    if not isinstance(x, str) or len(x) != length:
        return False
    try:
        bytes.fromhex(x)
    except ValueError:
        return False
    return True


def check_path(path: Any) -> str:
    """A relative POSIX path that stays inside the folder it is joined to."""
    if not isinstance(path, str) or not path:
        raise FormatError("index: a path is empty or not a string")
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
        raise FormatError(f"index: unsafe path {path!r}")
    return path


class _Validator:
    def __init__(self, start: int, end: int):
        self.start, self.end = start, end
        # Segments of a family, or taking one learned program, share it:
        # each distinct program is parsed and checked once per value type.
        self.programs: dict[tuple[str, str], tuple[Program, int]] = {}

    def program(self, obj, t: Field) -> tuple[Program, int]:
        """A program and the number of streams it reads, checked against t."""
        # marshal (version 2: no back-references) is an exact, typed image of
        # the JSON value, 6x faster to make than json.dumps; a key that
        # differs only costs a parse.
        key = (marshal.dumps(obj, 2), str(t))
        hit = self.programs.get(key)
        if hit is None:
            program = Program.from_json(obj)
            hit = self.programs[key] = (program, program.check(t))
        return hit

    def fail(self, msg: str):
        raise FormatError(f"index: {msg}")

    def get(self, obj: dict, key: str, kind, where: str):
        if not isinstance(obj, dict) or key not in obj:
            self.fail(f"{where} lacks {key!r}")
        value = obj[key]
        ok = _is_int(value) if kind is int else isinstance(value, kind)
        if not ok:
            self.fail(f"{where}: {key!r} has the wrong type")
        return value

    def index(self, obj) -> Index:
        if not isinstance(obj, dict):
            self.fail("not an object")
        files = [self.file(f) for f in self.get(obj, "files", list, "index")]
        dirs = [check_path(d) for d in self.get(obj, "dirs", list, "index")]
        created_by = self.get(obj, "created_by", str, "index")
        prior = obj.get("prior")
        if prior is not None and not isinstance(prior, dict):
            self.fail("prior must be an object")
        base = obj.get("base")
        if base is not None and not (isinstance(base, dict) and _is_hex(base.get("sha256"), 32)
                                     and _is_int(base.get("tensors"))):
            self.fail("base must be an object with sha256 and tensors")
        paths = [f.path for f in files] + dirs
        if len(set(paths)) != len(paths):
            self.fail("a path appears twice")
        file_paths = {f.path for f in files}
        for p in paths:
            parts = p.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in file_paths:
                    self.fail(f"{p!r} lies under a file")
        uses_base = any(s.base for f in files for s in f.segments)
        if uses_base and base is None:
            self.fail("segments are coded against a base the index does not describe")
        return Index(files, dirs, created_by, prior, base)

    def file(self, obj) -> FileEntry:
        path = check_path(self.get(obj, "path", str, "file"))
        size = self.get(obj, "size", int, path)
        fmt = self.get(obj, "format", str, path)
        segments = [self.segment(s, path) for s in self.get(obj, "segments", list, path)]
        if size < 0 or sum(s.length for s in segments) != size:
            self.fail(f"{path}: segments do not add up to the file size")
        return FileEntry(path, size, fmt, segments)

    def segment(self, obj, path: str) -> SegmentEntry:
        where = f"{path}: segment"
        name = self.get(obj, "name", str, where)
        length = self.get(obj, "length", int, where)
        if length < 0:
            self.fail(f"{where} {name!r} has a negative length")
        dtype_name = obj.get("dtype") if isinstance(obj, dict) else None
        shape = obj.get("shape")
        if dtype_name is None:
            dtype = None
            if shape is not None:
                self.fail(f"{where} {name!r}: bytes have no shape")
        else:
            dtype = dtypes.lookup(dtype_name) if isinstance(dtype_name, str) else None
            if dtype is None:
                self.fail(f"{where} {name!r}: unknown dtype {dtype_name!r}")
            if (not isinstance(shape, list) or len(shape) > 64
                    or not all(_is_int(d) and d >= 0 for d in shape)):
                self.fail(f"{where} {name!r}: malformed shape")
            if math.prod(shape) * dtype.itemsize != length:
                self.fail(f"{where} {name!r}: shape and length disagree")
            shape = tuple(shape)
        search = obj.get("search", {})
        if not isinstance(search, dict):
            self.fail(f"{where} {name!r}: search must be an object")
        base = obj.get("base")
        if base is not None and not (isinstance(base, dict) and isinstance(base.get("file"), str)
                                     and isinstance(base.get("name"), str) and _is_hex(base.get("sha256"), 32)
                                     and dtype is not None):
            self.fail(f"{where} {name!r}: malformed base reference")
        seg = SegmentEntry(name, dtype, shape, length, search=search, base=base)
        counts = []  # streams each program reads
        for p in self.get(obj, "programs", list, where):
            try:
                program, count = self.program(p, seg.value_type)
                counts.append(count)
            except ProgramError as e:
                raise FormatError(f"{where} {name!r}: {e}") from None
            seg.programs.append(program)
        if any(p.uses_reference for p in seg.programs) and seg.base is None:
            self.fail(f"{where} {name!r}: coded against a base tensor it does not name")
        elements = 0
        max_n = MAX_CHUNK_BYTES // seg.itemsize
        start, end, programs = self.start, self.end, len(seg.programs)
        # The hottest loop of reading an index (one pass per stream): `type(x)
        # is int` is what _is_int checks on JSON values, which are never int
        # subclasses other than bool.
        for c in self.get(obj, "chunks", list, where):
            if not (isinstance(c, list) and len(c) == 4):
                self.fail(f"{where} {name!r}: malformed chunk")
            prog, n, streams, digest = c
            if not (type(prog) is int and 0 <= prog < programs):
                self.fail(f"{where} {name!r}: chunk names no program")
            if not (type(n) is int and 0 < n <= max_n):
                self.fail(f"{where} {name!r}: chunk of {n!r} elements is out of bounds")
            if not (isinstance(streams, list) and len(streams) == counts[prog]):
                self.fail(f"{where} {name!r}: chunk has the wrong number of streams")
            located = []
            for s in streams:
                if not (isinstance(s, list) and len(s) == 3):
                    self.fail(f"{where} {name!r}: malformed stream location")
                off, ln, crc = s
                if not (type(off) is int and type(ln) is int and type(crc) is int):
                    self.fail(f"{where} {name!r}: malformed stream location")
                if not (start <= off and ln >= 0 and off + ln <= end):
                    self.fail(f"{where} {name!r}: stream lies outside the stream region")
                if not 0 <= crc < 1 << 32:
                    self.fail(f"{where} {name!r}: malformed stream checksum")
                located.append((off, ln, crc))
            try:
                raw_digest = bytes.fromhex(digest) if isinstance(digest, str) else b""
            except ValueError:
                raw_digest = b""
            if len(raw_digest) != DIGEST_BYTES:
                self.fail(f"{where} {name!r}: malformed checksum")
            elements += n
            seg.chunks.append(Chunk(prog, n, located, raw_digest))
        if elements * seg.itemsize != length:
            self.fail(f"{where} {name!r}: chunks do not add up to its length")
        return seg
