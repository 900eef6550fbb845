"""Compression: sources -> segments -> chosen programs -> streams -> archive.

Work flows through two ordered maps on one thread pool: planning (reading
a sample of each segment and choosing its program) runs a few segments
ahead of encoding (reading, checksumming and coding each chunk). The
writer takes results in order, so the archive is the same whatever the
number of threads.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from . import __version__
from .archive.index import Chunk, FileEntry, Index, SegmentEntry
from .archive.reader import chunk_digest
from .archive.writer import ArchiveWriter
from .dsl.interpreter import encode
from .dsl.program import Program
from .dsl.types import BYTES, Field, tensor
from .errors import InvalidArgument, IOFailure, NotApplicable
from .formats import Segment, layout
from .parallel import CHUNK_BYTES, Pool, chunk_counts
from .sources import Source, collect
from .synth.candidates import choose

SAMPLE_BYTES = 128 << 10
SAMPLE_SLICES = 4


@dataclass
class OpenSource:
    source: Source
    fd: int
    size: int
    mtime_ns: int
    format: str
    segments: list[Segment]
    entry: FileEntry = field(init=False)

    def __post_init__(self):
        self.entry = FileEntry(self.source.name, self.size, self.format)

    def read(self, offset: int, length: int) -> bytes:
        data = bytearray()
        while len(data) < length:
            more = os.pread(self.fd, length - len(data), offset + len(data))
            if not more:
                raise IOFailure(f"{self.source.path} shrank while being read")
            data += more
        return bytes(data)


@dataclass
class Plan:
    file: OpenSource
    segment: Segment
    value_type: Field
    programs: list[Program]
    estimate: int
    entry: SegmentEntry | None = None  # filled in as its chunks are written


@dataclass
class ChunkJob:
    plan: Plan
    offset: int  # in the source file
    n: int  # elements
    last: bool  # last chunk of its file


@dataclass
class ChunkResult:
    job: ChunkJob
    program: int
    streams: list[bytes]
    digest: bytes


def value_type(seg: Segment) -> Field:
    return tensor(seg.dtype) if seg.dtype else BYTES


def sample_of(f: OpenSource, seg: Segment, itemsize: int) -> bytes:
    """A few evenly spaced slices of a segment, whole elements only."""
    if seg.length <= SAMPLE_BYTES:
        return f.read(seg.offset, seg.length)
    per = SAMPLE_BYTES // SAMPLE_SLICES // itemsize * itemsize
    elements = seg.length // itemsize
    parts = []
    for i in range(SAMPLE_SLICES):
        start = (elements - per // itemsize) * i // (SAMPLE_SLICES - 1) * itemsize
        parts.append(f.read(seg.offset + start, per))
    return b"".join(parts)


def plan_segment(item: tuple[OpenSource, Segment]) -> Plan:
    f, seg = item
    t = value_type(seg)
    if not seg.length:
        return Plan(f, seg, t, [], 0)
    itemsize = t.container.itemsize
    choice = choose(np.frombuffer(sample_of(f, seg, itemsize), np.uint8), t)
    programs = [choice.program] + ([choice.fallback] if choice.fallback != choice.program else [])
    return Plan(f, seg, t, programs, choice.estimate)


def encode_chunk(job: ChunkJob) -> ChunkResult:
    plan = job.plan
    itemsize = plan.value_type.container.itemsize
    data = job.plan.file.read(job.offset, job.n * itemsize)
    x = np.frombuffer(data, dtype=plan.value_type.container)
    for i, program in enumerate(plan.programs):
        try:
            return ChunkResult(job, i, encode(program, x, plan.value_type), chunk_digest(data))
        except NotApplicable:
            continue
    raise AssertionError("the fallback program refused a chunk")


def open_sources(sources: list[Source]) -> Iterator[OpenSource]:
    for s in sources:
        try:
            fd = os.open(s.path, os.O_RDONLY)
        except OSError as e:
            raise InvalidArgument(f"cannot read {s.path}: {e.strerror}") from None
        st = os.fstat(fd)
        with os.fdopen(os.dup(fd), "rb") as f:
            fmt, segments = layout(f, st.st_size, s.name)
        yield OpenSource(s, fd, st.st_size, st.st_mtime_ns, fmt, segments)


def compress(sources: list[str | os.PathLike], output: str | os.PathLike, *, threads: int = 1,
             force: bool = False, chunk_bytes: int = CHUNK_BYTES,
             progress: Callable[[int], None] | None = None) -> dict:
    """Write an archive of the sources; return a summary (see api.compress)."""
    start = time.perf_counter()
    files, dirs = collect(list(sources))
    out = Path(output).absolute()
    for s in files:
        if s.path.absolute() == out or (out.exists() and s.path.exists() and os.path.samefile(s.path, out)):
            raise InvalidArgument(f"the output {output} is also a source")
    index = Index([], dirs, f"brevis {__version__}")
    opened: list[OpenSource] = []

    def segments() -> Iterator[tuple[OpenSource, Segment]]:
        for f in open_sources(files):
            opened.append(f)
            index.files.append(f.entry)
            if not f.segments:
                _check_unchanged(f)
            for seg in f.segments:
                yield f, seg

    def jobs(plans: Iterator[Plan]) -> Iterator[ChunkJob]:
        for plan in plans:
            f, seg = plan.file, plan.segment
            itemsize = plan.value_type.container.itemsize
            plan.entry = SegmentEntry(seg.name, seg.dtype, seg.shape, seg.length, list(plan.programs))
            f.entry.segments.append(plan.entry)
            offset = seg.offset
            counts = chunk_counts(seg.length // itemsize, itemsize, chunk_bytes)
            for k, n in enumerate(counts):
                yield ChunkJob(plan, offset, n, seg is f.segments[-1] and k == len(counts) - 1)
                offset += n * itemsize
            if not counts and seg is f.segments[-1]:
                _check_unchanged(f)

    try:
        with ArchiveWriter(out, force) as writer, Pool(threads) as pool:
            plans = pool.ordered_map(plan_segment, segments())
            for result in pool.ordered_map(encode_chunk, jobs(plans)):
                job = result.job
                located = [writer.write_stream(s) for s in result.streams]
                job.plan.entry.chunks.append(Chunk(result.program, job.n, located, result.digest))
                if progress:
                    progress(job.n * job.plan.value_type.container.itemsize)
                if job.last:
                    _check_unchanged(job.plan.file)
            for f in index.files:
                for seg in f.segments:
                    _drop_unused_programs(seg)
            size = writer.finish(index)
    finally:
        for f in opened:
            os.close(f.fd)
    seconds = time.perf_counter() - start
    original = index.original_bytes
    return {
        "archive": str(output),
        "files": len(index.files),
        "original_bytes": original,
        "archive_bytes": size,
        "ratio": size / original if original else None,
        "seconds": seconds,
        "throughput_mb_s": original / seconds / 1e6 if seconds else None,
    }


def _check_unchanged(f: OpenSource) -> None:
    try:
        st = os.stat(f.source.path)
    except OSError:
        raise IOFailure(f"{f.source.path} disappeared while being read") from None
    if st.st_size != f.size or st.st_mtime_ns != f.mtime_ns:
        raise IOFailure(f"{f.source.path} changed while being read; archive not written")


def _drop_unused_programs(seg: SegmentEntry) -> None:
    used = sorted({c.program for c in seg.chunks})
    remap = {old: new for new, old in enumerate(used)}
    seg.programs = [seg.programs[i] for i in used]
    for c in seg.chunks:
        c.program = remap[c.program]
