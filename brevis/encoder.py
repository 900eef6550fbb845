"""Compression: sources -> segments -> planned programs -> streams -> archive.

1. Scan: every source file is cut into segments (formats/); only headers
   are read.
2. Learn: the planner learns the production prior on a stratified sample
   of the segments (unless a prior was given).
3. Plan and encode, through two ordered maps on one thread pool: planning
   (sampling a segment and searching its program) runs a few segments
   ahead of encoding (reading, checksumming and coding each chunk). The
   writer takes results in order, so the archive does not depend on the
   number of threads.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from . import __version__
from .base import Base, BaseTensor
from .archive.index import DIGEST_BYTES, Chunk, FileEntry, Index, SegmentEntry
from .archive.writer import ArchiveWriter
from .dsl.interpreter import forward
from .dsl.types import BYTES, Field, tensor
from .errors import InvalidArgument, IOFailure, NotApplicable
from .formats import Segment, layout
from .parallel import CHUNK_BYTES, Pool, chunk_counts
from .sources import Source, collect, read_exactly
from .dsl.operator import Coder
from .dsl.program import Program
from .synth.planner import DEFAULT_EFFORT, FALLBACK, PLAIN, Plan, Planner, SegmentInfo
from .synth.prior import Prior


@dataclass
class ScannedFile:
    source: Source
    size: int
    mtime_ns: int
    format: str
    segments: list[Segment]
    fd: int = -1  # open while its segments are read
    pending: int = 0  # chunk jobs queued and not yet written
    queued_all: bool = False  # every chunk job of the file is queued
    entry: FileEntry = field(init=False)

    def __post_init__(self):
        self.entry = FileEntry(self.source.name, self.size, self.format)

    def open(self) -> None:
        if self.fd < 0:
            try:
                self.fd = os.open(self.source.path, os.O_RDONLY)
            except OSError as e:
                raise InvalidArgument(f"cannot read {self.source.path}: {e.strerror}") from None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read(self, offset: int, length: int) -> bytes:
        return read_exactly(self.fd, self.source.path, offset, length)

    def finish_if_done(self) -> None:
        """Once every chunk is written: check the file did not change, close it."""
        if self.queued_all and not self.pending:
            self.check_unchanged()
            self.close()

    def check_unchanged(self) -> None:
        try:
            st = os.stat(self.source.path)
        except OSError:
            raise IOFailure(f"{self.source.path} disappeared while being read") from None
        if st.st_size != self.size or st.st_mtime_ns != self.mtime_ns:
            raise IOFailure(f"{self.source.path} changed while being read; archive not written")


def scan(source: Source) -> ScannedFile:
    try:
        with open(source.path, "rb") as f:
            st = os.fstat(f.fileno())
            fmt, segments = layout(f, st.st_size, source.name)
    except OSError as e:
        raise InvalidArgument(f"cannot read {source.path}: {e.strerror}") from None
    return ScannedFile(source, st.st_size, st.st_mtime_ns, fmt, segments)


def value_type(seg: Segment) -> Field:
    return tensor(seg.dtype) if seg.dtype else BYTES


def segment_info(f: ScannedFile, seg: Segment, chunk_bytes: int, base: Base | None = None) -> SegmentInfo:
    t = value_type(seg)
    itemsize = t.container.itemsize
    chunks = len(chunk_counts(seg.length // itemsize, itemsize, chunk_bytes, _row(seg)))
    ref = base.match(f.source.name, seg.name, seg.dtype, seg.shape) if base else None
    return SegmentInfo(seg.name, t, seg.shape, seg.length, chunks,
                       lambda off, n: f.read(seg.offset + off, n), seg.records,
                       ref.read if ref else None)


def _row(seg: Segment) -> int:
    """Elements per row: chunks hold whole rows (whole records for blocks)."""
    if seg.records:
        return sum(c * w for c, w in seg.records)
    return seg.shape[-1] if seg.shape else 1


@dataclass
class PlannedSegment:
    file: ScannedFile
    segment: Segment
    value_type: Field
    plan: Plan
    base: BaseTensor | None = None  # the base tensor it may be coded against
    entry: SegmentEntry | None = None


@dataclass
class ChunkJob:
    planned: PlannedSegment
    offset: int  # in the source file
    n: int  # elements
    order: int  # position in the archive, for deduplication


@dataclass
class ChunkResult:
    job: ChunkJob
    key: bytes  # full SHA-256 of the original bytes, with the value type
    program: Program | None  # None: a duplicate of an earlier chunk, not encoded
    streams: list[bytes]
    crcs: list[int] = field(default_factory=list)  # CRC-32 of each stream


class Deduplicator:
    """Chunks with the same bytes and value type are stored once.

    A worker skips encoding a chunk that an earlier chunk (in archive order)
    already claimed; the writer points the later chunk at the earlier one's
    streams. Whatever the timing, the earlier chunk is always encoded or
    itself points further back, so the archive is the same for any number
    of threads.
    """

    def __init__(self):
        self.claimed: dict[bytes, int] = {}
        self.lock = threading.Lock()
        self.written: dict[bytes, tuple] = {}  # key -> (program, streams), writer thread only

    def claim(self, key: bytes, order: int) -> bool:
        """True if an earlier chunk with this key exists (so skip encoding)."""
        with self.lock:
            first = self.claimed.get(key)
            if first is not None and first < order:
                return True
            self.claimed[key] = order
            return False


def encode_repairing(program: Program, x: np.ndarray, t: Field,
                     reference: np.ndarray | None = None) -> tuple[Program, list[bytes]]:
    """Run a program forward; where an operator refuses this input (the
    sample said constant, this chunk is not), that sub-value is coded by
    the fallback instead. Returns the program that ran and its streams."""
    node = program.node
    if isinstance(node, Coder):
        return program, [node.encode(x, t)]
    try:
        values = forward(node, x, t, reference)
    except NotApplicable:
        return FALLBACK, [FALLBACK.node.encode(x, t)]
    children, streams = [], []
    for child, value, ct in zip(program.children, values, node.output_types(t)):
        p, s = encode_repairing(child, value, ct)
        children.append(p)
        streams += s
    return Program(node, tuple(children)), streams


def encode_chunk(job: ChunkJob, dedup: Deduplicator) -> ChunkResult:
    ps = job.planned
    t = ps.value_type
    data = ps.file.read(job.offset, job.n * t.container.itemsize)
    digest = hashlib.sha256(data).digest()
    key = digest + str(t).encode()
    if dedup.claim(key, job.order):
        return ChunkResult(job, key, None, [])
    x = np.frombuffer(data, dtype=t.container)
    reference = None
    if ps.plan.program.uses_reference and ps.base is not None:
        ref = ps.base.read(job.offset - ps.segment.offset, len(data))
        reference = np.frombuffer(ref, dtype=t.container)
    program, streams = encode_repairing(ps.plan.program, x, t, reference)
    if sum(map(len, streams)) > len(data):  # never larger than the data itself
        program, streams = PLAIN, [data]
    return ChunkResult(job, key, program, streams, [zlib.crc32(s) for s in streams])


def _learn(planner: Planner, scanned: list[ScannedFile], pool: Pool, chunk_bytes: int,
           base: Base | None = None) -> Prior:
    infos = []
    try:
        for f in scanned:
            f.open()
            infos += [segment_info(f, seg, chunk_bytes, base) for seg in f.segments]
        return planner.learn(infos, lambda fn, xs: pool.ordered_map(fn, xs))
    finally:
        for f in scanned:
            f.close()


def learn(sources, *, effort: int = DEFAULT_EFFORT, threads: int = 1, chunk_bytes: int = CHUNK_BYTES) -> Prior:
    """Learn the production prior of a checkpoint without compressing it."""
    files, _ = collect(list(sources))
    planner = Planner(effort)
    if not planner.effort.learn_tensors:
        raise InvalidArgument(f"effort {effort} does not learn a prior; use 1 or more")
    with Pool(threads) as pool:
        scanned = list(pool.ordered_map(scan, files))
        return _learn(planner, scanned, pool, chunk_bytes)


def compress(sources: list[str | os.PathLike], output: str | os.PathLike, *, threads: int = 1,
             force: bool = False, effort: int = DEFAULT_EFFORT, prior: Prior | str | os.PathLike | None = None,
             base: str | os.PathLike | None = None, chunk_bytes: int = CHUNK_BYTES,
             progress: Callable[[int], None] | None = None) -> dict:
    """Write an archive of the sources; return a summary (see api.compress)."""
    start = time.perf_counter()
    files, dirs = collect(list(sources))
    out = Path(output).absolute()
    for s in files:
        if s.path.absolute() == out or (out.exists() and os.path.samefile(s.path, out)):
            raise InvalidArgument(f"the output {output} is also a source")
    if prior is not None and not isinstance(prior, Prior):
        prior = Prior.load(prior)
    planner = Planner(effort, prior)
    index = Index([], dirs, f"brevis {__version__}")
    dedup = Deduplicator()
    scanned: list[ScannedFile] = []
    base_model = Base.open(base) if base is not None else None
    try:
        with ArchiveWriter(out, force) as writer, Pool(threads) as pool:
            scanned = list(pool.ordered_map(scan, files))
            learn_time = time.perf_counter()
            if prior is None and planner.effort.learn_tensors:
                _learn(planner, scanned, pool, chunk_bytes, base_model)
            learn_time = time.perf_counter() - learn_time
            for result in pool.ordered_map(lambda job: encode_chunk(job, dedup),
                                           _chunk_jobs(_planned(scanned, planner, pool, index, chunk_bytes,
                                                                base_model), chunk_bytes)):
                _write_chunk(result, writer, dedup)
                if progress:
                    progress(result.job.n * result.job.planned.value_type.container.itemsize)
            index.prior = planner.prior.to_json()
            index.base = _base_identity(index)
            size = writer.finish(index)
    finally:
        for f in scanned:
            f.close()
        if base_model is not None:
            base_model.close()
    seconds = time.perf_counter() - start
    original = index.original_bytes
    return {
        "archive": str(output),
        "files": len(index.files),
        "original_bytes": original,
        "archive_bytes": size,
        "ratio": size / original if original else None,
        "seconds": seconds,
        "learn_seconds": learn_time,
        "throughput_mb_s": original / seconds / 1e6 if seconds else None,
        "effort": planner.effort.level,
        "prior_samples": planner.prior.samples,
    }


def _planned(scanned: list[ScannedFile], planner: Planner, pool: Pool, index: Index,
             chunk_bytes: int, base: Base | None) -> Iterator[PlannedSegment]:
    """Plans of every segment in archive order (planning runs in the pool)."""

    def items():
        for f in scanned:
            f.open()
            index.files.append(f.entry)
            if not f.segments:
                f.queued_all = True
                f.finish_if_done()
            for seg in f.segments:
                info = segment_info(f, seg, chunk_bytes, base)
                family, leader = planner.claim_family(info)  # in archive order: deterministic
                yield f, seg, info, family, leader

    def plan(item) -> PlannedSegment:
        f, seg, info, family, leader = item
        ref = base.match(f.source.name, seg.name, seg.dtype, seg.shape) if base else None
        return PlannedSegment(f, seg, info.t, planner.plan(info, family, leader), ref)

    return pool.ordered_map(plan, items())


def _chunk_jobs(planned: Iterator[PlannedSegment], chunk_bytes: int) -> Iterator[ChunkJob]:
    order = 0
    for ps in planned:
        f, seg = ps.file, ps.segment
        itemsize = ps.value_type.container.itemsize
        ps.entry = SegmentEntry(seg.name, seg.dtype, seg.shape, seg.length, search=ps.plan.stats)
        f.entry.segments.append(ps.entry)
        offset = seg.offset
        counts = chunk_counts(seg.length // itemsize, itemsize, chunk_bytes, _row(seg))
        for n in counts:
            f.pending += 1
            yield ChunkJob(ps, offset, n, order)
            order += 1
            offset += n * itemsize
        if seg is f.segments[-1]:
            f.queued_all = True
            f.finish_if_done()


def _write_chunk(result: ChunkResult, writer: ArchiveWriter, dedup: Deduplicator) -> None:
    job = result.job
    ps = job.planned
    entry = ps.entry
    assert entry is not None
    if result.program is None or result.key in dedup.written:
        program, located = dedup.written[result.key]
    else:
        program = result.program
        located = [writer.write_stream(s, c) for s, c in zip(result.streams, result.crcs)]
        dedup.written[result.key] = (program, located)
    if program not in entry.programs:
        entry.programs.append(program)
    index = entry.programs.index(program)
    if program.uses_reference and entry.base is None:
        b = ps.base
        entry.base = {"file": b.file, "name": b.name, "sha256": b.digest()[:DIGEST_BYTES].hex()}
    entry.chunks.append(Chunk(index, job.n, located, result.key[:DIGEST_BYTES]))
    ps.file.pending -= 1
    ps.file.finish_if_done()


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
