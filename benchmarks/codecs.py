"""The compressors compared: Brevis and its peers, one small class each.

A codec turns an item (a list of files) into compressed form and back, in
two ways, each timed in its own worker process (worker.py):

- **file to file** (`compress`, `decompress`): the files are read from the
  corpus and the outputs written to a folder (on tmpfs or on disk, as the
  harness chooses), the way the codec's documentation does it for files
  (streaming where it streams);
- **in memory** (`compress_memory`, `decompress_memory`): the input is
  already in memory (read before the clock starts) and the output is kept
  in memory (a list of buffers per file, no needless joins or copies).

Peers compress each file on its own; an item's compressed size is the
total over its files. Codec objects (compressors, configs) are made once
per run by `begin`, outside the timed part, and reused for every file.
What a peer is told about a file (its dtype, the tensors' boundaries) is
worked out by `prepare`, also outside the timed part: it gets that for
free, while Brevis finds it itself inside its timed run.
Everything here runs inside a worker process, so a codec imports its
library only when used and the peak memory measured is that codec's alone.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

STREAM_CHUNK = 1 << 20

Parts = list  # one file's bytes: a list of buffers, in order


def read_all(path_or_file) -> bytearray:
    """A whole file in one writable buffer (no copy after the read)."""
    f = open(path_or_file, "rb") if isinstance(path_or_file, (str, os.PathLike)) else path_or_file
    try:
        size = os.fstat(f.fileno()).st_size
        buf = bytearray(size)
        view, done = memoryview(buf), 0
        while done < size:
            n = f.readinto(view[done:])
            if not n:
                raise OSError(f"{getattr(f, 'name', '?')}: short read")
            done += n
        return buf
    finally:
        if f is not path_or_file:
            f.close()


def write_parts(fout, parts: Parts) -> None:
    for p in parts:
        fout.write(p)


class Codec:
    name = ""  # key in results and on the command line
    label = ""  # for tables and the plot
    module = ""  # the optional library it needs, if any
    threads_note = ""  # how it uses the threads it is given, for the report
    imports: tuple[str, ...] = ()  # modules its timed calls use, imported before the clock starts
    reads_files = False  # in memory too: then its input is not read into memory first (it would only add to the peak)

    def available(self) -> str | None:
        """None if usable here, else why not."""
        if not self.module:
            return None
        try:
            __import__(self.module)
        except Exception as e:  # a missing or broken install
            return f"{self.module} not importable ({type(e).__name__}: {e})"
        return None

    def unsupported(self, files: list[Path], dtypes: list[dict[str, int]]) -> str | None:
        """None if it can compress every file, else why not (reported '–')."""
        return None

    def begin(self, threads: int) -> None:
        """Make the codec objects this run reuses (outside the timed part)."""

    def prepare(self, files: list[Path], dtypes: list[dict[str, int]]) -> list:
        """What the codec is told about each file (outside the timed part)."""
        return dtypes

    # file to file
    def compress(self, files: list[Path], names: list[str], metas: list, work: Path, threads: int) -> None:
        raise NotImplementedError

    def decompress(self, work: Path, names: list[str], out: Path, threads: int) -> None:
        raise NotImplementedError

    # in memory
    def compress_memory(self, files: list[Path], inputs: list[bytearray], names: list[str], metas: list,
                        work: Path, threads: int) -> list[Parts] | None:
        """The compressed form of each file, kept in memory."""
        raise NotImplementedError

    def save(self, compressed: list[Parts] | None, names: list[str], work: Path) -> None:
        """Write compress_memory's result under `work` (outside the timed part)."""
        raise NotImplementedError

    def load(self, work: Path, names: list[str]) -> list:
        """The compressed form read back into memory (outside the timed part)."""
        raise NotImplementedError

    def decompress_memory(self, loaded: list, names: list[str], threads: int) -> list[Parts] | None:
        """Each file's original bytes, kept in memory; None where they were
        decoded in other processes (and so cannot be hashed here)."""
        raise NotImplementedError


class PerFile(Codec):
    """A compressor applied to each file of the item on its own."""

    ext = ""

    def compress(self, files, names, metas, work, threads):
        for src, name, meta in zip(files, names, metas):
            dst = work / (name + self.ext)
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(src, "rb") as fin, open(dst, "wb") as fout:
                self.compress_stream(fin, fout, threads, meta)

    def decompress(self, work, names, out, threads):
        for name in names:
            dst = out / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(work / (name + self.ext), "rb") as fin, open(dst, "wb") as fout:
                self.decompress_stream(fin, fout, threads)

    def compress_memory(self, files, inputs, names, metas, work, threads):
        return [self.compress_bytes(buf, threads, meta) for buf, meta in zip(inputs, metas)]

    def save(self, compressed, names, work):
        for parts, name in zip(compressed, names):
            dst = work / (name + self.ext)
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(dst, "wb") as f:
                write_parts(f, parts)

    def load(self, work, names):
        return [read_all(work / (name + self.ext)) for name in names]

    def decompress_memory(self, loaded, names, threads):
        return [self.decompress_bytes(memoryview(blob), threads) for blob in loaded]

    # streams (file to file) and buffers (in memory)
    def compress_stream(self, fin, fout, threads: int, meta) -> None:
        raise NotImplementedError

    def decompress_stream(self, fin, fout, threads: int) -> None:
        raise NotImplementedError

    def compress_bytes(self, data: bytearray, threads: int, meta) -> Parts:
        raise NotImplementedError

    def decompress_bytes(self, blob: memoryview, threads: int) -> Parts:
        raise NotImplementedError


class WholeFile(PerFile):
    """A codec with no streaming interface: file to file reads the whole
    file into memory, compresses it as in memory, writes the parts."""

    def compress_stream(self, fin, fout, threads, meta):
        write_parts(fout, self.compress_bytes(read_all(fin), threads, meta))

    def decompress_stream(self, fin, fout, threads):
        write_parts(fout, self.decompress_bytes(memoryview(read_all(fin)), threads))


# ---------------------------------------------------------------- Brevis

class Brevis(Codec):
    """Brevis has no bytes-in API for compression: compression "in memory"
    is the Python API from the files (in the page cache) to an archive on
    tmpfs, the same work as file to file on tmpfs. Decompression in memory
    is `brevis.unpack` on the archive's bytes, read into memory before the
    clock as every peer's input is: every file decoded into one buffer of
    its own on N threads, every chunk's digest checked (the archive's format
    version's: XXH3-128 from version 7 on) and, where a chunk fails, its
    streams' checks, to name the damaged one; no file written."""

    name, label = "brevis", "Brevis"
    reads_files = True
    # What brevis.compress and unpack import on first use: the format
    # parsers (the first file's scan) and the worker processes' executor
    # (inputs of PROCESS_MIN_BYTES or more) too, which were imported inside
    # the clock of every compression up to 1f7f11d (3-10 ms a run).
    imports = ("contextlib", "brevis.api", "brevis.archive.reader", "brevis.codec.chunks", "brevis.codec.decoder",
               "brevis.codec.encoder", "brevis.workers.heap", "brevis.formats.discovery", "brevis.formats.gguf",
               "brevis.formats.numpy_files", "brevis.formats.onnx", "brevis.formats.pytorch",
               "brevis.formats.safetensors", "brevis.workers.executor", "multiprocessing.popen_fork",
               "multiprocessing.synchronize")
    threads_note = ("file to file: chunks in worker processes (from 3 threads, inputs of 32 MiB or more) or "
                    "threads; in memory (brevis.unpack): threads")

    def compress(self, files, names, metas, work, threads):
        import brevis

        brevis.compress([str(f) for f in files], work / "item.brv", threads=threads, force=True)

    def decompress(self, work, names, out, threads):
        import brevis

        # Checks every chunk's checksum on the way, inside the timed run. The
        # trailing separator: an archive of one file puts it inside `out` too.
        brevis.decompress(work / "item.brv", os.path.join(out, ""), threads=threads, force=True)

    def compress_memory(self, files, inputs, names, metas, work, threads):
        self.compress(files, names, metas, work, threads)
        return None

    def save(self, compressed, names, work):
        pass  # the archive is under `work` already

    def load(self, work, names):
        with open(work / "item.brv", "rb") as f:
            return f.read()

    def decompress_memory(self, loaded, names, threads):
        import brevis

        files = brevis.unpack(loaded, threads=threads)
        return [[files[n]] for n in names]


# ---------------------------------------------------------------- general-purpose peers

class Zstd(PerFile):
    module, ext = "zstandard", ".zst"
    imports = ("zstandard",)
    threads_note = "threads=N (zstd's own worker threads)"

    def __init__(self, level: int):
        self.level = level
        self.name, self.label = f"zstd-{level}", f"zstd -{level}"

    def begin(self, threads):
        import zstandard

        self.c = zstandard.ZstdCompressor(level=self.level, threads=threads if threads > 1 else 0)
        self.d = zstandard.ZstdDecompressor()

    def compress_stream(self, fin, fout, threads, meta):
        # Large reads: fed 1 MiB at a time, zstd's worker threads barely overlap.
        self.c.copy_stream(fin, fout, size=os.fstat(fin.fileno()).st_size,
                           read_size=16 * STREAM_CHUNK, write_size=STREAM_CHUNK)

    def decompress_stream(self, fin, fout, threads):
        self.d.copy_stream(fin, fout, read_size=STREAM_CHUNK, write_size=STREAM_CHUNK)

    def compress_bytes(self, data, threads, meta):
        return [self.c.compress(data)]  # records the content size: one allocation when decoding

    def decompress_bytes(self, blob, threads):
        return [self.d.decompress(blob)]


class Gzip(PerFile):
    name, label, ext = "gzip-9", "gzip -9", ".gz"
    imports = ("gzip",)
    threads_note = "one thread"

    def compress_stream(self, fin, fout, threads, meta):
        import gzip

        with gzip.GzipFile(fileobj=fout, mode="wb", compresslevel=9, mtime=0) as g:
            shutil.copyfileobj(fin, g, STREAM_CHUNK)

    def decompress_stream(self, fin, fout, threads):
        import gzip

        with gzip.GzipFile(fileobj=fin, mode="rb") as g:
            shutil.copyfileobj(g, fout, STREAM_CHUNK)

    def compress_bytes(self, data, threads, meta):
        import gzip

        return [gzip.compress(data, compresslevel=9, mtime=0)]  # one zlib call

    def decompress_bytes(self, blob, threads):
        import gzip

        return [gzip.decompress(blob)]


class Xz(PerFile):
    """xz -6. With several threads, like `xz -T N`: the file is cut into
    24 MiB blocks (xz's default for -6, 3 x the dictionary) compressed in
    parallel and written as consecutive .xz streams, which any xz reads.
    Decompression is single-threaded (Python's lzma)."""

    name, label, ext = "xz-6", "xz -6", ".xz"
    imports = ("lzma", "concurrent.futures")
    threads_note = "24 MiB blocks on N threads (compression); one thread (decompression)"
    BLOCK = 24 << 20

    def compress_stream(self, fin, fout, threads, meta):
        import lzma

        if threads <= 1:
            with lzma.LZMAFile(fout, "wb", preset=6) as x:
                shutil.copyfileobj(fin, x, STREAM_CHUNK)
            return

        def blocks():
            while block := fin.read(self.BLOCK):
                yield block

        write_parts(fout, self._parallel(blocks(), threads))

    def _parallel(self, blocks, threads):
        import lzma
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:  # lzma releases the GIL
            window, any_block = [], False
            for block in blocks:
                any_block = True
                window.append(pool.submit(lzma.compress, block, preset=6))
                if len(window) >= threads:
                    yield window.pop(0).result()
            for f in window:
                yield f.result()
        if not any_block:  # an empty file: one empty stream, which any xz reads
            yield lzma.compress(b"", preset=6)

    def decompress_stream(self, fin, fout, threads):
        import lzma

        with lzma.LZMAFile(fin, "rb") as x:  # reads consecutive streams
            shutil.copyfileobj(x, fout, STREAM_CHUNK)

    def compress_bytes(self, data, threads, meta):
        import lzma

        if threads <= 1:
            return [lzma.compress(data, preset=6)]
        view = memoryview(data)
        return list(self._parallel((view[i: i + self.BLOCK] for i in range(0, len(view), self.BLOCK)), threads))

    def decompress_bytes(self, blob, threads):
        import lzma

        return [lzma.decompress(blob)]  # reads consecutive streams


class Brotli(PerFile):
    QUALITY = 9  # 11 runs at well under 1 MB/s on float data: too slow for 1.35 GB
    name, label, module, ext = f"brotli-{QUALITY}", f"brotli -{QUALITY}", "brotli", ".br"
    imports = ("brotli",)
    threads_note = "one thread"

    def compress_stream(self, fin, fout, threads, meta):
        import brotli

        c = brotli.Compressor(quality=self.QUALITY)
        while chunk := fin.read(STREAM_CHUNK):
            fout.write(c.process(chunk))
        fout.write(c.finish())

    def decompress_stream(self, fin, fout, threads):
        import brotli

        d = brotli.Decompressor()
        while chunk := fin.read(STREAM_CHUNK):
            fout.write(d.process(chunk))
        if not d.is_finished():
            raise ValueError("truncated brotli stream")

    def compress_bytes(self, data, threads, meta):
        import brotli

        return [brotli.compress(data, quality=self.QUALITY)]

    def decompress_bytes(self, blob, threads):
        import brotli

        return [brotli.decompress(blob)]


class Lz4(PerFile):
    name, label, module, ext = "lz4", "lz4", "lz4", ".lz4"
    imports = ("lz4.frame",)
    threads_note = "one thread"

    def compress_stream(self, fin, fout, threads, meta):
        import lz4.frame

        with lz4.frame.LZ4FrameFile(fout, "wb") as z:
            shutil.copyfileobj(fin, z, STREAM_CHUNK)

    def decompress_stream(self, fin, fout, threads):
        import lz4.frame

        with lz4.frame.LZ4FrameFile(fin, "rb") as z:
            shutil.copyfileobj(z, fout, STREAM_CHUNK)

    def compress_bytes(self, data, threads, meta):
        import lz4.frame

        return [lz4.frame.compress(data)]  # records the content size

    def decompress_bytes(self, blob, threads):
        import lz4.frame

        return [lz4.frame.decompress(blob)]


# ---------------------------------------------------------------- numeric and model-specific peers

class ZipNN(WholeFile):
    """ZipNN's byte-array mode, with the file's float dtype.

    ZipNN 0.5.4 rewrites the buffer it is given (even a `bytes`) and may
    write past the end of one whose length is not a multiple of the element
    size, so it is given the file's own freshly read buffer, cut to its
    largest whole-element prefix (a memoryview: no copy), after the 0-3
    bytes left have been copied out and stored raw. Layout: 1 byte (tail
    length), the tail, ZipNN's output. One ZipNN object per dtype for
    compressing and one for decompressing (the dtype is in its header),
    reused for every file. A file is handled only if most of its tensor
    bytes are one float dtype ZipNN knows; an item with any other file is
    reported '–'. (ZipNN itself copies its input once more inside compress:
    `ba_saved = bytearray(ba)`, unused.)
    """

    name, label, module, ext = "zipnn", "ZipNN", "zipnn", ".znn"
    imports = ("zipnn",)
    threads_note = "threads=N (its own C threads)"
    DTYPES = {"BF16": ("bfloat16", 2), "F16": ("float16", 2), "F32": ("float32", 4)}

    @classmethod
    def float_dtype(cls, dtypes: dict[str, int]) -> str | None:
        total = sum(dtypes.values())
        floats = [d for d in cls.DTYPES if dtypes.get(d, 0) * 2 > total]
        return floats[0] if floats else None

    def unsupported(self, files, dtypes):
        for f, dt in zip(files, dtypes):
            if self.float_dtype(dt) is None:
                shown = ", ".join(sorted(dt, key=dt.get, reverse=True)) or "no tensors found"
                return f"{f.name}: not mostly BF16/F16/F32 ({shown})"
        return None

    def begin(self, threads):
        from zipnn import ZipNN as Z

        self.compressors = {d: Z(input_format="byte", bytearray_dtype=z, threads=max(1, threads))
                            for d, (z, _) in self.DTYPES.items()}
        self.decompressor = Z(input_format="byte", threads=max(1, threads))

    def prepare(self, files, dtypes):
        return [self.float_dtype(dt) for dt in dtypes]

    def compress_bytes(self, data, threads, meta):
        size = self.DTYPES[meta][1]
        cut = len(data) - len(data) % size
        parts = [bytes([len(data) - cut]) + bytes(data[cut:])]  # copied before ZipNN may write past `cut`
        if cut:
            parts.append(self.compressors[meta].compress(memoryview(data)[:cut]))
        return parts

    def decompress_bytes(self, blob, threads):
        n = blob[0]
        tail = blob[1: 1 + n]
        if len(blob) == 1 + n:
            return [tail]
        return [self.decompressor.decompress(blob[1 + n:]), tail]


class Pcodec(WholeFile):
    """pcodec applied tensor by tensor with the tensor's dtype (BF16 as
    uint16: pcodec has no bfloat16; 8-bit types are not pcodec's and go
    with the rest), the rest of the file (headers, names, other dtypes) as
    one zstd -3 frame, as issue 18 measured it. The tensors' boundaries
    are found by Brevis's own format parsers in `prepare`, outside the
    timed part (a pcodec user has the arrays already). One ChunkConfig per
    run; each tensor is handed over as a view of the file's buffer (a
    copy only where it is not aligned to its element size, which pcodec
    refuses), and decoded straight into its place in the output buffer
    (`simple_decompress_into`). Layout: u32 manifest length, manifest
    (zstd -3 of JSON: per segment its kind, length and, for a tensor, its
    blob length), the blobs, the zstd frame of the rest (with its content
    size). In memory the compressed form is that list of bytes objects, as
    pcodec returns them and takes them back. pcodec holds the
    GIL and runs one thread per call (measured: two calls on two threads
    take twice as long as one), so it runs on one thread; the zstd frame
    of the rest gets the N threads."""

    module, ext = "pcodec", ".pco"
    imports = ("json", "pcodec.standalone", "zstandard")
    threads_note = "one thread (pcodec holds the GIL); the zstd -3 rest on N threads"
    NUMPY = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I32": "<i4", "I64": "<i8",
             "I16": "<i2", "U16": "<u2", "U32": "<u4", "U64": "<u8"}
    MIN_TENSOR = 64  # bytes; smaller ones go with the rest

    def __init__(self, level: int):
        self.level = level
        self.name, self.label = f"pcodec-{level}", f"pcodec level {level}"

    def begin(self, threads):
        import zstandard
        from pcodec import ChunkConfig

        self.config = ChunkConfig(compression_level=self.level)
        self.z = zstandard.ZstdCompressor(level=3, threads=threads if threads > 1 else 0)
        self.d = zstandard.ZstdDecompressor()

    def prepare(self, files, dtypes):
        """Per file: [(kind or None, length)] tiling it, kind a key of NUMPY."""
        import numpy as np

        from brevis.formats import layout

        out = []
        for f in files:
            size = f.stat().st_size
            with open(f, "rb") as fh:
                _, segments = layout(fh, size, f.name)
            plan, pos = [], 0
            for seg in segments:
                if seg.offset != pos:  # not a tiling: the whole file as bytes
                    plan, pos = [], size
                    break
                kind = seg.dtype.name if seg.dtype is not None else None
                ok = (kind in self.NUMPY and seg.length >= self.MIN_TENSOR
                      and seg.length % np.dtype(self.NUMPY[kind]).itemsize == 0)
                plan.append((kind if ok else None, seg.length))
                pos = seg.end
            if pos != size:
                plan = []
            out.append(plan or [(None, size)])
        return out

    def compress_bytes(self, data, threads, meta):
        import json

        import numpy as np
        from pcodec import standalone

        view = memoryview(data)
        manifest, blobs, rest = [], [], []
        pos = 0
        for kind, length in meta:
            chunk = view[pos: pos + length]
            pos += length
            if kind is None:
                manifest.append([None, length, 0])
                rest.append(chunk)
                continue
            values = np.frombuffer(chunk, dtype=self.NUMPY[kind])
            if not values.flags.aligned:
                values = values.copy()
            blob = standalone.simple_compress(values, self.config)
            manifest.append([kind, length, len(blob)])
            blobs.append(blob)
        head = self.z.compress(json.dumps(manifest).encode())
        rest_size = sum(len(r) for r in rest)
        c = self.z.compressobj(size=rest_size)
        frame = [c.compress(r) for r in rest] + [c.flush()]
        return [len(head).to_bytes(4, "little"), head] + blobs + frame

    def decompress_stream(self, fin, fout, threads):
        # Each blob read as a bytes object of its own: pcodec takes only bytes.
        head = fin.read(4)
        head += fin.read(int.from_bytes(head, "little"))
        manifest = self._manifest(head)
        blobs = [fin.read(b) for kind, _, b in manifest if kind is not None]
        write_parts(fout, self._decode(manifest, blobs, fin.read()))

    def load(self, work, names):
        """Per file: [head, blob, ..., rest], each a bytes object as
        compress_memory gave them (pcodec decodes only from bytes)."""
        out = []
        for name in names:
            with open(work / (name + self.ext), "rb") as f:
                head = f.read(4)
                head += f.read(int.from_bytes(head, "little"))
                blobs = [f.read(b) for kind, _, b in self._manifest(head) if kind is not None]
                out.append([head, *blobs, f.read()])
        return out

    def decompress_memory(self, loaded, names, threads):
        return [self._decode(self._manifest(parts[0]), parts[1:-1], parts[-1]) for parts in loaded]

    def _manifest(self, head) -> list:
        import json

        return json.loads(self.d.decompress(head[4:]))

    def _decode(self, manifest, blobs, rest) -> Parts:
        import numpy as np
        from pcodec import standalone

        total = sum(length for _, length, _ in manifest)
        out = np.empty(total, np.uint8)
        rest = self.d.decompress(rest)
        at = r = 0
        tensors = iter(blobs)
        for kind, length, _ in manifest:
            if kind is None:
                if length:
                    out[at: at + length] = np.frombuffer(rest, np.uint8, length, r)
                r += length
            else:
                dst = out[at: at + length].view(self.NUMPY[kind])
                if dst.flags.aligned:
                    standalone.simple_decompress_into(next(tensors), dst)
                else:
                    out[at: at + length] = standalone.simple_decompress(next(tensors)).view(np.uint8)
            at += length
        return [out]


class Blosc2(WholeFile):
    """blosc2 with byte shuffle and zstd at clevel 5 (its default codec and
    level), the file's dominant element size as typesize (from the same
    dtype table ZipNN gets), blosc2's own N threads (cparams/dparams
    nthreads), automatic block size. Frames of at most 1 GiB (a blosc2
    frame holds under 2 GB), each after its u64 length."""

    name, label, module, ext = "blosc2", "blosc2 shuffle+zstd", "blosc2", ".b2"
    imports = ("blosc2",)
    threads_note = "nthreads=N (its own threads)"
    SIZES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4,
             "I64": 8, "U64": 8}

    def begin(self, threads):
        import blosc2

        n = max(1, threads)
        self.cparams = {t: blosc2.CParams(codec=blosc2.Codec.ZSTD, clevel=5, typesize=t, nthreads=n,
                                          filters=[blosc2.Filter.SHUFFLE], filters_meta=[0])
                        for t in (1, 2, 4, 8)}
        self.dparams = blosc2.DParams(nthreads=n)

    def prepare(self, files, dtypes):
        return [self.SIZES.get(max(dt, key=dt.get), 1) if dt else 1 for dt in dtypes]

    def compress_bytes(self, data, threads, meta):
        import blosc2

        view = memoryview(data)
        step = (1 << 30) // meta * meta
        parts = []
        for start in range(0, len(view), step):
            frame = blosc2.compress2(view[start: start + step], cparams=self.cparams[meta])
            parts += [len(frame).to_bytes(8, "little"), frame]
        return parts

    def decompress_bytes(self, blob, threads):
        import blosc2

        parts, pos = [], 0
        while pos < len(blob):
            n = int.from_bytes(blob[pos: pos + 8], "little")
            parts.append(blosc2.decompress2(blob[pos + 8: pos + 8 + n], dparams=self.dparams))
            pos += 8 + n
        return parts


ALL: list[Codec] = [Brevis(), Zstd(3), Zstd(19), Gzip(), Xz(), Brotli(), Lz4(), ZipNN(), Pcodec(8), Pcodec(12),
                    Blosc2()]
BY_NAME: dict[str, Codec] = {c.name: c for c in ALL}
# Run unless --codecs names them (or says "all"): each takes 20-40 minutes of
# the corpus per timed pass on 2 cores, and a codec has four compression passes.
SLOW = {"zstd-19", "xz-6", "brotli-9"}
DEFAULT = [c.name for c in ALL if c.name not in SLOW]
