"""Writing an archive in one pass: header, streams as they come, index, footer.

Everything goes to a temporary file beside the output, renamed into place
only once complete, so a failed or interrupted run leaves nothing at the
output path.

Temporaries are named `.NAME.XXXXXXXX.partial` and locked (flock) by the
run that writes them. A run killed outright (SIGKILL, power loss) cannot
remove its own; the next run for the same output removes those that are
older than itself and that no live process holds locked (the lock dies
with its process). Decompression stages its folder the same way.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path

import zstandard

from ..errors import IOFailure, OutputExists
from .format import HEADER_SIZE, Footer, index_digest, pack_header
from .index import Index


# Written bytes between flushes to disk in the background while encoding
# goes on, so that the final fsync finds little left to write.
SYNC_BYTES = 64 << 20
_datasync = getattr(os, "fdatasync", os.fsync)


def io_failure(e: OSError, what: str) -> IOFailure:
    reason = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return IOFailure(f"{what}: {reason}")


TEMP_SUFFIX = ".partial"
# ".NAME." + 8 random characters + ".partial" must fit in a 255-byte file name.
_TEMP_NAME_BYTES = 255 - 1 - 1 - 8 - len(TEMP_SUFFIX)


def temp_prefix(name: str) -> str:
    """".NAME." for the temporaries of NAME, cut to keep the whole name short enough."""
    return "." + os.fsdecode(os.fsencode(name)[:_TEMP_NAME_BYTES]) + "."


def lock_temp(fd: int, path: Path) -> bool:
    """Lock a temporary just created; False if a cleaner removed it first (make another).

    Where the filesystem has no flock, the temporary stays unlocked, and
    remove_stale leaves it alone for the same reason.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        return True
    try:
        return os.lstat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def make_temp(parent: Path, name: str, folder: bool = False) -> tuple[Path, int]:
    """A locked temporary file (or folder) for NAME in parent: (path, fd holding the lock).

    Ctrl-C and SIGTERM are held back while it is made (in the main thread),
    so an interruption cannot fall between its creation and the caller's
    cleanup: it is raised here, after the temporary is removed again, or
    once the caller holds it.
    """
    prefix = temp_prefix(name)
    held = _hold_signals()
    path = fd = None
    try:
        while True:
            if folder:
                path = Path(tempfile.mkdtemp(prefix=prefix, suffix=TEMP_SUFFIX, dir=parent))
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            else:
                fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=TEMP_SUFFIX, dir=parent)
                path = Path(tmp)
            if lock_temp(fd, path):
                break
            os.close(fd)
            path = fd = None
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a pending Ctrl-C is raised here
            held = None
        return path, fd
    except BaseException:
        if fd is not None:
            os.close(fd)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True) if folder else path.unlink(missing_ok=True)
        raise
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _hold_signals():
    """Block SIGINT and SIGTERM in the main thread; the previous mask, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def remove_stale(parent: Path, name: str, before_ns: int) -> list[Path]:
    """Remove the temporaries of earlier runs for NAME in parent: entries named
    like ours, last changed before `before_ns`, that no live process holds
    locked. Best effort: anything unclear is left alone."""
    pattern = re.compile(re.escape(os.fsencode(temp_prefix(name))) + rb"[a-z0-9_]{8}"
                         + re.escape(TEMP_SUFFIX.encode()))
    removed = []
    try:
        entries = os.listdir(os.fsencode(parent))
    except OSError:
        return removed
    for entry in entries:
        if not pattern.fullmatch(entry):
            continue
        path = os.path.join(os.fsencode(parent), entry)
        try:
            st = os.lstat(path)
            folder = stat.S_ISDIR(st.st_mode)
            if st.st_mtime_ns >= before_ns or not (folder or stat.S_ISREG(st.st_mode)):
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if folder else 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its run is alive
            if os.lstat(path).st_ino != st.st_ino:
                continue
            if folder:
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(Path(os.fsdecode(path)))
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


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
            # mkstemp made it private; an archive gets the usual permissions.
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(self.file.fileno(), 0o666 & ~umask)
            # Renamed while still open: the lock keeps other runs' cleanup off it.
            os.replace(self.tmp, self.path)
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
