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

from ..errors import IOFailure, OutputExists
from ..fs.atomic import io_failure, make_temp, publish, remove_stale
from .format import HEADER_SIZE, Footer, index_digest, pack_header
from .index import Index


# Written bytes between flushes to disk in the background while encoding
# goes on, so that the final fsync finds little left to write.
SYNC_BYTES = 64 << 20
_datasync = getattr(os, "fdatasync", os.fsync)


class ArchiveWriter:
    def __init__(self, path: Path, force: bool = False):
        self.path = Path(path)
        if self.path.is_dir():
            raise OutputExists(f"{self.path} is a folder")
        if self.path.exists() and not force:
            raise OutputExists(f"{self.path} exists (use --force to overwrite)")
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if not parent.is_dir():
            raise IOFailure(f"cannot write {self.path}: folder {parent} does not exist")
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
                self.syncing.start()
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
        raw = json.dumps(index.to_json(), separators=(",", ":")).encode("ascii")
        stored = zstandard.ZstdCompressor(level=9).compress(raw)
        footer = Footer(self.offset, len(stored), len(raw), index_digest(stored))
        self._write(stored)
        self._write(footer.pack())
        self._wait_for_sync()
        try:
            if self.sync_error is not None:
                raise self.sync_error
            self.file.flush()
            os.fsync(self.file.fileno())
            publish(self.file.fileno(), self.tmp, self.path)
            self.file.close()
        except OSError as e:
            raise io_failure(e, f"cannot write {self.path}") from None
        return self.offset

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
