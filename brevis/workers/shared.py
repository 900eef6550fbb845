"""Batches of chunk results that come back through shared memory (/dev/shm).

A worker on this machine writes the streams of a batch of chunks into one
file in /dev/shm (`write_batch`) and sends back only the small outputs,
with the (offset, length) of every stream in that file. The receiver maps
the file, unlinks it at once and reads the streams in place (`read_batch`);
a batch nobody will read is removed by `release_batch`. Measured: sending
the streams themselves through the result pipe cost more than the second
worker saved. The receiver's pid is in the file's name, so a later run
removes what a killed one left (`remove_stale_batches`).

Within a compress run the batches go to a `Ring` instead: one file of
slots, mapped once by the receiver and once by each worker, batch k
written to slot k mod slots (a batch too large for its slot, or a ring a
worker cannot map or allocate, takes a file of its own as above). A file
per batch paid, for every batch, its pages' allocation and zeroing where
the worker wrote and their mapping where the receiver read: 231 MB of
streams in batches of 4 MiB cost 0.28 s of CPU that way against 0.13 s
through a ring (nomic's archive, one process playing both sides). A slot's
pages are allocated by the first worker to write to it (posix_fallocate:
a full /dev/shm is then an error it falls back from, not a SIGBUS as it
writes to its mapping), not by the receiver when it makes the ring: that
was 2.7 ms of the main process's CPU a slot of 6 MiB, before any work,
and a run keeps two slots a worker (92 ms at -j16, all serial).
"""

from __future__ import annotations

import errno
import mmap
import os
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import IOFailure

SHM_DIR = "/dev/shm"
_fallocate = getattr(os, "posix_fallocate", None)


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


@dataclass
class RingBatch:
    """A batch's outputs (tasks.ChunkOutput), each with `spans` into slot
    `slot` of the run's Ring and no `streams`."""
    slot: int
    outputs: list


class Ring:
    """`slots` slots of `slot_bytes` in one shared file, for a run's batches
    (the receiver's side): created whole (posix_fallocate, so that a full
    /dev/shm fails here with ENOSPC rather than as SIGBUS in a worker
    writing to its mapping), mapped once, removed by `close`. The receiver
    gives batch k `place(k)` and reads it with `read_batch` before batch
    k + slots is given out (pool.ordered_pairs with a window of `slots`
    does exactly that)."""

    def __init__(self, owner: int, slots: int, slot_bytes: int):
        import uuid

        self.name = f"{shm_prefix(owner)}ring{uuid.uuid4().hex}"
        self.slots, self.slot_bytes = slots, slot_bytes
        size = slots * slot_bytes
        fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if _fallocate is None:
                raise OSError(f"no posix_fallocate to allocate {self.name}")
            if _free_bytes(SHM_DIR) < size:
                raise OSError(errno.ENOSPC, f"{SHM_DIR} cannot hold a ring of {size} bytes")
            os.ftruncate(fd, size)  # (its slots are allocated by the workers, as they first write to them)
            self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except BaseException:
            os.unlink(self.name)
            raise
        finally:
            os.close(fd)
        self.view = memoryview(self.map)

    @classmethod
    def open(cls, owner: int, slots: int, slot_bytes: int) -> "Ring | None":
        """A ring, or None where /dev/shm cannot hold one (batches then take files)."""
        try:
            return cls(owner, slots, slot_bytes)
        except OSError:
            return None

    def place(self, k: int) -> tuple[str, int, int]:
        """Where batch k goes: what a worker needs (write_ring_or_batch)."""
        return self.name, k % self.slots, self.slot_bytes

    def close(self) -> None:
        self.view.release()
        try:
            self.map.close()
        except BufferError:  # a stream still referenced: the mapping goes with it
            pass
        try:
            os.unlink(self.name)
        except FileNotFoundError:
            pass


def _free_bytes(folder: str) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


class _Mapped:
    """A worker's mapping of a ring, with the descriptor its slots are
    allocated through and the slots it has allocated (or found allocated)."""

    def __init__(self, name: str):
        self.fd = os.open(name, os.O_RDWR)
        try:
            self.map = mmap.mmap(self.fd, 0, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.allocated: set[int] = set()

    def __len__(self) -> int:
        return len(self.map)

    def allocate(self, slot: int, slot_bytes: int) -> None:
        """The slot's pages allocated (OSError where /dev/shm cannot hold them)."""
        if slot not in self.allocated:
            _fallocate(self.fd, slot * slot_bytes, slot_bytes)
            self.allocated.add(slot)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


RINGS_MAPPED = 4  # a worker keeps its mappings of the last rings it wrote to (runs at once share workers)
_mapped: dict[str, _Mapped] = {}  # a worker's: ring name -> its mapping


def _ring_map(name: str) -> _Mapped:
    m = _mapped.get(name)
    if m is not None:
        return m
    for old in [n for n in _mapped if not os.path.exists(n)]:  # rings of runs that are over: their memory goes
        _mapped.pop(old).close()
    m = _mapped[name] = _Mapped(name)
    if len(_mapped) > RINGS_MAPPED:  # the oldest ring: its run is over by now, or writes files
        _mapped.pop(next(iter(_mapped))).close()
    return m


def write_ring_or_batch(outputs: list, owner: int, place: tuple[str, int, int]):
    """Move the streams of `outputs` into their slot of the ring (Ring.place);
    where they do not fit or the ring cannot be mapped, write_batch_or_keep."""
    name, slot, slot_bytes = place
    views = [[memoryview(x).cast("B") for x in o.streams] for o in outputs]
    if sum(v.nbytes for vs in views for v in vs) > slot_bytes:
        return write_batch_or_keep(outputs, owner)
    try:
        m = _ring_map(name)
    except (OSError, ValueError):  # the run is over (its ring removed), or the file is not the ring's size
        return write_batch_or_keep(outputs, owner)
    if len(m) < (slot + 1) * slot_bytes:
        return write_batch_or_keep(outputs, owner)
    try:
        m.allocate(slot, slot_bytes)
    except OSError:  # /dev/shm is full
        return write_batch_or_keep(outputs, owner)
    pos = 0
    spans = []
    base = slot * slot_bytes
    ring = m.map
    for vs in views:
        spans.append([])
        for v in vs:
            ring[base + pos: base + pos + v.nbytes] = v
            spans[-1].append((pos, v.nbytes))
            pos += v.nbytes
    for o, where in zip(outputs, spans):
        o.spans, o.streams = where, None
    return RingBatch(slot, outputs)


def write_batch_or_keep(outputs: list, owner: int):
    """write_batch, or where /dev/shm is missing, full or too small (Docker
    gives 64 MiB by default), the outputs as they are: their streams then
    travel through the result pipe (slower, but the run goes on)."""
    try:
        return write_batch(outputs, owner)
    except OSError:
        return outputs


@contextmanager
def read_batch(result, ring: Ring | None = None):
    """(output, streams) of a batch's chunks: a list of ChunkOutput as it
    is, a RingBatch whose streams are read in place from its slot of
    `ring`, or a SharedBatch whose streams are read in place from a
    mapping of its file (unlinked at once); the streams are valid inside
    the block."""
    if isinstance(result, RingBatch):
        if ring is None:
            raise AssertionError("a batch in a ring read without the ring")
        base = result.slot * ring.slot_bytes
        yield [(o, [ring.view[base + a: base + a + n] for a, n in o.spans]) for o in result.outputs]
        return
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
