"""The layout kernels against numpy: the tiled transpose, the partition's classify
and scatter, the records' column copy, the fields' join; hostile arguments refused."""

from __future__ import annotations

import numpy as np
import pytest

from brevis.dsl import delta

pytestmark = pytest.mark.skipif(delta._layout is None, reason="the C extension is not built")


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("rows,cols", [(0, 5), (1, 1), (1, 40), (3, 7), (33, 65), (1000, 517)])
def test_tiled_transpose_is_numpys(dtype, rows, cols):
    x = np.random.default_rng(rows * cols).integers(0, 255, rows * cols).astype(dtype)
    assert np.array_equal(delta._transposed(x, rows, cols), x.reshape(rows, cols).T.reshape(-1))


def test_bad_arguments_are_refused():
    x = np.zeros(12, np.uint16)
    with pytest.raises(ValueError):
        delta._layout.transpose(x, 3, 5, 2, np.empty_like(x))  # wrong size
    with pytest.raises(ValueError):
        delta._layout.transpose(x, 3, 4, 2, x)  # in place
    with pytest.raises(ValueError):
        delta._layout.transpose(x, 3, 4, 3, np.empty_like(x))  # item size


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("k", [1, 3, 200])
def test_scatter_puts_each_class_in_order(dtype, k):
    rng = np.random.default_rng(k)
    cls = rng.integers(0, k, 5000).astype(np.uint8)
    x = rng.integers(0, 1 << 30, 5000).astype(dtype)
    parts = [x[cls == j] for j in range(k)]
    out = np.empty_like(x)
    delta._layout.scatter(cls, parts, x.itemsize, out)
    assert np.array_equal(out, x)


def test_scatter_refuses_parts_that_do_not_match_the_classes():
    cls = np.array([0, 1, 1, 0, 2], np.uint8)
    x = np.arange(5, dtype=np.uint16)
    good = [x[cls == j] for j in range(3)]
    for parts in (good[:2], [good[0], good[1][:1], good[2]], [good[0], good[1], np.zeros(2, np.uint16)],
                  [good[0], good[1], good[2], np.zeros(1, np.uint16)], [good[0].view(np.uint8)[:3]] + good[1:]):
        with pytest.raises(ValueError):
            delta._layout.scatter(cls, parts, 2, np.empty_like(x))
    with pytest.raises(ValueError):
        delta._layout.scatter(cls, good, 2, np.empty(4, np.uint16))  # wrong size
    with pytest.raises(ValueError):
        delta._layout.scatter(cls, [], 2, np.empty_like(x))


def test_partition_decodes_alike_with_and_without_the_kernel(monkeypatch):
    from brevis.dsl import REGISTRY, Program, decode, encode, symbols
    from brevis.dsl.types import Field

    rng = np.random.default_rng(3)
    x = rng.integers(0, 1 << 16, 20_000).astype(np.uint16)
    x[rng.random(len(x)) < 0.5] &= 0x03FF
    t = Field(16)
    for classes in ([[0], [1], [2]], [[0, 3], [1]]):
        node = REGISTRY["partition"](context=[[14, 2]], rest=[[0, 14]], classes=classes)
        program = Program(node, tuple(Program(REGISTRY["raw"](), ()) for _ in range(len(classes) + 2)))
        streams = [memoryview(s) for s in encode(program, x, Field(16))]
        fast = decode(program, t, len(x), streams)
        monkeypatch.setattr(symbols, "_layout", None)
        slow = decode(program, t, len(x), streams)
        monkeypatch.undo()
        assert np.array_equal(fast, x) and np.array_equal(slow, x)


@pytest.mark.parametrize("width", [1, 2, 3, 4, 8, 16, 32, 33])
def test_place_copies_a_column_of_records(width):
    rng = np.random.default_rng(width)
    records, stride, offset = 301, width + 7, 5
    src = rng.integers(0, 256, records * width).astype(np.uint8)
    dst = rng.integers(0, 256, records * stride).astype(np.uint8)
    want = dst.reshape(records, stride).copy()
    want[:, offset:offset + width] = src.reshape(records, width)
    delta._layout.place(src, width, records, stride, offset, dst)
    assert np.array_equal(dst.reshape(records, stride), want)


def test_place_refuses_a_field_outside_its_records():
    src, dst = np.zeros(20, np.uint8), np.zeros(50, np.uint8)
    for width, records, stride, offset in ((2, 10, 5, 4), (2, 10, 1, 0), (0, 10, 5, 0), (2, 10, 5, -1), (3, 10, 5, 0)):
        with pytest.raises(ValueError):
            delta._layout.place(src, width, records, stride, offset, dst)


def test_records_decode_alike_with_and_without_the_kernel(monkeypatch):
    from brevis.dsl import REGISTRY, Program, decode, encode, records
    from brevis.dsl.types import Field

    x = np.random.default_rng(4).integers(0, 256, 18 * 500).astype(np.uint8)
    node = REGISTRY["records"](fields=[[1, 2], [16, 1]])
    program = Program(node, (Program(REGISTRY["raw"](), ()), Program(REGISTRY["raw"](), ())))
    streams = [memoryview(s) for s in encode(program, x, Field(8))]
    fast = decode(program, Field(8), len(x), streams)
    monkeypatch.setattr(records, "_layout", None)
    assert np.array_equal(fast, x) and np.array_equal(decode(program, Field(8), len(x), streams), x)


@pytest.mark.parametrize("groups,bits", [([[[16, 16]], [[0, 16]]], 32), ([[[31, 1], [0, 23]], [[23, 8]]], 32),
                                         ([[[10, 6]], [[0, 10]]], 16), ([[[4, 4]], [[0, 4]]], 8),
                                         ([[[0, 64]]], 64), ([[[40, 24], [0, 8]], [[8, 32]]], 64)])
def test_join_is_numpys(groups, bits, monkeypatch):
    from brevis.dsl import fields
    from brevis.dsl.types import Field

    rng = np.random.default_rng(bits)
    t = Field(bits)
    x = rng.integers(0, 1 << 62, 3001, dtype=np.uint64).astype(t.container)
    parts = fields._split(x, groups)
    fast = fields._join(len(x), t, groups, parts)
    monkeypatch.setattr(fields, "_layout", None)
    slow = fields._join(len(x), t, groups, parts)
    assert np.array_equal(fast, x) and np.array_equal(slow, x)


def test_join_refuses_ranges_outside_the_words():
    src, dst = np.zeros(8, np.uint16), np.zeros(8, np.uint16)
    for ranges in ([(10, 7)], [(0, 0)], [(-1, 4)], [(0, 9), (9, 9)]):
        with pytest.raises(ValueError):
            delta._layout.join(src, ranges, dst, True)
    with pytest.raises(ValueError):
        delta._layout.join(src, [(0, 4)], np.zeros(7, np.uint16), True)


def test_classify_counts_and_refuses_values_past_the_table():
    table = np.array([2, 0, 1, 2], np.uint8)
    context = np.array([0, 1, 2, 3, 3, 1], np.uint16)
    cls = np.empty(6, np.uint8)
    counts = delta._layout.classify(context, table, cls)
    assert cls.tolist() == [2, 0, 1, 2, 2, 0] and counts[:3] == [2, 1, 3] and sum(counts) == 6
    with pytest.raises(ValueError):
        delta._layout.classify(np.array([0, 4], np.uint16), table, np.empty(2, np.uint8))
