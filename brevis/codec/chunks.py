"""Decoding the chunks of an archive: one job type, three sinks, one runner.

- A `DecodeJob` is a run of consecutive chunks of one file, with the
  file's `Sink`: where the decoded bytes go.
- Sinks: `WriteInPlace` (decompress: into the staged file, created at its
  full size, so jobs need no order among themselves), `CompareWith`
  (verify against the source file) and `CheckOnly` (verify: checksums
  alone). A sink in memory may also offer `buffer(handle, offset,
  length)`: a writable uint8 array where those bytes go (or None), into
  which a chunk decodes in place instead of being put. A writer stops at the first damaged chunk (it raises); the
  others report every problem and go on.
- `run_jobs` runs the jobs on any executor, inline, on a thread pool or in
  worker processes, and yields their results in order; `executing` is the
  one place that chooses which.

A job is self-contained: a worker process opens the archive by path, so
no decoded byte travels between processes.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor
from contextlib import closing, contextmanager
from dataclasses import dataclass
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..archive.index import DIGEST_BYTES, pieces
from ..archive.reader import ArchiveReader
from ..dsl.entropy import decode_in_place
from ..fs.atomic import io_failure
from ..errors import BaseRequired, BrevisError, ChecksumError, FormatError, InvalidArgument
from ..fs.sources import read_up_to
from ..workers import Workers, open_workers
from ..workers.processes import broken_pool
from ..workers.heap import keep_freed_memory
from ..workers.pool import Pool, ordered_pairs

try:
    from ..native import _layout
except ImportError:  # built without its extensions: the pieces one at a time
    _layout = None

Progress = Callable[[int], None] | None


class ChunkDecoder:
    """Decodes chunks, giving those coded against a base their base tensor.

    Opening checks that the base is the one the archive was made with: every
    base tensor it used must be present, of the same dtype and shape, with
    the recorded SHA-256. A member of a training run finds its predecessor
    itself, beside it (series.py), unless `base` names another.
    """

    def __init__(self, reader: ArchiveReader, base=None, chain: tuple = ()):
        self.reader = reader
        self.base = None
        # Chunks checked already (verify without a source), and what was found:
        # a chunk naming the same program, length, streams and digest as one of
        # them decodes to the same bytes, so it is not decoded again (repeated
        # chunks: zeros, tied weights; and a small archive declaring many of
        # them, damaged or not). Failures are kept per segment name, which
        # their messages carry.
        self.checked: dict[tuple, str | None] = {}
        self.tensors: dict[int, object] = {}
        self._placed: dict[int, list] = {}
        index = reader.index
        if index.base is None:
            return
        from .base_model import Base

        if base is not None:
            self.base = Base.open(base)
        elif index.series is not None and index.series["previous"] is not None and not reader.in_memory:
            from ..series import open_predecessor

            self.base = open_predecessor(reader.path, index.series, chain)
        else:
            raise BaseRequired(f"{reader.path} was made against a base model: it is needed to decode it")
        reader.on_close.append(self.close)  # the base's files live as long as the reader
        try:
            for f in index.files:
                for seg in f.segments:
                    if seg.base:
                        self.tensors[id(seg)] = self._resolve(f.path, seg)
        except BaseException:
            self.base.close()
            raise

    def _resolve(self, path: str, seg):
        ref = seg.base
        t = self.base.exact(ref["file"], ref["name"]) or self.base.match(ref["file"], ref["name"], seg.dtype, seg.shape)
        if t is None or t.dtype != seg.dtype or tuple(t.shape) != tuple(seg.shape):
            raise InvalidArgument(f"the base has no tensor {ref['name']!r} of {seg.dtype.name}{list(seg.shape)} "
                                  f"(needed by {path}); is it the right base?")
        if not self.base.vouched and t.digest()[:DIGEST_BYTES].hex() != ref["sha256"]:
            raise ChecksumError(f"base tensor {ref['name']!r} differs from the one {path} was coded against: wrong base")
        return t

    def placements(self, file: int) -> list[tuple[tuple[int, int], ...]]:
        """Where file `file`'s segments lie in it (FileEntry.placements), kept."""
        placed = self._placed.get(file)
        if placed is None:
            placed = self._placed[file] = self.reader.index.files[file].placements()
        return placed

    def reference(self, seg, chunk, start: int) -> np.ndarray | None:
        """The base tensor's elements at a chunk's positions, for a chunk
        coded against a base (else None)."""
        if not seg.programs[chunk.program].uses_reference:
            return None
        ref = self.tensors[id(seg)].read(start, chunk.n * seg.itemsize)
        return np.frombuffer(ref, dtype=seg.value_type.container)

    def decode(self, seg, chunk, start: int, into=None, stored=None, streams_first: bool = False):
        """The original bytes (uint8) of one chunk starting `start` bytes into
        its segment; `into`, `stored` and `streams_first` as
        ArchiveReader.decode_chunk's."""
        return self.reader.decode_chunk(seg, chunk, self.reference(seg, chunk, start), into, stored, streams_first)

    def decode_many(self, items, streams_first: bool = False) -> list:
        """decode() for each (segment, chunk, start, into, stored), in order
        (ArchiveReader.decode_chunks: small chunks decode in batches)."""
        if self.base is None:  # no chunk reads a base tensor
            return self.reader.decode_chunks([(seg, chunk, None, into, stored)
                                              for seg, chunk, _, into, stored in items], streams_first)
        return self.reader.decode_chunks([(seg, chunk, self.reference(seg, chunk, start), into, stored)
                                          for seg, chunk, start, into, stored in items], streams_first)

    def in_file_order(self, entry) -> list:
        """What rebuilds a file front to back: (segment, chunk, start) to
        decode, or bytes already decoded (the spans of its gathered
        segments, decoded first, where they lie between the others)."""
        placed = entry.placements()
        spans = []  # (offset in the file, bytes) of every gathered span
        for seg, where in zip(entry.segments, placed):
            if seg.ranges:
                data = b"".join(self.decode(*w) for w in self.work_segment(seg))
                at = 0
                for off, n in where:
                    spans.append((off, memoryview(data)[at:at + n]))
                    at += n
        spans.sort(key=lambda x: x[0])
        out, k = [], 0
        for seg, where in zip(entry.segments, placed):
            if seg.ranges:
                continue
            while k < len(spans) and spans[k][0] < where[0][0]:
                out.append(spans[k][1])
                k += 1
            out += self.work_segment(seg)
        out += [data for _, data in spans[k:]]
        return out

    @staticmethod
    def work_segment(seg) -> list[tuple]:
        """(segment, chunk, byte offset in the segment) for every chunk of a segment."""
        out, start = [], 0
        for chunk in seg.chunks:
            out.append((seg, chunk, start))
            start += chunk.n * seg.itemsize
        return out

    def close(self) -> None:
        if self.base is not None:
            self.base.close()


# ------------------------------------------------------------ threads or processes
# Archives of fewer original bytes are decoded on the thread pool: starting
# worker processes costs more than it saves (the same bound as compress).
PROCESS_MIN_BYTES = 32 << 20
# ...and only from this many threads: on two, threads decode as fast or
# faster than two worker processes at any size, since processes start,
# import and fault in their own output pages. Measured 2026-12-03, 2
# threads against 2 processes, one shot: in memory astra 182-190 ms
# against 371-426, nomic 208-210 against 239-271, minilm 57-61 against
# 76-90, piper 88-96 against 87-231; verify astra 373-379 against 379-560,
# nomic 364-369 against 385-635, easyocr and piper within 5 %; to tmpfs
# within this machine's noise. The GIL held per chunk (35-65 % of one
# thread's time on these items, profiled) is what caps threads on more
# cores.
PROCESS_MIN_THREADS = 3
# Below PROCESS_MIN_BYTES a thread pool pays wherever there are two jobs or
# more to share: the `ans` kernel, the reads and the digests run without the
# GIL, and a chunk coded by one leaf costs little Python besides. Measured
# (2026-12-02, in memory, best of 6), 2 threads against one: taesd (34 KiB a
# chunk) 1.43x, pocketnet (43 KiB) 1.25x, ppocr (68 KiB) 1.29x, silero 1.12x,
# resemblyzer 1.41x, voicefilter 1.74x; fracast (0.5 MB, one job) 0.63x.
# A job for the thread pool decodes whole chunks of one file, in order, until
# it holds at least this many original bytes: most chunks of a checkpoint are
# small tensors, and a job of one of them costs more in thread switches than
# it decodes.
THREAD_JOB_BYTES = 1 << 20
# ... and, on more than one thread, jobs shrink towards the end of the
# archive to no less than this (decode_jobs): with jobs of 1 MiB, silero's
# last file (1.2 MB, one job) was decoded by one thread while the other
# waited, 1.3 ms of its 8. Not below: a job's chunks are decoded in one
# call, eight blocks at once, and jobs of 128 KiB (taesd: two chunks) made
# taesd 3.5 % slower (one-shot unpack at 2 threads, 40 interleaved runs).
TAIL_JOB_BYTES = 512 << 10
# A job for a worker process decodes about this many original bytes of one
# file (whole chunks, in order) and writes them in place itself, so no
# decoded byte travels between processes.
PROCESS_JOB_BYTES = 4 << 20
# A job reads the stored streams of this many of its chunks at a time, with
# one pread per run of them that lies back to back in the archive
# (ArchiveReader.read_runs): a pread per chunk cost more than its copy on
# small tensors, and a window bounds what is held.
READ_WINDOW = 256


@dataclass(frozen=True)
class Executing:
    """How an archive's jobs run: in worker `processes`, or (None) on
    `threads` threads of this process (inline for one). Jobs in flight:
    two per thread or process."""
    processes: Executor | None
    threads: int


def decode_workers(index, threads: int, processes: bool | None = None) -> Workers:
    """Worker processes to decode or verify an archive (with this index), or
    none: with PROCESS_MIN_THREADS threads or more, for PROCESS_MIN_BYTES
    of original bytes or more, or with threads > 1 and processes=True. An
    archive coded against a base decodes on threads: every worker would
    have to open and check the base again; but a member of a training run
    finds and checks its predecessors cheaply (series.py), in each worker
    as here."""
    return open_workers(threads, index.original_bytes, PROCESS_MIN_BYTES,
                        processes if workers_may_decode(index) else False,
                        min_workers=2 if processes else PROCESS_MIN_THREADS)


def workers_may_decode(index) -> bool:
    """Worker processes can decode the archive on their own: it needs no
    base, or finds its own (a member of a training run)."""
    return index.base is None or (index.series is not None and index.series["previous"] is not None)


def _threads_for(threads: int, index, processes: bool | None) -> int:
    """Threads for an archive decoded without worker processes: one where
    it makes a single thread job (under 2 * THREAD_JOB_BYTES) unless
    processes=False asks for the pool."""
    total = index.original_bytes
    if processes is not None or total >= PROCESS_MIN_BYTES:
        return threads
    return threads if total >= 2 * THREAD_JOB_BYTES else 1


def on_threads(index, threads: int) -> Executing:
    """How an archive's jobs run on threads of this process alone, as
    executing chooses where no worker process may run (unpack: the buffers
    are this process's): one thread for a single job's worth."""
    return Executing(None, _threads_for(threads, index, None))


@contextmanager
def executing(index, threads: int, processes: bool | None = None,
              executor: Executor | None = None, base=None) -> Iterator[Executing]:
    """The one place choosing between threads and worker processes.

    `executor`: worker processes the caller opened (processes_for) and
    shuts down, used unless the archive is coded against a base. Else
    decode_workers decides, and the processes it opens are shut down on
    the way out (queued jobs dropped: Ctrl-C, errors); without them, small
    archives of one job run on one thread (_threads_for). A `base`
    given by the caller is open here only: threads then."""
    if base is not None:
        processes, executor = False, None
    if executor is not None:
        yield Executing(executor if workers_may_decode(index) else None, threads)
        return
    with decode_workers(index, threads, processes) as workers:
        yield Executing(workers, threads if workers is not None else _threads_for(threads, index, processes))


def processes_for(archive, threads: int, base=None, processes: bool | None = None) -> Workers:
    """Worker processes to decode or verify this archive (decode_workers),
    opened ahead of any thread of the caller's (a progress bar) so that
    they can start by fork; none if they would not pay or the archive
    cannot be read (the call that follows says why). A context manager
    (Workers) that gives the executor, or None. `base` is not needed: the
    archive's index says whether it was coded against one."""
    try:
        with ArchiveReader(Path(archive)) as reader:
            index = reader.index
    except BrevisError:
        return Workers(None)
    return decode_workers(index, threads, processes)


# ------------------------------------------------------------ sinks
class Unreadable(Exception):
    """A sink's file could not be opened in the job: one problem for the job."""


_IOV_MAX = 1024  # buffers a pwritev call takes (Linux's and the BSDs' IOV_MAX)
_pwritev = getattr(os, "pwritev", None)


def _zeros(view: memoryview) -> bool:
    """Whether the bytes are all zero: their first 8 looked at alone first
    (a chunk of data rarely starts with 8 zero bytes; numpy's any() over
    every byte cost taesd's 279 chunks 1 ms)."""
    if len(view) >= 8 and int.from_bytes(view[:8], "little"):
        return False
    return not np.frombuffer(view, np.uint8).any()


@dataclass(frozen=True)
class WriteInPlace:
    """Decompress: the decoded bytes go into the staged file `path` (created
    at its full size, so reading zeros) at their offset, chunks of zeros
    not at all (holes); damage raises. `shown`: the output path, for
    messages."""
    path: str
    shown: str
    keeps_going = False
    # A repeated chunk's bytes are put in its place by the job that decodes
    # the chunk it repeats, while they are in memory, rather than read back
    # from the file once that job is done (copy_repeats).
    copies_at_source = True

    def open(self) -> int:
        try:
            return os.open(self.path, os.O_WRONLY)
        except OSError as e:
            raise io_failure(e, f"cannot write {self.shown}") from None

    def put(self, fd: int, data, offset: int) -> str | None:
        self.put_run(fd, [data], offset)
        return None

    def put_run(self, fd: int, parts: list, offset: int) -> None:
        """Pieces that follow one another in the file from `offset` on, in
        as few pwritev calls as the pieces of zeros between them allow (a
        pwrite a chunk cost taesd, 34 KiB chunks, 279 calls)."""
        run: list[memoryview] = []
        start = offset
        for part in parts:
            view = memoryview(part).cast("B")
            if _zeros(view):
                # The staged file was created at its full size, all zeros: a piece of
                # zeros is left as a hole, so a sparse input comes back sparse.
                self._write(fd, run, start)
                run, start = [], offset + len(view)
            else:
                run.append(view)
            offset += len(view)
        self._write(fd, run, start)

    def _write(self, fd: int, views: list[memoryview], offset: int) -> None:
        k = 0  # views[k:] are left to write (views[k] cut where a short write stopped)
        while k < len(views):
            try:
                if _pwritev is None:  # a system without pwritev: one call a piece
                    written = os.pwrite(fd, views[k], offset)
                else:
                    written = _pwritev(fd, views[k:k + _IOV_MAX], offset)
            except OSError as e:
                raise io_failure(e, f"cannot write {self.shown}") from None
            offset += written
            while k < len(views) and written >= len(views[k]):
                written -= len(views[k])
                k += 1
            if written:
                views[k] = views[k][written:]

    def close(self, fd: int) -> None:
        os.close(fd)


@dataclass(frozen=True)
class CompareWith:
    """Verify against a source file (by path): the bytes at the same offset
    must be the decoded ones."""
    path: str
    keeps_going = True

    def open(self) -> int:
        try:
            return os.open(self.path, os.O_RDONLY)
        except OSError as e:
            raise Unreadable(f"cannot read source: {e.strerror}") from None

    def put(self, fd: int, data, offset: int) -> str | None:
        if read_up_to(fd, offset, len(data)) != memoryview(data):
            return "decoded bytes differ from the source"
        return None

    def close(self, fd: int) -> None:
        os.close(fd)


@dataclass(frozen=True)
class CheckOnly:
    """Verify without a source: decoding checks every checksum."""
    keeps_going = True

    def open(self) -> None:
        return None

    def put(self, handle, data, offset: int) -> str | None:
        return None

    def close(self, handle) -> None:
        pass


class IntoMemory:
    """Unpack: a file's decoded bytes into one buffer of its size in this
    process (`data`), chunks coded by one leaf decoded straight into their
    place (`buffer`); damage raises. Threads only: a worker process's
    buffers would stay there."""

    keeps_going = False

    def __init__(self, data: np.ndarray):
        self.data = data  # writable uint8, the file's size

    def open(self) -> np.ndarray:
        return self.data

    def buffer(self, data: np.ndarray, offset: int, length: int) -> np.ndarray:
        """Where a chunk's bytes go (run_job decodes into it)."""
        return data[offset: offset + length]

    def put(self, data: np.ndarray, chunk, offset: int) -> None:
        # A memoryview assignment is one memcpy; numpy's copy into pages not
        # touched yet was measured 10-20x slower on this machine's VMs.
        memoryview(data)[offset: offset + len(chunk)] = memoryview(chunk).cast("B")
        return None

    open_to_read = open

    def read_back(self, data: np.ndarray, parts: list[tuple[int, int, int]], length: int) -> np.ndarray:
        """The bytes put at these pieces, in order (a view where one)."""
        if len(parts) == 1:
            at, _, n = parts[0]
            return data[at:at + n]
        return np.concatenate([data[at:at + n] for at, _, n in parts])

    def put_pieces(self, data: np.ndarray, chunk, parts) -> None:
        """A chunk's pieces (pieces(): offset in the file, in the chunk,
        length) into their places at once (with the extension; without it,
        _put_all puts them one at a time)."""
        _layout.scatter(chunk, parts, data)

    def close(self, data) -> None:
        pass


Sink = WriteInPlace | CompareWith | CheckOnly | IntoMemory


# ------------------------------------------------------------ jobs
@dataclass(frozen=True)
class DecodeJob:
    file: int  # index of the file entry
    chunks: tuple[tuple[int, int], ...]  # (segment, chunk) pairs, consecutive in the file's segments
    offset: int  # bytes of the file's segments before the first chunk, in segment order
    start: int  # the first chunk's offset in its segment
    sink: Sink
    # (segment, chunk) pairs of `chunks` not to decode: repeats of an earlier
    # chunk, whose bytes are copied from its place once this job is done,
    # unless the job that decodes that chunk puts them (`copied`).
    skip: frozenset = frozenset()
    copied: frozenset = frozenset()
    # ((segment, the chunk's offset in it), ((sink, file, segment, offset), ...)):
    # the places of the chunks that repeat one of this job's, put by it.
    copies: tuple = ()


def decode_jobs(index, sink_of: Callable[[int], Sink], job_bytes: int, files=None,
                threads: int = 1, repeats: dict | None = None) -> Iterator[DecodeJob]:
    """Jobs of whole chunks of about job_bytes (at least one chunk) covering
    every chunk of every file (of those whose positions are in `files`,
    where given), in order; file i's bytes go to sink_of(i). For `threads`
    > 1 the jobs shrink towards the end (half of each thread's share of
    what is left, down to TAIL_JOB_BYTES), so that the threads finish
    together rather than one decoding the last job alone. `repeats`
    (find_repeats): chunks each job skips, put by the job of the chunk
    they repeat where both sinks take copies at the source (a file's)."""
    left = sum(f.size for i, f in enumerate(index.files) if files is None or i in files)
    at_source: dict[tuple[int, int, int], list] = {}  # (file, segment, offset) of a chunk -> places of its repeats
    copied: set[tuple[int, int, int]] = set()
    for (i, s, c), (fi, fs, fstart, start) in (repeats or {}).items():
        if getattr(sink_of(i), "copies_at_source", False) and getattr(sink_of(fi), "copies_at_source", False):
            at_source.setdefault((fi, fs, fstart), []).append((sink_of(i), i, s, start))
            copied.add((i, s, c))

    def job(i: int, run: list, first: int, first_start: int, sink, copies: list) -> DecodeJob:
        skip = frozenset(sc for sc in run if (i, *sc) in repeats) if repeats else frozenset()
        return DecodeJob(i, tuple(run), first, first_start, sink, skip,
                         frozenset(sc for sc in skip if (i, *sc) in copied), tuple(copies))

    target = _job_target(left, job_bytes, threads)
    for i, entry in enumerate(index.files):
        if files is not None and i not in files:
            continue
        sink = None
        run: list[tuple[int, int]] = []
        copies: list = []
        offset = first = first_start = 0
        for s, seg in enumerate(entry.segments):
            start = 0
            for c, chunk in enumerate(seg.chunks):
                if not run:
                    first, first_start = offset, start
                run.append((s, c))
                if at_source and (i, s, start) in at_source:
                    copies.append(((s, start), tuple(at_source[(i, s, start)])))
                length = chunk.n * seg.itemsize
                offset += length
                start += length
                if offset - first >= target:
                    sink = sink or sink_of(i)
                    yield job(i, run, first, first_start, sink, copies)
                    left -= offset - first
                    target = _job_target(left, job_bytes, threads)
                    run, copies = [], []
        if run:
            yield job(i, run, first, first_start, sink or sink_of(i), copies)
            left -= offset - first
            target = _job_target(left, job_bytes, threads)


def _job_target(left: int, job_bytes: int, threads: int) -> int:
    """The bytes the next job gathers, `left` bytes being still to decode."""
    if threads < 2:
        return job_bytes
    return max(TAIL_JOB_BYTES, min(job_bytes, left // (2 * threads)))


def run_job(decoder: ChunkDecoder, job: DecodeJob) -> tuple[int, list[tuple[str | None, str]]]:
    """Decode a job's chunks into its sink (in any thread or process);
    return the bytes done and the (segment name, problem) pairs found, in
    order. A writer's sink raises at the first damaged chunk."""
    sink = job.sink
    try:
        handle = sink.open()
    except Unreadable as e:
        return 0, [(None, str(e))]
    try:
        if sink.keeps_going:
            return _check_job(decoder, job, handle)
        return _write_job(decoder, job, handle)
    finally:
        sink.close(handle)


def _job_chunks(decoder: ChunkDecoder, job: DecodeJob) -> list[tuple[int, object, object, int]]:
    """(segment position, segment, chunk, the chunk's offset in its segment) for each chunk of a job."""
    segments = decoder.reader.index.files[job.file].segments
    out, start, here, skip = [], job.start, job.chunks[0][0], job.skip
    for s, c in job.chunks:
        if s != here:
            start, here = 0, s
        seg = segments[s]
        chunk = seg.chunks[c]
        if not skip or (s, c) not in skip:
            out.append((s, seg, chunk, start))
        start += chunk.n * seg.itemsize
    return out


def _windows(decoder: ChunkDecoder, job: DecodeJob):
    """The job's chunks (_job_chunks), READ_WINDOW at a time, each window
    with its chunks' stored streams (read_runs)."""
    chunks = _job_chunks(decoder, job)
    for w in range(0, len(chunks), READ_WINDOW):
        window = chunks[w:w + READ_WINDOW]
        yield window, decoder.reader.read_runs([chunk for _, _, chunk, _ in window])


def _put(sink: Sink, handle, data, parts, length: int) -> str | None:
    """A chunk's bytes into the sink, a piece at a time (pieces); the last problem found, or None."""
    problem = None
    for at, within, n in parts:
        problem = sink.put(handle, data[within:within + n] if n != length else data, at) or problem
    return problem


def _put_all(sink: Sink, handle, puts: list[tuple[str, object, list]]) -> list[tuple[str, str]]:
    """Each (segment name, bytes, pieces) of `puts` into the sink; the
    (name, problem) pairs found, in order. A sink that takes runs (put_run)
    gets the pieces in file order, those that follow one another together:
    gathered segments' pieces lie between each other's (a layer's bias,
    scale and weight, each gathered with its kind), and in decoding order
    they were a write each (fracast's archive: 81 writes, now 3)."""
    put_pieces = getattr(sink, "put_pieces", None) if _layout is not None else None
    if put_pieces is not None:  # in memory: nothing to report, damage raises
        for _, data, parts in puts:
            put_pieces(handle, data, parts)
        return []
    put_run = getattr(sink, "put_run", None)
    if put_run is None:
        found = []
        for name, data, parts in puts:
            problem = _put(sink, handle, data, parts, len(data))
            if problem is not None:
                found.append((name, problem))
        return found
    run: list = []
    start = end = 0
    for at, data, within, n in sorted(((at, data, within, n) for _, data, parts in puts for at, within, n in parts),
                                      key=itemgetter(0)):
        if run and at != end:
            put_run(handle, run, start)
            run = []
        if not run:
            start = end = at
        run.append(data[within:within + n] if n != len(data) else data)
        end += n
    if run:
        put_run(handle, run, start)
    return []


def _write_job(decoder: ChunkDecoder, job: DecodeJob, handle) -> tuple[int, list[tuple[str | None, str]]]:
    """A writer's job: each window of chunks read at once, those one leaf
    codes decoded in one call (_decode_in_one_call), the others in batches
    (decode_many), into the sink's memory where it offers it (`buffer`),
    else put; raises at the first damage."""
    sink = job.sink
    buffer = getattr(sink, "buffer", None)
    placed = decoder.placements(job.file)
    copies = dict(job.copies)
    problems: list[tuple[str | None, str]] = []
    done = 0
    checks_in_call = decoder.reader.checks_in_call  # else the usual way makes the archive's older checks
    for window, stored in _windows(decoder, job):
        puts = []  # (segment name, bytes, pieces) decoded beside their place, put at the window's end
        elsewhere: list = []  # (sink, segment name, bytes, pieces) of the chunks that repeat these
        if checks_in_call:
            left, decoded = _decode_in_one_call(window, stored, placed, buffer, handle)
            if left is not None:
                for k, parts, data in decoded:
                    done += len(data)
                    if parts is not None:  # decoded beside its place
                        puts.append((window[k][1].name, data, parts))
                    if copies:
                        _copies_of(decoder, copies, window[k], data, elsewhere)
                window, stored = [window[k] for k in left], [stored[k] for k in left]
        work, where = [], []
        for (s, seg, chunk, start), streams in zip(window, stored):
            length = chunk.n * seg.itemsize
            parts = pieces(placed[s], start, length)
            into = buffer(handle, parts[0][0], length) if buffer is not None and len(parts) == 1 else None
            work.append((seg, chunk, start, into, streams))
            where.append(parts)
        for here, (seg, chunk, _, into, _), parts, data in zip(window, work, where, decoder.decode_many(work)):
            done += chunk.n * seg.itemsize
            if into is None:  # else decoded in its place
                puts.append((seg.name, data, parts))
            if copies:
                _copies_of(decoder, copies, here, data if into is None else into, elsewhere)
        problems += _put_all(sink, handle, puts)
        if elsewhere:
            _put_copies(elsewhere)
    return done, problems


def _copies_of(decoder: ChunkDecoder, copies: dict, chunk: tuple, data, elsewhere: list) -> None:
    """The places of the chunks that repeat `chunk` (a window's (segment,
    entry, chunk, offset in the segment)), with its bytes, onto `elsewhere`."""
    s, seg, _, start = chunk
    for sink, i, ds, dstart in copies.get((s, start), ()):
        elsewhere.append((sink, seg.name, data, pieces(decoder.placements(i)[ds], dstart, len(data))))


def _put_copies(elsewhere: list) -> None:
    """Each (sink, segment name, bytes, pieces) into its sink, each sink opened once."""
    by_sink: dict = {}
    for sink, name, data, parts in elsewhere:
        by_sink.setdefault(sink, []).append((name, data, parts))
    for sink, puts in by_sink.items():
        handle = sink.open()
        try:
            _put_all(sink, handle, puts)
        finally:
            sink.close(handle)


def _decode_in_one_call(window, stored, placed, buffer, handle) -> tuple[list[int] | None, list]:
    """The chunks of a window that one `ans` or `raw` leaf codes
    (SegmentEntry.in_one_call) decoded in one call of the C decoder, which
    also checks their digests: into the sink's memory
    where it offers it (`buffer`) and the chunk lies in one piece of its
    file, else into one buffer beside (a gathered segment's chunk, whose
    pieces the caller puts in their places: pieces()). Returns the
    positions of the other chunks (to decode as usual) and (position, the
    pieces to put or None, bytes) of each decoded. A chunk costs a tuple
    here, where the usual way costs a dozen calls. With damage among them,
    (None, []): the caller decodes the whole window as usual, which names
    the first damaged chunk."""
    taken, left = [], []
    beside = 0  # bytes decoded into the buffer beside
    for k, ((s, seg, chunk, start), streams) in enumerate(zip(window, stored)):
        lane = seg.in_one_call[chunk.program]
        if lane is None or len(streams) != 1 or seg.base is not None:
            left.append(k)
            continue
        length = chunk.n * seg.itemsize
        place = placed[s]
        parts = None if buffer is not None and len(place) == 1 else pieces(place, start, length)
        beside += length if parts is not None else 0
        taken.append((k, lane, chunk, streams[0], place[0][0] + start, length, parts))
    if not taken:
        return left, []
    scratch, at = (np.empty(beside, np.uint8) if beside else None), 0
    calls, decoded = [], []
    for k, lane, chunk, stream, offset, length, parts in taken:
        if parts is None:
            out = buffer(handle, offset, length)
        else:
            out, at = scratch[at:at + length], at + length
        # No stream check (-1): the digest guards the bytes; where a chunk fails,
        # the usual way tells a damaged stream.
        calls.append((stream, chunk.n if lane[0] else length, lane[0], lane[1], out, -1, chunk.digest))
        decoded.append((k, parts, out))
    if not decode_in_place(calls):
        return None, []
    return left, decoded


def _check_job(decoder: ChunkDecoder, job: DecodeJob, handle) -> tuple[int, list[tuple[str | None, str]]]:
    """A checker's job (verify): every problem reported, in order; a chunk
    that repeats one checked (same program, length, streams and digest) is
    not decoded again (CheckOnly). Each window is first decoded in batches
    (decode_many); where that finds damage, its chunks are decoded one by
    one, so that each problem is found and told."""
    sink = job.sink
    placed = decoder.placements(job.file)
    problems: list[tuple[str | None, str]] = []
    done = 0
    for window, stored in _windows(decoder, job):
        decoded = _decode_window(decoder, window, stored, isinstance(sink, CheckOnly))
        for (s, seg, chunk, start), streams, data in zip(window, stored, decoded):
            length = chunk.n * seg.itemsize
            done += length
            key = None
            if isinstance(sink, CheckOnly) and not seg.programs[chunk.program].uses_reference:
                key = _repeat_key(seg, chunk)
                found = decoder.checked.get(key, decoder.checked.get((key, seg.name), _UNSEEN))
                if found is not _UNSEEN:
                    if found is not None:
                        problems.append((seg.name + seg.holding(start, length), found))
                    continue
            try:
                if data is None:
                    data = decoder.decode(seg, chunk, start, None, streams, streams_first=True)
            except BrevisError as e:
                problems.append((seg.name + seg.holding(start, length), str(e)))
                if key is not None:
                    decoder.checked[(key, seg.name)] = str(e)
                continue
            problem = _put(sink, handle, data, pieces(placed[s], start, length), length)
            if problem is not None:
                problems.append((seg.name + seg.holding(start, length), problem))
            elif key is not None:
                decoder.checked[key] = None
    return done, problems


def _repeat_key(seg, chunk) -> tuple:
    """What makes two chunks decode to the same bytes: program, value type,
    length, streams and digest (CheckOnly decodes each such chunk once)."""
    return (seg.programs[chunk.program], seg.value_type, chunk.n, tuple(chunk.streams), chunk.digest)


def _decode_window(decoder: ChunkDecoder, window, stored, dedup: bool) -> list:
    """A checker's window decoded in batches: per chunk its bytes, or None
    where it is to be decoded on its own (a chunk that repeats one checked
    already, one coded against a base, or every chunk of a window in which
    a batch found damage)."""
    out: list = [None] * len(window)
    todo = []
    for k, ((_, seg, chunk, start), streams) in enumerate(zip(window, stored)):
        program = seg.programs[chunk.program]
        if program.uses_reference:
            continue
        if dedup:
            key = _repeat_key(seg, chunk)
            if key in decoder.checked or (key, seg.name) in decoder.checked:
                continue
        todo.append((k, (seg, chunk, start, None, streams)))
    try:
        for (k, _), data in zip(todo, decoder.decode_many([item for _, item in todo], streams_first=True)):
            out[k] = data
    except BrevisError:
        return [None] * len(window)
    return out


_UNSEEN = object()
_decoders: dict[str, ChunkDecoder] = {}  # per worker process


def run_job_in_worker(archive: str, digest: bytes, job: DecodeJob) -> tuple[int, list[tuple[str | None, str]]]:
    """run_job in a worker process, on the archive opened there by path
    (once per process); `digest` of its index: a worker refuses an archive
    replaced meanwhile."""
    decoder = _decoders.get(archive)
    if decoder is None:
        keep_freed_memory()
        decoder = _decoders[archive] = ChunkDecoder(ArchiveReader(Path(archive)))
    if decoder.reader.footer.digest != digest:
        raise FormatError(f"{archive} changed while being decoded")
    return run_job(decoder, job)


def run_jobs(decoder: ChunkDecoder, sink_of: Callable[[int], Sink], how: Executing,
             files=None, repeats: bool = False) -> Iterator[tuple[DecodeJob, tuple[int, list[tuple[str | None, str]]]]]:
    """(job, run_job's result) for every chunk of the archive, in order, on
    `how`: worker processes (jobs of PROCESS_JOB_BYTES) or threads (jobs of
    THREAD_JOB_BYTES). Close it (contextlib.closing) to stop early.
    `repeats` (writers): a chunk that repeats an earlier one (find_repeats)
    is not decoded but put in its place by the job that decodes that one,
    where both are files (decode_jobs), else copied from that one's place
    once its job is done (the earlier one's job is done by then: results
    come in order), by the calling thread while the others decode; its
    bytes count in its job's."""
    index = decoder.reader.index
    found = find_repeats(index, files) if repeats else None
    with closing(_run(decoder, sink_of, how, files, found)) as pairs:  # its pool shut down with this
        for job, (done, problems) in pairs:
            if job.skip:
                rest = job.skip - job.copied
                done += copy_repeats(decoder, sink_of, [((job.file, *sc), found[(job.file, *sc)]) for sc in rest])
                segments = index.files[job.file].segments
                done += sum(segments[s].chunks[c].n * segments[s].itemsize for s, c in job.copied)
            yield job, (done, problems)


def _run(decoder: ChunkDecoder, sink_of: Callable[[int], Sink], how: Executing, files, found):
    index = decoder.reader.index
    if how.processes is not None:
        reader = decoder.reader
        fn = partial(run_job_in_worker, str(reader.path.absolute()), reader.footer.digest)
        try:
            yield from ordered_pairs(how.processes, fn,
                                     decode_jobs(index, sink_of, PROCESS_JOB_BYTES, files, repeats=found),
                                     2 * max(1, how.threads))
        except Exception as e:
            if broken_pool(e):
                raise BrevisError("a decoding worker process died (killed, or out of memory)") from None
            raise
        return
    # The calling thread decodes too (`helps`): one thread fewer to start,
    # and none left waiting. It queues jobs only between its own, so the
    # window leaves the pool's threads work for a long one of its own (at 2
    # x threads, resemblyzer's pool thread once waited 4.6 ms while the
    # caller decoded a 7 ms chunk); queued jobs hold no memory.
    with Pool(how.threads, caller_helps=True) as pool:
        yield from ordered_pairs(pool.executor, partial(run_job, decoder),
                                 decode_jobs(index, sink_of, THREAD_JOB_BYTES, files, pool.threads, found),
                                 4 * pool.threads, helps=True)


def find_repeats(index, files=None) -> dict[tuple[int, int, int], tuple[int, int, int, int]]:
    """The chunks that repeat an earlier one of the archive (of the files
    at positions `files`, where given): the same program, value type,
    count, streams and digest, so the same bytes (a tensor stored in two
    files, tied weights): {(file, segment, chunk): (the earlier one's file,
    segment, offset in its segment; this one's offset in its segment)}.
    Chunks without streams (a constant) and chunks coded against a base
    are left out. Candidates are found by their first stream's location,
    a dict lookup a chunk."""
    found: dict[tuple[int, int, int], tuple[int, int, int, int]] = {}
    chosen = [(i, f) for i, f in enumerate(index.files) if files is None or i in files]
    # Most archives name no stream twice: comprehensions tell (a tenth of a
    # loop over the chunks, on pocketnet's 206).
    offsets = [c.streams[0][0] for _, f in chosen for seg in f.segments for c in seg.chunks if c.streams]
    if len(set(offsets)) == len(offsets):
        return found
    # (Sets, not a Counter: its first use in a process checks a list
    # against the Mapping ABC, 45 us.)
    seen, again = set(), set()
    for o in offsets:
        (again if o in seen else seen).add(o)
    first: dict[tuple, list] = {}  # a first stream's location -> [(file, segment, chunk, its _repeat_key)]
    for i, f in chosen:
        for s, seg in enumerate(f.segments):
            if seg.base is not None:
                continue
            for c, chunk in enumerate(seg.chunks):
                if not chunk.streams or chunk.streams[0][0] not in again:
                    continue
                earlier = first.setdefault(chunk.streams[0], [])
                key = _repeat_key(seg, chunk)
                for fi, fs, fc, fkey in earlier:
                    if fkey == key:
                        source = index.files[fi].segments[fs]
                        found[(i, s, c)] = (fi, fs, _chunk_start(source, fc), _chunk_start(seg, c))
                        break
                else:
                    earlier.append((i, s, c, key))
    return found


def _chunk_start(seg, c: int) -> int:
    """Chunk c's offset in its segment, in bytes."""
    return sum(chunk.n for chunk in seg.chunks[:c]) * seg.itemsize


def copy_repeats(decoder: ChunkDecoder, sink_of: Callable[[int], Sink], repeats: list) -> int:
    """Each repeated chunk's bytes ((file, segment, chunk), find_repeats'
    value) read back from its earlier copy's place and put in its own; the
    bytes copied. The earlier chunk matched its digest, which is the
    repeat's: the bytes are checked. Unpack's (a view of its buffer); a
    file's repeats are put by the job that decodes the chunk they repeat
    (WriteInPlace.copies_at_source): reading them back from the files was
    a fifth of silero's decompress to tmpfs (2.3-2.5 of 11-15 ms)."""
    index = decoder.reader.index
    done = 0
    readers: dict[int, object] = {}  # file -> its sink's handle, open to read back
    elsewhere: list = []  # (sink, segment name, bytes, pieces), put as the sources' copies are (_put_copies)
    try:
        for (i, s, c), (fi, fs, fstart, start) in repeats:
            seg = index.files[i].segments[s]
            length = seg.chunks[c].n * seg.itemsize
            source = sink_of(fi)
            if fi not in readers:
                readers[fi] = source.open_to_read()
            data = source.read_back(readers[fi], pieces(decoder.placements(fi)[fs], fstart, length), length)
            elsewhere.append((sink_of(i), seg.name, data, pieces(decoder.placements(i)[s], start, length)))
            done += length
    finally:
        for k, handle in readers.items():
            sink_of(k).close(handle)
    _put_copies(elsewhere)
    return done
