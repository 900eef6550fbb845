"""The compressors compared: Brevis and its peers, one small class each.

A codec turns an item (a list of files) into files under a work folder and
back. Peers compress each file separately, as Brevis compresses a folder
into one archive; the compressed size of an item is the total over its
files. Everything here runs inside a worker process (see worker.py), so a
codec imports its library only when used and the peak memory measured is
that codec's alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

STREAM_CHUNK = 1 << 20


class Codec:
    name = ""  # key in results and on the command line
    label = ""  # for tables and the plot
    module = ""  # the optional library it needs, if any

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

    def compress(self, files: list[Path], names: list[str], work: Path, threads: int,
                 dtypes: list[dict[str, int]]) -> None:
        raise NotImplementedError

    def decompress(self, work: Path, names: list[str], out: Path, threads: int) -> None:
        raise NotImplementedError


class PerFile(Codec):
    """A stream compressor applied to each file of the item on its own."""

    ext = ""

    def compress(self, files, names, work, threads, dtypes):
        for src, name, dt in zip(files, names, dtypes):
            dst = work / (name + self.ext)
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(src, "rb") as fin, open(dst, "wb") as fout:
                self.compress_stream(fin, fout, threads, dt)

    def decompress(self, work, names, out, threads):
        for name in names:
            dst = out / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            with open(work / (name + self.ext), "rb") as fin, open(dst, "wb") as fout:
                self.decompress_stream(fin, fout, threads)

    def compress_stream(self, fin, fout, threads: int, dtypes: dict[str, int]) -> None:
        raise NotImplementedError

    def decompress_stream(self, fin, fout, threads: int) -> None:
        raise NotImplementedError


class Brevis(Codec):
    name, label = "brevis", "Brevis"

    def compress(self, files, names, work, threads, dtypes):
        import brevis

        brevis.compress([str(f) for f in files], work / "item.brv", threads=threads, force=True)

    def decompress(self, work, names, out, threads):
        import brevis

        # Checks every chunk's checksum on the way, inside the timed run.
        brevis.decompress(work / "item.brv", out, threads=threads, force=True)


class Zstd(PerFile):
    module, ext = "zstandard", ".zst"

    def __init__(self, level: int):
        self.level = level
        self.name, self.label = f"zstd-{level}", f"zstd -{level}"

    def compress_stream(self, fin, fout, threads, dtypes):
        import zstandard

        # Large reads: fed 1 MiB at a time, zstd's worker threads barely overlap.
        zstandard.ZstdCompressor(level=self.level, threads=threads).copy_stream(
            fin, fout, read_size=16 * STREAM_CHUNK, write_size=STREAM_CHUNK)

    def decompress_stream(self, fin, fout, threads):
        import zstandard

        zstandard.ZstdDecompressor().copy_stream(fin, fout, read_size=STREAM_CHUNK, write_size=STREAM_CHUNK)


class Gzip(PerFile):
    name, label, ext = "gzip-9", "gzip -9", ".gz"

    def compress_stream(self, fin, fout, threads, dtypes):
        import gzip

        with gzip.GzipFile(fileobj=fout, mode="wb", compresslevel=9, mtime=0) as g:
            shutil.copyfileobj(fin, g, STREAM_CHUNK)

    def decompress_stream(self, fin, fout, threads):
        import gzip

        with gzip.GzipFile(fileobj=fin, mode="rb") as g:
            shutil.copyfileobj(g, fout, STREAM_CHUNK)


class Xz(PerFile):
    """xz -6. With several threads, like `xz -T N`: the file is cut into
    24 MiB blocks (xz's default for -6, 3 x the dictionary) compressed in
    parallel and written as consecutive .xz streams, which any xz reads."""

    name, label, ext = "xz-6", "xz -6", ".xz"
    BLOCK = 24 << 20

    def compress_stream(self, fin, fout, threads, dtypes):
        import lzma

        if threads <= 1:
            with lzma.LZMAFile(fout, "wb", preset=6) as x:
                shutil.copyfileobj(fin, x, STREAM_CHUNK)
            return
        from concurrent.futures import ThreadPoolExecutor

        def blocks():
            while block := fin.read(self.BLOCK):
                yield block

        with ThreadPoolExecutor(threads) as pool:  # lzma releases the GIL
            window = []
            for block in blocks():
                window.append(pool.submit(lzma.compress, block, preset=6))
                if len(window) >= threads:
                    fout.write(window.pop(0).result())
            for f in window:
                fout.write(f.result())

    def decompress_stream(self, fin, fout, threads):
        import lzma

        with lzma.LZMAFile(fin, "rb") as x:  # reads consecutive streams
            shutil.copyfileobj(x, fout, STREAM_CHUNK)


class Brotli(PerFile):
    QUALITY = 9  # 11 runs at well under 1 MB/s on float data: too slow for 1.35 GB
    name, label, module, ext = f"brotli-{QUALITY}", f"brotli -{QUALITY}", "brotli", ".br"

    def compress_stream(self, fin, fout, threads, dtypes):
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


class Lz4(PerFile):
    name, label, module, ext = "lz4", "lz4", "lz4", ".lz4"

    def compress_stream(self, fin, fout, threads, dtypes):
        import lz4.frame

        with lz4.frame.LZ4FrameFile(fout, "wb") as z:
            shutil.copyfileobj(fin, z, STREAM_CHUNK)

    def decompress_stream(self, fin, fout, threads):
        import lz4.frame

        with lz4.frame.LZ4FrameFile(fin, "rb") as z:
            shutil.copyfileobj(z, fout, STREAM_CHUNK)


class ZipNN(PerFile):
    """ZipNN's byte-array mode, with the file's float dtype.

    ZipNN 0.5.4 rewrites the buffer it is given and may write past the end
    of one whose length is not a multiple of the element size, so it gets a
    copy of the file's largest whole-element prefix; the 0-3 bytes left are
    stored raw. Layout: 1 byte (tail length), the tail, ZipNN's output.
    A file is handled only if most of its tensor bytes are one float dtype
    ZipNN knows; an item with any other file is reported '–'.
    """

    name, label, module, ext = "zipnn", "ZipNN", "zipnn", ".znn"
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

    def compress_stream(self, fin, fout, threads, dtypes):
        from zipnn import ZipNN as Z

        zname, size = self.DTYPES[self.float_dtype(dtypes)]
        data = fin.read()
        cut = len(data) - len(data) % size
        tail = data[cut:]
        fout.write(bytes([len(tail)]) + tail)
        if cut:
            z = Z(input_format="byte", bytearray_dtype=zname, threads=threads)
            fout.write(z.compress(bytearray(data[:cut])))

    def decompress_stream(self, fin, fout, threads):
        from zipnn import ZipNN as Z

        n = fin.read(1)[0]
        tail = fin.read(n)
        blob = fin.read()
        if blob:
            # The dtype is read from ZipNN's own header.
            fout.write(Z(input_format="byte", threads=threads).decompress(bytearray(blob)))
        fout.write(tail)


ALL: list[Codec] = [Brevis(), Zstd(3), Zstd(19), Gzip(), Xz(), Brotli(), Lz4(), ZipNN()]
BY_NAME: dict[str, Codec] = {c.name: c for c in ALL}
