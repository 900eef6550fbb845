"""The search reads what a parent operator declares about its children
(Operator.splits_records, delta_children, signed_children, ranked_children,
typed_children, keeps_order), not lists of production ids."""

from __future__ import annotations

import numpy as np
import pytest

from brevis.dsl import REGISTRY, Delta, Rank, View, XorDelta, ZigZag
from brevis.dsl.operator import Operator
from brevis.dsl.types import Field, tensor
from brevis.dtypes import DTYPES
from brevis.synth.prior import Prior
from brevis.synth.search import Budget, Search
from brevis.synth.proposals import HALF_FIELDS, NIBBLES, Value, child_row, proposals
from helpers import second_moments

HINTS = ("splits_records", "delta_children", "signed_children", "ranked_children", "keeps_order", "typed_children")


def parent(**facts) -> Operator:
    """An unregistered operator declaring only `facts`."""
    return type("Parent", (Operator,), {"id": "parent", **facts})()


def child(x: np.ndarray, bits: int, up: Operator | None, row: int | None = None) -> Value:
    return Value([x], Field(bits), row, up, 0 if up is None else 1)


RNG = np.random.default_rng(3)
WORDS = RNG.integers(0, 1 << 16, 4096).astype(np.uint16)
SMALL_ALPHABET = RNG.choice(np.array([1, 7, 9, 200, 33], np.uint8), 4096, p=[0.5, 0.2, 0.15, 0.1, 0.05])


def ids(v: Value) -> list[str]:
    return [p.id for p in proposals(v)]


def test_no_parent_declares_nothing():
    for hint in HINTS:
        assert getattr(Operator, hint) is False


def test_delta_children():
    assert "delta" in ids(child(WORDS, 16, None))  # the root: always
    assert "delta" in ids(child(WORDS, 16, parent(delta_children=True)))
    assert "delta" not in ids(child(WORDS, 16, parent()))
    props = proposals(child(WORDS, 16, parent(delta_children=True)))
    assert Delta(stride=1) in props and XorDelta(stride=1) in props


def test_signed_children():
    assert ZigZag() in proposals(child(WORDS, 16, parent(signed_children=True)))
    assert ZigZag() not in proposals(child(WORDS, 16, parent()))


def test_splits_records():
    assert NIBBLES in proposals(child(SMALL_ALPHABET, 8, parent(splits_records=True)))
    assert HALF_FIELDS in proposals(child(WORDS, 16, parent(splits_records=True)))
    assert NIBBLES not in proposals(child(SMALL_ALPHABET, 8, parent()))


def test_ranked_children():
    def ranks(up):
        return [p for p in proposals(child(SMALL_ALPHABET, 8, up)) if isinstance(p, Rank)]

    assert ranks(parent())  # a small alphabet: ranked in 4 bits
    assert not ranks(parent(ranked_children=True))


def test_typed_children_are_searched_as_a_root():
    """A tensor read out of bytes (`view`) gets what a segment's root gets:
    ranks of a wide value's few values, deltas."""
    wide = RNG.choice(np.arange(1, 40, dtype=np.uint32) * 0x01010101, 4096)
    at_root = Value([wide], tensor(DTYPES["F32"]), None, View(dtype="F32"), 0)
    assert any(isinstance(p, Rank) for p in proposals(at_root)) and "delta" in ids(at_root)
    deeper = Value([wide], tensor(DTYPES["F32"]), None, parent(), 1)
    assert not any(isinstance(p, Rank) for p in proposals(deeper))
    search = Search(Prior(), "weight", 1.0, 1, Budget())
    (kid,) = search.children(Value([wide.view(np.uint8)], Field(8), opaque=True), View(dtype="F32"))
    assert kid.depth == 0 and kid.t == tensor(DTYPES["F32"]) and not kid.opaque


def test_keeps_order_carries_the_row():
    v = child(WORDS, 16, None, row=64)
    assert child_row(parent(keeps_order=True), v) == 64
    assert child_row(parent(), v) is None


@pytest.mark.parametrize("prod", sorted(i for i, c in REGISTRY.items() if issubclass(c, Operator)))
def test_value_context_is_the_parent_id(prod):
    """The prior's context names the parent by its production id, as learned priors store it."""
    cls = REGISTRY[prod]
    up = object.__new__(cls)  # the id is a class attribute: no configuration needed
    assert child(WORDS, 16, up).parent_id == prod
    assert child(WORDS, 16, None).parent_id == "root"


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_distinct_counts_as_unique_does(dtype):
    from brevis.synth.proposals import _distinct

    rng = np.random.default_rng(3)
    for n, high in ((0, 1), (1, 1), (500, 3), (5000, 1 << 12)):
        x = rng.integers(0, high, n).astype(dtype)
        assert _distinct(x) == len(np.unique(x))
        if n:  # rows of 4 as opaque records, as the row dedup proposal counts them
            rows = np.ascontiguousarray(x[: n // 4 * 4].reshape(-1, 4)).view(np.dtype((np.void, 4 * x.itemsize)))
            assert _distinct(rows) == len(np.unique(rows))


@pytest.mark.parametrize("bits", [2, 8, 12, 16])
def test_a_fields_histogram_is_bincounts(bits, monkeypatch):
    """Counted in C (key_counts): the distinct values in increasing order
    and their counts, as numpy's bincount and flatnonzero give them, at
    any length (fewer values than keys, more, one value)."""
    from brevis.synth import proposals as p

    rng = np.random.default_rng(bits)
    for n in (1, 300, 70_000):
        x = np.minimum(rng.geometric(0.01, n), (1 << bits) - 1).astype(Field(bits).container)
        fast = p._histogram(x, Field(bits))
        monkeypatch.setattr(p, "_rans", None)
        plain = p._histogram(x, Field(bits))
        monkeypatch.undo()
        assert all(np.array_equal(a, b) for a, b in zip(fast, plain)), n


def test_the_rank_proposals_test_is_the_sum_of_the_largest_counts():
    from brevis.synth.proposals import _top_sum

    rng = np.random.default_rng(5)
    for n in (1, 255, 256, 5000):
        counts = rng.integers(1, 50, n)
        assert _top_sum(counts, 255) == int(counts[np.argsort(-counts, kind="stable")[:255]].sum())


def test_entropy_from_the_counts_memo_is_the_entropy_counted():
    """_entropy_bits of symbols counted before (the memo of their digests)
    is what counting them gives; symbols of the same length and itemsize
    that differ are counted anew."""
    from brevis.synth import proposals as p

    if p._rans is None:
        pytest.skip("the C extension is not built")
    rng = np.random.default_rng(8)
    p._counts_memo.clear()
    samples = [rng.integers(0, 300, 10_000).astype(np.uint16), rng.integers(0, 3, 10_000).astype(np.uint16),
               rng.integers(0, 256, 10_000).astype(np.uint8), rng.integers(0, 9, 100).astype(np.uint8)]
    counted = []
    for x in samples:
        total, distinct = p._rans.counts(x, x.itemsize)
        counted.append(len(x) * np.log2(len(x)) - total + (distinct - 1) / (2 * np.log(2)))
    for _ in range(2):  # the second time from the memo
        assert [p._entropy_bits(x) for x in samples] == counted
    assert len(p._counts_memo) == 3  # the short sample counted each time
    for other in (samples[0][::-1].copy(), samples[1] + np.uint16(1)):  # (the sum's order is the symbols')
        total, distinct = p._rans.counts(other, 2)
        assert p._entropy_bits(other) == len(other) * np.log2(len(other)) - total + (distinct - 1) / (2 * np.log(2))
    assert len(p._counts_memo) == 5


def test_row_heads_never_tell_equal_rows_apart():
    """_row_heads: one key a row, equal for equal rows (so the distinct
    heads are at most the distinct rows, and as many heads as the row
    dedup proposal's limit settle it); rows of any width."""
    from brevis.synth.proposals import _distinct, _row_heads

    rng = np.random.default_rng(6)
    for dtype, width in ((np.uint8, 3), (np.uint16, 8), (np.uint32, 4), (np.uint32, 768)):
        base = rng.integers(0, 1 << 16, (50, width)).astype(dtype)
        rows = base[rng.integers(0, 50, 200)]
        heads = _row_heads(rows)
        assert len(heads) == len(rows)
        same = (rows[:, None, :] == rows[None, :, :]).all(axis=2)
        assert np.all(heads[:, None] == heads[None, :], where=same)
        assert _distinct(heads) <= _distinct(np.ascontiguousarray(rows).view(np.dtype((np.void, width * rows.itemsize))))


def test_neighbours_alike_where_their_differences_have_less_entropy():
    """A smooth float tensor's root: the differences' entropy (their top 16
    bits counted, the rest taken as the values') is below the values' own,
    each slice differenced on its own, and near the differences' whole
    order-0 entropy; dense weights: not."""
    t = tensor(DTYPES["F32"])
    x = second_moments(RNG, 65536).view(np.uint32)
    v = Value([x[i:i + 16384] for i in range(0, 65536, 16384)], t)
    assert v.neighbours_alike and v.difference_bytes < 0.85 * v.entropy_bytes
    d = np.concatenate([np.concatenate([s[:1], s[1:] - s[:-1]]) for s in v.slices])
    assert v.difference_bytes == pytest.approx(Value([d], Field(32), parent=Delta(stride=1), depth=1).entropy_bytes,
                                               rel=0.002)
    dense = (RNG.standard_normal(65536) * 0.02).astype(np.float32).view(np.uint32)
    assert not Value([dense], t).neighbours_alike


def test_spike_bits_are_the_commonest_words_raw_low_bits():
    """A wide field's commonest word (a float tensor's zeros) costs `ans`
    its share times the bits below the 16-bit key; a field of 16 bits or
    fewer costs nothing (its keys are its words)."""
    x = (RNG.standard_normal(40000) * 0.02).astype(np.float32)
    x[:1000] = 0  # 2.5 %
    v = Value([x.view(np.uint32)], tensor(DTYPES["F32"]))
    assert v.spike_bits == pytest.approx(0.025 * 16)
    assert Value([x[1000:].view(np.uint32)], tensor(DTYPES["F32"])).spike_bits < 0.01
    assert Value([x.astype(np.float16).view(np.uint16)], tensor(DTYPES["F16"])).spike_bits == 0


@pytest.mark.parametrize("where", ["child", "integers", "one each"])
def test_only_a_float_tensors_root_has_differences(where):
    x = second_moments(RNG, 4096).view(np.uint32)
    v = {"child": lambda: child(x, 32, Delta(stride=1)),
         "integers": lambda: Value([x], tensor(DTYPES["U32"])),
         "one each": lambda: Value([x[:1], x[1:2]], tensor(DTYPES["F32"]))}[where]()
    assert v.difference_bytes is None and not v.neighbours_alike
