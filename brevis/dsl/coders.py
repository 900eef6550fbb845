"""Coder leaves: the last step of a program, turning a value into stored bytes."""

from __future__ import annotations

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

    def encode(self, x, t):
        return x.astype(t.container, copy=False).tobytes()

    def decode(self, data, n, t):
        _expect_length(data, n * t.container.itemsize, "raw stream")
        return np.frombuffer(data, dtype=t.container, count=n)


_local = threading.local()


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
            params = zstandard.ZstdCompressionParameters.from_level(
                c["level"],
                strategy=c["strategy"] or 0,
                window_log=c["window_log"] or 0,
                hash_log=c["hash_log"] or 0,
                chain_log=c["chain_log"] or 0,
                min_match=c["min_match"] or 0,
                write_content_size=True,
                write_checksum=False,
            )
            cache[key] = zstandard.ZstdCompressor(compression_params=params)
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
        decompressor = _local.__dict__.setdefault("decompressor", None)
        if decompressor is None:
            decompressor = _local.decompressor = zstandard.ZstdDecompressor()
        try:
            out = decompressor.decompress(data, max_output_size=expected)
        except zstandard.ZstdError as e:
            raise FormatError(f"zstd stream: {e}") from None
        _expect_length(out, expected, "zstd stream")
        return np.frombuffer(out, dtype=t.container, count=n)
