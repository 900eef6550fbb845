"""Batches of chunk results that come back through shared memory (/dev/shm).

A worker on this machine writes the streams of a batch of chunks into one
file in /dev/shm (`write_batch`) and sends back only the small outputs,
with the (offset, length) of every stream in that file. The receiver maps
the file, unlinks it at once and reads the streams in place (`read_batch`);
a batch nobody will read is removed by `release_batch`. Measured: sending
the streams themselves through the result pipe cost more than the second
worker saved. The receiver's pid is in the file's name, so a later run
removes what a killed one left (`remove_stale_batches`).
"""

from __future__ import annotations

import mmap
import os
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import IOFailure

SHM_DIR = "/dev/shm"


@dataclass
class SharedBatch:
    """A batch's outputs (tasks.ChunkOutput), their streams in one file in
    shared memory that the receiver maps, unlinks and reads in place."""
    name: str  # the file's path
    outputs: list  # of ChunkOutput, each with `spans` and no `streams`


def shm_prefix(owner: int) -> str:
    return os.path.join(SHM_DIR, f".brevis-{owner}-")


def write_batch(outputs: list, owner: int) -> SharedBatch:
    """Move the streams of `outputs` (ChunkOutput) into a new shared file
    named for `owner` (the receiver's pid); each output keeps the spans of
    its streams instead."""
    import uuid

    path = f"{shm_prefix(owner)}{uuid.uuid4().hex}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        pos = 0
        spans = []
        for o in outputs:
            spans.append([])
            for x in o.streams:
                view = memoryview(x)
                while view:
                    view = view[os.write(fd, view):]
                spans[-1].append((pos, len(x)))
                pos += len(x)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    for o, where in zip(outputs, spans):  # only once all is written: a failed batch keeps its streams
        o.spans, o.streams = where, None
    return SharedBatch(path, outputs)


def write_batch_or_keep(outputs: list, owner: int):
    """write_batch, or where /dev/shm is missing, full or too small (Docker
    gives 64 MiB by default), the outputs as they are: their streams then
    travel through the result pipe (slower, but the run goes on)."""
    try:
        return write_batch(outputs, owner)
    except OSError:
        return outputs


@contextmanager
def read_batch(result):
    """(output, streams) of a batch's chunks: a list of ChunkOutput as it
    is, or a SharedBatch whose streams are read in place from a mapping of
    its file (unlinked at once); the streams are valid inside the block."""
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
