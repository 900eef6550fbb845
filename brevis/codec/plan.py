"""The plan of an archive, as data: files -> segments -> chunk references.

`scan` cuts every source file into segments (formats/; only headers are
read). `lay_out` turns the scanned files into the plan's skeleton: a
`PlannedFile` per file, in archive order, each with its `PlannedSegment`s,
each with its `ChunkRef`s (what is read: a file, an offset, a number of
elements). Everything but the programs is known from the layout, so the
whole skeleton exists before any segment is planned.

`plan_segments` then fills in each segment's program (its `Plan`, the base
tensor it may be coded against, the program as the chunk tasks carry it),
lazily and in archive order: the searches run on the pool a few segments
ahead of encoding. Planning reads the segments' samples through the file's
descriptor, which it opens on reaching the file's first segment; closing
it, and checking the file did not change, is the assembler's (see
assembler.Assembler), once the file's last chunk is in the index.

Nothing here changes the index.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from collections import Counter
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass, field, replace
from typing import Iterator

from .base_model import Base, BaseTensor, tensor_keys
from ..dsl.program import Program
from ..dsl.types import BYTES, Field, tensor
from ..errors import InvalidArgument, IOFailure
from ..archive.format import chunk_digest
from ..archive.index import pieces
from ..formats import Segment, discovery, layout, repeats
from ..formats.gather import gather, gatherable, gather_tensors, gatherable_tensor
from ..fs.sources import Source, check_identity, read_exactly
from ..synth.planner import LZMA_CHUNK_BYTES, LZMA_MARGIN, TINY, Plan, Planner, SegmentInfo, lzma_wins, publish
from ..synth.prior import Prior
from ..synth.search import SearchResult
from ..workers.pool import Pool, Threads, chunk_counts, ordered_map, ordered_pairs
from ..workers.tasks import (ChunkTask, PlanTask, ProbeTask, SegmentTask, SpanTask, parse_program, run_learn, run_plans,
                             run_probe, run_span)


@dataclass(eq=False)
class ScannedFile:
    """A source file as the scan found it: its size and mtime (the
    changed-file check compares them), its format and its segments."""

    source: Source
    size: int
    mtime_ns: int
    format: str
    segments: list[Segment]
    fd: int = -1  # open while its segments are sampled
    # The file the scan read (inode, status change time): a file replaced
    # by another of the same size and mtime (touch -r), or written in place
    # and its mtime put back, changes these (see identity()).
    ino: int = 0
    ctime_ns: int = 0
    mode: int | None = None  # permission bits, as the index records them

    def tensor_key(self, seg: Segment) -> str:
        """The name a base tensor is matched by (base_model.tensor_keys)."""
        keys = self.__dict__.get("_keys")
        if keys is None:
            keys = self.__dict__["_keys"] = tensor_keys(self.segments)
        return keys.get(id(seg), seg.name)

    def identity(self) -> tuple[int, int, int, int]:
        """(inode, size, mtime, ctime) as the scan found them: every read of
        the file (here, in worker processes) checks the file it opened has
        them still, and the end check compares them once more."""
        return (self.ino, self.size, self.mtime_ns, self.ctime_ns)

    def open(self) -> None:
        if self.fd < 0:
            try:
                self.fd = os.open(self.source.path, os.O_RDONLY)
            except OSError as e:
                raise InvalidArgument(f"cannot read {self.source.path}: {e.strerror}") from None
            try:
                check_identity(os.fstat(self.fd), self.identity(), self.source.path)
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read(self, offset: int, length: int) -> bytes:
        return read_exactly(self.fd, self.source.path, offset, length)

    def check_unchanged(self) -> None:
        try:
            st = os.stat(self.source.path)
        except OSError:
            raise IOFailure(f"{self.source.path} disappeared while being read") from None
        check_identity(st, self.identity(), self.source.path)


def scan(source: Source) -> ScannedFile:
    try:
        with open(source.path, "rb") as f:
            st = os.fstat(f.fileno())
            fmt, segments = layout(f, st.st_size, source.name)
            segments = gather(segments)
    except OSError as e:
        raise InvalidArgument(f"cannot read {source.path}: {e.strerror}") from None
    return ScannedFile(source, st.st_size, st.st_mtime_ns, fmt, segments, ino=st.st_ino, ctime_ns=st.st_ctime_ns,
                       mode=stat.S_IMODE(st.st_mode))


def discover(scanned: list[ScannedFile], lzma_margin: float = LZMA_MARGIN, threads: int = 1,
             executor: Executor | None = None) -> None:
    """What the parsers left as long byte spans, cut from the bytes alone
    (formats/repeats.py, formats/discovery.py):

    - each copy of a long repeat across all the files' spans becomes a
      segment of its own, so that its chunks are stored once;
    - a span is cut where its statistics change and into runs of whole
      quantized blocks of a layout Brevis knows, unless LZMA may code it
      (a file no parser knows) and codes it better whole
      (planner.lzma_wins): its adaptive model follows the changes, and
      its window the repeats within reach (LZMA_CHUNK_BYTES), which are
      then left in place; pieces of a span LZMA lost on do not try it;
    - the other pieces are cut at their words' phase, and the short ones
      gathered again (formats/gather.py), each with those that read alike
      (discovery.kinds): a piece cut for its statistics keeps them.

    A later copy of a repeat is cut as the first (the same bytes), and its
    pieces numbered alike.

    Each unparsed span's measurements (span_trials: its changes, LZMA's
    trials and its quantized blocks; most of discovery there, LZMA coding
    about 3 MB/s) go to `executor` (worker processes, which wait for
    discovery anyway), else to `threads` threads (liblzma releases the
    GIL), or one span's LZMA trials to threads (planner._lzma_best); the
    rest runs here."""
    spans = [repeats.Span(i, seg, _read_once(f)) for i, f in enumerate(scanned)
             for seg in f.segments if repeats.searchable(seg)]
    if not spans:
        return
    unparsed = [k for k, sp in enumerate(spans) if scanned[sp.file].format == "bytes"]
    # The other spans' samples (a job each, about 30 ms) go to the workers
    # first: this process measures those spans' changes while they probe
    # (it waited for them idle, then measured: 33-58 ms of waiting in
    # gemma3's, nomic's, piper's and smollm's compression, profiled).
    probing = _probe_elsewhere(scanned, spans, [k for k in range(len(spans)) if k not in unparsed],
                               executor) if executor is not None else {}
    try:
        _discover(scanned, spans, unparsed, probing, lzma_margin, threads, executor)
    finally:
        _cancel(probing)


def _discover(scanned: list[ScannedFile], spans: list, unparsed: list[int], probing: dict, lzma_margin: float,
              threads: int, executor: Executor | None) -> None:
    """discover's work once the other spans' probes are on their way (`probing`)."""
    if executor is not None and len(unparsed) > 1:
        tasks = [SpanTask(str(scanned[spans[k].file].source.path), spans[k].segment,
                          scanned[spans[k].file].identity(), lzma_margin) for k in unparsed]
        measured = [job.result() for job in [executor.submit(run_span, task) for task in tasks]]
    elif threads > 1 and len(unparsed) > 1:  # every read opens its own descriptor
        with Threads(threads) as pool:
            measured = list(pool.map(lambda k: span_trials(spans[k].segment, spans[k].read, lzma_margin), unparsed))
    else:
        measured = [span_trials(spans[k].segment, spans[k].read, lzma_margin, threads) for k in unparsed]
    changed = {k: m[0] for k, m in zip(unparsed, measured)}  # span -> where its statistics change
    whole = {k: m[1] for k, m in zip(unparsed, measured)}  # span -> whether LZMA codes it whole better
    held = {k: m[2] for k, m in zip(unparsed, measured)}  # span -> whether it holds quantized blocks
    found = [copies for copies in repeats.regions(spans) if not _within_reach(copies, whole)]
    replaced = repeats.cut(spans, found)
    for k in probing:  # (the changes _cut would measure below, measured while the workers probe)
        if any(piece is spans[k].segment for piece in replaced.get(k, [spans[k].segment])):
            changed[k] = discovery.changes(spans[k].segment, spans[k].read)
    held.update({k: any([job.result() for job in probes]) for k, probes in probing.items()})
    numbers: dict[tuple[int, int], int] = {}  # (region, piece of it) -> the piece's region
    by_file: dict[int, dict[int, int]] = {}
    for k, sp in enumerate(spans):
        by_file.setdefault(sp.file, {})[id(sp.segment)] = k
    for i, ks in by_file.items():
        f = scanned[i]
        segments = []
        for seg in f.segments:
            k = ks.get(id(seg))
            if k is None:
                segments.append(seg)
                continue
            read = spans[k].read
            blocks = held[k] if k in held else discovery.holds_blocks(seg, read)
            for piece in replaced.get(k, [seg]):
                if whole.get(k) and piece.region is None:
                    cut = discovery.split(piece, read, words=False)
                else:  # a copy is cut alike wherever it lies, LZMA's span or not: its pieces are stored once
                    cut = _cut(piece, read, blocks or piece.region is not None, changed.get(k) if piece is seg else None)
                for j, part in enumerate(cut):
                    if part.region is not None:
                        part = replace(part, region=numbers.setdefault((part.region, j), len(numbers)))
                    if whole.get(k) is False:
                        part = replace(part, lzma=False)
                    segments.append(part)
        small = [s for s in segments if gatherable(s) and s.length > TINY]
        labels = {id(s): k for s, k in zip(small, discovery.kinds(small, _read_once(f)))}
        f.segments = gather(segments, lambda s: labels.get(id(s), -1))  # -1: the short ones, together


def _probe_elsewhere(scanned: list[ScannedFile], spans: list, ks: list[int], executor: Executor) -> dict[int, list]:
    """discovery.holds_blocks of spans[k] for each k, its samples read and
    measured by `executor`'s workers: span -> the jobs of its samples,
    whether any of which reads as blocks (the same answer as holds_blocks
    here). The caller cancels those not done where it gives up."""
    jobs: dict[int, list] = {}
    try:
        for k in ks:
            f = scanned[spans[k].file]
            path, identity = str(f.source.path), f.identity()
            jobs[k] = [executor.submit(run_probe, ProbeTask(path, identity, offset, n, start))
                       for offset, n, start in discovery.block_probes(spans[k].segment)]
    except BaseException:
        _cancel(jobs)
        raise
    return jobs


def _cancel(jobs: dict[int, list]) -> None:
    """Cancel the probes (span -> its jobs) not started yet."""
    for probes in jobs.values():
        for job in probes:
            job.cancel()


def span_trials(span: Segment, read, lzma_margin: float, threads: int = 1) -> tuple[list[Segment], bool, bool]:
    """A byte span of a file no parser knows (read: offset in the file, n
    -> bytes): its pieces where its statistics change (discovery.changes);
    whether LZMA codes it whole better than those pieces by `lzma_margin`
    (planner.lzma_wins, its trials on `threads` threads); and, where it does
    not, whether the span holds quantized blocks (discovery.holds_blocks)."""
    changed = discovery.changes(span, read)
    at = span.offset
    better = lzma_wins(lambda off, n: read(at + off, n), [(p.offset - at, p.length) for p in changed],
                       lzma_margin, threads)
    return changed, better, not better and discovery.holds_blocks(span, read)


def gather_small_tensors(scanned: list[ScannedFile], base: Base | None = None) -> None:
    """Each file's small tensors gathered with those of their dtype that
    read alike (formats/gather.py), unless a base is given: a tensor coded
    against its base tensor costs next to nothing where a fine-tune left
    it as it was, and base tensors are matched one by one.

    A small tensor whose bytes another repeats is stored once (its chunk
    is shared), so it is gathered only with repeats, and only where its
    copies lie one in each of some files whose repeats are the same bytes
    in the same order (a checkpoint saved twice, at two precisions: the
    biases and norms of both): those files gather them alike, into the
    same bytes, whose chunks are then stored once. Other repeats stay
    alone."""
    if base is not None:
        return
    # Which small tensors repeat: a digest of each (its bytes are read again to gather).
    digests: list[dict[int, bytes]] = []  # per file: offset -> digest, of each small tensor
    for f in scanned:
        small = [s for s in f.segments if gatherable_tensor(s)]
        digests.append({})
        if small:
            f.open()  # checks it is the file scanned
            try:
                digests[-1].update((s.offset, chunk_digest(f.read(s.offset, s.length))) for s in small)
            finally:
                f.close()
    seen = Counter(d for file_digests in digests for d in file_digests.values())
    repeats = [tuple(d for _, d in sorted(file_digests.items()) if seen[d] > 1) for file_digests in digests]
    alike = Counter(repeats)  # files by their repeats, in file order
    for f, file_digests, mine in zip(scanned, digests, repeats):
        groups = [{o for o, d in file_digests.items() if seen[d] == 1}]
        if len(mine) > 1 and len(set(mine)) == len(mine) and all(seen[d] == alike[mine] for d in mine):
            groups.append({o for o, d in file_digests.items() if seen[d] > 1})
        groups = [g for g in groups if len(g) > 1]
        if groups:
            f.open()
            try:
                for group in groups:
                    f.segments = gather_tensors(f.segments, group, f.read)
            finally:
                f.close()


def _cut(piece: Segment, read, blocks: bool, changed: list[Segment] | None = None) -> list[Segment]:
    """A piece of bytes cut where its statistics change (`changed`, where
    already measured), into runs of whole quantized blocks (where
    `blocks`), and at its words' phase (formats/discovery.py)."""
    out = []
    for part in changed or discovery.changes(piece, read):
        for run in discovery.blocks(part, read) if blocks else [part]:
            out += [run] if run.records else discovery.split(run, read)
    return out


def _within_reach(copies: list[repeats.Copy], whole: dict[int, bool]) -> bool:
    """Whether all of a region's copies lie in one span LZMA codes whole,
    close enough for its window to find them."""
    span = copies[0].span
    return (whole.get(span, False) and all(c.span == span for c in copies)
            and max(c.end for c in copies) - min(c.start for c in copies) <= LZMA_CHUNK_BYTES)


def _read_once(f: ScannedFile):
    """(offset, n) -> bytes of the file, opening it for the one read."""
    path = f.source.path

    def read(offset: int, n: int) -> bytes:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise InvalidArgument(f"cannot read {path}: {e.strerror}") from None
        try:
            return read_exactly(fd, path, offset, n)
        finally:
            os.close(fd)
    return read


def value_type(seg: Segment) -> Field:
    return tensor(seg.dtype) if seg.dtype else BYTES


def segment_info(f: ScannedFile, seg: Segment, chunk_bytes: int, base: Base | None = None) -> SegmentInfo:
    t = value_type(seg)
    itemsize = t.container.itemsize
    chunks = len(chunk_counts(seg.length // itemsize, itemsize, chunk_bytes, _row(seg)))
    ref = base.match(f.source.name, f.tensor_key(seg), seg.dtype, seg.shape) if base else None
    return SegmentInfo(seg.name, t, seg.shape, seg.length, chunks, _reader(f, seg), seg.records,
                       ref.read if ref else None, parsed=f.format != "bytes", lzma=seg.lzma)


def _reader(f: ScannedFile, seg: Segment):
    """(offset, n) -> bytes of the segment's value (a gathered one's spans, back to back)."""
    if seg.ranges is None:
        return lambda off, n: f.read(seg.offset + off, n)
    return lambda off, n: b"".join(f.read(at, k) for at, _, k in pieces(seg.ranges, off, n))


def _row(seg: Segment) -> int:
    """Elements per row: chunks hold whole rows (whole records for blocks)."""
    if seg.records:
        return sum(c * w for c, w in seg.records)
    return seg.shape[-1] if seg.shape else 1


# ------------------------------------------------------------ the plan's data
@dataclass(eq=False)
class PlannedFile:
    """A file of the archive, in archive order, and its segments in file order."""

    scanned: ScannedFile
    path: str  # str() of the source's path, as the chunk tasks name it
    segments: list[PlannedSegment] = field(default_factory=list)

    @property
    def source(self) -> Source:
        return self.scanned.source


@dataclass(eq=False)
class PlannedSegment:
    """A segment, its chunks (known from the layout) and, once planned,
    its program (`plan`, None until then)."""

    file: PlannedFile
    segment: Segment
    value_type: Field
    type_name: str  # str(value_type), as the chunk tasks carry it
    chunks: tuple[ChunkRef, ...] = ()
    plan: Plan | None = None  # set by plan_segments
    base: BaseTensor | None = None  # the base tensor it may be coded against
    program_json: str = ""  # the planned program, as the chunk tasks carry it

    @property
    def planned(self) -> bool:
        return self.plan is not None


@dataclass(frozen=True, eq=False)
class ChunkRef:
    """One chunk: `n` elements (`length` bytes) at `offset` in the
    segment's file, encoded with the segment's program."""

    segment: PlannedSegment
    offset: int  # in the source file (of a gathered segment: in its spans' bytes)
    n: int  # elements
    length: int  # bytes

    def task(self) -> ChunkTask:
        """The picklable job a worker runs (tasks.run_chunk)."""
        ps = self.segment
        base_path, base_offset, reference = None, 0, None
        if ps.plan.program.uses_reference and ps.base is not None:
            within = self.offset - ps.segment.offset
            if ps.base.path is not None:
                base_path, base_offset = ps.base.path, ps.base.offset + within
            else:  # an archive: decoded here, the bytes travel with the task
                reference = ps.base.read(within, self.length)
        return ChunkTask(ps.file.path, self.offset, self.length, ps.type_name, ps.program_json,
                         base_path, base_offset, reference, ps.file.scanned.identity(), ps.segment.ranges)


def lay_out(scanned: list[ScannedFile], chunk_bytes: int) -> list[PlannedFile]:
    """The plan's skeleton: every file, segment and chunk, in archive order."""
    files = []
    for f in scanned:
        pf = PlannedFile(f, str(f.source.path))
        for seg in f.segments:
            t = value_type(seg)
            ps = PlannedSegment(pf, seg, t, str(t))
            itemsize = t.container.itemsize
            refs, offset = [], seg.start
            for n in chunk_counts(seg.length // itemsize, itemsize, chunk_bytes, _row(seg)):
                refs.append(ChunkRef(ps, offset, n, n * itemsize))
                offset += n * itemsize
            ps.chunks = tuple(refs)
            pf.segments.append(ps)
        files.append(pf)
    return files


@functools.lru_cache(maxsize=1024)
def program_text(program: Program) -> str:
    """A program as the chunk tasks carry it: families and learned programs
    share one program across many segments, so it is written out once."""
    return json.dumps(program.to_json())


def plan_segments(files: list[PlannedFile], planner: Planner, pool: Pool, chunk_bytes: int,
                  base: Base | None, executor: Executor | None = None,
                  ahead: int = 0) -> Iterator[PlannedSegment]:
    """Every segment of the plan in archive order, each once its program is
    set; the searches run on the pool, a few segments ahead of the caller,
    or where `executor` is given (worker processes), there, `ahead` of them
    at once (a segment coded against a base stays here: its base tensor is
    this process's). Families are claimed here, in archive order, and a
    follower waits for its leader's program wherever it is planned, so the
    plan is the same for any number of threads or processes. A file is
    opened (for sampling) on reaching its first segment; the assembler
    closes it."""

    first_copy: dict[int, PlannedSegment] = {}  # a repeated region's number -> its first segment

    def items():
        for pf in files:
            if pf.segments:
                pf.scanned.open()
            for ps in pf.segments:
                region = ps.segment.region
                if region is not None and region in first_copy:
                    yield ps, None, None, False  # a later copy: planned as the first (below)
                    continue
                if region is not None:
                    first_copy[region] = ps
                info = segment_info(pf.scanned, ps.segment, chunk_bytes, base)
                family, leader = planner.claim_family(info)  # in archive order: deterministic
                yield ps, info, family, leader

    def plan(item) -> tuple[Plan, BaseTensor | None, str] | None:
        ps, info, family, leader = item
        if info is None:
            return None
        p = planner.plan(info, family, leader)
        return p, reference(ps), program_text(p.program) if p.program is not None else ""

    def reference(ps: PlannedSegment) -> BaseTensor | None:
        seg = ps.segment
        return base.match(ps.file.source.name, ps.file.scanned.tensor_key(seg), seg.dtype, seg.shape) if base else None

    if executor is None:
        pairs = ordered_pairs(pool.executor, plan, items(), 2 * pool.threads)
    else:
        pairs = _planned_elsewhere(items(), plan, planner, executor, max(1, ahead))
    yield from _placed(pairs, first_copy, chunk_bytes)


HELD = object()  # _planned_elsewhere's job of a follower not yet sent
QUEUED = object()  # _planned_elsewhere's job of a segment in the batch not yet sent

# Segments cheap to plan (a family's follower, which tries its leader's
# program first, or a segment of at most PLAN_BATCH_SMALL bytes) go to the
# workers in batches of at most PLAN_BATCH_SEGMENTS and about
# PLAN_BATCH_BYTES, once `ahead` jobs are out; any other goes alone: a
# job's round trip costs the main process about 0.2 ms of its threads
# (ProcessPoolExecutor's queues and pickling, measured on the AMD EPYC), as
# much as planning a small segment that takes its sibling's program, and a
# batch holding a long search held back the plans after it (ppocr, where
# every segment was batched: 1.12x the time). Compress at -j2 against one
# job a segment, fresh processes taking turns, median s (benchmarks/
# results/ab-0c6bfc5-plan-batches.md): pocketnet (206 segments, 185
# followers) 0.431 -> 0.364, minilm-int8 0.285 -> 0.252, onnx's test data
# (5,805 small files) 4.70 -> 3.28; ppocr 1.010 -> 1.025 (0.975 at the
# best); every archive the same.
PLAN_BATCH_SEGMENTS = 16
PLAN_BATCH_BYTES = 1 << 20
PLAN_BATCH_SMALL = 16 << 10  # a segment this small is batched whatever it is (a larger one: a follower)


class _Batch:
    """A job of several segments' plans (tasks.run_plans): its future, and
    how many of its segments' plans are still to be taken."""

    def __init__(self, future: Future, size: int):
        self.future, self.left = future, size


class _Part:
    """One segment's plan in a batch's job: the k-th of its results."""

    def __init__(self, batch: _Batch, k: int):
        self.batch, self.k = batch, k

    def done(self) -> bool:
        return self.batch.future.done()

    def failed(self) -> bool:
        return self.batch.future.exception() is not None

    def result(self):
        return self.batch.future.result()[self.k]


def _planned_elsewhere(items, plan, planner: Planner, executor: Executor, ahead: int):
    """(item, plan_segments' plan of it) in order, each segment planned by
    a worker (tasks.run_plans), the cheap ones in batches
    (PLAN_BATCH_SEGMENTS), `ahead` jobs out and a full batch more; a
    segment coded against a base is planned here
    (`plan`). Jobs are submitted from this thread only: a worker process
    started by a submit is tied to the submitting thread (its death signal,
    processes.py). A family's follower is sent once its leader's plan is
    back, with the leader's program; meanwhile the segments after it are
    sent (on 16 cores, waiting there left all but a few workers idle while
    a leader's search ran: benchmarks/results/scaling.md), and while this
    thread waits for the oldest plan, each leader's plan that comes back
    sends its followers. A batch goes out at once while fewer than `ahead`
    are out, else when full or when this thread needs a plan of it."""
    prior = json.dumps(planner.prior.to_json())
    pending: deque[list] = deque()  # [item, job, plan]: job a _Part, QUEUED, a plan made here, or HELD
    held: dict[int, list[list]] = {}  # id(family) -> its followers' entries, sent once its leader's plan is back
    leaders: dict[int, list] = {}  # id(family) -> its leader's entry, while that plan is out
    batch: list[tuple[list, PlanTask]] = []  # the entries and tasks of the batch not yet sent
    batch_bytes = 0
    out = 0  # batches sent whose plans are not all taken

    def send(entry: list) -> None:
        nonlocal batch_bytes
        ps, info, family, leader = entry[0]
        seg, f = ps.segment, ps.file.scanned
        follows = family is not None and not leader and family.program is not None
        segment = SegmentTask(ps.file.path, seg.start, seg.length, seg.name, ps.type_name, seg.shape,
                              seg.records, info.chunks, planner.effort.level, f.identity(), seg.ranges)
        task = PlanTask(segment, prior, info.parsed, info.lzma,
                        (program_text(family.program), family.bytes_per_byte) if follows else None)
        # A follower (its leader's program tried first) or a small segment is
        # cheap to plan; another may search for long, and goes alone.
        cheap = follows or seg.length <= PLAN_BATCH_SMALL
        if batch and (not cheap or batch_bytes + seg.length > PLAN_BATCH_BYTES):
            flush()
        entry[1] = QUEUED
        batch.append((entry, task))
        batch_bytes += seg.length
        # Out at once where fewer than `ahead` jobs are (the workers may be
        # idle, or the plans soon needed), else once full
        if not cheap or len(batch) >= PLAN_BATCH_SEGMENTS or batch_bytes >= PLAN_BATCH_BYTES or out < ahead:
            flush()

    def flush() -> None:
        nonlocal batch_bytes, out
        if not batch:
            return
        job = _Batch(executor.submit(run_plans, [task for _, task in batch]), len(batch))
        for k, (entry, _) in enumerate(batch):
            entry[1] = _Part(job, k)
        batch.clear()
        batch_bytes = 0
        out += 1

    def parsed(entry: list) -> tuple:
        if entry[2] is None:
            text, stats, estimate, most = entry[1].result()
            entry[2] = (Plan(parse_program(text) if text else None, stats, estimate, most), None, text)
        return entry[2]

    def lead(entry: list, result: Plan | None) -> None:
        """The leader's plan published (None: it failed), its followers sent."""
        _, info, family, _ = entry[0]
        del leaders[id(family)]
        publish(family, result, info)
        for follower in held.pop(id(family), ()):
            send(follower)

    def release() -> None:
        """Every leader whose plan is back and good leads now, in archive order
        (a failed one leads when finish reaches it, and raises there)."""
        for entry in [e for e in leaders.values() if isinstance(e[1], _Part) and e[1].done() and not e[1].failed()]:
            lead(entry, parsed(entry)[0])

    def finish():
        nonlocal out
        entry = pending.popleft()
        item = entry[0]
        _, info, family, leader = item
        if entry[1] is HELD:  # a follower, whose leader came before it and has led by now
            send(entry)
        if entry[1] is QUEUED:  # (else its batch is out, with `ahead` more: the workers have enough)
            flush()
        job = entry[1]
        if not isinstance(job, _Part):
            return item, job
        job.batch.left -= 1
        out -= not job.batch.left
        result = None
        try:
            while not job.done():
                wait([job.batch.future, *(e[1].batch.future for e in leaders.values() if isinstance(e[1], _Part))],
                     return_when=FIRST_COMPLETED)
                release()
            result = parsed(entry)
            return item, result
        finally:
            if leader and family is not None and id(family) in leaders:
                lead(entry, result[0] if result else None)

    try:
        for item in items:
            ps, info, family, leader = item
            entry = [item, HELD, None]
            if info is None or info.reference is not None:
                while family is not None and not leader and not family.ready.is_set() and pending:
                    yield finish()  # up to its leader, which came before: planned here, it waits for it
                entry[1] = plan(item)
            elif family is not None and not leader and not family.ready.is_set():
                held.setdefault(id(family), []).append(entry)
            else:
                send(entry)
                if leader and family is not None:
                    leaders[id(family)] = entry
            pending.append(entry)
            release()
            # A full batch past the `ahead` jobs out is the cue to take a plan. Followers
            # held count against a larger window: they cost the workers nothing yet.
            if out > ahead or len(pending) >= 8 * ahead * PLAN_BATCH_SEGMENTS:
                yield finish()
        while pending:
            yield finish()
    finally:
        for entry in pending:
            if isinstance(entry[1], _Part):
                entry[1].batch.future.cancel()


def _placed(pairs, first_copy: dict, chunk_bytes: int) -> Iterator[PlannedSegment]:
    """Each planned segment with its plan set (on the caller's thread)."""
    for (ps, *_), planned in pairs:
        if planned is None:  # the same bytes as an earlier segment: the same plan, so the same chunks
            first = first_copy[ps.segment.region]
            planned = first.plan, first.base, first.program_json
        p, ref, text = planned
        ps.plan, ps.base, ps.program_json = p, ref, text  # here, on the caller's thread
        if p.chunk_bytes and p.chunk_bytes > chunk_bytes:
            ps.chunks = merged(ps.chunks, p.chunk_bytes)
        yield ps


def merged(refs: tuple[ChunkRef, ...], most: int) -> tuple[ChunkRef, ...]:
    """Consecutive chunks of a segment joined into chunks of at most `most`
    bytes (each at least as long as the longest one given)."""
    out: list[ChunkRef] = []
    for r in refs:
        last = out[-1] if out else None
        if last is not None and last.length + r.length <= max(most, r.length):
            out[-1] = ChunkRef(r.segment, last.offset, last.n + r.n, last.length + r.length)
        else:
            out.append(r)
    return tuple(out)


# ------------------------------------------------------------ learning the prior
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

        def task(info: SegmentInfo) -> SegmentTask:
            f, seg = places[id(info)]
            return SegmentTask(str(f.source.path), seg.start, seg.length, seg.name, str(info.t), seg.shape,
                               seg.records, info.chunks, planner.effort.level, f.identity(), seg.ranges)

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
