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
from pathlib import Path

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
        self.offset = 0
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

    def _write(self, data: bytes | memoryview) -> None:
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
        self.offset += len(data)

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
        self._write(data)
        return where

    def finish(self, index: Index) -> int:
        """Write index and footer, then move the archive into place; its size."""
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
