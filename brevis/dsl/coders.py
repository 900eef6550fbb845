"""Coder leaves: the last step of a program, turning a value into stored bytes."""

from __future__ import annotations

import hashlib
import lzma
import threading

import numpy as np
import zstandard

from ..errors import FormatError, ProgramError
from .operator import Coder, register


def _expect_length(data: memoryview | bytes, expected: int, what: str) -> None:
    if len(data) != expected:
        raise FormatError(f"{what}: {len(data)} bytes where {expected} were expected")


@register
class Raw(Coder):
    """Store the little-endian words as they are. Inverse: read them back.

    Memory of the inverse: at most 1 times its output (a view of the stream)."""

    id = "raw"
    params: dict = {}
    remembered = False  # its estimate is a product

    def encode(self, x, t):
        return x.astype(t.container, copy=False).tobytes()

    def estimate(self, x, t):
        """encode's length without the copy: the values' words."""
        return x.size * t.container.itemsize, 0

    def decode(self, data, n, t):
        _expect_length(data, n * t.container.itemsize, "raw stream")
        view = np.frombuffer(data, dtype=t.container, count=n)
        # Read-only: a view of the stream, which may lie in the caller's
        # writable buffer (an archive in a bytearray or mmap), and parents
        # undo their step in a child's value where they may write it.
        view.flags.writeable = False
        return view


_local = threading.local()


def thread_decompressor() -> zstandard.ZstdDecompressor:
    """This thread's zstd decompressor (one is not thread-safe), made once:
    each makes its context, fresh pages the first time (a reader's index
    and its streams share the calling thread's)."""
    decompressor = _local.__dict__.get("decompressor")
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor


@register
class Zstd(Coder):
    """zstd with explicit parameters; inverse: zstd decompression.

    0 for a tuning parameter means "the level's default". A fast strategy
    with a long minimum match and the smallest hash table turns zstd into a
    near-order-0 Huffman coder. On minilm's f32 exponents in 256K-value
    chunks: 2.641 bits/value, against 2.626 for an ideal Huffman code, 2.696
    with hash_log 10 and 3.236 for default level 3.

    Memory of the inverse: at most 1 times its output: a frame must declare
    exactly the bytes expected, so a lying frame costs no more.
    """

    id = "zstd"
    params = {"level": int, "strategy": int, "window_log": int, "hash_log": int,
              "chain_log": int, "min_match": int}

    @classmethod
    def validate(cls, config):
        if not -7 <= config["level"] <= 22:
            raise ProgramError("zstd: level must be in -7..22")
        if not 0 <= config["strategy"] <= 9:
            raise ProgramError("zstd: strategy must be in 0..9")
        for key, low, high in (("window_log", 10, 31), ("hash_log", 6, 30),
                               ("chain_log", 6, 30), ("min_match", 3, 7)):
            if config[key] and not low <= config[key] <= high:
                raise ProgramError(f"zstd: {key} must be 0 or in {low}..{high}")

    @classmethod
    def at_level(cls, level: int) -> "Zstd":
        return cls(level=level, strategy=0, window_log=0, hash_log=0, chain_log=0, min_match=0)

    @classmethod
    def entropy(cls) -> "Zstd":
        """Match finder nearly off: an order-0 coder for field streams."""
        return cls(level=1, strategy=1, window_log=17, hash_log=6, chain_log=6, min_match=7)

    def describe(self):
        if self == Zstd.entropy():
            return "zstd(entropy)"  # the preset above; its parameters are in the archive
        shown = {k: v for k, v in self._config.items() if v or k == "level"}
        return "zstd(" + ",".join(f"{k}={v}" for k, v in shown.items()) + ")"

    def _compressor(self) -> zstandard.ZstdCompressor:
        # Compressors are not thread-safe: one per thread and configuration.
        cache = _local.__dict__.setdefault("compressors", {})
        key = tuple(self._config.values())
        if key not in cache:
            c = self._config
            # Only the parameters set: from_level takes a 0 it is given as
            # "zstd's default", which is level 3's, whatever the level (until
            # 2026-12-06 every level with no parameter set coded as level 3).
            tuning = {k: c[k] for k in ("strategy", "window_log", "hash_log", "chain_log", "min_match") if c[k]}
            if tuning:
                params = zstandard.ZstdCompressionParameters.from_level(
                    c["level"], **tuning, write_content_size=True, write_checksum=False)
                cache[key] = zstandard.ZstdCompressor(compression_params=params)
            else:  # the level as zstd defines it, fitted to each input's size
                cache[key] = zstandard.ZstdCompressor(level=c["level"], write_content_size=True, write_checksum=False)
        return cache[key]

    def encode(self, x, t):
        return self._compressor().compress(np.ascontiguousarray(x, dtype=t.container))

    def decode(self, data, n, t):
        expected = n * t.container.itemsize
        try:
            declared = zstandard.frame_content_size(data)
        except zstandard.ZstdError as e:
            raise FormatError(f"zstd stream: {e}") from None
        if declared != expected:
            raise FormatError(f"zstd stream declares {declared} bytes where {expected} were expected")
        if data[4] & 0x10:  # an unused frame header bit: zstd ignores it, so damage there would pass
            raise FormatError("zstd stream: unused frame header bit is set")
        try:
            out = thread_decompressor().decompress(data, max_output_size=expected)
        except zstandard.ZstdError as e:
            raise FormatError(f"zstd stream: {e}") from None
        _expect_length(out, expected, "zstd stream")
        return np.frombuffer(out, dtype=t.container, count=n)


LZMA_MIN_DICT = 1 << 12  # LZMA2's smallest dictionary
LZMA_MAX_DICT = 1 << 30
LZMA_INPUT_STEP = 1 << 16  # stream bytes handed to liblzma at a time
LZMA_OUTPUT_STEP = 1 << 20  # ... and output bytes taken back


def lzma_dictionary(nbytes: int) -> int:
    """The dictionary both directions use for a stream of nbytes: as large
    as the data (a larger one cannot pay), within LZMA2's limits. Derived
    from the length the index declares, never read from the stream, so a
    damaged archive cannot ask the decoder for more memory."""
    return min(LZMA_MAX_DICT, max(LZMA_MIN_DICT, nbytes))


@register
class Lzma(Coder):
    """Raw LZMA2 (liblzma, as in xz) over the little-endian bytes; inverse:
    LZMA2 decoding. Where zstd codes a literal on its own, LZMA codes it in
    the context of the previous byte's top `lc` bits and of its position
    mod 2**lp, and a match's state mod 2**pb: with lp = pb = 2 that is a
    4-byte word's lane (sign and exponent apart from the mantissa) whatever
    the alignment of the arrays in a file no parser knows, and its optimal
    parse finds the repeats and zero runs of headers and string tables.
    Several times slower than zstd both ways (about 3 MB/s to code, 20-30
    MB/s to decode here): the planner takes it only on byte spans where a
    measurement shows it clearly smaller.

    Memory of the inverse: at most 2 times its output: the output, decoded
    into in pieces, and a dictionary of the output's size (from the declared
    length: see lzma_dictionary)."""

    id = "lzma"
    params = {"preset": int, "lc": int, "lp": int, "pb": int}

    @classmethod
    def validate(cls, config):
        if not 0 <= config["preset"] <= 9:
            raise ProgramError("lzma: preset must be in 0..9")
        for key in ("lc", "lp", "pb"):
            if not 0 <= config[key] <= 4:
                raise ProgramError(f"lzma: {key} must be in 0..4")
        if config["lc"] + config["lp"] > 4:
            raise ProgramError("lzma: lc + lp must be at most 4 (LZMA2)")

    @staticmethod
    def fingerprint() -> str:
        """The SHA-256 of the stream this liblzma writes for a fixed input.
        LZMA's output (like zstd's) is fixed for one library version only:
        streams written elsewhere compare byte for byte only where this matches."""
        probe = b"".join(i.to_bytes(4, "little") for i in range(0, 4000, 7)) + b"brevis " * 64
        stream = lzma.compress(probe, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2, "preset": 6}])
        return hashlib.sha256(stream).hexdigest()

    def _filters(self, nbytes: int, encoder: bool) -> list[dict]:
        c = self._config
        f = {"id": lzma.FILTER_LZMA2, "dict_size": lzma_dictionary(nbytes), "lc": c["lc"], "lp": c["lp"],
             "pb": c["pb"]}
        if encoder:
            f["preset"] = c["preset"]
        return [f]

    def encode(self, x, t):
        data = np.ascontiguousarray(x, dtype=t.container)
        if not data.nbytes:
            return b""
        return lzma.compress(data, format=lzma.FORMAT_RAW, filters=self._filters(data.nbytes, True))

    def decode(self, data, n, t):
        expected = n * t.container.itemsize
        out = np.empty(expected, dtype=np.uint8)
        if not expected:
            _expect_length(data, 0, "lzma stream of no values")
            return out.view(t.container)
        # In pieces into the output: liblzma's own output buffer (and
        # Python's joining of it) would hold the output two more times.
        stream = memoryview(data).cast("B")
        decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=self._filters(expected, False))
        read = done = 0
        try:
            while not decompressor.eof:
                if decompressor.needs_input:
                    if read >= len(stream):
                        raise FormatError(f"lzma stream ends before its end mark, after {done} of {expected} bytes")
                    piece = stream[read: read + LZMA_INPUT_STEP]
                    read += len(piece)
                else:
                    piece = b""
                got = decompressor.decompress(piece, max_length=max(1, min(LZMA_OUTPUT_STEP, expected - done)))
                if len(got) > expected - done:
                    raise FormatError(f"lzma stream holds more than the {expected} bytes expected")
                if not got and not len(piece) and not decompressor.eof and not decompressor.needs_input:
                    raise FormatError("lzma stream makes no progress")  # never seen: a guard against a loop
                out[done: done + len(got)] = np.frombuffer(got, dtype=np.uint8)
                done += len(got)
        except lzma.LZMAError as e:
            raise FormatError(f"lzma stream: {e}") from None
        _expect_length(memoryview(out)[:done], expected, "lzma stream")
        extra = len(decompressor.unused_data) + len(stream) - read
        if extra:
            raise FormatError(f"lzma stream: {extra} bytes after its end")
        return out.view(t.container)
