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


def is_tensor(seg) -> bool:
    """A segment that can be a base tensor (or be coded against one)."""
    return seg.dtype is not None and seg.shape is not None and seg.length > 0


def tensor_keys(segments) -> dict[int, str]:
    """The name each tensor of a file is matched by (id(segment) -> key;
    `segments`: its segments, or its tensors, in file order):
    its own where no other tensor of the file has it, else NAME#K, the
    K-th (from 0) of that name in file order (an optimizer's state holds
    one `exp_avg` per parameter)."""
    tensors = [s for s in segments if is_tensor(s)]
    count: dict[str, int] = {}
    for s in tensors:
        count[s.name] = count.get(s.name, 0) + 1
    seen: dict[str, int] = {}
    keys = {}
    for s in tensors:
        if count[s.name] > 1:
            k = seen.get(s.name, 0)
            keys[id(s)], seen[s.name] = f"{s.name}#{k}", k + 1
        else:
            keys[id(s)] = s.name
    return keys


def keyed_tensors(segments):
    """(segment, key, own_name) of every tensor of a file: its key as
    tensor_keys gives it, and its own name where the key is not it."""
    keys = tensor_keys(segments)
    for seg in segments:
        if is_tensor(seg):
            key = keys[id(seg)]
            yield seg, key, (seg.name if key != seg.name else None)


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
    own_name: str | None = None  # its name in the file, where `name` is a key NAME#K (tensor_keys)
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
    def __init__(self, tensors: list[BaseTensor], description: str, closer=None, series: dict | None = None):
        self.description = description
        self.series = series  # an archive's series record, where it is a member of a run
        self.tensors = tensors
        self._closer = closer
        self.by_key = {(t.file, t.name): t for t in tensors}
        # Archives made before tensor_keys named a repeated name plainly and
        # were matched to the last tensor of that name.
        self.by_own_name = {(t.file, t.own_name): t for t in tensors if t.own_name is not None}
        self.by_name: dict[str, list[BaseTensor]] = {}
        for t in tensors:
            self.by_name.setdefault(t.name, []).append(t)

    @staticmethod
    def open(path: str | os.PathLike, chain: tuple = ()) -> "Base":
        """The base at `path`; `chain`: the archives being decoded that lead to
        it (series.py refuses a run whose predecessors go round in a loop)."""
        p = Path(path)
        if not p.exists():
            raise InvalidArgument(f"base {p}: no such file or folder")
        if p.is_file():
            with open(p, "rb") as f:
                if f.read(len(MAGIC)) == MAGIC:
                    return _archive_base(p, chain)
        return _files_base(p)

    @property
    def vouched(self) -> bool:
        """A member of a training run, whose content identity the successor
        checked (series.py) and whose chunks are checked as they decode: its
        tensors' SHA-256 need not be computed again."""
        return self.series is not None

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
        return self.by_key.get((file, name)) or self.by_own_name.get((file, name))

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
            for seg, key, own_name in keyed_tensors(segments):
                tensors.append(BaseTensor(
                    s.name, key, seg.dtype, seg.shape, seg.length,
                    lambda off, n, fd=fd, start=seg.offset, p=s.path: read_exactly(fd, f"base {p}", start + off, n),
                    str(s.path), seg.offset, own_name=own_name))
    except OSError as e:
        for fd in fds:
            os.close(fd)
        raise InvalidArgument(f"cannot read base {path}: {e.strerror}") from None
    return Base(tensors, str(path), lambda: [os.close(fd) for fd in fds])


def _archive_base(path: Path, chain: tuple = ()) -> Base:
    """The tensors of a Brevis archive, decoded chunk by chunk on demand. A
    member of a training run brings its own predecessors (series.py); any
    other archive made against a base cannot serve as one."""
    from .chunks import ChunkDecoder

    reader = ArchiveReader(path)
    try:
        if reader.index.base and not reader.index.series:
            raise InvalidArgument(f"base {path} is itself coded against a base; decompress it first")
        decoder = ChunkDecoder(reader, chain=chain)
    except BaseException:
        reader.close()
        raise
    cache = _ChunkCache(decoder)
    tensors = []
    readers: dict[int, _ChunkedReader] = {}  # id(segment) -> its reader, shared by the tensors it gathers
    for f in reader.index.files:
        for t, key, own_name in keyed_tensors(f.tensors()):
            read = readers.get(id(t.segment))
            if read is None:
                read = readers[id(t.segment)] = _ChunkedReader(cache, t.segment)
            if t.start:
                read = (lambda offset, n, read=read, at=t.start: read(at + offset, n))
            tensors.append(BaseTensor(f.path, key, t.dtype, t.shape, t.length, read, own_name=own_name))
    return Base(tensors, str(path), reader.close, reader.index.series)


class _ChunkCache:
    """The last few decoded chunks of an archive, shared by its tensors: the
    chunks that the threads decoding a successor are on (each is decoded
    once where the successor's chunks line up with it, as a run's do)."""

    ENTRIES = 8

    def __init__(self, decoder):
        self.decoder = decoder
        self.chunks: dict[tuple[int, int], bytes] = {}
        self.lock = threading.Lock()

    def get(self, seg, i: int, start: int):
        key = (id(seg), i)
        with self.lock:
            data = self.chunks.get(key)
        if data is None:
            data = self.decoder.decode(seg, seg.chunks[i], start)
            with self.lock:
                if len(self.chunks) >= self.ENTRIES:
                    self.chunks.pop(next(iter(self.chunks)))
                self.chunks[key] = data
        return data


class _ChunkedReader:
    """Reads a byte range of an archived segment by decoding the chunks it spans."""

    def __init__(self, cache: _ChunkCache, seg):
        self.cache, self.seg = cache, seg
        self.starts = []
        pos = 0
        for c in seg.chunks:
            self.starts.append(pos)
            pos += c.n * seg.itemsize

    def __call__(self, offset: int, length: int):
        import bisect

        i = max(0, bisect.bisect_right(self.starts, offset) - 1)
        parts = []
        have = 0
        while have < length:
            if i >= len(self.starts):
                raise ChecksumError("base archive is shorter than its index says")
            data = self.cache.get(self.seg, i, self.starts[i])
            start = offset + have - self.starts[i]
            part = data[start:start + length - have]
            parts.append(part)
            have += len(part)
            i += 1
        return parts[0] if len(parts) == 1 else b"".join(bytes(p) for p in parts)
