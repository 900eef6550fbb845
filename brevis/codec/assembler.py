"""The assembler: the one place the index of an archive is built.

An `Assembler` walks the plan (plan.lay_out: files -> segments -> chunk
references, in archive order) and takes each chunk's encoded result in
that order. It alone changes the index: it appends file entries, segment
entries (with their search statistics), chunks, the programs the chunks
ran and the base tensors they were coded against, and at the end the prior
and the identity of the base. It deduplicates (the first chunk of given
bytes is stored, later ones point at its streams) and it releases files:
once a file's last chunk is in the index (at once for a file without
segments), it checks the file did not change since the scan and closes
its descriptor.

So the archive depends only on the plan and on the chunks' results, never
on how many threads, processes or workers encoded them, nor on how far
planning ran ahead: a segment without chunks (an empty tensor) enters the
index once it is planned and the segments before it are complete.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections.abc import Sequence

from .. import __version__
from ..archive.index import DIGEST_BYTES, Chunk, FileEntry, Index, LinkEntry, SegmentEntry
from ..archive.writer import ArchiveWriter
from ..dsl.program import Program
from ..workers.tasks import ChunkOutput, parse_program, read_chunk, read_reference
from .plan import ChunkRef, PlannedFile, PlannedSegment


class Deduplicator:
    """Chunks with the same bytes and value type are stored once.

    Workers encode every chunk; the assembler, taking results in archive
    order, points a chunk whose key it has already stored at the earlier
    chunk's streams. The first chunk of a key is always the one stored,
    so the archive is the same for any number of threads or processes.
    A key is a digest (XXH3-128), not a proof: a chunk is pointed at an
    earlier one only once their bytes (and references, coded against a
    base) are read again and found equal, a cost paid by repeats alone.
    """

    def __init__(self):
        # key -> [(program, streams, the chunk stored)]: one, unless digests collided
        self.written: dict[bytes, list[tuple[Program, list[tuple[int, int, int]], ChunkRef]]] = {}

    def get(self, key: bytes, ref: ChunkRef) -> tuple[Program, list[tuple[int, int, int]]] | None:
        """The program and streams of the earlier chunk with ref's bytes, or None."""
        for program, located, earlier in self.written.get(key, ()):
            if same_chunks(earlier, ref, program.uses_reference):
                return program, located
        return None

    def remember(self, key: bytes, program: Program, located: list[tuple[int, int, int]], ref: ChunkRef) -> None:
        self.written.setdefault(key, []).append((program, located, ref))


def same_chunks(a: ChunkRef, b: ChunkRef, references: bool) -> bool:
    """Whether two chunks hold the same bytes (and, `references`, are coded against the same ones)."""
    if a.length != b.length:
        return False
    ta, tb = a.task(), b.task()
    if read_chunk(ta) != read_chunk(tb):
        return False
    return not references or read_reference(ta) == read_reference(tb)


class Assembler:
    """Builds the index from the plan and the chunks' results, in plan order.

    `add(ref, output, streams)` for every chunk reference of the plan, in
    order; then `finish(prior)`. Where it stands in the plan: `files[:_next_file]`
    are in the index, the last of them (`_file`, until released) with
    `segments[:_next_segment]`, the last of those (`_segment`) with
    `chunks[:_next_chunk]`.
    """

    def __init__(self, files: Sequence[PlannedFile], dirs: list[str], writer: ArchiveWriter, links=()):
        self.files = files
        self.writer = writer
        self.index = Index([], dirs, f"brevis {__version__}", links=[link_entry(s) for s in links])
        self.dedup = Deduplicator()
        self._next_file = 0
        self._file: PlannedFile | None = None  # entered, not yet released
        self._file_entry: FileEntry | None = None
        self._next_segment = 0
        self._segment: PlannedSegment | None = None
        self._entry: SegmentEntry | None = None
        self._next_chunk = 0

    # ------------------------------------------------------------ chunks
    def add(self, ref: ChunkRef, output: ChunkOutput, streams) -> None:
        """The next chunk of the plan, encoded: its streams are written
        (unless an earlier chunk had the same bytes) and it enters the index."""
        ps = ref.segment
        if ps is not self._segment:
            self._advance(until=ps)
        if ps.chunks[self._next_chunk] is not ref:
            raise AssertionError(f"chunk at {ref.offset} of {ps.segment.name!r} out of plan order")
        stored = self.dedup.get(output.key, ref)
        if stored is not None:  # an earlier chunk with these bytes: point at its streams
            program, located = stored
        else:
            program = ps.plan.program if output.program is None else parse_program(output.program)
            located = [self.writer.write_stream(s, c) for s, c in zip(streams, output.crcs)]
            self.dedup.remember(output.key, program, located, ref)
        entry = self._entry
        if program not in entry.programs:
            entry.programs.append(program)
        number = entry.programs.index(program)
        if program.uses_reference and entry.base is None:
            b = ps.base
            entry.base = {"file": b.file, "name": b.name, "sha256": b.digest()[:DIGEST_BYTES].hex()}
        entry.chunks.append(Chunk(number, ref.n, located, output.digest))
        self._next_chunk += 1
        if self._next_chunk == len(ps.chunks):
            self._advance()  # the segment is complete: release its file if it was the last

    def finish(self, prior: dict | None, series: dict | None = None) -> int:
        """The rest of the plan (segments without chunks, files without
        segments; every segment is planned by now), the prior and the base's
        identity; the archive is written. Returns its size."""
        self._advance()
        if self._file is not None or self._next_file < len(self.files):
            raise AssertionError("the archive is finished before its plan")
        self.index.prior = prior
        self.index.base = _base_identity(self.index)
        self.index.series = series
        return self.writer.finish(self.index)

    # ------------------------------------------------------------ walking the plan
    def _advance(self, until: PlannedSegment | None = None) -> None:
        """Past every complete segment and file: up to `until` (the segment
        whose chunk comes next), else as far as segments are planned."""
        while True:
            ps = self._segment
            if ps is not None and self._next_chunk < len(ps.chunks):
                if until is not None and ps is not until:
                    raise AssertionError(f"a chunk of {until.segment.name!r} before {ps.segment.name!r} is complete")
                return  # it waits for its chunks
            f = self._file
            if f is not None and self._next_segment < len(f.segments):
                following = f.segments[self._next_segment]
                if not following.planned:
                    if until is not None:
                        raise AssertionError(f"a chunk of {until.segment.name!r} before {following.segment.name!r}"
                                             " is planned")
                    return  # entered once planned
                self._enter_segment(following)
                continue
            if f is not None:
                self._release(f)
            if self._next_file == len(self.files):
                if until is not None:
                    raise AssertionError(f"a chunk of {until.segment.name!r} past the end of the plan")
                return
            self._enter_file(self.files[self._next_file])

    def _enter_file(self, f: PlannedFile) -> None:
        s = f.scanned
        self._file_entry = FileEntry(s.source.name, s.size, s.format, mode=s.mode, mtime=s.mtime_ns)
        self.index.files.append(self._file_entry)
        self._file, self._next_segment = f, 0
        self._next_file += 1
        self._segment, self._entry = None, None

    def _enter_segment(self, ps: PlannedSegment) -> None:
        seg = ps.segment
        self._entry = SegmentEntry(seg.name, seg.dtype, seg.shape, seg.length, search=ps.plan.stats, ranges=seg.ranges,
                                   members=seg.members)
        self._file_entry.segments.append(self._entry)
        self._segment, self._next_chunk = ps, 0
        self._next_segment += 1

    def _release(self, f: PlannedFile) -> None:
        """Every chunk of the file is in the index: check it did not change, close it."""
        self._file, self._file_entry = None, None
        self._segment, self._entry = None, None
        f.scanned.check_unchanged()
        f.scanned.close()


def link_entry(source) -> LinkEntry:
    """The index entry of a link kept as a link (fs.sources.Source with
    `link`): its target relative to its folder, its own mtime."""
    folder = posixpath.dirname(source.name)
    try:
        mtime = os.lstat(source.path).st_mtime_ns
    except OSError:
        mtime = None
    return LinkEntry(source.name, posixpath.relpath(source.link, folder or "."), mtime)


def _base_identity(index: Index) -> dict | None:
    """What the archive needs of its base: the tensors it used, hashed together."""
    used = sorted({(s.base["file"], s.base["name"], s.base["sha256"])
                   for f in index.files for s in f.segments if s.base})
    if not used:
        return None
    h = hashlib.sha256()
    for entry in used:
        h.update("\0".join(entry).encode("utf-8", "surrogateescape") + b"\n")
    return {"sha256": h.digest()[:DIGEST_BYTES].hex(), "tensors": len(used)}
