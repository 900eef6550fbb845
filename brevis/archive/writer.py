"""Writing an archive in one pass: header, streams as they come, index, footer.

Everything goes to a temporary file beside the output, renamed into place
only once complete, so a failed or interrupted run leaves nothing at the
output path.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path

import zstandard

from ..errors import IOFailure, OutputExists
from .format import FOOTER_SIZE, HEADER_SIZE, Footer, index_digest, pack_header
from .index import Index


def io_failure(e: OSError, what: str) -> IOFailure:
    reason = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return IOFailure(f"{what}: {reason}")


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
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".partial", dir=parent)
        except OSError as e:
            raise io_failure(e, f"cannot write {self.path}") from None
        self.tmp = Path(tmp)
        self.file = os.fdopen(fd, "wb")
        self.offset = 0
        self._write(pack_header())
        assert self.offset == HEADER_SIZE

    def _write(self, data: bytes | memoryview) -> None:
        try:
            self.file.write(data)
        except OSError as e:
            raise io_failure(e, f"cannot write {self.path}") from None
        self.offset += len(data)

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
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            # mkstemp made it private; an archive gets the usual permissions.
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(self.tmp, 0o666 & ~umask)
            os.replace(self.tmp, self.path)
        except OSError as e:
            raise io_failure(e, f"cannot write {self.path}") from None
        return self.offset

    def abort(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> "ArchiveWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
