"""Self-contained chunk jobs: what a worker process (or a Dask worker) needs
to encode one chunk, and nothing it would have to share with the writer.

A `ChunkTask` names its bytes (a source file by path, an offset, a length),
its value type and its program (as text), and where the program is coded
against a base, the base tensor's bytes at the same place (a file and an
offset, or the bytes themselves when the base is an archive). `run_chunk`
reads the bytes with pread, computes the chunk's key (SHA-256 and value
type), runs the program (repairing where an operator refuses this chunk),
applies the raw guard and returns the key, the program that ran (None when
it is the task's own), the streams and their CRC-32s. Deduplication is the
writer's business: a worker always encodes.

Workers ignore SIGINT (the main process alone reacts to Ctrl-C and shuts
the pool down) and, on Linux, die with the process that started them.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..dsl.interpreter import forward
from ..dsl.operator import Coder
from ..dsl.program import Program
from ..dsl.types import Field, tensor
from ..dtypes import lookup
from ..errors import InvalidArgument, NotApplicable
from .heap import keep_freed_memory
from ..fs.sources import read_exactly


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


@dataclass
class ChunkOutput:
    key: bytes  # full SHA-256 of the original bytes, then the value type
    program: str | None  # JSON of the program that ran; None: the task's own program
    streams: list[bytes] | None  # None when they are in shared memory (spans)
    crcs: list[int]  # CRC-32 of each stream
    pid: int  # the process that encoded it
    spans: list[tuple[int, int]] | None = None  # (offset, length) of each stream in the batch's shared memory


@dataclass
class SharedBatch:
    """A batch's outputs, their streams in one file in shared memory that
    the receiver maps, unlinks and reads in place."""
    name: str  # the file's path
    outputs: list[ChunkOutput]


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


def _read(path: str, offset: int, length: int, what: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise InvalidArgument(f"cannot read {what}: {e.strerror}") from None
    try:
        return read_exactly(fd, what, offset, length)
    finally:
        os.close(fd)


def run_chunk(task: ChunkTask) -> ChunkOutput:
    """Read, checksum and encode one chunk (in any process)."""
    t = parse_value_type(task.value_type)
    data = _read(task.path, task.offset, task.length, task.path)
    key = hashlib.sha256(data).digest() + task.value_type.encode()
    planned = parse_program(task.program)
    x = np.frombuffer(data, dtype=t.container)
    reference = None
    if planned.uses_reference:
        ref = task.reference
        if ref is None:
            ref = _read(task.base_path, task.base_offset, task.length, f"base {task.base_path}")
        reference = np.frombuffer(ref, dtype=t.container)
    program, streams = encode_repairing(planned, x, t, reference)
    if sum(map(len, streams)) > len(data):  # never larger than the data itself
        program, streams = _plain()[0], [data]
    ran = None if program is planned or program == planned else json.dumps(program.to_json())
    return ChunkOutput(key, ran, streams, [zlib.crc32(s) for s in streams], os.getpid())


@dataclass(frozen=True)
class LearnTask:
    """A representative tensor for learning the prior: the wide search on
    its sample runs in a worker while the others run in the rest."""

    path: str  # the source file
    offset: int  # of the segment in the file
    length: int
    name: str
    value_type: str  # as in ChunkTask
    shape: tuple[int, ...] | None
    records: tuple[tuple[int, int], ...] | None
    chunks: int
    effort: int


def run_learn(task: LearnTask) -> tuple[str, float, int, int, bool, float | None]:
    """The learning search on one tensor (in any process): the winning
    program as JSON text (hashes of operators are per process, so programs
    cross as text), its estimate, nodes expanded and generated, whether a
    limit was hit, and its estimate relative to the entropy."""
    from ..synth.planner import Planner, SegmentInfo

    info = SegmentInfo(task.name, parse_value_type(task.value_type), task.shape, task.length, task.chunks,
                       lambda off, n: _read(task.path, task.offset + off, n, task.path), task.records)
    result, relative = Planner(task.effort).learn_one(info)
    return (json.dumps(result.program.to_json()), result.estimate, result.expanded, result.generated,
            result.exhausted, relative)


def run_chunks(tasks: list[ChunkTask]) -> list[ChunkOutput]:
    """A batch of chunks: one round trip to a worker for several chunks."""
    return [run_chunk(t) for t in tasks]


SHM_DIR = "/dev/shm"


def shm_prefix(owner: int) -> str:
    return os.path.join(SHM_DIR, f".brevis-{owner}-")


def run_chunks_shared(tasks: list[ChunkTask], owner: int) -> SharedBatch:
    """A batch whose streams go back through a file in shared memory
    (/dev/shm), for workers on this machine: only the small outputs cross
    the pipe. Measured: sending the streams themselves through the result
    pipe cost more than the second worker saved. The receiver unlinks the
    file (see read_batch, release_batch); `owner` (the receiver's pid) in
    its name lets a later run remove what a killed one left."""
    import uuid

    outputs = run_chunks(tasks)
    path = f"{shm_prefix(owner)}{uuid.uuid4().hex}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        pos = 0
        for o in outputs:
            o.spans = []
            for x in o.streams:
                view = memoryview(x)
                while view:
                    view = view[os.write(fd, view):]
                o.spans.append((pos, len(x)))
                pos += len(x)
            o.streams = None
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return SharedBatch(path, outputs)


def release_batch(result) -> None:
    """Remove the shared file of a batch nobody will read (interrupted runs)."""
    if isinstance(result, SharedBatch):
        try:
            os.unlink(result.name)
        except FileNotFoundError:
            pass


def remove_stale_batches() -> None:
    """Shared files of runs whose process is gone (killed before it could remove them)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        parts = name.split("-")
        if len(parts) == 3 and parts[0] == ".brevis" and parts[1].isdigit():
            try:
                os.kill(int(parts[1]), 0)
            except ProcessLookupError:
                try:
                    os.unlink(os.path.join(SHM_DIR, name))
                except OSError:
                    pass
            except PermissionError:
                pass


# ------------------------------------------------------------ worker processes
def worker_init(parent: int) -> None:
    """Initializer of chunk worker processes (children of `parent`): Ctrl-C
    is the main process's to handle, and a worker never outlives it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker inherits the CLI's handler
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # when the thread that started it ends (parallel.py)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died while this one was starting
        os._exit(1)
    keep_freed_memory()
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="brevis-parent-watch").start()


def _watch(parent: int) -> None:
    """Exit once the parent is gone (reparented: dead, even if not yet reaped)."""
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)


def warm_up() -> int:
    """A no-op job: starts a worker before the first chunk needs it."""
    return os.getpid()
