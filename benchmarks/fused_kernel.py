"""What a compiled kernel would give chunk encoding (issue 4's proposal).

Takes real BF16 chunks (1 MiB, the encoder's size) from the largest
tensors of astra-i3d-resnet152 and the program most of them are coded by:
float_fields(s|e|m), the exponent ranked (15 symbols, escapes apart), sign
bits and 4-bit ranks packed into bytes. Times, per chunk (best of
--repeat), the numpy operators Brevis runs today, the same streams from
one fused loop compiled by numba (if numba is installed; it is not a
dependency of Brevis), the zstd entropy coding of the streams, the
SHA-256 digest the format stores (and BLAKE3's, if the blake3 package is
installed: a digest a later format could store), the CRC-32s, and zstd -3
of the same chunk. Checks that both paths give the same streams.

    pip install numba blake3 && python benchmarks/fused_kernel.py [--repeat 50]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.scaling import CORPUS  # noqa: E402
from brevis.codec import encoder  # noqa: E402
from brevis.dsl.coders import Zstd  # noqa: E402
from brevis.dsl.fields import FloatFields, PackBits  # noqa: E402
from brevis.dsl.symbols import Rank  # noqa: E402
from brevis.dsl.types import Field, tensor  # noqa: E402
from brevis.dtypes import lookup  # noqa: E402
from brevis.workers.heap import keep_freed_memory  # noqa: E402
from brevis.fs.sources import collect  # noqa: E402

ESCAPE = 15  # ranks 0..14 are table symbols, 15 escapes


def chunks(count: int) -> list[tuple[str, bytes]]:
    files, _ = collect([CORPUS / "astra-i3d-resnet152"])
    scanned = encoder.scan(next(s for s in files if s.path.suffix == ".pt"))
    bf16 = sorted((s for s in scanned.segments if s.dtype and s.dtype.name == "BF16"), key=lambda s: -s.length)
    fd = os.open(scanned.source.path, os.O_RDONLY)
    try:
        return [(s.name, os.pread(fd, 1 << 20, s.offset)) for s in bf16[:count]]
    finally:
        os.close(fd)


def numpy_streams(x: np.ndarray, symbols: list[int]):
    t = tensor(lookup("BF16"))
    sign, exponent, mantissa = FloatFields(grouping="s|e|m").forward(x, t)
    ranks, escaped = Rank(symbols=symbols).forward(exponent, Field(8))
    pack = PackBits()
    return pack.forward(sign, Field(1))[0], pack.forward(ranks, Field(4))[0], escaped, mantissa


def compiled_kernel():
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(nogil=True, boundscheck=False)
    def fused(x, lut, sign, ranks, mantissa, escaped):  # pragma: no cover - compiled
        n = x.shape[0]
        m = 0
        for i in range(n):
            v = x[i]
            e = (v >> 7) & 0xFF
            r = lut[e]
            escaped[m] = e
            m += r == ESCAPE
            mantissa[i] = v & 0x7F
            if i & 7 == 0:
                sign[i >> 3] = v >> 15
            else:
                sign[i >> 3] |= (v >> 15) << (i & 7)
            if i & 1:
                ranks[i >> 1] |= r << 4
            else:
                ranks[i >> 1] = r
        return m

    def streams(x: np.ndarray, symbols: list[int]):
        n = len(x)
        lut = np.full(256, ESCAPE, np.uint8)
        lut[np.array(symbols)] = np.arange(len(symbols), dtype=np.uint8)
        sign, ranks = np.empty((n + 7) // 8, np.uint8), np.empty((n + 1) // 2, np.uint8)
        mantissa, escaped = np.empty(n, np.uint8), np.empty(n, np.uint8)
        m = fused(x, lut, sign, ranks, mantissa, escaped)
        return sign, ranks, escaped[:m], mantissa

    return streams


def blake3_digest():
    try:
        from blake3 import blake3
    except ImportError:
        return None
    return lambda data: blake3(data).digest()


def best_ms(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    keep_freed_memory()  # as in Brevis's workers: temporaries not faulted in afresh every call
    fused, blake = compiled_kernel(), blake3_digest()
    coder, level3 = Zstd.entropy(), zstandard.ZstdCompressor(level=3)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()}, one thread, ms per 1 MiB chunk"
          f" (best of {args.repeat})\n")
    print("| chunk of | numpy operators | numba fused | zstd entropy of the streams | SHA-256 | CRC-32 "
          "| numba path in all | BLAKE3 | zstd -3 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, data in chunks(args.chunks):
        x = np.frombuffer(data, np.uint16)
        values, counts = np.unique((x >> 7) & 0xFF, return_counts=True)
        symbols = [int(v) for v in values[np.argsort(-counts, kind="stable")][:ESCAPE]]
        streams = numpy_streams(x, symbols)
        if fused is not None:
            assert all(np.array_equal(a, b) for a, b in zip(streams, fused(x, symbols))), "streams differ"
        coded = [coder.encode(s, Field(8)) for s in streams]
        ops = best_ms(lambda: numpy_streams(x, symbols), args.repeat)
        kernel = best_ms(lambda: fused(x, symbols), args.repeat) if fused else 0.0
        entropy = best_ms(lambda: [coder.encode(s, Field(8)) for s in streams], args.repeat)
        digest = best_ms(lambda: hashlib.sha256(data).digest(), args.repeat)
        crc = best_ms(lambda: [zlib.crc32(c) for c in coded], args.repeat)
        b3 = f"{best_ms(lambda: blake(data), args.repeat):.2f}" if blake else "–"
        z3 = best_ms(lambda: level3.compress(data), args.repeat)
        compiled = f"{kernel:.2f} | {entropy:.2f} | {digest:.2f} | {crc:.2f} | {kernel + entropy + digest + crc:.2f}" \
            if fused else f"– | {entropy:.2f} | {digest:.2f} | {crc:.2f} | –"
        print(f"| {name} | {ops:.2f} | {compiled} | {b3} | {z3:.2f} |")


if __name__ == "__main__":
    main()
