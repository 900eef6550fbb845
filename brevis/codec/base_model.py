"""A base model that tensors are coded against (`--base`).

The base is a checkpoint folder or file (parsed like any source) or a
Brevis archive (decoded chunk by chunk on demand). Tensors are matched by
file and name, or by name alone where it is unique, and must agree in
dtype and shape. The archive records, for every segment coded against the
base, which base tensor it used and the SHA-256 of that tensor's bytes, so
a wrong or changed base is refused instead of decoding garbage.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..archive.reader import ArchiveReader
from ..archive.format import MAGIC
from ..dtypes import DType
from ..errors import ChecksumError, InvalidArgument
from ..formats import layout
from ..fs.sources import collect, read_exactly

READ_BYTES = 1 << 20


@dataclass(eq=False)
class BaseTensor:
    file: str  # path as named in the base
    name: str
    dtype: DType
    shape: tuple[int, ...]
    length: int
    read: Callable[[int, int], bytes]  # (offset within the tensor, length) -> bytes
    path: str | None = None  # the file holding the tensor's bytes, where the base is plain files
    offset: int = 0  # of the tensor in that file
    _digest: bytes | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def digest(self) -> bytes:
        """SHA-256 of the tensor's bytes (computed once, streaming)."""
        with self._lock:
            if self._digest is None:
                h = hashlib.sha256()
                for off in range(0, self.length, READ_BYTES):
                    h.update(self.read(off, min(READ_BYTES, self.length - off)))
                self._digest = h.digest()
            return self._digest


class Base:
    def __init__(self, tensors: list[BaseTensor], description: str, closer=None):
        self.description = description
        self.tensors = tensors
        self._closer = closer
        self.by_key = {(t.file, t.name): t for t in tensors}
        self.by_name: dict[str, list[BaseTensor]] = {}
        for t in tensors:
            self.by_name.setdefault(t.name, []).append(t)

    @staticmethod
    def open(path: str | os.PathLike) -> "Base":
        p = Path(path)
        if not p.exists():
            raise InvalidArgument(f"base {p}: no such file or folder")
        if p.is_file():
            with open(p, "rb") as f:
                if f.read(len(MAGIC)) == MAGIC:
                    return _archive_base(p)
        return _files_base(p)

    def match(self, file: str, name: str, dtype: DType | None, shape) -> BaseTensor | None:
        """The base tensor for a tensor of the checkpoint, if one fits."""
        if dtype is None or shape is None:
            return None
        t = self.by_key.get((file, name))
        if t is None:
            same = self.by_name.get(name, [])
            t = same[0] if len(same) == 1 else None
        if t is None or t.dtype != dtype or tuple(t.shape) != tuple(shape):
            return None
        return t

    def exact(self, file: str, name: str) -> BaseTensor | None:
        return self.by_key.get((file, name))

    def close(self) -> None:
        if self._closer:
            self._closer()
            self._closer = None

    def __enter__(self) -> "Base":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _files_base(path: Path) -> Base:
    files, _ = collect([path])
    fds: list[int] = []
    tensors: list[BaseTensor] = []
    try:
        for s in files:
            fd = os.open(s.path, os.O_RDONLY)
            fds.append(fd)
            with os.fdopen(os.dup(fd), "rb") as f:
                _, segments = layout(f, os.fstat(fd).st_size, s.name)
            for seg in segments:
                if seg.dtype is not None and seg.shape is not None and seg.length:
                    tensors.append(BaseTensor(
                        s.name, seg.name, seg.dtype, seg.shape, seg.length,
                        lambda off, n, fd=fd, start=seg.offset, p=s.path: read_exactly(fd, f"base {p}", start + off, n),
                        str(s.path), seg.offset))
    except OSError as e:
        for fd in fds:
            os.close(fd)
        raise InvalidArgument(f"cannot read base {path}: {e.strerror}") from None
    return Base(tensors, str(path), lambda: [os.close(fd) for fd in fds])


def _archive_base(path: Path) -> Base:
    reader = ArchiveReader(path)
    if reader.index.base:
        reader.close()
        raise InvalidArgument(f"base {path} is itself coded against a base; decompress it first")
    tensors = []
    for f in reader.index.files:
        for seg in f.segments:
            if seg.dtype is not None and seg.shape is not None and seg.length:
                tensors.append(BaseTensor(f.path, seg.name, seg.dtype, seg.shape, seg.length,
                                          _ChunkedReader(reader, seg)))
    return Base(tensors, str(path), reader.close)


class _ChunkedReader:
    """Reads a byte range of an archived segment by decoding the chunks it spans."""

    def __init__(self, reader: ArchiveReader, seg):
        self.reader, self.seg = reader, seg
        self.starts = []
        pos = 0
        for c in seg.chunks:
            self.starts.append(pos)
            pos += c.n * seg.itemsize
        self.cache: dict[int, bytes] = {}
        self.lock = threading.Lock()

    def _chunk(self, i: int) -> bytes:
        with self.lock:
            if i in self.cache:
                return self.cache[i]
        data = self.reader.decode_chunk(self.seg, self.seg.chunks[i]).tobytes()
        with self.lock:
            if len(self.cache) >= 4:  # the few chunks that threads are on
                self.cache.pop(next(iter(self.cache)))
            self.cache[i] = data
        return data

    def __call__(self, offset: int, length: int) -> bytes:
        import bisect

        out = bytearray()
        i = max(0, bisect.bisect_right(self.starts, offset) - 1)
        while len(out) < length:
            if i >= len(self.starts):
                raise ChecksumError("base archive is shorter than its index says")
            data = self._chunk(i)
            start = offset + len(out) - self.starts[i]
            out += data[start:start + length - len(out)]
            i += 1
        return bytes(out)
