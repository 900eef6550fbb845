"""The archive's hashes in C (_rans.check and _rans.digest, xxHash with its
x86 dispatcher) give what the xxhash package gives, which serves a tree
without the extension: every length class of XXH3 (0, 1-3, 4-8, 9-16,
17-128, 129-240, long, and long with a partial stripe and block)."""

from __future__ import annotations

import numpy as np
import pytest
from xxhash import xxh3_64_intdigest, xxh3_128_digest

from brevis.archive import format as fmt

_rans = pytest.importorskip("brevis.native._rans")

LENGTHS = [0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1000, 1024, 65535, 65536, 1 << 20, (1 << 20) + 63]


@pytest.mark.parametrize("n", LENGTHS)
def test_c_hashes_match_the_xxhash_package(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert _rans.check(data) == xxh3_64_intdigest(data) & 0xFFFFFFFF == fmt.stream_check(data)
    assert _rans.digest(data) == xxh3_128_digest(data) == fmt.chunk_digest(data)
    view = memoryview(np.frombuffer(b"\0" + data, np.uint8)[1:])  # at an odd address, as a view
    assert _rans.check(view) == fmt.stream_check(data) and _rans.digest(view) == fmt.chunk_digest(data)


def test_each_version_has_its_digest():
    data = b"brevis" * 1000
    import hashlib

    from blake3 import blake3

    assert fmt.chunk_digester(7)(data) == xxh3_128_digest(data)
    assert fmt.chunk_digester(3)(data) == fmt.chunk_digester(6)(data) == blake3(data).digest(16)
    assert fmt.chunk_digester(1)(data) == hashlib.sha256(data).digest()[:16]
