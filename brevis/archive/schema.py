"""The archive index's schema, once: each record as a list of fields.

Both directions are derived from these lists: `dumper` makes the JSON
written into an archive (keys in field order), `parser` the function that
reads it back, checking every value read from an untrusted archive. The
table of fields in docs/FORMAT.md is generated from them too (`python -m
brevis.archive.schema` prints it; a test keeps the two equal).

A record is a sequence of items, run in order:

    Field(key, attr, kind)   one JSON value (key: its name in an object,
                             its position in a record stored as an array)
                             checked by `kind` and kept as attribute `attr`
    Let(name, expr)          a local for the checks that follow
    Check(cond, message)     a condition on the values read so far
    Run(statement)           a check that raises by itself (helpers below)

Reading an index of many thousands of chunks is timed, so a schema is not
interpreted value by value: it is compiled once into one Python function
with every nested record inlined (the same loops one would write by
hand). Expressions (`cond`, `expr`, bounds) are Python over the locals of
that function: `RECORD_ATTR` for each field read so far (`segment_dtype`,
`chunk_n`), the Lets, `start` and `end` (the stream region) and the names
in `_NAMESPACE`. Messages are f-strings over the same locals. The code
is made from the schema's own strings only, never from archive data; its
source is kept as the functions' `source` attribute.

Plain checks use `type(x) is int` where one would write _is_int: JSON
values are never int subclasses other than bool.
"""

from __future__ import annotations

import dataclasses
import gc
import marshal
import math
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .. import dtypes
from ..dsl.memory import MAX_DECODE_BYTES, cached_peak
from ..dsl.program import Program
from ..dsl.types import BYTES, tensor
from ..errors import FormatError, ProgramError
from .format import DIGEST_BYTES, MAX_CHUNK_BYTES, MAX_DIMS, shape_fits

try:
    from ..native import _index
except ImportError:  # a source tree that was never built: the compiled readers' loops
    _index = None

REQUIRED = object()  # a Field's default: the key must be there
_MISSING = object()


def is_int(x) -> bool:
    """An integer that is not a bool (JSON's true and false are bools)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_hex(x, length: int) -> bool:
    """A string of `length` hex digits."""
    if not isinstance(x, str) or len(x) != length:
        return False
    try:
        bytes.fromhex(x)
    except ValueError:
        return False
    return True


def check_path(path: Any) -> str:
    """A relative POSIX path that stays inside the folder it is joined to,
    written as the file system names it: names that are not UTF-8 are
    surrogate escapes of their bytes (os.fsdecode), so a lone surrogate, or
    an escape of bytes that are valid UTF-8 (another spelling of a name
    that is), is refused: two names can never be one file on disk."""
    if not isinstance(path, str) or not path:
        raise FormatError("index: a path is empty or not a string")
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
        raise FormatError(f"index: unsafe path {path!r}")
    if not path.isascii():
        try:
            canonical = path.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape") == path
        except UnicodeError:
            canonical = False
        if not canonical:
            raise FormatError(f"index: path {path!r} is not a file name (a lone surrogate, or another spelling "
                              "of a UTF-8 name)")
    return path


class SearchKind(StrEnum):
    """How a segment's program was found: the `search` entry of its stats.

    The values are what archives hold; they are never renamed."""

    TINY = "tiny"  # too small to search: zstd at level 3 (or raw)
    NONE = "none"  # effort 0: zstd's entropy preset
    SEARCH = "a*"  # an A* search; with expanded, generated, estimate, exhausted
    LEARNED = "learned"  # a program learned on the sample; with estimate
    FAMILY = "family"  # a sibling's program (same family); with estimate


# ---------------------------------------------------------------- kinds
class Kind:
    """How one JSON value is checked and what it becomes."""

    doc = ""

    def parse(self, g: "_Gen", v: str, bad: str, name: str) -> str:
        """Emit the checks of JSON value `v` (failing with message expression
        `bad`); the expression of the Python value."""
        return v

    def dump(self, x: str) -> str:
        """The expression of the JSON value of Python value `x`."""
        return x


class Int(Kind):
    def __init__(self, cond: str | None = None, message: str | None = None, doc: str = "integer"):
        self.cond, self.message, self.doc = cond, message, doc

    def parse(self, g, v, bad, name):
        test = f"type({v}) is int" + (f" and {self.cond.format(v=v)}" if self.cond else "")
        g.fail_unless(test, g.about(self.message) if self.message else bad)
        return v


class Str(Kind):
    doc = "string"

    def parse(self, g, v, bad, name):
        g.fail_unless(f"type({v}) is str", bad)
        return v


class Path(Kind):
    doc = "safe relative path"

    def parse(self, g, v, bad, name):
        g.line(f"check_path({v})")
        return v


class Obj(Kind):
    """Any JSON object, kept as it is (informative entries)."""

    def __init__(self, message: str | None = None, doc: str = "object"):
        self.message, self.doc = message, doc

    def parse(self, g, v, bad, name):
        g.fail_unless(f"type({v}) is dict", g.about(self.message) if self.message else bad)
        return v


class Hex(Kind):
    """Hex digits of `nbytes` bytes: kept as the string, or (raw) as bytes."""

    def __init__(self, nbytes: int, raw: bool = False, message: str | None = None):
        self.nbytes, self.raw, self.message = nbytes, raw, message
        self.doc = f"hex of {nbytes} bytes"

    def parse(self, g, v, bad, name):
        bad = g.about(self.message) if self.message else bad
        if not self.raw:
            g.fail_unless(f"is_hex({v}, {2 * self.nbytes})", bad)
            return v
        g.line("try:")
        g.line(f"    {name} = bytes.fromhex({v}) if type({v}) is str else b''")
        g.line("except ValueError:")
        g.line(f"    {name} = b''")
        g.fail_unless(f"len({name}) == {self.nbytes}", bad)
        return name

    def dump(self, x):
        return f"{x}.hex()" if self.raw else x


class DTypeName(Kind):
    doc = "dtype name"

    def parse(self, g, v, bad, name):
        found = f"{name}_found"
        g.line(f"{found} = dtypes.lookup({v}) if type({v}) is str else None")
        g.fail_unless(f"{found} is not None", g.about("unknown dtype {%s!r}" % v))
        return found

    def dump(self, x):
        return f"{x}.name"


class Shape(Kind):
    doc = f"list of at most {MAX_DIMS} non-negative integers"

    def parse(self, g, v, bad, name):
        g.fail_unless(f"type({v}) is list and len({v}) <= {MAX_DIMS}"
                      f" and all(type(d) is int and d >= 0 for d in {v})", g.about("malformed shape"))
        return f"tuple({v})"

    def dump(self, x):
        return f"list({x})"


class Ranges(Kind):
    doc = "list of [offset, length] pairs of integers, length >= 1"

    def parse(self, g, v, bad, name):
        g.line(f"{name} = ranges_of({v})")
        g.fail_unless(f"{name} is not None", g.about("malformed ranges"))
        return name

    def dump(self, x):
        return f"[list(r) for r in {x}]"


class Members(Kind):
    doc = f"list of [name, shape] pairs: a string, a list of at most {MAX_DIMS} non-negative integers"

    def parse(self, g, v, bad, name):
        g.line(f"{name} = members_of({v})")
        g.fail_unless(f"{name} is not None", g.about("malformed members"))
        return name

    def dump(self, x):
        return f"[[m[0], list(m[1])] for m in {x}]"


class Programs(Kind):
    """The segment's programs, each checked against value type `t` (an
    expression); also makes NAME_streams, the streams each one reads,
    NAME_peaks, the most bytes each needs per element to decode
    (dsl/memory.py), and NAME_reference, whether any reads a base tensor.
    `table`: the expression of the index's program table (ProgramTable):
    where it is not None, the list holds numbers of its entries instead."""

    doc = "list of programs, or of numbers in the program table where the index has one"

    def __init__(self, t: str, table: str = "None"):
        self.t, self.table = t, table

    def parse(self, g, v, bad, name):
        g.fail_unless(f"type({v}) is list", bad)
        g.line(f"{name}, {name}_streams, {name}_peaks, {name}_reference = programs({v}, {self.t}, cache, "
               f"lambda: {g.where_expr()}, {self.table})")
        return name

    def dump(self, x):
        return f"[p.to_json() for p in {x}]"


class ProgramTable(Kind):
    """The programs of an index, each written once: segments name them by
    number (Programs). Each entry is read and checked where a segment names
    it, against that segment's value type."""

    doc = "list of programs"

    def parse(self, g, v, bad, name):
        g.fail_unless(f"type({v}) is list", g.about("the program table must be a list"))
        return v


class List(Kind):
    """A list of `item` (a Kind or a Record), optionally of a length (an
    expression) failing with `message`. `fast`: an expression over the
    list `{v}` that reads it at once where it can (a compiled reader of
    the same checks and values: brevis/native/_index.c), or gives None,
    where the loop below reads it item by item and says what is wrong."""

    def __init__(self, item: "Kind | Record", length: str | None = None, message: str | None = None,
                 doc: str | None = None, fast: str | None = None):
        self.item, self.length, self.message, self.count_doc, self.fast = item, length, message, doc, fast

    @property
    def doc(self) -> str:
        return f"list of {_kind_doc(self.item)}" + (f", {self.count_doc}" if self.count_doc else "")

    def parse(self, g, v, bad, name):
        test = f"type({v}) is list" + (f" and len({v}) == {self.length}" if self.length else "")
        g.fail_unless(test, g.about(self.message) if self.message else bad)
        item, out = f"{name}_i", f"{name}_out"
        if self.fast:
            g.line(f"{out} = {self.fast.format(v=v)}")
            g.line(f"if {out} is None:")
            g.indent += 1
        g.line(f"{out} = []")
        g.line(f"for {item} in {v}:")
        g.indent += 1
        value = self.item.parse(g, item, bad, f"{name}_v")
        g.line(f"{out}.append({value})")
        g.indent -= 1
        if self.fast:
            g.indent -= 1
        return out

    def dump(self, x):
        item = x.replace(".", "_") + "_i"
        value = self.item.dump(item)
        return x if value == item else f"[{value} for {item} in {x}]"


# ---------------------------------------------------------------- records
@dataclass(frozen=True)
class Field:
    key: str | int  # JSON key, or position in a record stored as an array
    attr: str  # Python attribute
    kind: Kind
    default: Any = REQUIRED  # source expression of the value a missing key reads as
    null: bool = False  # JSON null reads as None (not checked by kind)
    doc: str = ""
    # Written only when set (not None; for a list, not empty): a field added
    # after archives without it were written, so those stay byte-identical.
    omit: bool = False
    # Kept as an attribute of the record's value; a field that is not is
    # a local for the checks of later fields, written by the caller.
    keep: bool = True


@dataclass(frozen=True)
class Let:
    name: str
    expr: str


@dataclass(frozen=True)
class Check:
    cond: str
    message: str  # f-string over the locals; prefixed by the record's `about`


@dataclass(frozen=True)
class Run:
    statement: str  # a check that raises FormatError itself
    message: str = ""  # what it checks, for the docs


@dataclass
class Record(Kind):
    """A record: a JSON object (or, array=True, a fixed-length array) and
    the Python value made of its fields: cls(**fields), cls=dict to keep
    the JSON object itself (checked), cls=tuple for a tuple of the fields.

    where:  expression naming the record in "lacks"/"wrong type" messages
    where0: the same before field `ident` is read (None: where)
    about:  prefix of the other messages ("": none; None: the enclosing record's)
    malformed: the message for any wrong shape or type (arrays, and
            records whose fields have no messages of their own)
    """

    name: str
    cls: type
    items: list
    array: bool = False
    where: str | None = None
    where0: str | None = None
    ident: str | None = None
    about: str | None = None
    malformed: str | None = None
    doc: str = ""

    @property
    def fields(self) -> list[Field]:
        return [f for f in self.items if isinstance(f, Field)]

    def local(self, f: Field) -> str:
        return f"{self.name}_{f.attr}"

    # -------------------------------------------------------- parsing
    def parse(self, g: "_Gen", v: str, bad: str, name: str) -> str:
        g.records.append(self)
        fields = self.fields
        malformed = g.about(self.malformed) if self.malformed else None
        if self.array:
            g.fail_unless(f"type({v}) is list and len({v}) == {len(fields)}", malformed)
            g.line(", ".join(self.local(f) for f in fields) + f" = {v}")
        else:
            g.fail_unless(f"type({v}) is dict", malformed or bad)
        # Consecutive plain type tests failing alike are one test.
        pending: list[str] = []
        pending_msg = None
        for item in self.items:
            if isinstance(item, Field) and self.array and isinstance(item.kind, Int) and not item.kind.message:
                pending.append(f"type({self.local(item)}) is int" +
                               (f" and {item.kind.cond.format(v=self.local(item))}" if item.kind.cond else ""))
                pending_msg = malformed
                continue
            if pending:
                g.fail_unless(" and ".join(pending), pending_msg)
                pending = []
            if isinstance(item, Let):
                g.line(f"{item.name} = {item.expr}")
            elif isinstance(item, Check):
                g.fail_unless(item.cond, g.about(item.message))
            elif isinstance(item, Run):
                g.line(item.statement)
            else:
                self._field(g, v, item, malformed)
        if pending:
            g.fail_unless(" and ".join(pending), pending_msg)
        g.records.pop()
        if self.cls is dict:
            return v
        fields = [f for f in fields if f.keep]
        if self.cls is tuple:
            return "(" + ", ".join(self.local(f) for f in fields) + ",)"
        attrs = [f.attr for f in fields]
        if dataclasses.is_dataclass(self.cls) and [f.name for f in dataclasses.fields(self.cls)] == attrs:
            args = [self.local(f) for f in fields]  # positional: a little faster
        else:
            args = [f"{f.attr}={self.local(f)}" for f in fields]
        return g.const(self.cls) + "(" + ", ".join(args) + ")"

    def _field(self, g: "_Gen", v: str, f: Field, malformed: str | None) -> None:
        local = self.local(f)
        where = g.where_expr()
        if self.array:
            bad = malformed
        else:
            bad = malformed or f"{where} + {': ' + repr(f.key) + ' has the wrong type'!r}"
            if f.default is REQUIRED:
                g.line(f"{local} = {v}.get({f.key!r}, _MISSING)")
                g.fail_unless(f"{local} is not _MISSING", malformed or f"{where} + {' lacks ' + repr(f.key)!r}")
            else:
                g.line(f"{local} = {v}.get({f.key!r}, {f.default})")
        if f.null:
            g.line(f"if {local} is not None:")
            g.indent += 1
        value = f.kind.parse(g, local, bad, local)
        if value != local:
            g.line(f"{local} = {value}")
        if f.null:
            g.indent -= 1
        if f.attr == self.ident:
            g.past_ident.add(self.name)

    # -------------------------------------------------------- dumping
    def dump(self, x: str) -> str:
        if self.cls is dict:
            return x
        if self.cls is tuple:
            return f"list({x})"
        parts = []
        for f in self.fields:
            if not f.keep:
                continue
            value = f.kind.dump(f"{x}.{f.attr}")
            if f.null and value != f"{x}.{f.attr}":
                value = f"({value} if {x}.{f.attr} is not None else None)"
            if f.omit and not self.array:
                given = f"{x}.{f.attr} is not None" if f.null else f"{x}.{f.attr}"
                parts.append(f"**({{{f.key!r}: {value}}} if {given} else {{}})")
                continue
            parts.append(value if self.array else f"{f.key!r}: {value}")
        return ("[" + ", ".join(parts) + "]") if self.array else ("{" + ", ".join(parts) + "}")


# ---------------------------------------------------------------- code
class _Gen:
    def __init__(self):
        self.lines: list[str] = []
        self.indent = 1
        self.records: list[Record] = []
        self.past_ident: set[str] = set()
        self.namespace: dict[str, Any] = dict(_NAMESPACE)

    def line(self, text: str) -> None:
        self.lines.append("    " * self.indent + text)

    def fail_unless(self, cond: str, message: str) -> None:
        self.line(f"if not ({cond}):")
        self.line(f"    fail({message})")

    def const(self, obj) -> str:
        name = f"_{obj.__name__}"
        self.namespace[name] = obj
        return name

    def where_expr(self) -> str:
        for r in reversed(self.records):
            if r.where is not None:
                if r.where0 is not None and r.name not in self.past_ident:
                    return r.where0
                return r.where
        return repr("index")

    def about(self, message: str) -> str:
        """The expression of a message (an f-string body) with its record's prefix."""
        for r in reversed(self.records):
            if r.about is not None:
                prefix = r.about
                break
        else:
            prefix = ""
        body = "f" + repr(message)
        return f"{prefix} + ': ' + {body}" if prefix else body


@contextmanager
def paused_gc():
    """The cyclic garbage collector held off while an index is read: its
    tens of thousands of new objects (none in a cycle) would otherwise set
    off collections that cost as much as the reading (118 ms against 55 ms
    for 21,000 chunks). Collections resume afterwards, unless they were
    off before."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def fail(message: str):
    raise FormatError(f"index: {message}")


def programs(values: list, t, cache: dict, where, table: list | None = None
             ) -> tuple[list[Program], list[int], list[float], bool]:
    """Programs, the number of streams each reads and the bytes per element
    each needs to decode (cached_peak), checked against t; and whether any
    reads a base tensor.

    Segments of a family, or taking one learned program, share it: each
    distinct list of programs is read once per value type (per index read),
    so that a segment costs a lookup (taesd's 123 segments hold 5 distinct
    lists); each distinct program once, parsed, checked and measured
    (hashing a Program is a walk of it); and the subtrees programs share
    (a partition's byte planes, its leaves) once (Program.from_json's
    memo: ppocr's 27 programs 3.6 -> 2.7 ms in a fresh process). marshal
    (version 2: no back-references) is an exact, typed image of the JSON
    value, 6x faster to make than json.dumps; a key that differs only
    costs a parse. The value type is keyed by identity: there is one per
    dtype (types.tensor), alive while the index is read. `where()`: the
    segment, for a message. Each segment gets a list of its own (the
    counts and peaks, read only by the checks, are shared).

    With the index's program `table` (format version 9 on), `values` are
    numbers of its entries: the key is their tuple, and the JSON of a
    program is read once however many segments name it (smollm2's index
    held 12 distinct programs 219 times, 597 KB of rank symbols)."""
    if table is not None:
        for i in values:
            if type(i) is not int or not 0 <= i < len(table):
                raise FormatError(f"{where()}: names no program of the table: {str(i)[:40]}")
        key = (tuple(values), id(t))
    else:
        key = (marshal.dumps(values, 2), id(t))
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = _programs(values if table is None else [table[i] for i in values], t, cache, where)
    return list(hit[0]), hit[1], hit[2], hit[3]


def _programs(values: list, t, cache: dict, where) -> tuple[list[Program], list[int], list[float], bool]:
    out, counts, peaks = [], [], []
    reference = False
    nodes = cache.setdefault(None, {})  # subtrees read so far (Program.from_json's memo); no other key is None
    for obj in values:
        key = (marshal.dumps(obj, 2), id(t), None)  # a program's key: never a list's (a list's has 2 parts)
        hit = cache.get(key)
        if hit is None:
            try:
                program = Program.from_json(obj, nodes)
                hit = cache[key] = (program, program.check(t), cached_peak(program, t), program.uses_reference)
            except ProgramError as e:
                raise FormatError(f"{where()}: {e}") from None
        out.append(hit[0])
        counts.append(hit[1])
        peaks.append(hit[2])
        reference = reference or hit[3]
    return out, counts, peaks, reference


def ranges_of(v) -> tuple[tuple[int, int], ...] | None:
    """A gathered segment's ranges, [[offset >= 0, length >= 1], ...]
    (integers), as a tuple of pairs; None where malformed. (A loop: a
    generator in all() costs twice as much a range.)"""
    if type(v) is not list:
        return None
    for r in v:
        if type(r) is not list or len(r) != 2:
            return None
        offset, length = r
        if type(offset) is not int or type(length) is not int or offset < 0 or length < 1:
            return None
    return tuple(map(tuple, v))


def members_of(v) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """Gathered tensors, [[name, shape], ...] (a string; at most MAX_DIMS
    integers >= 0), as a tuple of (name, shape tuple); None where
    malformed. (A loop: nested generators cost twice as much a member.)"""
    if type(v) is not list:
        return None
    for m in v:
        if type(m) is not list or len(m) != 2:
            return None
        name, shape = m
        if type(name) is not str or type(shape) is not list or len(shape) > MAX_DIMS:
            return None
        for d in shape:
            if type(d) is not int or d < 0:
                return None
    return tuple((name, tuple(shape)) for name, shape in v)


def check_tree(files: list, dirs: list[str], links: list = ()) -> None:
    """No path twice, none under a file or a link; every link names a file
    or folder of the archive (check_links)."""
    paths = [f.path for f in files] + dirs + [k.path for k in links]
    if len(set(paths)) != len(paths):
        fail("a path appears twice")
    file_paths = {f.path for f in files}
    link_paths = {k.path for k in links}
    for p in paths:
        parts = p.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in file_paths:
                fail(f"{p!r} lies under a file")
            if link_paths and "/".join(parts[:i]) in link_paths:
                fail(f"{p!r} lies under the link {'/'.join(parts[:i])!r}")
    if links:
        check_links(links, file_paths, paths)


def check_tiling(segments: list, size: int) -> None:
    """The segments tile their file: the ranges of gathered segments lie in
    it, sorted and apart, and the other segments fill the rest in order,
    none across a range (placements)."""
    placements(segments, size)


def placements(segments: list, size: int) -> list[tuple[tuple[int, int], ...]]:
    """Where each segment's bytes lie in its file: (offset, length) pieces,
    in the segment's order. A gathered segment lies at its `ranges`; the
    others, in order, fill what the ranges leave, each in one piece. In C
    where built (_index.placements); where that refuses them, here, which
    says why."""
    if _index is not None:
        placed = _index.placements(segments, size)
        if placed is not None:
            return placed
    return _placements(segments, size)


def _placements(segments: list, size: int) -> list[tuple[tuple[int, int], ...]]:
    for s in segments:
        if s.ranges and any(a[0] + a[1] > b[0] for a, b in zip(s.ranges, s.ranges[1:])):
            fail("a gathered segment's ranges are not in file order")
    taken = sorted((r for s in segments if s.ranges for r in s.ranges))
    at = 0
    for off, length in taken:
        if off < at:
            fail("gathered ranges overlap")
        at = off + length
    if at > size:
        fail("a gathered range lies past the end of its file")
    out, pos, k = [], 0, 0
    for s in segments:
        if s.ranges:
            out.append(s.ranges)
            continue
        while k < len(taken) and taken[k][0] == pos:
            pos += taken[k][1]
            k += 1
        if s.length and k < len(taken) and taken[k][0] < pos + s.length:
            fail("a segment lies across a gathered range")
        out.append(((pos, s.length),))
        pos += s.length
    return out


def link_target(path: str, target: Any) -> str | None:
    """The archive path a link at `path` points at: `target` is relative to
    the link's folder, some `..` first, then names (no empty, `.` or `..`
    component, no NUL); None where it leaves the archive's tree or names
    its root."""
    if not isinstance(target, str) or not target or target.startswith("/") or "\x00" in target:
        return None
    parts = target.split("/")
    up = 0
    while up < len(parts) and parts[up] == "..":
        up += 1
    rest = parts[up:]
    folder = path.split("/")[:-1]
    if not rest or up > len(folder) or any(p in ("", ".", "..") for p in rest):
        return None
    return "/".join(folder[:len(folder) - up] + rest)


def check_links(links: list, file_paths: set[str], paths: list[str]) -> None:
    """Every link points at a file or a folder of the archive (never at a
    link, nor outside the tree). With nothing under a file or a link, each
    folder on the way is one decompress creates itself, so the target
    resolves on disk exactly as it does here: inside the output folder."""
    folders = {d for d in paths if d not in file_paths}  # the empty folders, and prefixes below
    for p in paths:
        parts = p.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    folders -= {k.path for k in links}
    for k in links:
        resolved = link_target(k.path, k.target)
        if resolved is None or (resolved not in file_paths and resolved not in folders):
            fail(f"link {k.path!r} points at {k.target!r}: not a file or folder of the archive")


_NAMESPACE = {"fail": fail, "programs": programs, "check_tree": check_tree, "check_path": check_path,
              "check_tiling": check_tiling, "ranges_of": ranges_of, "members_of": members_of,
              "is_hex": is_hex, "dtypes": dtypes, "tensor": tensor, "BYTES": BYTES, "prod": math.prod,
              "MAX_CHUNK_BYTES": MAX_CHUNK_BYTES, "shape_fits": shape_fits,
              "MAX_DECODE_BYTES": MAX_DECODE_BYTES, "_MISSING": _MISSING}


def parser(record: Record, args: str = "start, end", names: dict | None = None):
    """The function reading `record` from its JSON value: f(value, args).
    `names`: more names its expressions use (a List's `fast` reader)."""
    g = _Gen()
    g.namespace.update(names or {})
    g.line("cache = {}")
    value = record.parse(g, "obj", "'not an object'", "value")
    g.line(f"return {value}")
    source = f"def parse_{record.name}(obj, {args}):\n" + "\n".join(g.lines) + "\n"
    exec(compile(source, f"<schema {record.name}>", "exec"), g.namespace)
    fn = g.namespace[f"parse_{record.name}"]
    fn.source = source
    return fn


def dumper(record: Record):
    """The function making the JSON value of a `record.cls`."""
    g = _Gen()
    source = f"def dump_{record.name}(x):\n    return {record.dump('x')}\n"
    exec(compile(source, f"<schema {record.name} dump>", "exec"), g.namespace)
    fn = g.namespace[f"dump_{record.name}"]
    fn.source = source
    return fn


# ---------------------------------------------------------------- docs
def _records(record: Record, seen: list[Record]) -> list[Record]:
    if record not in seen:
        seen.append(record)
        for f in record.fields:
            kind = f.kind.item if isinstance(f.kind, List) else f.kind
            if isinstance(kind, Record):
                _records(kind, seen)
    return seen


def _kind_doc(kind: Kind) -> str:
    if isinstance(kind, Record):
        return f"`{kind.name}`" + (" (array)" if kind.array else "")
    return kind.doc


_JSON_DEFAULTS = {"None": "null", "{}": "{}", "[]": "[]"}


def markdown(record: Record) -> str:
    """The tables of docs/FORMAT.md: one per record, nested ones after."""
    out = []
    for r in _records(record, []):
        out.append(f"`{r.name}`" + (" (an array)" if r.array else "") + f": {r.doc}")
        out.append("")
        out.append("| " + ("position" if r.array else "key") + " | type | if absent | meaning |")
        out.append("|---|---|---|---|")
        for f in r.fields:
            kind = _kind_doc(f.kind) + (" or null" if f.null else "")
            absent = "-" if r.array else (
                "required" if f.default is REQUIRED else f"`{_JSON_DEFAULTS.get(f.default, f.default)}`")
            key = str(f.key) if r.array else f"`{f.key}`"
            out.append(f"| {key} | {kind} | {absent} | {f.doc} |")
        checks = [c for c in r.items if isinstance(c, (Check, Run))]
        if checks:
            out.append("")
            out.append("Checked, in this order with the fields:")
            out.append("")
            out += [f"- `{c.cond if isinstance(c, Check) else c.statement}`: {c.message}" for c in checks]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def search_kind(stats: Any) -> SearchKind | None:
    """The kind of search a segment's stats name; None where they name none
    this version knows (the stats are informative: not checked on reading)."""
    try:
        return SearchKind(stats.get("search"))
    except (AttributeError, TypeError, ValueError):
        return None


DOC_BEGIN = "<!-- index schema: generated by `python -m brevis.archive.schema --write docs/FORMAT.md` -->"
DOC_END = "<!-- end of index schema -->"


def write_doc(path: str) -> None:
    """Replace the generated tables in a copy of docs/FORMAT.md by the schema's."""
    from .index import INDEX

    with open(path, encoding="utf-8") as f:
        text = f.read()
    a, b = text.index(DOC_BEGIN) + len(DOC_BEGIN), text.index(DOC_END)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:a] + "\n\n" + markdown(INDEX) + "\n" + text[b:])


if __name__ == "__main__":
    import sys

    from brevis.archive import schema  # not this module's second copy, __main__
    from brevis.archive.index import INDEX

    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        schema.write_doc(sys.argv[2])
    else:
        print(schema.markdown(INDEX), end="")
