"""The archive index: files, their segments, programs and stream locations.

Stored as zstd-compressed JSON. Reading it validates every field: types,
ranges, that streams lie inside the stream region, that chunk sizes add up
to segment sizes and segment sizes to file sizes, that programs type-check,
and that paths cannot leave the output folder. Nothing read from an archive
is used before it passed these checks.

The records of the index are declared once, below (INDEX and the records
it nests): to_json, from_json and docs/FORMAT.md's tables are derived
from that declaration (see schema.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .. import dtypes
from ..dsl.entropy import in_one_call
from ..dsl.memory import MAX_DECODE_BYTES
from ..dsl.program import Program
from ..dsl.types import BYTES, Field as ValueType, tensor
from ..dtypes import DType
from .format import MAX_CHUNK_BYTES, MAX_DIMS
from .schema import (DIGEST_BYTES, Check, DTypeName, Field, Hex, Int, Let, List, Members, Obj, Path, Programs,
                     ProgramTable, Ranges, Record, Run, SearchKind, Shape, Str, _index, check_path, dumper, is_hex,
                     is_int, parser, paused_gc, placements, programs)

__all__ = ["DIGEST_BYTES", "Chunk", "SegmentEntry", "FileEntry", "TensorRef", "LinkEntry", "Index", "SearchKind",
           "check_path", "is_int", "is_hex", "INDEX", "pieces"]


@dataclass
class Chunk:
    program: int  # index into the segment's programs
    n: int  # elements
    streams: list[tuple[int, int, int]]  # (offset, length, check of the stored bytes: format.stream_checker)
    digest: bytes  # XXH3-128 of the original bytes (BLAKE3 in versions 3 to 6, SHA-256 before)

    @property
    def stored(self) -> int:
        return sum(s[1] for s in self.streams)


class _kept:
    """functools.cached_property without its lock (Python 3.11 takes an
    RLock at every first read of every instance: 0.37 against 0.13 us,
    three times a segment of every index read): a value computed at its
    first read and kept in the instance, where later reads find it."""

    def __init__(self, compute):
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.compute(obj)
        return value


@dataclass
class SegmentEntry:
    name: str
    dtype: DType | None
    shape: tuple[int, ...] | None
    length: int
    programs: list[Program] = dataclasses.field(default_factory=list)
    chunks: list[Chunk] = dataclasses.field(default_factory=list)
    search: dict = dataclasses.field(default_factory=dict)  # how the program was found (informative)
    base: dict | None = None  # {"file", "name", "sha256"}: the base tensor it is coded against
    # A gathered segment: the byte spans of its file it holds, (offset,
    # length) in file order, one after another (None: one span, in order).
    ranges: tuple[tuple[int, int], ...] | None = None
    # Gathered tensors (a typed gathered segment): each span's tensor, (name,
    # shape), in the order of `ranges` (None: not gathered tensors).
    members: tuple[tuple[str, tuple[int, ...]], ...] | None = None

    # Kept once read: decoding asks for both at every chunk (a segment's dtype
    # never changes; dataclasses.replace makes a new entry).
    @_kept
    def value_type(self) -> ValueType:
        return tensor(self.dtype) if self.dtype else BYTES

    @_kept
    def itemsize(self) -> int:
        return self.dtype.itemsize if self.dtype else 1

    @_kept
    def in_one_call(self) -> list[tuple[int, int] | None]:
        """Per program: (width, bits) where its chunks decode in one batched
        call straight into their place (entropy.in_one_call), else None."""
        return [in_one_call(p, self.value_type, self.itemsize) for p in self.programs]

    @property
    def stored(self) -> int:
        return sum(c.stored for c in self.chunks)

    def holding(self, start: int = 0, length: int | None = None) -> str:
        """For messages: "" or, gathered tensors, " (the tensors whose bytes
        lie in [start, start + length) of it)", three named."""
        if self.members is None:
            return ""
        end = self.length if length is None else start + length
        names, at = [], 0
        for (name, _), (_, n) in zip(self.members, self.ranges):
            if at < end and at + n > start:
                names.append(name)
            at += n
        more = f", and {len(names) - 3} more" if len(names) > 3 else ""
        return f" ({', '.join(names[:3])}{more})"


@dataclass
class FileEntry:
    path: str
    size: int
    format: str
    segments: list[SegmentEntry] = dataclasses.field(default_factory=list)
    mode: int | None = None  # permission bits (st_mode & 0o7777); None: not recorded (older archives)
    mtime: int | None = None  # modification time, nanoseconds since 1970; None: not recorded

    @property
    def stored(self) -> int:
        return sum(s.stored for s in self.segments)

    def placements(self) -> list[tuple[tuple[int, int], ...]]:
        """Where each segment's bytes lie in the file: (offset, length) pieces."""
        return placements(self.segments, self.size)

    def tensors(self) -> list["TensorRef"]:
        """The file's tensors in file order: its typed segments, and the
        members of its gathered tensors."""
        out = []
        for seg, placed in zip(self.segments, self.placements()):
            if seg.dtype is None:
                continue
            if seg.members is None:
                out.append(TensorRef(seg.name, seg.dtype, seg.shape, seg.length, seg, 0, placed[0][0]))
                continue
            start = 0
            for (name, shape), (offset, length) in zip(seg.members, seg.ranges):
                out.append(TensorRef(name, seg.dtype, shape, length, seg, start, offset))
                start += length
        out.sort(key=lambda t: t.offset)  # stable: an empty tensor stays before the one at its offset
        return out


@dataclass(frozen=True, eq=False)
class TensorRef:
    """A tensor of an archived file: a typed segment, or one of the tensors
    a segment gathers (its bytes: [start, start + length) of the segment's)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    length: int
    segment: SegmentEntry
    start: int  # in the segment's bytes
    offset: int  # in the file

    @property
    def gathered(self) -> bool:
        return self.segment.members is not None

    @property
    def stored(self) -> int:
        """Stored bytes: its segment's, or, gathered, its share of them by length."""
        seg = self.segment
        return seg.stored if not self.gathered else seg.stored * self.length // max(1, seg.length)


def pieces(placed: tuple[tuple[int, int], ...], start: int, length: int) -> list[tuple[int, int, int]]:
    """Bytes [start, start + length) of a segment placed at `placed` (its
    pieces in the file): (offset in the file, offset in those bytes,
    length) of each part."""
    if len(placed) == 1 and length and 0 <= start and start + length <= placed[0][1]:
        return [(placed[0][0] + start, 0, length)]  # most segments: one span of the file
    # (Comparisons, not max and min: a gathered segment's chunk walks its
    # tens to hundreds of ranges, 64 -> 25 us for 150 of them.)
    end = start + length
    out, at = [], 0
    for off, n in placed:
        nxt = at + n
        if nxt > start:
            if at >= end:
                break
            lo = start if start > at else at
            hi = end if end < nxt else nxt
            if lo < hi:
                out.append((off + lo - at, lo - start, hi - lo))
        at = nxt
    return out


@dataclass
class LinkEntry:
    """A symbolic link of the archived tree to a file or folder of the same tree."""

    path: str
    target: str  # relative to the link's folder: some "..", then names (schema.link_target)
    mtime: int | None = None  # of the link itself, nanoseconds since 1970


@dataclass
class Index:
    files: list[FileEntry]
    dirs: list[str] = dataclasses.field(default_factory=list)
    created_by: str = ""
    prior: dict | None = None  # the production prior the programs were found with
    base: dict | None = None  # {"sha256", "tensors"}: identity of the base model used, if any
    links: list[LinkEntry] = dataclasses.field(default_factory=list)  # symbolic links inside the tree
    series: dict | None = None  # {"name", "step", "content", "previous"}: a member of a run (brevis/series.py)

    @property
    def original_bytes(self) -> int:
        return sum(f.size for f in self.files)

    # ------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        """The index's JSON value: every distinct program once, in the
        program table (format version 9), each segment naming its own by
        number there."""
        obj = _dump_index(self)
        table: list = []
        numbers: dict[Program, int] = {}  # equal programs write the same JSON
        for f, f_obj in zip(self.files, obj["files"]):
            for s, s_obj in zip(f.segments, f_obj["segments"]):
                refs = []
                for program, value in zip(s.programs, s_obj["programs"]):
                    k = numbers.get(program)
                    if k is None:
                        k = numbers[program] = len(table)
                        table.append(value)
                    refs.append(k)
                s_obj["programs"] = refs
        # In the order of INDEX's fields: the table before the files that name its entries.
        at = list(obj).index("files")
        items = list(obj.items())
        return dict(items[:at] + [("programs", table)] + items[at:])

    @staticmethod
    def from_json(obj: Any, stream_start: int, stream_end: int) -> "Index":
        """The index of JSON value obj, every field checked (FormatError);
        streams must lie in [stream_start, stream_end)."""
        with paused_gc():
            return _parse_index(obj, stream_start, stream_end)


# ---------------------------------------------------------------- schema
# The index, field by field: what to_json writes and from_json reads and
# checks (see schema.py; docs/FORMAT.md's tables are generated from it).
# Locals in expressions: RECORD_ATTR of the fields read so far, the Lets,
# start and end (the stream region).

STREAM = Record("stream", tuple, array=True, malformed="malformed stream location", doc=(
    "where a stream lies: its offset in the archive, its stored length, the check of its stored bytes "
    "(format version 3 on: the low 32 bits of XXH3-64; versions 1 and 2: zlib's CRC-32)."), items=[
    Field(0, "offset", Int(doc="integer, from the end of the header"), doc="absolute offset"),
    Field(1, "length", Int(doc="integer >= 0"), doc="stored bytes"),
    Field(2, "crc", Int(doc="integer below 2^32"), doc="check of the stored bytes (XXH3-64 low 32 bits, or CRC-32)"),
    Check("start <= stream_offset and stream_length >= 0 and stream_offset + stream_length <= end",
          "stream lies outside the stream region"),
    Check("0 <= stream_crc < 4294967296", "malformed stream checksum"),
])

CHUNK = Record("chunk", Chunk, array=True, malformed="malformed chunk", doc=(
    "a run of the segment's elements coded by one of its programs."), items=[
    Field(0, "program", Int("0 <= {v} < segment_count", "chunk names no program",
                            doc="index into `programs`"), doc="the program coding it"),
    Field(1, "n", Int("0 < {v} <= segment_max_n", "chunk of {chunk_n!r} elements is out of bounds",
                      doc=f"integer, 1 to {MAX_CHUNK_BYTES >> 20} MiB of elements"), doc="elements"),
    Field(2, "streams", List(STREAM, length="segment_programs_streams[chunk_program]",
                             message="chunk has the wrong number of streams", doc="as many as the program reads"),
          doc="one per leaf of the program, in order"),
    Field(3, "digest", Hex(DIGEST_BYTES, raw=True, message="malformed checksum"),
          doc="XXH3-128 of the chunk's original bytes, big-endian (format version 7 on; versions 3 to 6: the "
              "first 16 bytes of their BLAKE3, 1 and 2: of their SHA-256)"),
    Check("segment_programs_peaks[chunk_program] * chunk_n <= MAX_DECODE_BYTES",
          "chunk of {chunk_n!r} elements would take more than MAX_DECODE_BYTES to decode with its program"),
])

BASE_REF = Record("base_ref", dict, malformed="malformed base reference", doc=(
    "the base tensor a segment is coded against (see Base models)."), items=[
    Field("file", "file", Str(), doc="its file, as named in the base"),
    Field("name", "name", Str(), doc="its name"),
    Field("sha256", "sha256", Hex(16), doc="first 16 bytes of the SHA-256 of its bytes"),
])

SEGMENT = Record("segment", SegmentEntry, where='f"{file_path}: segment {segment_name!r}"',
                 where0='f"{file_path}: segment"', ident="name", about='f"{file_path}: segment {segment_name!r}"',
                 doc="a tensor or a byte span of a file.", items=[
    Field("name", "name", Str(), doc="tensor name (empty for bytes)"),
    Field("dtype", "dtype", DTypeName(), default="None", null=True, doc="null for bytes"),
    Field("shape", "shape", Shape(), default="None", null=True, doc="null for bytes"),
    Field("length", "length", Int(doc="integer >= 0"), doc="original bytes"),
    Check("segment_length >= 0", "negative length"),
    Check("segment_dtype is not None or segment_shape is None", "bytes have no shape"),
    Check("segment_dtype is None or segment_shape is not None", "malformed shape"),
    Check("segment_dtype is None or shape_fits(segment_shape, segment_dtype.itemsize)",
          "shape too large for an array"),
    Check("segment_dtype is None or prod(segment_shape) * segment_dtype.itemsize == segment_length",
          "shape and length disagree"),
    Let("segment_itemsize", "segment_dtype.itemsize if segment_dtype else 1"),
    Let("segment_max_n", "MAX_CHUNK_BYTES // segment_itemsize"),
    Field("programs", "programs", Programs("tensor(segment_dtype) if segment_dtype else BYTES", "index_programs"),
          doc="each must type-check against the segment's value (below, `segment_programs_peaks`: the bytes "
              "per element each needs to decode; `segment_programs_reference`: whether any codes against a base "
              "tensor); where the index has a program table, each is the number of one of its entries"),
    Let("segment_count", "len(segment_programs)"),
    Field("chunks", "chunks", List(CHUNK), doc="in order"),
    Check("sum(c.n for c in segment_chunks) * segment_itemsize == segment_length",
          "chunks do not add up to its length"),
    Field("search", "search", Obj("search must be an object"), default="{}",
          doc="how the program was found (informative)"),
    Field("base", "base", BASE_REF, default="None", null=True, doc="the base tensor it is coded against"),
    Check("segment_base is None or segment_dtype is not None", "malformed base reference"),
    Check("segment_base is not None or not segment_programs_reference",
          "coded against a base tensor it does not name"),
    Field("ranges", "ranges", Ranges(), default="None", null=True, omit=True,
          doc="a gathered segment (see Gathered byte spans): the byte spans of the file it holds, in file order; "
              "absent: the segment is one span, placed in order"),
    Check("segment_ranges is None or (len(segment_ranges) > 0 and sum(r[1] for r in segment_ranges) == segment_length)",
          "gathered ranges do not add up to the segment"),
    Check("segment_ranges is None or segment_base is None", "a gathered segment is coded against a base tensor"),
    Field("members", "members", Members(), default="None", null=True, omit=True,
          doc="gathered tensors (format version 8 on; see Gathered tensors): each range's tensor, [name, shape], "
              "in the order of `ranges`; absent: the segment is not gathered tensors"),
    Check("(segment_members is not None) == (segment_ranges is not None and segment_dtype is not None)",
          "gathered tensors must name their tensors, and only they"),
    Check("segment_members is None or (len(segment_members) == len(segment_ranges) and all("
          "prod(m[1]) * segment_itemsize == r[1] for m, r in zip(segment_members, segment_ranges)))",
          "gathered tensors do not match their ranges"),
])

# What a file system's timestamp can hold (a 64-bit count of nanoseconds,
# years 1678 to 2262): os.utime refuses more, after the files are written.
MTIME_RANGE = "-(1 << 63) <= {v} < (1 << 63)"
MTIME_DOC = "integer, -2^63 to 2^63 - 1"

FILE = Record("file", FileEntry, where="file_path", where0='"file"', ident="path", about="file_path",
              doc="a file of the checkpoint.", items=[
    Field("path", "path", Path(), doc="where it goes in the output folder"),
    Field("size", "size", Int(doc="integer >= 0"), doc="bytes"),
    Field("format", "format", Str(), doc="how it was cut (informative)"),
    Field("segments", "segments", List(SEGMENT, fast="read_segments({v}, start, end, cache, index_programs)"),
          doc="tiling the file, in order"),
    Check("file_size >= 0 and sum(s.length for s in file_segments) == file_size",
          "segments do not add up to the file size"),
    Run("check_tiling(file_segments, file_size)",
        "gathered ranges lie in the file, sorted and apart, and no other segment lies across one"),
    Field("mode", "mode", Int("0 <= {v} <= 0o7777", "malformed mode", doc="integer, 0 to 0o7777"),
          default="None", null=True, omit=True, doc="permission bits (absent: not recorded)"),
    Field("mtime", "mtime", Int(MTIME_RANGE, "malformed mtime", doc=MTIME_DOC), default="None", null=True,
          omit=True, doc="modification time, nanoseconds since 1970 (absent: not recorded)"),
])

LINK = Record("link", LinkEntry, where="link_path", where0='"link"', ident="path", about="link_path",
              doc="a symbolic link to a file or folder of the archive (see Links).", items=[
    Field("path", "path", Path(), doc="where it goes in the output folder"),
    Field("target", "target", Str(), doc="what it points at, relative to its folder: `..`s, then names"),
    Field("mtime", "mtime", Int(MTIME_RANGE, "malformed mtime", doc=MTIME_DOC), default="None", null=True,
          omit=True, doc="the link's own modification time, nanoseconds since 1970"),
])

BASE_IDENTITY = Record("base_identity", dict, malformed="base must be an object with sha256 and tensors",
                       doc="identity of the base model used (see Base models).", items=[
    Field("sha256", "sha256", Hex(16), doc="of the sorted lines of the base tensors used"),
    Field("tensors", "tensors", Int(), doc="how many base tensors are used"),
])

SERIES_PREVIOUS = Record("series_previous", dict, malformed="malformed series predecessor",
                         doc="the member of the run an archive is coded against (see Training runs).", items=[
    Field("archive", "archive", Path(), doc="its archive: a file name in the same folder"),
    Check("'/' not in series_previous_archive", "a predecessor must be a file name in the same folder"),
    Field("content", "content", Hex(16), doc="its content identity (its `series.content`)"),
])

SERIES = Record("series", dict, malformed="malformed series record",
                doc="a checkpoint of a training run (see Training runs).", items=[
    Field("name", "name", Path(), doc="the checkpoint's name in the run: a file or folder name"),
    Check("'/' not in series_name", "a checkpoint's name must be a file or folder name"),
    Field("position", "position", Int("{v} >= 0", "malformed position"), doc="its place in the run's order"),
    Field("step", "step", Int("{v} >= 0", "malformed step"), default="None", null=True,
          doc="its training step, where its name tells it"),
    Field("content", "content", Hex(16), doc="its content identity: see Training runs"),
    Field("previous", "previous", SERIES_PREVIOUS, default="None", null=True,
          doc="the member it is coded against; null for a keyframe"),
])

INDEX = Record("index", Index, where='"index"', about="", doc="the index, at the top.", items=[
    Field("created_by", "created_by", Str(), doc="the writer's name and version"),
    Field("prior", "prior", Obj("prior must be an object"), default="None", null=True,
          doc="the production prior the programs were found with (informative)"),
    Field("base", "base", BASE_IDENTITY, default="None", null=True, doc="the base model, if any"),
    Field("dirs", "dirs", List(Path()), doc="folders to create (empty ones)"),
    Field("programs", "programs", ProgramTable(), default="None", null=True, omit=True, keep=False,
          doc="the program table (format version 9 on): every distinct program of the "
              "segments, once; absent: each segment holds its programs themselves"),
    Field("files", "files", List(FILE), doc="the files"),
    Field("links", "links", List(LINK), default="[]", omit=True, doc="symbolic links (absent: none)"),
    Field("series", "series", SERIES, default="None", null=True, omit=True,
          doc="where the archive is a member of a training run (absent: it is not)"),
    Run("check_tree(index_files, index_dirs, index_links)",
        "no path appears twice or lies under a file or a link; every link points at a file or folder of the archive"),
    Check("index_base is not None or not any(s.base for f in index_files for s in f.segments)",
          "segments are coded against a base the index does not describe"),
])


def _loops_only(v, start: int, end: int, cache: dict, table) -> None:
    """Without the compiled reader: None, and the schema's loops read every segment."""
    return None


# What the compiled reader of a file's segments (brevis/native/_index.c)
# builds, by position: it is used only while the records' classes have
# these fields (one added leaves it unused until it learns the field, and
# tests/native/test_index_reader.py fails until then). It reads the common
# shape of an index with the checks of SEGMENT, CHUNK and STREAM, and gives
# up (None) on any other: the loop the schema compiles then reads them and
# says what is wrong. One-shot unpack in fresh processes, on an AMD EPYC
# (Zen 3) at 2 threads, against the loops alone: fracast 0.80-0.93 of the
# time, taesd 0.92-0.97, silero 0.93, ppocr 0.95, piper 0.96; larger items
# within the host's noise (benchmarks/results/ab-fa2cc01-acf2508-index-reader.md).
_COMPILED_FIELDS = (("name", "dtype", "shape", "length", "programs", "chunks", "search", "base", "ranges", "members"),
                    ("program", "n", "streams", "digest"))
_compiled = _index is not None and _COMPILED_FIELDS == tuple(tuple(f.name for f in dataclasses.fields(c))
                                                             for c in (SegmentEntry, Chunk))
if _compiled:
    _index.setup(programs, dtypes.DTYPES, tensor, BYTES, SegmentEntry, Chunk, MAX_CHUNK_BYTES, MAX_DECODE_BYTES,
                 MAX_DIMS)
_read_segments = _index.segments if _compiled else _loops_only

_parse_index = parser(INDEX, names={"read_segments": _read_segments})
_dump_index = dumper(INDEX)
