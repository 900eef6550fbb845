"""Self-contained chunk jobs: what a worker process (or a Dask worker) needs
to encode one chunk, and nothing it would have to share with the writer.

A `ChunkTask` names its bytes (a source file by path, an offset, a length),
its value type and its program (as text), and where the program is coded
against a base, the base tensor's bytes at the same place (a file and an
offset, or the bytes themselves when the base is an archive). `run_chunk`
reads the bytes with pread, computes the chunk's key (its digest and value
type), runs the program (repairing where an operator refuses this chunk),
applies the raw guard and returns the key, the program that ran (None when
it is the task's own), the streams and their CRC-32s. Deduplication is the
writer's business: a worker always encodes.

Batches whose streams come back through shared memory are in shared.py;
the worker processes themselves (start, signals, death) in processes.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..dsl.entropy import MAX_BITS
from ..dsl.interpreter import forward
from ..dsl.memory import chunk_fits
from ..dsl.operator import Coder
from ..dsl.program import Program
from ..dsl.types import Field, Tensor, tensor
from ..dtypes import lookup
from ..errors import NotApplicable
from ..archive.format import chunk_digest, stream_check
from ..archive.index import pieces
from ..fs.sources import read_at, read_pieces
from .shared import RingBatch, SharedBatch, write_batch_or_keep, write_ring_or_batch


@dataclass(frozen=True)
class ChunkTask:
    path: str  # the source file
    offset: int  # of the chunk in the file
    length: int  # bytes
    value_type: str  # str() of the segment's value type: a dtype name, or u8 for bytes
    program: str  # the planned program, as JSON text
    base_path: str | None = None  # the base tensor's file, for programs coded against a base
    base_offset: int = 0  # where this chunk's reference starts in that file
    reference: bytes | None = None  # the reference itself, where the base is not a plain file
    # (inode, size, mtime, ctime) of the source as the scan found it: the
    # worker refuses to read another file, or one written since.
    identity: tuple[int, int, int, int] | None = None
    # A chunk of a gathered segment: the segment's spans in the file, and
    # `offset` is the chunk's in their bytes (formats/gather.py).
    ranges: tuple[tuple[int, int], ...] | None = None


@dataclass
class ChunkOutput:
    key: bytes  # the digest of the original bytes, the value type, and for a chunk coded against
    # a base, NUL and the digest of its reference: what repeats share (a hash, not a proof:
    # the assembler compares the bytes of two chunks whose keys are equal)
    digest: bytes  # the index's digest of the original bytes (format.chunk_digest)
    program: str | None  # JSON of the program that ran; None: the task's own program
    streams: list[bytes] | None  # None when they are in shared memory (spans)
    crcs: list[int]  # the check of each stream (format.stream_check)
    pid: int  # the process that encoded it
    spans: list[tuple[int, int]] | None = None  # (offset, length) of each stream in the batch's shared memory


@lru_cache(maxsize=64)
def parse_value_type(name: str) -> Field:
    if name.startswith("u") and name[1:].isdigit():
        return Field(int(name[1:]))
    dtype = lookup(name)
    if dtype is None:
        raise ValueError(f"unknown value type {name!r}")
    return tensor(dtype)


@lru_cache(maxsize=256)
def parse_program(text: str) -> Program:
    return Program.from_json(json.loads(text))


def _plain() -> tuple[Program, Program]:
    from ..synth.planner import FALLBACK, PLAIN
    return PLAIN, FALLBACK


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
        fallback = _plain()[1]
        return fallback, [fallback.node.encode(x, t)]
    children, streams = [], []
    for child, value, ct in zip(program.children, values, node.child_types(t)):
        p, s = encode_repairing(child, value, ct)
        children.append(p)
        streams += s
    return Program(node, tuple(children)), streams


def one_leaf(program: Program, streams: list[bytes], x: np.ndarray, t: Field) -> tuple[Program, list[bytes]]:
    """A tensor's chunk that a split coded in several streams (a partition
    by exponent, a float's fields, bit fields) coded instead by one `ans`
    of its whole values where that is no larger, index entries counted:
    one stream to decode and no pass to put the parts together (easyocr's
    F32 chunks split by exponent decoded at about 1.0 GB/s on one thread,
    those coded by `ans` at 2.7). The search compared the two on a sample,
    where a leaf over wide values looks dearer than it is (its keys binned
    coarsely: easyocr's F32 tensors 1.1-3.5 % dearer on their samples, as
    large or smaller on their chunks); here the split's streams are made
    already, and the leaf costs its choice of models and, where it may
    fit, its coding (Ans.encode_within). A chunk takes what codes it no
    larger: it never grows."""
    if not isinstance(t, Tensor) or t.bits > MAX_BITS:  # (values `ans` does not code)
        return program, streams
    leaf, entry = _leaf_and_entry()
    stream = leaf.node.encode_within(x, t, sum(map(len, streams)) + entry * (len(streams) - 1))
    return (program, streams) if stream is None else (leaf, [stream])


@lru_cache(maxsize=1)
def _leaf_and_entry() -> tuple[Program, int]:
    """One `ans` leaf, and what one more stream costs the index (the search's figure)."""
    from ..synth.planner import TINY_ANS
    from ..synth.search import STREAM_INDEX_BYTES
    return TINY_ANS, STREAM_INDEX_BYTES


def _read(path: str, offset: int, length: int, what: str, identity=None, ranges=None) -> bytes:
    """`length` bytes at `offset` of the file (of a gathered segment's spans, where `ranges`)."""
    if ranges is None:
        return read_at(path, offset, length, what, identity)  # one name for benchmarks/phases.py to wrap
    return read_pieces(path, pieces(ranges, offset, length), what, identity)


def read_chunk(task: ChunkTask) -> bytes:
    """The chunk's bytes, from its file."""
    return _read(task.path, task.offset, task.length, task.path, task.identity, task.ranges)


def read_reference(task: ChunkTask) -> bytes:
    """The base tensor's bytes at the chunk's place (a task coded against a base)."""
    if task.reference is not None:
        return task.reference
    return _read(task.base_path, task.base_offset, task.length, f"base {task.base_path}")


def run_chunk(task: ChunkTask) -> ChunkOutput:
    """Read, checksum and encode one chunk (in any process)."""
    t = parse_value_type(task.value_type)
    data = read_chunk(task)
    # The key is the index's digest (XXH3-128, made anyway), not a
    # cryptographic hash of its own: BLAKE3 was 4-5 % of compressing nomic
    # or astra on one thread (benchmarks/phases.py), and equal keys are
    # confirmed by the bytes (Deduplicator).
    digest = chunk_digest(data)
    key = digest + task.value_type.encode()
    planned = parse_program(task.program)
    x = np.frombuffer(data, dtype=t.container)
    reference = ref = None
    if planned.uses_reference:
        ref = read_reference(task)
        reference = np.frombuffer(ref, dtype=t.container)
    if chunk_fits(planned, t, len(x)):
        program, streams = encode_repairing(planned, x, t, reference)
    else:  # readers would refuse it (dsl/memory.py): not worth encoding
        program, streams = _plain()[0], [data]
    if len(streams) > 1 and reference is None:
        program, streams = one_leaf(program, streams, x, t)
    if sum(map(len, streams)) > len(data) or not chunk_fits(program, t, len(x)):
        # Never larger than the data itself, nor costlier to decode than readers accept (dsl/memory.py).
        program, streams = _plain()[0], [data]
    ran = None if program is planned or program == planned else json.dumps(program.to_json())
    if program.uses_reference:
        # Its streams rebuild these bytes only beside this reference: the same
        # bytes coded against another base tensor's are another chunk (two
        # tensors a fine-tune made equal, whose bases differ). After the
        # value type, which holds no NUL: no key of a chunk without one.
        key += b"\0" + chunk_digest(ref)
    return ChunkOutput(key, digest, ran, streams, [stream_check(s) for s in streams], os.getpid())


@dataclass(frozen=True)
class SegmentTask:
    """A segment as a worker samples it: learning's wide search on a
    representative tensor (run_learn), or planning (run_plan)."""

    path: str  # the source file
    offset: int  # where reads of the segment's value begin (Segment.start)
    length: int
    name: str
    value_type: str  # as in ChunkTask
    shape: tuple[int, ...] | None
    records: tuple[tuple[int, int], ...] | None
    chunks: int
    effort: int
    identity: tuple[int, int, int, int] | None = None  # as in ChunkTask
    ranges: tuple[tuple[int, int], ...] | None = None  # as in ChunkTask

    def info(self, parsed: bool = False, lzma: bool = True):
        """The planner's view of the segment, its bytes read from the file."""
        from ..synth.planner import SegmentInfo

        return SegmentInfo(self.name, parse_value_type(self.value_type), self.shape, self.length, self.chunks,
                           lambda off, n: _read(self.path, self.offset + off, n, self.path, self.identity,
                                                self.ranges),
                           self.records, parsed=parsed, lzma=lzma)


def run_learn(task: SegmentTask) -> tuple[str, float, int, int, bool, float | None]:
    """The learning search on one tensor (in any process): the winning
    program as JSON text (hashes of operators are per process, so programs
    cross as text), its estimate, nodes expanded and generated, whether a
    limit was hit, and its estimate relative to the entropy."""
    from ..synth.planner import Planner

    result, relative = Planner(task.effort).learn_one(task.info())
    return (json.dumps(result.program.to_json()), result.estimate, result.expanded, result.generated,
            result.exhausted, relative)


@dataclass(frozen=True)
class SpanTask:
    """A long byte span of a file no parser knows, for discovery's
    measurements in a worker (plan.discover)."""

    path: str
    span: object  # formats.Segment: the span, at its offset in the file
    identity: tuple[int, int, int, int] | None  # as in ChunkTask
    lzma_margin: float


def run_span(task: SpanTask) -> tuple[list, bool, bool]:
    """plan.span_trials of the span (in any process): its pieces where its
    statistics change, whether LZMA codes it whole better, and whether it
    holds quantized blocks."""
    from ..codec.plan import span_trials

    return span_trials(task.span, lambda off, n: _read(task.path, off, n, task.path, task.identity),
                       task.lzma_margin)


@dataclass(frozen=True)
class ProbeTask:
    """One of discovery.holds_blocks' samples of a long byte span, for a
    worker (plan.discover): `length` bytes at `offset`, lanes counted from
    `start`."""

    path: str
    identity: tuple[int, int, int, int] | None  # as in ChunkTask
    offset: int
    length: int
    start: int


def run_probe(task: ProbeTask) -> bool:
    """Whether the sample reads as blocks of a known layout (in any process)."""
    from ..formats.discovery import probe_reads_as_blocks

    data = _read(task.path, task.offset, task.length, task.path, task.identity)
    return probe_reads_as_blocks(np.frombuffer(data, np.uint8), task.start)


@dataclass(frozen=True)
class PlanTask:
    """A segment to plan (sample, search or shortcut) in a worker, with the
    prior learned for the checkpoint and, for a segment of a family, the
    program its leader found."""

    segment: SegmentTask
    prior: str  # the prior's JSON text
    parsed: bool  # as in SegmentInfo
    lzma: bool
    family: tuple[str, float] | None = None  # the leader's program (JSON text) and its bytes per byte


@lru_cache(maxsize=4)
def _planner(effort: int, prior: str):
    """One planner per prior in a worker: the prior is read once, and its
    learned programs' trials share the worker's memo of estimates."""
    from ..synth.planner import Planner
    from ..synth.prior import Prior

    return Planner(effort, Prior.from_json(json.loads(prior)))


def run_plan(task: PlanTask) -> tuple[str, dict, float | None, int | None]:
    """Plan one segment (in any process) as the planner of the main process
    would: the program as JSON text, the plan's stats, estimate and chunk size."""
    from ..synth.planner import published

    family = published(parse_program(task.family[0]), task.family[1]) if task.family else None
    plan = _planner(task.segment.effort, task.prior).plan(task.segment.info(task.parsed, task.lzma), family)
    text = json.dumps(plan.program.to_json()) if plan.program is not None else ""
    return text, plan.stats, plan.estimate, plan.chunk_bytes


def run_plans(tasks: list[PlanTask]) -> list[tuple[str, dict, float | None, int | None]]:
    """A batch of segments' plans: one round trip to a worker for several segments."""
    return [run_plan(t) for t in tasks]


def run_chunks(tasks: list[ChunkTask]) -> list[ChunkOutput]:
    """A batch of chunks: one round trip to a worker for several chunks."""
    return [run_chunk(t) for t in tasks]


def run_chunks_shared(tasks: list[ChunkTask], owner: int) -> SharedBatch:
    """A batch whose streams go back through a file in shared memory, for
    workers on this machine: only the small outputs cross the pipe (see
    shared.py; `owner` is the receiver's pid)."""
    return write_batch_or_keep(run_chunks(tasks), owner)


def run_chunks_ring(job: tuple[list[ChunkTask], tuple[str, int, int]], owner: int) -> RingBatch | SharedBatch:
    """A batch whose streams go back through its slot of the run's ring in
    shared memory (job: the tasks and shared.Ring.place of the batch), or
    where they do not fit, as run_chunks_shared's."""
    tasks, place = job
    return write_ring_or_batch(run_chunks(tasks), owner, place)
