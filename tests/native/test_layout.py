"""The layout kernels against numpy: the tiled transpose, the partition's classify
and scatter_join, the records' weave and unweave, the fields' join, the rank's
lookup and patch, pack_bits' unpack, byte planes' interleave; hostile arguments
refused."""

from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest

from brevis.dsl import delta
from helpers import before_unreadable_page

pytestmark = pytest.mark.skipif(delta._layout is None, reason="the C extension is not built")


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("rows,cols", [(0, 5), (1, 1), (1, 40), (3, 7), (33, 65), (1000, 517),
                                       (1024, 45), (1536, 70), (128, 3),  # through the tile buffer
                                       (2, 77), (3, 1000),  # two or three rows woven
                                       (8, 8), (16, 9), (9, 16), (768, 682), (512, 33),  # 8 x 8 blocks, edges
                                       (100, 517), (1536, 40), (515, 1001), (7, 300), (1537, 20),  # bands of dst rows
                                       (1001, 2), (4099, 3), (517, 4), (300, 5), (70, 6), (33, 7), (129, 8)])  # columns taken out
def test_tiled_transpose_is_numpys(dtype, rows, cols):
    x = np.random.default_rng(rows * cols).integers(0, 255, rows * cols).astype(dtype)
    assert np.array_equal(delta._transposed(x, rows, cols), x.reshape(rows, cols).T.reshape(-1))


@pytest.mark.parametrize("rows,cols", [(768, 682), (1536, 70), (515, 1001), (37, 41), (1001, 3), (513, 2), (77, 7)])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_transpose_at_any_alignment(rows, cols, itemsize):
    """Two-byte items go through 8 x 8 register blocks, two to eight columns
    are taken out at a stride: source and destination at odd addresses
    read and write the same items."""
    size = itemsize * rows * cols
    raw = np.random.default_rng(cols).integers(0, 256, size + 1, dtype=np.uint8)
    src = raw[1:]
    out = np.zeros(size + 3, np.uint8)[3:]
    delta._layout.transpose(src, rows, cols, itemsize, out)
    want = src.view(f"<u{itemsize}").reshape(rows, cols).T.reshape(-1)
    assert np.array_equal(out.view(f"<u{itemsize}"), want)


def test_bad_arguments_are_refused():
    x = np.zeros(12, np.uint16)
    with pytest.raises(ValueError):
        delta._layout.transpose(x, 3, 5, 2, np.empty_like(x))  # wrong size
    with pytest.raises(ValueError):
        delta._layout.transpose(x, 3, 4, 2, x)  # in place
    with pytest.raises(ValueError):
        delta._layout.transpose(x, 3, 4, 3, np.empty_like(x))  # item size


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


FIELD_LAYOUTS = [[1], [2, 2, 16], [2, 32], [2, 2, 12, 128], [128, 64, 16, 2], [3, 33, 1, 5], [2, 4, 8, 1, 1, 16]]


@pytest.mark.parametrize("widths", FIELD_LAYOUTS, ids=str)
@pytest.mark.parametrize("records", [0, 1, 301, 5000])  # 5000: blocks of 16 KiB and a partial one
def test_weave_and_unweave_are_numpys_column_copies(widths, records):
    rng = np.random.default_rng(records + len(widths))
    stride = sum(widths)
    whole = rng.integers(0, 256, records * stride).astype(np.uint8)
    bounds = np.cumsum([0, *widths])
    want = [np.ascontiguousarray(whole.reshape(records, stride)[:, a:b]).reshape(-1) for a, b in zip(bounds, bounds[1:])]
    parts = [np.full(records * w, 7, np.uint8) for w in widths]
    delta._layout.unweave(whole, widths, parts)
    assert all(np.array_equal(p, w) for p, w in zip(parts, want))
    back = np.zeros(records * stride + 1, np.uint8)[1:]  # any alignment
    delta._layout.weave(parts, widths, back)
    assert np.array_equal(back, whole)


def test_weave_and_unweave_refuse_parts_that_do_not_fit():
    whole, two = np.zeros(40, np.uint8), [np.zeros(10, np.uint8), np.zeros(30, np.uint8)]
    for widths, parts, dst in (([1, 3], two, np.zeros(41, np.uint8)),  # not whole records
                               ([1, 2], two, whole),  # part 1 of the wrong length
                               ([1], two, whole),  # a width a part
                               ([0, 4], two, whole), ([-1, 5], two, whole),
                               ([1] * 65, [np.zeros(1, np.uint8)] * 65, np.zeros(65, np.uint8)), ([], [], whole)):
        with pytest.raises(ValueError):
            delta._layout.weave(parts, widths, dst)
        with pytest.raises(ValueError):
            delta._layout.unweave(dst, widths, parts)
    with pytest.raises(ValueError):  # a part over the records it is taken from
        delta._layout.unweave(whole, [1, 3], [whole[:10], np.zeros(30, np.uint8)])
    with pytest.raises(ValueError):  # ... or put back into
        delta._layout.weave([whole[:10], np.zeros(30, np.uint8)], [1, 3], whole)
    with pytest.raises(BufferError):  # records that cannot be written
        delta._layout.weave(two, [1, 3], bytes(40))


def test_records_decode_alike_with_and_without_the_kernel(monkeypatch):
    from brevis.dsl import REGISTRY, Program, decode, encode, records
    from brevis.dsl.types import Field

    x = np.random.default_rng(4).integers(0, 256, 22 * 500).astype(np.uint8)
    node = REGISTRY["records"](fields=[[1, 2], [2, 1], [16, 1]])
    program = Program(node, tuple(Program(REGISTRY[c](), ()) for c in ("raw", "ans", "raw")))
    streams = encode(program, x, Field(8))
    fast = decode(program, Field(8), len(x), [memoryview(s) for s in streams])
    monkeypatch.setattr(records, "_layout", None)
    assert encode(program, x, Field(8)) == streams  # the fields taken apart alike
    assert np.array_equal(fast, x) and np.array_equal(decode(program, Field(8), len(x), [memoryview(s) for s in streams]), x)


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


@pytest.mark.parametrize("listed", [0, 1, 4, 16, 17, 200])
@pytest.mark.parametrize("n", [0, 31, 32, 1000, 4099])
def test_classify_of_bytes_is_numpys(listed, n):
    """Byte contexts with a class for every value: up to 16 values outside
    the most common class take the AVX2 kernel (where the CPU has it), more
    the loop; both are a take and a bincount."""
    rng = np.random.default_rng(listed * 7 + n)
    table = np.full(256, 5, np.uint8)
    table[rng.choice(256, listed, replace=False)] = rng.integers(0, 5, listed)
    context = rng.choice(np.concatenate([np.flatnonzero(table != 5), [0, 255, 7]]), n).astype(np.uint8)
    cls = np.empty(n, np.uint8)
    counts = delta._layout.classify(context, table, cls)
    assert np.array_equal(cls, table[context])
    assert counts == np.bincount(table[context], minlength=256).tolist()


def test_classify_counts_and_refuses_values_past_the_table():
    table = np.array([2, 0, 1, 2], np.uint8)
    context = np.array([0, 1, 2, 3, 3, 1], np.uint16)
    cls = np.empty(6, np.uint8)
    counts = delta._layout.classify(context, table, cls)
    assert cls.tolist() == [2, 0, 1, 2, 2, 0] and counts[:3] == [2, 1, 3] and sum(counts) == 6
    with pytest.raises(ValueError):
        delta._layout.classify(np.array([0, 4], np.uint16), table, np.empty(2, np.uint8))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("k", [1, 3, 256])
def test_split_classes_gives_each_class_its_elements_in_order(dtype, k):
    rng = np.random.default_rng(k)
    for n in (0, 1, 1000):
        cls = rng.integers(0, k, n).astype(np.uint8)
        src = rng.integers(0, np.iinfo(dtype).max, n, dtype=np.uint64, endpoint=True).astype(dtype)
        parts = [np.empty(int(np.count_nonzero(cls == j)), dtype) for j in range(k)]
        delta._layout.split_classes(cls, src, parts)
        for j in range(k):
            assert np.array_equal(parts[j], src[cls == j])


def test_split_classes_refuses_parts_that_do_not_match_the_classes():
    cls = np.array([0, 1, 1, 0, 2], np.uint8)
    src = np.arange(5, dtype=np.uint32)
    sizes = [2, 2, 1]
    for wrong in ([2, 2], [2, 1, 1], [2, 2, 2], [3, 2, 1]):
        with pytest.raises(ValueError):
            delta._layout.split_classes(cls, src, [np.empty(m, np.uint32) for m in wrong])
    with pytest.raises(ValueError):  # parts of another item size
        delta._layout.split_classes(cls, src, [np.empty(m, np.uint16) for m in sizes])
    with pytest.raises(ValueError):  # a class for every element
        delta._layout.split_classes(cls[:4], src, [np.empty(m, np.uint32) for m in sizes])
    with pytest.raises(ValueError):
        delta._layout.split_classes(cls, src, [])
    frozen = [np.empty(m, np.uint32) for m in sizes]
    frozen[1].flags.writeable = False
    with pytest.raises((ValueError, BufferError, TypeError)):
        delta._layout.split_classes(cls, src, frozen)


# scatter_join: the partition's scatter and joins at once. Ranges from the word's
# high bits down take the BMI2 deposit kernels (in the widths floats have), or,
# with AVX-512 (and VBMI2 for 16-bit words) and at most 16 classes, the expand
# kernels (simd=True, the default; simd=False keeps to the deposit kernels), or
# with AVX2 only, F32 words of at most six classes the AVX2 expand kernel (one
# body inlined for each count of classes); the others, and other widths, the
# element-by-element loop.
@pytest.mark.parametrize("rest,context,bits,rest_dtype,context_dtype", [
    ([[31, 1], [0, 23]], [[23, 8]], 32, np.uint32, np.uint8),   # F32 by exponent: deposit
    ([[15, 1], [0, 7]], [[7, 8]], 16, np.uint8, np.uint8),      # BF16: deposit
    ([[15, 1], [0, 10]], [[10, 5]], 16, np.uint16, np.uint8),   # F16: deposit
    ([[27, 5], [12, 11], [0, 8]], [[23, 4], [8, 4]], 32, np.uint32, np.uint8),  # not a float's runs
    ([[0, 23], [31, 1]], [[23, 8]], 32, np.uint32, np.uint8),   # low range first: elementwise
    ([[31, 1], [0, 23]], [[23, 8]], 32, np.uint32, np.uint16),  # a width without a kernel
    ([[63, 1], [0, 52]], [[52, 11]], 64, np.uint64, np.uint16), # F64: deposit
])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7, 16, 17, 200])
@pytest.mark.parametrize("simd", [True, False])
def test_scatter_join_is_scatter_then_join(rest, context, bits, rest_dtype, context_dtype, k, simd):
    from brevis.dsl import fields
    from brevis.dsl.types import Field

    rng = np.random.default_rng(k * bits)
    t, n = Field(bits), 4001
    x = rng.integers(0, 1 << 62, n, dtype=np.uint64).astype(t.container)
    ctx, rest_field = fields._split(x, [context, rest])
    ctx = ctx.astype(context_dtype)
    cls = rng.integers(0, k, n).astype(np.uint8)
    parts = [rest_field[cls == j].astype(rest_dtype) for j in range(k)]
    out = np.empty(n, t.container)
    delta._layout.scatter_join(cls, parts, [tuple(r) for r in rest], ctx, [tuple(r) for r in context], out, simd)
    assert np.array_equal(out, x)


def test_scatter_join_refuses_parts_that_do_not_match_the_classes():
    cls = np.array([0, 1, 1, 0, 2], np.uint8)
    ctx = np.arange(5, dtype=np.uint8)
    x = np.arange(5, dtype=np.uint32)
    good = [x[cls == j] for j in range(3)]
    out = np.empty(5, np.uint32)
    for ranges in ([(0, 23)], [(0, 23), (31, 1)]):  # the deposit kernel and the elementwise loop
        for parts in (good[:2], [good[0], good[1][:1], good[2]], [good[0], good[1], np.zeros(2, np.uint32)],
                      [good[0], good[1], good[2], np.zeros(1, np.uint32)], [good[0].view(np.uint8)[:3]] + good[1:],
                      [good[0], good[1].astype(np.uint16), good[2]]):
            with pytest.raises(ValueError):
                delta._layout.scatter_join(cls, parts, ranges, ctx, [(23, 8)], out)
    with pytest.raises(ValueError):
        delta._layout.scatter_join(cls, good, [(0, 23)], ctx, [(23, 8)], np.empty(4, np.uint32))  # wrong size
    with pytest.raises(ValueError):
        delta._layout.scatter_join(cls, good, [(0, 33)], ctx, [(23, 8)], out)  # outside the word
    with pytest.raises(ValueError):
        delta._layout.scatter_join(cls, [], [(0, 23)], ctx, [(23, 8)], out)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_lookup_and_patch_undo_ranks(dtype):
    rng = np.random.default_rng(7)
    table = rng.integers(0, 200, 16).astype(dtype)
    table[-1] = 0  # the escape's entry
    ranks = rng.integers(0, 16, 3001).astype(np.uint8)
    out = np.empty(len(ranks), dtype)
    escaped = delta._layout.lookup(ranks, table, out)
    assert escaped == int(np.count_nonzero(ranks == 15))
    values = rng.integers(0, 255, escaped).astype(dtype)
    delta._layout.patch(ranks, 15, values, out)
    want = table[ranks]
    want[ranks == 15] = values
    assert np.array_equal(out, want)
    with pytest.raises(ValueError):
        delta._layout.lookup(np.array([16], np.uint8), table, np.empty(1, dtype))  # past the table
    for past in (16, 128, 255):  # inside a vector of 32: the largest rank refuses it
        wrong = ranks.copy()
        wrong[5] = past
        with pytest.raises(ValueError):
            delta._layout.lookup(wrong, table, np.empty(len(ranks), dtype))
    short = table[:9].copy()  # fewer than 16 entries: ranks up to 8, the escape 8
    small = ranks % 9
    got = np.empty(len(small), dtype)
    assert delta._layout.lookup(small, short, got) == int(np.count_nonzero(small == 8))
    assert np.array_equal(got, short[small])
    with pytest.raises(ValueError):
        delta._layout.lookup(np.full(40, 9, np.uint8), short, np.empty(40, dtype))
    for wrong in (values[:-1], np.append(values, values[:1])):
        with pytest.raises(ValueError):
            delta._layout.patch(ranks, 15, wrong, out)


def test_patch_finds_escapes_at_the_ends_and_none_past_a_byte():
    ranks = np.array([3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3], np.uint8)
    out = np.zeros(len(ranks), np.uint32)
    delta._layout.patch(ranks, 3, np.array([7, 9], np.uint32), out)
    assert out[0] == 7 and out[-1] == 9 and not out[1:-1].any()
    delta._layout.patch(ranks, 256, np.zeros(0, np.uint32), out)  # a rank of 256: no byte escapes
    with pytest.raises(ValueError):
        delta._layout.patch(ranks, 256, np.zeros(1, np.uint32), out)


@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("n", [0, 1, 7, 4001])
def test_unpack_undoes_pack_bits(bits, n, monkeypatch):
    from brevis.dsl import REGISTRY, Program, decode, encode, fields
    from brevis.dsl.types import Field

    x = np.random.default_rng(n).integers(0, 1 << bits, n).astype(np.uint8)
    program = Program(REGISTRY["pack_bits"](), (Program(REGISTRY["raw"](), ()),))
    streams = [memoryview(s) for s in encode(program, x, Field(bits))]
    fast = decode(program, Field(bits), n, streams)
    monkeypatch.setattr(fields, "_layout", None)
    assert np.array_equal(fast, x) and np.array_equal(decode(program, Field(bits), n, streams), x)
    if n:
        with pytest.raises(ValueError):
            delta._layout.unpack(np.zeros(len(streams[0]) + 1, np.uint8), bits, np.empty(n, np.uint8))


@pytest.mark.parametrize("bits", [8, 12, 16, 24, 32, 40, 64])
def test_interleave_undoes_byte_planes(bits, monkeypatch):
    from brevis.dsl import REGISTRY, Program, decode, encode, planes
    from brevis.dsl.types import Field

    t = Field(bits)
    x = np.random.default_rng(bits).integers(0, 1 << 62, 2001, dtype=np.uint64).astype(t.container)
    x &= t.container.type((1 << bits) - 1)
    program = Program(REGISTRY["byte_planes"](), tuple(Program(REGISTRY["raw"](), ()) for _ in range((bits + 7) // 8)))
    streams = [memoryview(s) for s in encode(program, x, t)]
    fast = decode(program, t, len(x), streams)
    monkeypatch.setattr(planes, "_layout", None)
    assert np.array_equal(fast, x) and np.array_equal(decode(program, t, len(x), streams), x)
    with pytest.raises(ValueError):
        delta._layout.interleave([np.zeros(3, np.uint8)] * 9, np.empty(3, np.uint64))  # more planes than bytes
    with pytest.raises(ValueError):
        delta._layout.interleave([np.zeros(3, np.uint8), np.zeros(2, np.uint8)], np.empty(3, np.uint16))


def test_rank_decodes_alike_with_and_without_the_kernels(monkeypatch):
    from brevis.dsl import REGISTRY, Program, decode, encode, symbols
    from brevis.dsl.types import Field

    rng = np.random.default_rng(11)
    x = rng.choice([120, 121, 122, 119, 3000], 5000, p=[0.4, 0.3, 0.2, 0.09, 0.01]).astype(np.uint16)
    program = Program(REGISTRY["rank"](symbols=[120, 121, 122, 119]),
                      (Program(REGISTRY["raw"](), ()), Program(REGISTRY["raw"](), ())))
    streams = [memoryview(s) for s in encode(program, x, Field(16))]
    fast = decode(program, Field(16), len(x), streams)
    monkeypatch.setattr(symbols, "_layout", None)
    assert np.array_equal(fast, x) and np.array_equal(decode(program, Field(16), len(x), streams), x)


FLOATS = {  # word, exponent bits, mantissa bits, part (sign and mantissa)
    "F32": (np.uint32, 8, 23, np.uint32),
    "BF16": (np.uint16, 8, 7, np.uint8),
    "F16": (np.uint16, 5, 10, np.uint16),
}


@pytest.mark.parametrize("k", [1, 2, 5, 6, 7, 16, 17])
@pytest.mark.parametrize("dtype", list(FLOATS))
@pytest.mark.parametrize("simd", [True, False])
@pytest.mark.parametrize("at", [3, 70, 230])
def test_scatter_join_of_floats_by_exponent_refuses_damage_early_and_late(k, dtype, simd, at):
    """Float words by their exponent (the deposit and expand kernels): a
    part that runs out at element `at`, one a word too long, or a class
    without a part at `at` (in the first block of 16 or 32, in a later one,
    in the last elements a block leaves) is refused."""
    word, ebits, mbits, part = FLOATS[dtype]
    bits = 8 * np.dtype(word).itemsize
    rng = np.random.default_rng(k)
    n = 250
    x = rng.integers(0, 1 << 62, n, dtype=np.uint64).astype(word)
    cls = rng.integers(0, k, n).astype(np.uint8)
    ctx = (x >> mbits & ((1 << ebits) - 1)).astype(np.uint8)
    rest = ((x & ((1 << mbits) - 1)) | (x >> (bits - 1) << mbits)).astype(part)
    parts = [rest[cls == j].copy() for j in range(k)]
    args = ([(bits - 1, 1), (0, mbits)], ctx, [(mbits, ebits)])
    out = np.empty(n, word)
    delta._layout.scatter_join(cls, parts, args[0], args[1], args[2], out, simd)
    assert np.array_equal(out, x)
    first = int(cls[at])
    before = int(np.count_nonzero(cls[:at] == first))
    short = list(parts)
    short[first] = parts[first][:before]
    longer = list(parts)
    longer[first] = np.append(parts[first], part(0))
    stray = cls.copy()
    stray[at] = k
    for c, ps in ((cls, short), (cls, longer), (stray, parts)):
        with pytest.raises(ValueError):
            delta._layout.scatter_join(c, ps, args[0], args[1], args[2], out, simd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes")
@pytest.mark.parametrize("k", [1, 2, 5, 6])
@pytest.mark.parametrize("simd", [True, False])
def test_scatter_join_reads_nothing_past_a_part(k, simd):
    """Each F32 part ends just before a page that may not be read: a kernel
    loading a part's next eight elements past its last (the AVX2 expand
    kernel near a part's end) would crash the test process. Whole parts,
    and parts one element short (refused), at sizes around a block's."""
    word, ebits, mbits, part = FLOATS["F32"]
    rng = np.random.default_rng(k)
    for n in (1, 7, 8, 9, 63, 200):
        x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(word)
        cls = rng.integers(0, k, n).astype(np.uint8)
        ctx = (x >> mbits & ((1 << ebits) - 1)).astype(np.uint8)
        rest = ((x & ((1 << mbits) - 1)) | (x >> 31 << mbits)).astype(part)
        for short in (False, True):
            parts = [rest[cls == j].tobytes() for j in range(k)]
            if short:
                parts[int(cls[-1])] = parts[int(cls[-1])][:-4]
            with contextlib.ExitStack() as stack:
                views = [stack.enter_context(before_unreadable_page(p)) for p in parts]
                arrays = [np.frombuffer(v, dtype=part) for v in views]
                out = np.empty(n, word)
                try:
                    if short:
                        with pytest.raises(ValueError):
                            delta._layout.scatter_join(cls, arrays, [(31, 1), (0, mbits)], ctx, [(mbits, ebits)], out,
                                                       simd)
                    else:
                        delta._layout.scatter_join(cls, arrays, [(31, 1), (0, mbits)], ctx, [(mbits, ebits)], out, simd)
                        assert np.array_equal(out, x)
                finally:
                    del arrays  # the views' buffers are released on the way out


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize("stride", [1, 2, 3, 7, 64, 5000])
@pytest.mark.parametrize("bits_of", ["full", "narrow"])
def test_delta_and_xor_delta_decode_alike_with_and_without_the_kernel(dtype, stride, bits_of, monkeypatch):
    """The running sums and xors of `prefix` (in place) against numpy's
    cumsum and accumulate, for fields that fill their items or not, and a
    child's value that is read-only (a raw leaf's stream) is left as it is."""
    from brevis.dsl import Delta, XorDelta, delta as module
    from brevis.dsl.types import Field

    width = 8 * np.dtype(dtype).itemsize
    bits = width if bits_of == "full" else width - 3
    t = Field(bits)
    x = np.random.default_rng(stride).integers(0, 1 << bits, 3001, dtype=np.uint64).astype(t.container)
    for op in (Delta(stride=stride), XorDelta(stride=stride)):
        (y,) = op.forward(x, t)
        y.flags.writeable = False  # as a raw leaf's value is
        fast = op.inverse(len(x), t, lambda i, n: y)
        monkeypatch.setattr(module, "_layout", None)
        slow = op.inverse(len(x), t, lambda i, n: y)
        monkeypatch.undo()
        assert np.array_equal(fast, x) and np.array_equal(slow, x)
        (z,) = op.forward(x, t)
        assert np.array_equal(y, z)  # untouched
    with pytest.raises(ValueError):
        delta._layout.prefix(np.zeros(4, np.uint8), 0, True)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_zigzag_decodes_alike_with_and_without_the_kernel(dtype, monkeypatch):
    """unzigzag (in place) against numpy's four passes, extremes included,
    and a child's value that is read-only (a raw leaf's stream) is left as it is."""
    from brevis.dsl import ZigZag, delta as module
    from brevis.dsl.types import Field

    t = Field(8 * np.dtype(dtype).itemsize)
    top = np.iinfo(dtype).max
    x = np.concatenate([np.array([0, 1, top, top - 1, top // 2, top // 2 + 1], dtype),
                        np.random.default_rng(5).integers(0, top, 2001, dtype=np.uint64, endpoint=True).astype(dtype)])
    op = ZigZag()
    (z,) = op.forward(x, t)
    z.flags.writeable = False
    fast = op.inverse(len(x), t, lambda i, n: z)
    monkeypatch.setattr(module, "_layout", None)
    slow = op.inverse(len(x), t, lambda i, n: z)
    monkeypatch.undo()
    assert np.array_equal(fast, x) and np.array_equal(slow, x)
    assert np.array_equal(z, op.forward(x, t)[0])  # untouched
    with pytest.raises(ValueError):
        delta._layout.unzigzag(np.zeros(3, np.dtype("V3")))


def test_scatter_puts_each_piece_and_refuses_pieces_outside_their_buffers():
    src = np.arange(100, dtype=np.uint8)
    dst = np.zeros(50, np.uint8)
    delta._layout.scatter(src, [(0, 10, 5), (40, 95, 5), (20, 0, 0), (7, 0, 3)], dst)
    want = np.zeros(50, np.uint8)
    want[0:5], want[40:45], want[7:10] = src[10:15], src[95:100], src[0:3]
    assert np.array_equal(dst, want)
    for bad in ([(46, 0, 5)], [(0, 96, 5)], [(-1, 0, 1)], [(0, -1, 1)], [(0, 0, -1)], [(0, 0)], [[0, 0, 1]],
                [(0, 0, 1), (0, 0, 1 << 62)]):
        before = dst.copy()
        with pytest.raises((ValueError, TypeError, OverflowError)):
            delta._layout.scatter(src, bad, dst)
        assert np.array_equal(dst, before)  # every piece checked before any is copied
    with pytest.raises((ValueError, TypeError, BufferError)):
        delta._layout.scatter(src, [(0, 0, 1)], src.tobytes())  # read-only destination
