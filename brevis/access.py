"""Random access to the tensors of an archive, without decompressing it.

    with brevis.open("ckpt.brv") as ckpt:
        w = ckpt["model.layers.0.mlp.up_proj.weight"]   # decodes that tensor only
        ckpt.info("model.embed_tokens.weight")          # dtype, shape, file, sizes, programs

`brevis.open` returns an `Archive`: a read-only Mapping from tensor name to
numpy array. Only the index is read at open (header, footer, index); a
tensor is read and decoded when it is asked for, and only its own chunks
are read, each checked against its digest (and its streams' checks,
where it fails, to name the damaged one). Nothing is cached:
asking twice decodes twice.

Names. The tensors are the typed segments of every file (safetensors,
PyTorch storages, GGUF plain tensors and metadata arrays, ONNX
initializers), and the tensors a segment gathers (small ones of one
dtype, coded together); byte segments (headers, gaps, GGUF quantized
blocks) are not. A tensor's key is its name where no other tensor of the archive has
it (the shards of a sharded checkpoint included); a name several tensors
share makes each of their keys "path/in/archive::name", and a name that
appears twice in one file gets "#1", "#2", ... after its later
occurrences. "path::name" is accepted for every tensor. Iteration follows
archive order.

Frameworks. `Archive.tensor(name, "pt")` and `state_dict("pt")` give torch
tensors made with torch.frombuffer on the decoded bytes (no copy, BF16
and F8 as torch's own dtypes); `safe_open` and `load_file` offer the same
as safetensors does. torch is imported only when asked for. Stored files
(config.json, tokenizers) are read whole by path with `read_file`.

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
import shutil
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from .archive.index import FileEntry, Index, TensorRef
from .archive.reader import ArchiveReader
from .fs.atomic import io_failure, make_temp, publish
from .dtypes import DType
from .errors import InvalidArgument, IOFailure, OutputExists

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
    """(key -> (file, tensor) in archive order, other accepted name -> key,
    shared bare name -> its keys), by the rule of the module doc."""
    entries: dict[str, tuple[FileEntry, TensorRef]] = {}
    aliases: dict[str, str] = {}
    ambiguous: dict[str, list[str]] = {}
    tensors = [(f, t) for f in index.files for t in f.tensors()]
    counts = Counter(s.name for _, s in tensors)
    for f, s in tensors:
        key = base = s.name if counts[s.name] == 1 else f"{f.path}{QUALIFIER}{s.name}"
        k = 0
        while key in entries:  # the same name twice in one file
            k += 1
            key = f"{base}#{k}"
        entries[key] = (f, s)
    for key, (f, s) in entries.items():
        if counts[s.name] > 1:
            ambiguous.setdefault(s.name, []).append(key)
        else:  # "path::name" is accepted for every tensor
            qualified = f"{f.path}{QUALIFIER}{s.name}"
            if qualified not in entries:
                aliases[qualified] = key
    return entries, aliases, ambiguous


_TORCH = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
          "I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64",
          "U8": "uint8", "U16": "uint16", "U32": "uint32", "U64": "uint64",
          "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
_FRAMEWORKS = {"pt": "pt", "torch": "pt", "pytorch": "pt", "np": "np", "numpy": "np"}


class BitsWarning(UserWarning):
    """A BF16 or F8 tensor given to numpy as its bits (uint16/uint8): numpy
    has no such dtype and ml_dtypes is not installed."""


def _framework(name: str) -> str:
    kind = _FRAMEWORKS.get(str(name).lower())
    if kind is None:
        raise InvalidArgument(f"framework {name!r} is not supported: use 'pt' (torch) or 'np' (numpy)")
    if kind == "pt":
        _torch()
    return kind


def _torch():
    try:
        import torch
    except ImportError:
        raise InvalidArgument("torch is not installed (pip install torch), or use framework='np'") from None
    return torch


def _warn_bits(dtype: str) -> None:
    import warnings

    warnings.warn(f"{dtype} tensors come as their bits ({'uint16' if dtype == 'BF16' else 'uint8'}): numpy has "
                  f"no {dtype} dtype; pip install ml_dtypes to get them typed, or use framework='pt'",
                  BitsWarning, stacklevel=3)


def _torch_tensor(out: np.ndarray, s: TensorRef, device: str = "cpu"):
    """A torch tensor on the decoded bytes themselves (torch.frombuffer: it
    shares `out`'s memory and keeps it alive)."""
    torch = _torch()
    dtype = getattr(torch, _TORCH[s.dtype.name], None)
    if dtype is None:
        raise InvalidArgument(f"this torch ({torch.__version__}) has no {s.dtype.name} dtype")
    if s.length == 0:
        t = torch.empty(s.shape, dtype=dtype)
    else:
        t = torch.frombuffer(out, dtype=dtype).reshape(s.shape)
    return t if device == "cpu" else t.to(device)


def follow_links(index: Index, path: str) -> str:
    """The archive path an archived link at `path` points at (itself for
    anything else); a link, or a folder above `path`, that is an archived
    link is followed too. The reader checked that links end at a file or a
    folder, so this ends."""
    from .archive.schema import link_target

    links = {k.path: k.target for k in index.links}
    if not links:
        return path
    for _ in range(len(links) + 1):
        parts = path.split("/")
        for i in range(len(parts), 0, -1):
            head = "/".join(parts[:i])
            if head in links:
                path = "/".join([link_target(head, links[head])] + parts[i:])
                break
        else:
            return path
    return path


class Archive(Mapping):
    """A read-only mapping from tensor name to numpy array; see the module doc."""

    def __init__(self, path: str | os.PathLike, *, ml_dtypes: bool | None = None, base=None,
                 _index_only: bool = False):
        from .codec.chunks import ChunkDecoder

        self.path = Path(path)
        self._ml = _ml_dtypes(ml_dtypes)
        self._reader: ArchiveReader | None = ArchiveReader(self.path)
        self.index = self._reader.index
        try:
            # Checks the base, if the archive has one; listing needs no base (ls).
            self._decoder = None if _index_only else ChunkDecoder(self._reader, base)
        except BaseException:
            self._reader.close()
            raise
        self._entries, self._aliases, self._ambiguous = name_tensors(self.index)

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
        s, out = self.decode_bytes(name)
        out.setflags(write=False)
        array = out.view(self.numpy_dtype(s.dtype)).reshape(s.shape)
        array.setflags(write=False)
        return array

    def decode_bytes(self, name: str) -> tuple[TensorRef, np.ndarray]:
        """A tensor's entry and its bytes, decoded into a new (writable)
        uint8 array that nothing else refers to."""
        f, t = self._entries[self._resolve(name)]
        self._open_reader()
        available = available_memory()
        if available is not None and t.length > available:
            raise InvalidArgument(f"tensor {name!r} is {t.length} bytes, more than the {available} bytes of memory "
                                  "available: extract it to a file instead (brevis.extract)")
        try:
            out = np.empty(t.length, np.uint8)
        except MemoryError:
            raise InvalidArgument(f"tensor {name!r} is {t.length} bytes: not enough memory to hold it") from None
        return t, self._decode_into(t, out)

    def _decode_into(self, t: TensorRef, out: np.ndarray) -> np.ndarray:
        """A tensor's bytes into `out`: the chunks of its segment holding
        them, READ_WINDOW at a time, each decoded in its place where it lies
        within the tensor (every chunk of a tensor's own segment), else
        beside it and cut (a tensor its segment gathers with others)."""
        from .codec.chunks import READ_WINDOW

        seg, start, end = t.segment, t.start, t.start + t.length
        spans, at = [], 0  # (chunk, its offset in the segment) of those holding the tensor's bytes
        for chunk in seg.chunks:
            n = chunk.n * seg.itemsize
            if at < end and at + n > start:
                spans.append((chunk, at))
            at += n
        for w in range(0, len(spans), READ_WINDOW):
            window = spans[w:w + READ_WINDOW]
            for (chunk, at), stored in zip(window, self._reader.read_runs([c for c, _ in window])):
                n = chunk.n * seg.itemsize
                if start <= at and at + n <= end:
                    self._decoder.decode(seg, chunk, at, out[at - start:at - start + n], stored)
                    continue
                data = np.frombuffer(self._decoder.decode(seg, chunk, at, None, stored), np.uint8)
                lo, hi = max(start, at), min(end, at + n)
                out[lo - start:hi - start] = data[lo - at:hi - at]
        return out

    def tensor(self, name: str, framework: str = "np", device: str = "cpu"):
        """One tensor as `framework` gives it: "np" (a writable numpy array;
        see numpy_dtype for BF16 and F8) or "pt" (a torch tensor, BF16 and
        F8 included, made with torch.frombuffer on the decoded bytes: no
        copy), on `device`."""
        kind = _framework(framework)
        s, out = self.decode_bytes(name)
        if kind == "pt":
            return _torch_tensor(out, s, device)
        if device != "cpu":
            raise InvalidArgument(f"numpy arrays are on the cpu, not {device!r}")
        if s.dtype.name in _ML_DTYPES and self._ml is None:
            _warn_bits(s.dtype.name)
        return out.view(self.numpy_dtype(s.dtype)).reshape(s.shape)

    def state_dict(self, framework: str = "pt", device: str = "cpu") -> dict:
        """Every tensor of the archive, by key (plain names where unique), as
        `tensor` gives them: what model.load_state_dict takes."""
        _framework(framework)
        return {key: self.tensor(key, framework, device) for key in self._entries}

    # ------------------------------------------------------------ files
    def paths(self) -> list[str]:
        """The archived files and links, in archive order."""
        return [f.path for f in self.index.files] + [k.path for k in self.index.links]

    def read_file(self, path: str) -> bytes:
        """The bytes of one archived file (config.json, a tokenizer, a whole
        checkpoint file), every chunk checked; an archived link reads as
        what it points at."""
        files = {f.path: f for f in self.index.files}
        path = follow_links(self.index, str(path).strip("/"))
        entry = files.get(path)
        if entry is None:
            what = "a folder" if any(p.startswith(path + "/") for p in files) else "no file"
            raise InvalidArgument(f"{path!r} is {what} in {self.path} (`brevis ls {self.path}` lists the files)")
        self._open_reader()
        return b"".join(self._decoder.decode(*w) if isinstance(w, tuple) else w
                        for w in self._decoder.in_file_order(entry))

    def info(self, name: str) -> dict:
        """What the index says about one tensor; decodes nothing."""
        key = self._resolve(name)
        f, t = self._entries[key]
        s = t.segment
        return {"key": key, "name": t.name, "file": f.path, "dtype": t.dtype.name,
                "numpy_dtype": str(self.numpy_dtype(t.dtype)), "shape": list(t.shape),
                "original_bytes": t.length, "stored_bytes": t.stored, "chunks": len(s.chunks),
                "programs": [p.describe(s.value_type) for p in s.programs],
                "gathered_with": len(s.members) - 1 if t.gathered else 0}

    def files(self) -> list[dict]:
        """Every file of the archive with its tensors, from the index alone."""
        tensors: dict[int, list[dict]] = {id(f): [] for f in self.index.files}
        for key, (f, t) in self._entries.items():
            tensors[id(f)].append({"key": key, "name": t.name, "dtype": t.dtype.name, "shape": list(t.shape),
                                   "original_bytes": t.length, "stored_bytes": t.stored})
        return [{"path": f.path, "original_bytes": f.size, "format": f.format, "stored_bytes": f.stored,
                 "tensors": tensors[id(f)]} for f in self.index.files]

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


def available_memory() -> int | None:
    """Bytes of memory the system can still give (MemAvailable on Linux), or
    None where unknown: a tensor larger than that is refused before it is
    allocated, since with overcommit np.empty would succeed and decoding
    into it end in the OOM killer."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def open_archive(path: str | os.PathLike, *, ml_dtypes: bool | None = None, base=None) -> Archive:
    """Open an archive for random access to its tensors (exported as brevis.open);
    `base`: the base model, for an archive made with compress --base."""
    return Archive(path, ml_dtypes=ml_dtypes, base=base)


class SafeOpen:
    """safetensors' safe_open, on an archive: `with brevis.safe_open(path,
    framework="pt") as f: f.keys(), f.get_tensor(name)`. Every tensor of
    every file of the archive, by its key (its plain name where no other
    tensor has it, else "path/in/archive::name"; "path::name" is always
    accepted); each decoded when asked for. Also `state_dict()` (all of
    them) and `read_file(path)` (any archived file: config.json, a
    tokenizer). framework "pt": torch tensors (BF16 and F8 included) on the
    decoded bytes, without a copy; "np": numpy arrays (BF16 and F8 as
    ml_dtypes types when it is installed, else their bits as uint16/uint8,
    with a BitsWarning)."""

    def __init__(self, path: str | os.PathLike, framework: str = "pt", device: str = "cpu", *, base=None):
        self.framework = _framework(framework)
        self.device = device
        self.archive = Archive(path, base=base)

    def keys(self) -> list[str]:
        return list(self.archive)

    def get_tensor(self, name: str):
        return self.archive.tensor(name, self.framework, self.device)

    def get_slice(self, name: str) -> "TensorSlice":
        return TensorSlice(self, name)

    def metadata(self) -> dict[str, str] | None:
        """The `__metadata__` of the archive's one safetensors file, if it
        holds exactly one; else None."""
        import json

        files = [f for f in self.archive.index.files if f.format == "safetensors"]
        if len(files) != 1:
            return None
        data = self.archive.read_file(files[0].path)
        size = int.from_bytes(data[:8], "little") if len(data) >= 8 else 0
        try:
            header = json.loads(data[8:8 + size])
        except ValueError:
            return None
        meta = header.get("__metadata__") if isinstance(header, dict) else None
        return meta if isinstance(meta, dict) else None

    def state_dict(self) -> dict:
        return self.archive.state_dict(self.framework, self.device)

    def read_file(self, path: str) -> bytes:
        return self.archive.read_file(path)

    def paths(self) -> list[str]:
        return self.archive.paths()

    def close(self) -> None:
        self.archive.close()

    def __enter__(self) -> "SafeOpen":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TensorSlice:
    """safetensors' get_slice: shape and dtype from the index; indexing
    decodes the tensor and slices it."""

    def __init__(self, owner: SafeOpen, name: str):
        self.owner, self.name = owner, name
        self.info = owner.archive.info(name)

    def get_shape(self) -> list[int]:
        return list(self.info["shape"])

    def get_dtype(self) -> str:
        return self.info["dtype"]

    def __getitem__(self, index):
        return self.owner.get_tensor(self.name)[index]


def safe_open(path: str | os.PathLike, framework: str = "pt", device: str = "cpu", *, base=None) -> SafeOpen:
    """Open an archive as safetensors.safe_open opens a file (see SafeOpen)."""
    return SafeOpen(path, framework, device, base=base)


def load_file(path: str | os.PathLike, device: str = "cpu", *, framework: str = "pt", base=None) -> dict:
    """Every tensor of an archive, as safetensors.torch.load_file gives a
    file's (framework="np": as safetensors.numpy.load_file): a state dict."""
    with safe_open(path, framework, device, base=base) as f:
        return f.state_dict()


def ls(archive: str | os.PathLike) -> dict:
    """Files and tensors from the index alone: archive, archive_bytes,
    original_bytes, file_count, tensor_count, and files, each {path,
    original_bytes, format, stored_bytes, tensors: [{key, name, dtype, shape,
    original_bytes, stored_bytes}]}; links, each {path, target}."""
    with Archive(archive, ml_dtypes=False, _index_only=True) as a:
        files = a.files()
        return {"archive": str(archive), "archive_bytes": a._open_reader().size,
                "original_bytes": a.index.original_bytes, "file_count": len(files), "tensor_count": len(a),
                "files": files, "link_count": len(a.index.links),
                "links": [{"path": k.path, "target": k.target} for k in a.index.links]}


# ------------------------------------------------------------ extract
def _safetensors_header(chosen: list[tuple[str, TensorRef]]) -> bytes:
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
            raise OutputExists(f"{out} exists", option="force")
        parent = out.absolute().parent
        if not parent.is_dir():
            raise InvalidArgument(f"cannot write {out}: folder {parent} does not exist")
        a._open_reader()
        needed = len(header) + sum(s.length for _, s in chosen)
        try:
            free = shutil.disk_usage(parent).free
        except OSError as e:
            raise io_failure(e, f"cannot write {out}") from None
        if needed > free:
            raise IOFailure(f"{out}: needs {needed} bytes, {free} free on disk")
        try:
            # The writer's temporaries: the name cut to fit, locked against other runs' cleanup.
            tmp, fd = make_temp(parent, out.name)
        except OSError as e:
            raise io_failure(e, f"cannot write {out}") from None
        try:
            with os.fdopen(fd, "wb") as f, Pool(threads) as pool:
                try:
                    f.write(header)
                    # A tensor's chunks, or, where its segment gathers it with others, the tensor.
                    work = [w for _, t in chosen for w in ([t] if t.gathered else a._decoder.work_segment(t.segment))]
                    for data in pool.ordered_map(lambda w: a._decode_into(w, np.empty(w.length, np.uint8))
                                                 if isinstance(w, TensorRef) else a._decoder.decode(*w), work):
                        f.write(memoryview(data))
                    f.flush()
                    os.fsync(f.fileno())
                    publish(f.fileno(), tmp, out, replace=force)
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
            "tensor_count": len(chosen), "original_bytes": data_bytes, "output_bytes": len(header) + data_bytes,
            "seconds": time.perf_counter() - start}
