"""Random access to the tensors of an archive, without decompressing it.

    with brevis.open("ckpt.brv") as ckpt:
        w = ckpt["model.layers.0.mlp.up_proj.weight"]   # decodes that tensor only
        ckpt.info("model.embed_tokens.weight")          # dtype, shape, file, sizes, programs

`brevis.open` returns an `Archive`: a read-only Mapping from tensor name to
numpy array. Only the index is read at open (header, footer, index); a
tensor is read and decoded when it is asked for, and only its own chunks
are read, each checked against its CRCs and digest. Nothing is cached:
asking twice decodes twice.

Names. The tensors are the typed segments of every file (safetensors,
PyTorch storages, GGUF plain tensors and metadata arrays, ONNX
initializers); byte segments (headers, gaps, GGUF quantized blocks) are
not. When a single file of the archive holds tensors and their names are
unique, a tensor's key is its name. Otherwise (tensors in several files,
or a name that appears twice) every key is "path/in/archive::name", and a
bare name is still accepted where only one tensor has it. A name that
appears twice in one file gets "#1", "#2", ... after its later
occurrences. Iteration follows archive order.

Arrays. The tensor's dtype as numpy (F16 float16, F32 float32, F64
float64, I8-I64, U8-U64, BOOL bool), its shape from the index, read-only.
BF16, F8_E4M3 and F8_E5M2 have no numpy dtype: they come as ml_dtypes'
bfloat16, float8_e4m3fn and float8_e5m2 when ml_dtypes can be imported,
else as uint16/uint8 arrays of the same bits (`open(..., ml_dtypes=False)`
always gives the bits, `ml_dtypes=True` requires the package). Either way
the bytes are exactly the original ones; `info(name)["dtype"]` says what
they are.

Threads. One Archive serves any number of threads: streams are read with
os.pread, the zstd decompressors are per thread, and the Archive itself
changes no state after open. Do not close it while other threads read.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from .archive.index import FileEntry, Index, SegmentEntry
from .archive.reader import ArchiveReader
from .fs.atomic import io_failure, make_temp, publish
from .dtypes import DType
from .errors import InvalidArgument, OutputExists

QUALIFIER = "::"

_NUMPY = {
    "F16": "<f2", "F32": "<f4", "F64": "<f8",
    "I8": "i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
    "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8",
    "BOOL": "?",
    "BF16": "<u2", "F8_E4M3": "u1", "F8_E5M2": "u1",  # the bits, without ml_dtypes
}
_ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


class UnknownTensor(InvalidArgument, KeyError):
    """A name that is not (or not unambiguously) a tensor of the archive.

    A KeyError for Mapping users, an invalid argument (exit 2) for the CLI."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def _ml_dtypes(required: bool | None):
    if required is False:
        return None
    try:
        import ml_dtypes
    except ImportError:
        if required:
            raise InvalidArgument("ml_dtypes is not installed (pip install ml_dtypes)") from None
        return None
    return ml_dtypes


def name_tensors(index: Index):
    """(key -> (file, segment) in archive order, unique bare name -> key,
    shared bare name -> its keys), by the rule of the module doc."""
    entries: dict[str, tuple[FileEntry, SegmentEntry]] = {}
    aliases: dict[str, str] = {}
    ambiguous: dict[str, list[str]] = {}
    tensors = [(f, s) for f in index.files for s in f.segments if s.dtype is not None]
    counts = Counter(s.name for _, s in tensors)
    qualify = len({f.path for f, _ in tensors}) > 1 or any(n > 1 for n in counts.values())
    for f, s in tensors:
        key = base = f"{f.path}{QUALIFIER}{s.name}" if qualify else s.name
        k = 0
        while key in entries:  # the same name twice in one file
            k += 1
            key = f"{base}#{k}"
        entries[key] = (f, s)
    if qualify:
        for key, (_, s) in entries.items():
            if counts[s.name] > 1:
                ambiguous.setdefault(s.name, []).append(key)
            elif s.name not in entries:
                aliases[s.name] = key
    return entries, aliases, ambiguous


class Archive(Mapping):
    """A read-only mapping from tensor name to numpy array; see the module doc."""

    def __init__(self, path: str | os.PathLike, *, ml_dtypes: bool | None = None, base=None):
        from .codec.chunks import ChunkDecoder

        self.path = Path(path)
        self._ml = _ml_dtypes(ml_dtypes)
        self._reader: ArchiveReader | None = ArchiveReader(self.path)
        self.index = self._reader.index
        try:
            self._decoder = ChunkDecoder(self._reader, base)  # checks the base, if the archive has one
        except BaseException:
            self._reader.close()
            raise
        self._entries, self._aliases, self._ambiguous = name_tensors(self.index)
        self._keys = {id(s): key for key, (_, s) in self._entries.items()}

    # ------------------------------------------------------------ names
    def _resolve(self, name) -> str:
        if isinstance(name, str):
            if name in self._entries:
                return name
            if name in self._aliases:
                return self._aliases[name]
            if name in self._ambiguous:
                raise UnknownTensor(f"{name!r} names {len(self._ambiguous[name])} tensors in {self.path}: "
                                    f"use one of {', '.join(map(repr, self._ambiguous[name]))}")
        raise UnknownTensor(f"no tensor {name!r} in {self.path} (`brevis ls {self.path}` lists the names)")

    def key(self, name: str) -> str:
        """The canonical key of a name (a key, or a bare name that is unique)."""
        return self._resolve(name)

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and (name in self._entries or name in self._aliases)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    # ------------------------------------------------------------ data
    def numpy_dtype(self, dtype: DType) -> np.dtype:
        if self._ml is not None and dtype.name in _ML_DTYPES:
            return np.dtype(getattr(self._ml, _ML_DTYPES[dtype.name]))
        return np.dtype(_NUMPY[dtype.name])

    def _open_reader(self) -> ArchiveReader:
        reader = self._reader
        if reader is None:
            raise InvalidArgument(f"{self.path}: archive is closed")
        return reader

    def __getitem__(self, name: str) -> np.ndarray:
        f, s = self._entries[self._resolve(name)]
        self._open_reader()
        out = np.empty(s.length, np.uint8)
        pos = 0
        for chunk in s.chunks:
            data = self._decoder.decode(s, chunk, pos)
            out[pos:pos + len(data)] = data
            pos += len(data)
        out.setflags(write=False)
        array = out.view(self.numpy_dtype(s.dtype)).reshape(s.shape)
        array.setflags(write=False)
        return array

    def info(self, name: str) -> dict:
        """What the index says about one tensor; decodes nothing."""
        key = self._resolve(name)
        f, s = self._entries[key]
        return {"key": key, "name": s.name, "file": f.path, "dtype": s.dtype.name,
                "numpy_dtype": str(self.numpy_dtype(s.dtype)), "shape": list(s.shape),
                "bytes": s.length, "stored_bytes": s.stored, "chunks": len(s.chunks),
                "programs": [p.describe(s.value_type) for p in s.programs]}

    def files(self) -> list[dict]:
        """Every file of the archive with its tensors, from the index alone."""
        return [{"path": f.path, "size": f.size, "format": f.format, "stored_bytes": f.stored,
                 "tensors": [{"key": self._keys[id(s)], "name": s.name, "dtype": s.dtype.name,
                              "shape": list(s.shape), "bytes": s.length, "stored_bytes": s.stored}
                             for s in f.segments if s.dtype is not None]}
                for f in self.index.files]

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "" if self._reader is not None else ", closed"
        return f"<brevis.Archive {str(self.path)!r}: {len(self)} tensors{state}>"


def open_archive(path: str | os.PathLike, *, ml_dtypes: bool | None = None, base=None) -> Archive:
    """Open an archive for random access to its tensors (exported as brevis.open);
    `base`: the base model, for an archive made with compress --base."""
    return Archive(path, ml_dtypes=ml_dtypes, base=base)


def ls(archive: str | os.PathLike) -> dict:
    """Files and tensors (key, name, dtype, shape, bytes) from the index alone."""
    with Archive(archive, ml_dtypes=False) as a:
        return {"archive": str(archive), "archive_bytes": a._open_reader().size,
                "original_bytes": a.index.original_bytes, "tensors": len(a), "files": a.files()}


# ------------------------------------------------------------ extract
def _safetensors_header(chosen: list[tuple[str, SegmentEntry]]) -> bytes:
    import json
    import struct

    header, offset = {}, 0
    for name, s in chosen:
        header[name] = {"dtype": s.dtype.name, "shape": list(s.shape),
                        "data_offsets": [offset, offset + s.length]}
        offset += s.length
    try:
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("a tensor name is not valid UTF-8 and cannot be written to safetensors") from None
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return struct.pack("<Q", len(text)) + text


def _same_file(a, b) -> bool:
    """Whether two paths name one file (through links too)."""
    try:
        return Path(a).absolute() == Path(b).absolute() or os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def extract(archive: str | os.PathLike, names, output: str | os.PathLike, *, force: bool = False,
            threads: int = 1, base=None) -> dict:
    """Write the named tensors to a safetensors file, bit for bit.

    Tensors keep their names in the file (their keys where two chosen
    tensors share a name), in the order asked. Written to a temporary file
    beside `output` and renamed into place."""
    from .workers.pool import Pool

    start = time.perf_counter()
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise InvalidArgument("no tensor named")
    out = Path(output)
    with Archive(archive, ml_dtypes=False, base=base) as a:
        unknown = [n for n in names if n not in a]
        if unknown:
            for n in unknown:
                if len(unknown) == 1 or n in a._ambiguous:
                    a.key(n)  # raises with the most precise message
            raise UnknownTensor(f"no tensors {', '.join(map(repr, unknown))} in {archive} "
                                f"(`brevis ls {archive}` lists the names)")
        keys = list(dict.fromkeys(a.key(n) for n in names))
        segs = [a._entries[k][1] for k in keys]
        counts = Counter(s.name for s in segs)
        chosen = [(s.name if counts[s.name] == 1 else k, s) for k, s in zip(keys, segs)]
        if any(name == "__metadata__" for name, _ in chosen):
            raise InvalidArgument("a tensor named '__metadata__' cannot be written to safetensors")
        header = _safetensors_header(chosen)
        for read in [archive] + ([base] if base is not None else []):
            if _same_file(read, out):
                raise InvalidArgument(f"the output {out} is also an input ({read}): it would be replaced")
        if out.is_dir():
            raise OutputExists(f"{out} is a folder")
        if os.path.lexists(out) and not force:
            raise OutputExists(f"{out} exists (use --force to overwrite)")
        parent = out.absolute().parent
        if not parent.is_dir():
            raise InvalidArgument(f"cannot write {out}: folder {parent} does not exist")
        a._open_reader()
        try:
            # The writer's temporaries: the name cut to fit, locked against other runs' cleanup.
            tmp, fd = make_temp(parent, out.name)
        except OSError as e:
            raise io_failure(e, f"cannot write {out}") from None
        try:
            with os.fdopen(fd, "wb") as f, Pool(threads) as pool:
                try:
                    f.write(header)
                    work = [w for _, s in chosen for w in a._decoder.work_segment(s)]
                    for data in pool.ordered_map(lambda w: a._decoder.decode(*w), work):
                        f.write(memoryview(data))
                    f.flush()
                    os.fsync(f.fileno())
                    publish(f.fileno(), tmp, out)
                except OSError as e:
                    raise io_failure(e, f"cannot write {out}") from None
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    data_bytes = sum(s.length for _, s in chosen)
    return {"archive": str(archive), "output": str(out), "tensors": [n for n, _ in chosen],
            "bytes": data_bytes, "file_bytes": len(header) + data_bytes,
            "seconds": time.perf_counter() - start}
