"""Writing an archive in one pass: header, streams as they come, index, footer.

Everything goes to a temporary file beside the output, renamed into place
only once complete, so a failed or interrupted run leaves nothing at the
output path (see fs/atomic.py, whose helpers are importable from here too).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable

import zstandard

from ..errors import BrevisError, FormatError, InvalidArgument, OutputExists
from ..interrupts import start_thread
from ..fs.atomic import io_failure, make_temp, publish, remove_stale
from .format import FOOTER_SIZE, HEADER_SIZE, VERSION, Footer, index_digest, max_entries, pack_header
from .index import Index
from .schema import paused_gc


# Written bytes between flushes to disk in the background while encoding
# goes on, so that the final fsync finds little left to write.
SYNC_BYTES = 64 << 20
_datasync = getattr(os, "fdatasync", os.fsync)
# Streams queued for the writing thread (write_behind) and not yet
# written, at most this many bytes: the thread that queues them waits.
BEHIND_BYTES = 64 << 20


class _Behind:
    """A thread that writes the streams queued to it, in order (`put`:
    the writer's write to its file, which releases the GIL while the kernel
    copies). `mark()` queues a ticket, set once everything queued before it
    is written (or dropped after a failure); the first failure is kept and
    raised to the queuing thread at its next call. `cpu`: the thread's CPU
    seconds, once it has ended."""

    def __init__(self, put: Callable[[bytes | memoryview], None], most: int = BEHIND_BYTES):
        self.put, self.most = put, most
        self.items: deque = deque()
        self.queued = 0  # bytes queued and not yet written
        self.error: BaseException | None = None
        self.stopping = False
        self.cpu = 0.0
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True, name="brevis-writer")
        start_thread(self.thread)

    def add(self, streams: list) -> None:
        """Queue streams, to be written in order (after those queued before)."""
        size = sum(len(x) for x in streams)
        with self.cond:
            while self.queued > self.most and self.error is None:
                self.cond.wait()
            self._raise()
            self.items.append((streams, size))
            self.queued += size
            self.cond.notify_all()

    def mark(self) -> threading.Event:
        ticket = threading.Event()
        with self.cond:
            self.items.append(ticket)
            self.cond.notify_all()
        return ticket

    def check(self) -> None:
        """The first failure to write, raised, if any."""
        with self.cond:
            self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        start = time.thread_time()
        while True:
            with self.cond:
                while not self.items:
                    self.cond.wait()
                item = self.items.popleft()
            if item is None:
                break
            if isinstance(item, threading.Event):
                item.set()
                continue
            streams, size = item
            for data in streams:
                if self.error is None and not self.stopping:
                    try:
                        self.put(data)
                    except BaseException as e:  # (an interrupt goes to the main thread only)
                        self.error = e
            with self.cond:
                self.queued -= size
                self.cond.notify_all()
        self.cpu = time.thread_time() - start

    def wait(self, ticket: threading.Event) -> None:
        """Until `ticket` is set; the first failure raised. Should the
        thread have ended without setting it, that is a failure too, not
        a wait for ever."""
        while not ticket.wait(0.25):
            if not self.thread.is_alive():
                with self.cond:
                    self.error = self.error or RuntimeError("the archive's writing thread ended early")
                break
        self.check()

    def close(self, drop: bool = False) -> None:
        """Write what is queued (or, `drop`, drop it) and end the thread."""
        with self.cond:
            self.stopping = self.stopping or drop
            self.items.append(None)
            self.cond.notify_all()
        self.thread.join()


class ArchiveWriter:
    def __init__(self, path: Path, force: bool = False):
        self.path = Path(path)
        self.force = force
        if self.path.is_dir():
            raise OutputExists(f"{self.path} is a folder")
        if self.path.exists() and not force:
            raise OutputExists(f"{self.path} exists", option="force")
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if not parent.is_dir():
            raise InvalidArgument(f"cannot write {self.path}: folder {parent} does not exist")
        started = time.time_ns()
        try:
            self.tmp, fd = make_temp(parent, self.path.name)
        except OSError as e:
            raise io_failure(e, f"cannot write {self.path}") from None
        self.file = None
        self.offset = 0  # where the next stream goes (queued streams included)
        self.behind: _Behind | None = None  # write_behind's thread
        self.pending: list = []  # streams for it, handed over at the next mark
        self.behind_cpu = 0.0  # its CPU seconds, once finished
        self.unsynced = 0
        self.syncing: threading.Thread | None = None
        self.sync_error: OSError | None = None
        try:
            self.file = os.fdopen(fd, "wb")  # closing it releases the lock
            remove_stale(parent, self.path.name, started)
            self._write(pack_header())
        except BaseException:
            if self.file is None:
                os.close(fd)
            self.abort()
            raise
        assert self.offset == HEADER_SIZE

    def write_behind(self) -> None:
        """From now on, streams are written by a thread of their own, at
        most BEHIND_BYTES behind write_stream, which returns at once: the
        copy into the page cache leaves the thread that takes the encoded
        chunks (compressing nomic at -j2 it was 90 of the main thread's 164
        ms of CPU, perf). A stream's bytes must stay as they are until it
        is written: `mark` and `wait` tell when."""
        if self.behind is None:
            self.behind = _Behind(self._put)

    def mark(self) -> threading.Event | None:
        """A ticket for the streams written so far (None: they are on the
        file already). The streams since the last mark go to the writing
        thread now, together: a hand-over (a wake-up) per batch of chunks,
        not per stream."""
        if self.behind is None:
            return None
        if self.pending:
            self.behind.add(self.pending)
            self.pending = []
        return self.behind.mark()

    def wait(self, ticket: threading.Event | None) -> None:
        """Until the streams before `ticket` (mark) are on the file; a failure to write them raised."""
        if ticket is not None and self.behind is not None:
            self.behind.wait(ticket)

    def _end_behind(self, drop: bool = False) -> None:
        """The writing thread's streams written (or, `drop`, dropped) and the thread ended; its failure raised."""
        behind, self.behind = self.behind, None
        if behind is None:
            return
        pending, self.pending = self.pending, []
        try:
            if pending and not drop:
                behind.add(pending)
        finally:
            behind.close(drop)
            self.behind_cpu = behind.cpu
        if drop:
            return
        if behind.error is not None:
            raise behind.error
        try:
            self.file.flush()
            written = self.file.tell()
        except OSError as e:
            raise io_failure(e, f"cannot write {self.path}") from None
        if written != self.offset:  # (every stream's location is in the index: none may be missing)
            raise BrevisError(f"cannot write {self.path}: {self.offset - written} bytes of streams were not written")

    def _write(self, data: bytes | memoryview) -> None:
        self._put(data)
        self.offset += len(data)

    def _put(self, data: bytes | memoryview) -> None:
        try:
            self.file.write(data)
            self.unsynced += len(data)
            if self.unsynced >= SYNC_BYTES and not (self.syncing and self.syncing.is_alive()):
                self.file.flush()
                self.unsynced = 0
                self.syncing = threading.Thread(target=self._sync, args=(self.file.fileno(),), daemon=True)
                start_thread(self.syncing)
        except OSError as e:
            raise io_failure(e, f"cannot write {self.path}") from None

    def _sync(self, fd: int) -> None:
        try:
            _datasync(fd)
        except OSError as e:
            # Kept for finish: after a failed flush Linux may report the next fsync clean.
            self.sync_error = e

    def _wait_for_sync(self) -> None:
        if self.syncing is not None:
            self.syncing.join()  # before the descriptor closes
            self.syncing = None

    def write_stream(self, data: bytes, crc: int) -> tuple[int, int, int]:
        """Append a stream; its location and the CRC-32 of its bytes."""
        where = (self.offset, len(data), crc)
        if self.behind is not None:
            self.pending.append(data)
            self.offset += len(data)
        else:
            self._write(data)
        return where

    def finish(self, index: Index) -> int:
        """Write index and footer, then move the archive into place; its size."""
        self._end_behind()
        obj = index.to_json()
        raw = json.dumps(obj, separators=(",", ":")).encode("ascii")
        # Level 15: on a checkpoint of many small tensors (taesd, 456 chunks)
        # the index is 11 % smaller than at level 9, for 40 ms.
        stored = zstandard.ZstdCompressor(level=15).compress(raw)
        footer = Footer(self.offset, len(stored), len(raw), index_digest(stored, VERSION))
        self._check_readable(obj, footer)
        self._write(stored)
        self._write(footer.pack())
        self._wait_for_sync()
        try:
            if self.sync_error is not None:
                raise self.sync_error
            self.file.flush()
            os.fsync(self.file.fileno())
            publish(self.file.fileno(), self.tmp, self.path, replace=self.force)
            self.file.close()
        except OSError as e:
            raise io_failure(e, f"cannot write {self.path}") from None
        return self.offset

    def _check_readable(self, obj: dict, footer: Footer) -> None:
        """Every check a reader makes of the footer and the index, made here
        first: an archive that readers would refuse is never published."""
        from .reader import count_entries

        size = footer.index_offset + footer.index_length + FOOTER_SIZE
        try:
            Footer.unpack(footer.pack(), size)
            with paused_gc():
                parsed = Index.from_json(obj, HEADER_SIZE, footer.index_offset)
            if count_entries(parsed) > max_entries(size):
                raise FormatError(f"index lists {count_entries(parsed)} entries, more than an archive of "
                                  f"{size} bytes may hold ({max_entries(size)})")
        except FormatError as e:
            raise BrevisError(f"cannot write {self.path}: readers would refuse it ({e})") from None

    def abort(self) -> None:
        self._end_behind(drop=True)
        self._wait_for_sync()
        try:
            if self.file is not None:
                self.file.close()
        except OSError:
            pass
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> "ArchiveWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
