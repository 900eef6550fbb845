"""The memo of leaf estimates: what the coder says, once per content."""

from __future__ import annotations

import numpy as np

from brevis.dsl import Ans, Raw, Zstd
from brevis.dsl.types import Field
from brevis.synth import estimates
from brevis.synth.estimates import leaf_estimate


class Counting(Ans):
    """An `ans` coder that counts its estimates."""

    calls = 0

    def estimate(self, x, t):
        Counting.calls += 1
        return super().estimate(x, t)


def test_the_memo_answers_as_the_coder_and_asks_it_once_per_content(monkeypatch):
    monkeypatch.setattr(estimates, "_memo", {})
    rng = np.random.default_rng(3)
    x = rng.integers(0, 1 << 12, 1 << 14).astype(np.uint16)
    t, coder = Field(12), Counting()
    Counting.calls = 0
    first = leaf_estimate(coder, x, t)
    assert first == Ans().estimate(x, t)
    assert leaf_estimate(coder, x.copy(), t) == first  # the same values in another array
    assert Counting.calls == 1
    y = x.copy()
    y[-1] ^= 1  # other values, another type, another coder: asked again
    assert leaf_estimate(coder, y, t) == Ans().estimate(y, t)
    assert leaf_estimate(coder, x, Field(13)) == Ans().estimate(x, Field(13))
    assert Counting.calls == 3
    assert leaf_estimate(Zstd.at_level(3), x, t) == Zstd.at_level(3).estimate(x, t)


def test_small_values_are_not_kept_and_the_memo_stays_bounded(monkeypatch):
    monkeypatch.setattr(estimates, "_memo", {})
    monkeypatch.setattr(estimates, "MEMO_ENTRIES", 3)
    small = np.arange(estimates.MEMO_MIN_BYTES // 2 - 1, dtype=np.uint16)
    leaf_estimate(Ans(), small, Field(16))
    assert not estimates._memo
    for k in range(5):
        leaf_estimate(Ans(), np.full(estimates.MEMO_MIN_BYTES, k, dtype=np.uint8), Field(8))
    assert len(estimates._memo) == 3


def test_raw_estimates_its_length_without_coding_and_is_not_kept(monkeypatch):
    """`raw`'s estimate is its stream's length (any container, a value cast
    to a wider one too), not worth a digest: never in the memo."""
    monkeypatch.setattr(estimates, "_memo", {})
    for x, t in ((np.arange(9000, dtype=np.uint16), Field(16)), (np.arange(9000, dtype=np.uint8) % 7, Field(12)),
                 (np.zeros(0, np.uint32), Field(32)), (np.arange(5000, dtype=np.uint64), Field(64))):
        assert leaf_estimate(Raw(), x, t) == (len(Raw().encode(x, t)), 0)
    assert not estimates._memo
