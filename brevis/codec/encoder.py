"""Compression: sources -> segments -> planned programs -> streams -> archive.

1. Scan: every source file is cut into segments (formats/); only headers
   are read.
2. Learn: the planner learns the production prior on a stratified sample
   of the segments (unless a prior was given).
3. Plan and encode, through two ordered maps: planning (sampling a
   segment and searching its program) runs on a thread pool a few
   segments ahead of encoding. Encoding a chunk (reading, checksumming,
   coding: jobs.run_chunk) is a self-contained job that runs on worker
   processes (large inputs with threads > 1), on a caller's executor (a
   Dask cluster), or on the thread pool. The writer takes results in
   order and deduplicates, so the archive does not depend on the number
   of threads, processes or workers.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import time
from concurrent.futures import Executor
from contextlib import contextmanager
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .. import __version__
from .base_model import Base, BaseTensor
from ..archive.index import DIGEST_BYTES, Chunk, FileEntry, Index, SegmentEntry
from ..archive.writer import ArchiveWriter
from ..dsl.types import BYTES, Field, tensor
from ..errors import BrevisError, InvalidArgument, IOFailure
from ..formats import Segment, layout
from ..workers.tasks import (ChunkOutput, ChunkTask, LearnTask, SharedBatch, encode_repairing, parse_program,  # noqa: F401
                   release_batch, run_chunk, run_chunks, run_chunks_shared, run_learn)
from ..workers.pool import (CHUNK_BYTES, ChunkProcesses, Pool, can_start_processes, chunk_counts, chunk_processes,
                       ordered_map, ordered_pairs, runs)
from ..workers.heap import keep_freed_memory
from ..fs.sources import Source, collect, read_exactly
from ..dsl.program import Program
from ..synth.planner import DEFAULT_EFFORT, Plan, Planner, SegmentInfo
from ..synth.search import SearchResult
from ..synth.prior import Prior


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
    program_json: str = ""  # the planned program, as the chunk tasks carry it

    def __post_init__(self):
        if self.plan.program is not None:
            self.program_json = program_text(self.plan.program)


@functools.lru_cache(maxsize=1024)
def program_text(program: Program) -> str:
    """A program as the chunk tasks carry it: families and learned programs
    share one program across many segments, so it is written out once."""
    return json.dumps(program.to_json())


@dataclass
class ChunkJob:
    planned: PlannedSegment
    offset: int  # in the source file
    n: int  # elements

    def task(self) -> ChunkTask:
        """The picklable job a worker runs (jobs.run_chunk)."""
        ps = self.planned
        length = self.n * ps.value_type.container.itemsize
        base_path, base_offset, reference = None, 0, None
        if ps.plan.program.uses_reference and ps.base is not None:
            within = self.offset - ps.segment.offset
            if ps.base.path is not None:
                base_path, base_offset = ps.base.path, ps.base.offset + within
            else:  # an archive: decoded here, the bytes travel with the task
                reference = ps.base.read(within, length)
        return ChunkTask(str(ps.file.source.path), self.offset, length, str(ps.value_type), ps.program_json,
                         base_path, base_offset, reference)


class Deduplicator:
    """Chunks with the same bytes and value type are stored once.

    Workers encode every chunk; the writer, taking results in archive
    order, points a chunk whose key it has already written at the earlier
    chunk's streams. The first chunk of a key is always the one stored,
    so the archive is the same for any number of threads or processes.
    """

    def __init__(self):
        self.written: dict[bytes, tuple] = {}  # key -> (program, stream locations)


def _learn(planner: Planner, scanned: list[ScannedFile], pool: Pool, chunk_bytes: int,
           base: Base | None = None, executor: Executor | None = None) -> Prior:
    """Learn the prior; its searches run on `executor` (worker processes,
    idle until the first chunk) where one is given and no base is used,
    else on the pool."""
    infos, places = [], {}
    try:
        for f in scanned:
            f.open()
            for seg in f.segments:
                info = segment_info(f, seg, chunk_bytes, base)
                infos.append(info)
                places[id(info)] = (f, seg)
        if executor is None or base is not None:
            return planner.learn(infos, lambda fn, xs: pool.ordered_map(fn, xs))

        def task(info: SegmentInfo) -> LearnTask:
            f, seg = places[id(info)]
            return LearnTask(str(f.source.path), seg.offset, seg.length, seg.name, str(info.t), seg.shape,
                             seg.records, info.chunks, planner.effort.level)

        def searched(_, chosen):
            tasks = [task(info) for info in chosen]
            for text, estimate, expanded, generated, exhausted, relative in ordered_map(
                    executor, run_learn, tasks, len(tasks)):
                program = Program.from_json(json.loads(text))
                yield SearchResult(program, estimate, expanded, generated, exhausted), relative

        return planner.learn(infos, searched)
    finally:
        for f in scanned:
            f.close()


def learn(sources, *, effort: int = DEFAULT_EFFORT, threads: int = 1, chunk_bytes: int = CHUNK_BYTES,
          base: str | os.PathLike | None = None) -> Prior:
    """Learn the production prior of a checkpoint without compressing it
    (against a base, as compress --base learns it)."""
    files, _ = collect(list(sources))
    planner = Planner(effort)
    if not planner.effort.learn_tensors:
        raise InvalidArgument(f"effort {effort} does not learn a prior; use 1 or more")
    base_model = Base.open(base) if base is not None else None
    try:
        with Pool(threads) as pool:
            scanned = list(pool.ordered_map(scan, files))
            return _learn(planner, scanned, pool, chunk_bytes, base_model)
    finally:
        if base_model is not None:
            base_model.close()


# Inputs below this many bytes are compressed on one thread: two worker
# processes gained nothing there (measured, benchmarks/results/scaling.md:
# silero 6 MB +4 %, taesd 8 MB -3 %; nudenet 12 MB +18 %, ppocr 28 MB +27 %).
PROCESS_MIN_BYTES = 8 << 20
# Chunks go to another process in batches of about this many original
# bytes: every result costs the main process a few GIL hand-offs, which the
# planning threads make slow (measured: 1 MiB jobs ran at a third of the
# workers' speed while one thread searched).
BATCH_BYTES = 4 << 20
BATCH_JOBS = 64


def compress(sources: list[str | os.PathLike], output: str | os.PathLike, *, threads: int = 1,
             force: bool = False, effort: int = DEFAULT_EFFORT, prior: Prior | str | os.PathLike | None = None,
             base: str | os.PathLike | None = None, chunk_bytes: int = CHUNK_BYTES,
             progress: Callable[[int], None] | None = None, executor: Executor | None = None,
             processes: bool | None = None, window: int | None = None, batch_bytes: int = BATCH_BYTES) -> dict:
    """Write an archive of the sources; return a summary (see api.compress).

    Chunks are encoded by `executor` when one is given (anything with
    concurrent.futures' submit, e.g. Dask's Client.get_executor(); it is
    left open), else by `threads` worker processes when threads > 1 and
    `processes` is True, or None and the input is at least
    PROCESS_MIN_BYTES; scanning and planning then run on this thread.
    `processes=False`: everything on a pool of `threads` threads (as
    before worker processes); otherwise, small inputs run on this thread.
    `window`: jobs in flight (default 2 per thread or process); a job for
    another process or an executor is a batch of chunks of about
    `batch_bytes`.
    """
    start = time.perf_counter()
    keep_freed_memory()
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
    pids: set[int] = set()
    own = None
    if executor is None:  # before any thread of ours starts (see parallel.process_context)
        own = executor = open_chunk_processes(threads, _total_bytes(files), processes)
    try:
        # Threads only where asked for (processes=False): measured (scaling.md), planning
        # threads fight over the GIL with the thread taking results, and a thread pool
        # was slower than one thread on 9 of 12 items.
        with ArchiveWriter(out, force) as writer, Pool(threads if processes is False and executor is None
                                                       else 1) as pool:
            if executor is None:  # one chunk a job, as the thread pool has always run them
                chunk_executor, chunk_window, batch = pool.executor, window or 2 * pool.threads, (0, 1)
            else:
                chunk_executor, chunk_window = executor, window or 2 * max(1, threads)
                batch = (batch_bytes, BATCH_JOBS)
            scanned = list(pool.ordered_map(scan, files))
            learn_time = time.perf_counter()
            if prior is None and planner.effort.learn_tensors:
                _learn(planner, scanned, pool, chunk_bytes, base_model, executor)
            learn_time = time.perf_counter() - learn_time
            chunk_jobs = _chunk_jobs(_planned(scanned, planner, pool, index, chunk_bytes, base_model), chunk_bytes)
            # Workers on this machine: streams come back through shared memory.
            shared = isinstance(executor, ChunkProcesses) and executor.shared
            run = functools.partial(run_chunks_shared, owner=os.getpid()) if shared else run_chunks
            for jobs, result in ordered_pairs(chunk_executor, run, _batches(chunk_jobs, *batch), chunk_window,
                                              _tasks, release_batch):
                with _streams_of(result) as outputs:
                    for job, (output, streams) in zip(jobs, outputs):
                        pids.add(output.pid)
                        _write_chunk(job, output, streams, writer, dedup)
                        if progress:
                            progress(job.n * job.planned.value_type.container.itemsize)
            index.prior = planner.prior.to_json()
            index.base = _base_identity(index)
            size = writer.finish(index)
    except BrokenProcessPool:
        raise BrevisError("a chunk worker process died (killed, or out of memory); archive not written") from None
    finally:
        if own is not None:
            # Queued jobs are dropped; running ones are short (one chunk each).
            own.shutdown(wait=True, cancel_futures=True)
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
        "encode_processes": len(pids),
    }


def open_chunk_processes(threads: int, total_bytes: int, processes: bool | None = None):
    """Worker processes for the chunks of an input of total_bytes, or None
    where they would not pay (see compress). The caller shuts them down."""
    if threads > 1 and processes is not False and can_start_processes():
        if processes or total_bytes >= PROCESS_MIN_BYTES:
            return chunk_processes(threads)
    return None


def _total_bytes(files: list[Source]) -> int:
    total = 0
    for s in files:
        try:
            total += s.path.stat().st_size
        except OSError:
            pass  # reported by the scan
    return total


def _batches(jobs: Iterator[ChunkJob], max_bytes: int, max_jobs: int) -> Iterator[list[ChunkJob]]:
    """Consecutive chunk jobs, grouped up to max_bytes or max_jobs (at least one a batch)."""
    return runs(jobs, lambda job: job.n * job.planned.value_type.container.itemsize, max_bytes, max_jobs)


@contextmanager
def _streams_of(result: list[ChunkOutput] | SharedBatch):
    """(output, streams) of a batch's chunks; streams in a shared file are
    read in place from a mapping of it, the file unlinked at once."""
    if not isinstance(result, SharedBatch):
        yield [(o, o.streams) for o in result]
        return
    try:
        fd = os.open(result.name, os.O_RDONLY)
    except OSError as e:
        raise IOFailure(f"cannot read a worker's results {result.name}: {e.strerror}") from None
    os.unlink(result.name)
    size = max((a + n for o in result.outputs for a, n in o.spans), default=0)
    try:
        # Populated at once: one call instead of a page fault per 4 KiB as the writer copies.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        data = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ) if size else b""
    finally:
        os.close(fd)
    whole = memoryview(data)
    try:
        yield [(o, [whole[a:a + n] for a, n in o.spans]) for o in result.outputs]
    finally:
        whole.release()
        if size:
            try:
                data.close()
            except BufferError:  # a slice still referenced: the mapping goes with it
                pass


def _tasks(batch: list[ChunkJob]) -> list[ChunkTask]:
    return [job.task() for job in batch]


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
    for ps in planned:
        f, seg = ps.file, ps.segment
        itemsize = ps.value_type.container.itemsize
        ps.entry = SegmentEntry(seg.name, seg.dtype, seg.shape, seg.length, search=ps.plan.stats)
        f.entry.segments.append(ps.entry)
        offset = seg.offset
        counts = chunk_counts(seg.length // itemsize, itemsize, chunk_bytes, _row(seg))
        for n in counts:
            f.pending += 1
            yield ChunkJob(ps, offset, n)
            offset += n * itemsize
        if seg is f.segments[-1]:
            f.queued_all = True
            f.finish_if_done()


def _write_chunk(job: ChunkJob, result: ChunkOutput, streams, writer: ArchiveWriter, dedup: Deduplicator) -> None:
    ps = job.planned
    entry = ps.entry
    assert entry is not None
    if result.key in dedup.written:  # an earlier chunk with these bytes: point at its streams
        program, located = dedup.written[result.key]
    else:
        program = ps.plan.program if result.program is None else parse_program(result.program)
        located = [writer.write_stream(s, c) for s, c in zip(streams, result.crcs)]
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
