"""The anchors kernel against its numpy equivalent; hostile arguments refused."""

from __future__ import annotations

import numpy as np
import pytest

from brevis.formats import repeats

pytestmark = pytest.mark.skipif(repeats._chunking is None, reason="the C extension is not built")


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 4095, 65536, 100003])
def test_anchors_are_numpys(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    for bits in (6, 12):
        assert np.array_equal(np.frombuffer(repeats._chunking.anchors(data, bits), np.int64), repeats.anchors(data, bits))


def test_anchors_of_structured_data_are_numpys():
    data = np.frombuffer((np.arange(1 << 16, dtype=np.float32) * 0.01).tobytes(), np.uint8)
    for bits in (6, 12):
        assert np.array_equal(np.frombuffer(repeats._chunking.anchors(data, bits), np.int64), repeats.anchors(data, bits))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        repeats._chunking.anchors(b"x" * 64, 0)
    with pytest.raises(ValueError):
        repeats._chunking.anchors(b"x" * 64, 64)
    with pytest.raises(TypeError):
        repeats._chunking.anchors("text", 12)
