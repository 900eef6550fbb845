"""Which productions are worth trying on a value, judged from its sample.

Each proposal is a fully configured production (a resolved choice, never
"auto"): the configuration is read off the sample (the dominant value of
a sparse field, the live bits of a field, the exponents that deserve
their own sub-stream, ...). Whether it pays is for the search to measure.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
from xxhash import xxh3_128_digest

from ..dsl import (Ans, Affine, BitFields, BytePlanes, Records, SubBase, XorBase, Constant, Delta, Field, FloatFields, LowZeroBits, PackBits,
                   Partition, Rank, Raw, RowDedup, Sparse, Tensor, Transpose, View, XorDelta, ZigZag, Zstd)
from ..dsl.operator import Operator, Production
from ..dsl.types import tensor
from ..dsl.entropy import _rans
from ..errors import ProgramError
from .estimates import remembered

MAX_DEPTH = 6
SMALL_VALUE = 64  # elements per sample slice below which only coders are tried
MAX_CLASSES = 4  # sub-streams of a partition, besides the rest
CODERS = (Raw(), Zstd.entropy(), Zstd.at_level(3), Ans())
# Opaque bytes: no `ans` at the root. Its order-0 statistics look as good
# as zstd's on a sample, which is too short to show the repeats (strings,
# zero runs, copies) that decide for zstd on the whole span; typed values
# (fields, tensors found in the bytes) get it. No higher zstd level: levels
# 9 and 19 (honoured since 2026-12-06) made archives 0.00-0.39 % smaller
# (0.1 % on gemma3's and smollm2's GGUF, 0.4 % on silero) and compression
# 1.03-2.34x as long (benchmarks/results/ab-b5074ac-221a4e0-zstd-levels.md);
# LZMA is tried where a span's repeats pay more.
BYTE_CODERS = (Raw(), Zstd.entropy(), Zstd.at_level(3))
NIBBLES = BitFields(groups=[[[4, 4]], [[0, 4]]])
WORD_VIEWS = (Records(fields=[[1, 2]]), Records(fields=[[1, 4]]))
FLOAT_VIEWS = tuple(View(dtype=d) for d in ("F16", "BF16", "F32", "F64"))
VIEW_SLACK = 0.02
# Proposed only where a value's sample shows their structure: detectors
# whose finding the search always tries (see Search.options).
DETECTED = (Rank, Sparse, Constant, LowZeroBits, RowDedup, Affine)
FEW_PROBE = 4096  # wide values probed for how many distinct ones they hold ...
FEW_VALUES = 512  # ... and at most this many: measured as symbols
HALF_FIELDS = BitFields(groups=[[[10, 5]], [[15, 1], [0, 10]]])


@dataclass(eq=False)
class Value:
    """An open value of a partial program, with its sample (one array per sample chunk)."""

    slices: list[np.ndarray]
    t: Field
    row: int | None = None  # elements per row, while elements keep tensor order
    parent: Operator | None = None  # the operator this value is a child of; None at the root
    depth: int = 0
    opaque: bool = False  # a byte segment whose structure is unknown
    records: list | None = None  # field layout of fixed-size records, from the format
    reference: list[np.ndarray] | None = None  # the base tensor at the sample's places (root only)
    memo: dict = field(default_factory=dict)

    @property
    def parent_id(self) -> str:
        """The parent's production id ("root" at the root): the prior's context."""
        return "root" if self.parent is None else self.parent.id

    @cached_property
    def joined(self) -> np.ndarray:
        return np.concatenate(self.slices) if len(self.slices) > 1 else self.slices[0]

    @cached_property
    def entropy_bytes(self) -> float:
        """Order-0 entropy of the sample's bytes (per byte plane for wide
        fields, with the Miller-Madow small-sample correction), at most the
        raw size: an optimistic size for what is left of this value."""
        x = self.joined
        if not len(x):
            return 0.0
        planes = [x.astype(np.uint8)] if self.t.bits <= 8 else \
            [p for p in x.view(np.uint8).reshape(len(x), -1).T[: (self.t.bits + 7) // 8]]
        total = sum(_entropy_bits(plane) for plane in planes)
        if 8 < self.t.bits <= 16 or self.t.bits in (24, 32):
            # The top 16 bits as one symbol (what `ans` codes): below the
            # planes' sum where they depend on each other (a float's
            # exponent and top mantissa bits).
            shift = max(0, self.t.bits - 16)
            total = min(total, _top_bits(x, self.t.bits) + sum(_entropy_bits(plane) for plane in planes[: shift // 8]))
        if self.t.bits > 16 and self.depth == 0:
            # Few distinct wide values (dequantized weights, a table of
            # floats): their own entropy, far below the planes' (what `rank`
            # codes, proposed for wide values where they are a root: a
            # segment's, or a tensor read out of bytes). Without it the
            # search would judge the value by its planes and never open it.
            seen = x[:: max(1, len(x) // FEW_PROBE)]
            if _distinct(seen) <= FEW_VALUES:
                _, counts = np.unique(x, return_counts=True)
                total = min(total, _counts_bits(counts))
        return float(min(total, self.t.bits * len(x))) / 8

    @cached_property
    def difference_bytes(self) -> float | None:
        """Where `delta` is proposed at a float tensor's root, what the
        differences of neighbouring bit patterns would leave of entropy_bytes:
        those less the order-0 entropy of the values' top 16 bits (a
        float's sign, exponent and top mantissa bits, where neighbours are
        alike) plus that of the differences' (each slice's first element as
        it is, as `delta` codes a chunk). The low bits are noise either way
        (one count of 16-bit symbols, not a byte plane's each: a third of
        the time, which a search would pay on every float tensor); None
        elsewhere."""
        t = self.t
        if not (self.parent is None and not self.opaque and isinstance(t, Tensor)
                and t.dtype.is_float and t.bits > 8 and len(self.joined) > len(self.slices)):
            return None
        parts = []
        for s in self.slices:
            d = np.empty_like(s)
            d[:1] = s[:1]
            np.subtract(s[1:], s[:-1], out=d[1:])  # modulo the container's width, which t.bits fills
            parts.append(d)
        d = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return max(0.0, self.entropy_bytes + (_top_bits(d, t.bits) - _top_bits(self.joined, t.bits)) / 8)

    @cached_property
    def spike_bits(self) -> float:
        """Bits a value that `ans` pays for nothing where it codes this
        value's words as they are: its most common word, where the field is
        wider than the 16-bit keys, takes a bin of its own key whose low
        bits go raw although they never vary (rapidocr's 1x1 convolutions:
        2.9 % zeros, 0.47 bits a value). The sample's share of it times the
        bits below the key; 0 for fields of 16 bits or fewer."""
        x = self.joined
        if self.t.bits <= 16 or not len(x):
            return 0.0
        _, counts = _histogram(x, self.t)
        return float(counts.max()) / len(x) * (self.t.bits - 16)

    @cached_property
    def neighbours_alike(self) -> bool:
        """Whether neighbouring values' differences have less entropy than
        the values (difference_bytes): a float of one sign is monotone in its
        bits, so where a tensor changes smoothly (Adam's second moments)
        they are small. The planner then searches rather than take a
        learned or a sibling's program that does not come near them
        (sevenn's exp_avg_sq: `ans` 8 % larger than `delta` and `ans`), and
        an informed search that found no `delta` tries it after
        (Search.differences), whatever its prior says."""
        d = self.difference_bytes
        return d is not None and d < self.entropy_bytes

    @cached_property
    def is_constant(self) -> bool:
        x = self.joined
        return bool(len(x)) and bool(np.all(x == x[0]))


def _top_bits(x: np.ndarray, bits: int) -> float:
    """Order-0 entropy in bits of the top 16 bits of `bits`-bit values, as
    one symbol (what `ans` codes; entropy_bytes's joint count)."""
    return _entropy_bits((x >> x.dtype.type(max(0, bits - 16))).astype(np.uint16))


def _counts_bits(counts: np.ndarray) -> float:
    """Order-0 entropy in bits of symbols with these counts, Miller-Madow corrected."""
    counts = counts[counts > 0].astype(np.float64)
    n = counts.sum()
    return float(n * np.log2(n) - (counts * np.log2(counts)).sum() + (len(counts) - 1) / (2 * np.log(2)))


def _entropy_bits(symbols: np.ndarray) -> float:
    """Order-0 entropy of a sample in bits, with the Miller-Madow small-sample correction."""
    n = len(symbols)
    if _rans is not None and symbols.dtype in (np.uint8, np.uint16):
        total, distinct = _symbol_counts(np.ascontiguousarray(symbols))
        return n * np.log2(n) - total + (distinct - 1) / (2 * np.log(2))
    return _counts_bits(np.bincount(symbols))


COUNTS_MEMO_ENTRIES = 1024  # the most recent (sum c log2 c, distinct) kept
COUNTS_MEMO_MIN = 4096  # symbols; fewer are counted again (their digest costs about as much)
_counts_memo: dict[tuple, tuple[float, int]] = {}
_counts_lock = threading.Lock()  # planning threads share the memo


def _symbol_counts(symbols: np.ndarray) -> tuple[float, int]:
    """_rans.counts of 8 or 16-bit symbols, from a memo of their digests:
    the search counts the same symbols reached by two paths (a field and
    a byte plane, a float's top bits, a sibling's), 39 % of ppocr's counts."""
    if len(symbols) < COUNTS_MEMO_MIN:
        return _rans.counts(symbols, symbols.itemsize)
    key = (symbols.itemsize, len(symbols), xxh3_128_digest(symbols))
    return remembered(_counts_memo, _counts_lock, COUNTS_MEMO_ENTRIES, key,
                      lambda: _rans.counts(symbols, symbols.itemsize))


def low_zeros(x: np.ndarray) -> int:
    """How many low bits every element of x has zero (0 where all are zero)."""
    low = int(np.bitwise_or.reduce(x)) if len(x) else 0
    return (low & -low).bit_length() - 1 if low else 0


def _likely_views(v: Value, lengths: list[int]) -> list[View]:
    """The float views of opaque bytes whose elements read about as well as
    the best one's (order-0 entropy of the top 16 bits and the other
    bytes, within VIEW_SLACK): the element width the data has, found by
    measuring. A wrong width spreads a float's sign and exponent over two
    symbols; its subtree would take the search's budget for nothing."""
    fits = [op for op in FLOAT_VIEWS if all(n % op.dtype.itemsize == 0 for n in lengths)]
    if len(fits) < 2:
        return fits
    bits = {op: Value([s.view(op.dtype.uint) for s in v.slices], tensor(op.dtype)).entropy_bytes for op in fits}
    best = min(bits.values())
    return [op for op in fits if bits[op] <= best * (1 + VIEW_SLACK)]


def _float_partition(v: Value) -> Partition | None:
    """Exponent-context partition of sign+mantissa for a float tensor."""
    d = v.t.dtype
    m, e = d.mantissa_bits, d.exponent_bits
    exponent = ((v.joined >> v.t.container.type(m)) & v.t.container.type((1 << e) - 1)).astype(np.int64)
    counts = np.bincount(exponent, minlength=1 << e)
    top = np.argsort(-counts, kind="stable")[:MAX_CLASSES]
    classes = [[int(c)] for c in top if counts[c] >= 0.04 * len(exponent)]
    if len(classes) < 2:
        return None
    return Partition(context=[[m, e]], rest=[[m + e, 1], [0, m]], classes=classes)


def _distinct(x: np.ndarray) -> int:
    """How many distinct values x holds. (np.unique's plain form asks
    numpy.ma whether x is masked, importing it: 9 ms of a compress.)"""
    s = np.sort(x, axis=None)
    return int(len(s) and 1 + np.count_nonzero(s[1:] != s[:-1]))


def _row_heads(rows: np.ndarray) -> np.ndarray:
    """A uint64 of each row's first 16 bytes (zeros past a shorter row's
    end): equal rows have equal heads."""
    b = np.ascontiguousarray(rows).view(np.uint8).reshape(len(rows), -1)[:, :16]
    if b.shape[1] < 16:
        b = np.pad(b, ((0, 0), (0, 16 - b.shape[1])))
    w = np.ascontiguousarray(b).view(np.uint64)
    return w[:, 0] ^ (w[:, 1] * np.uint64(0x9E3779B97F4A7C15))


def _top_sum(counts: np.ndarray, k: int) -> int:
    """The sum of the k largest counts (all of them where there are fewer):
    one partition, not a sort of every distinct value's count (a 16-bit
    field's thousands, asked for every value the search opens)."""
    if len(counts) <= k:
        return int(counts.sum())
    return int(np.partition(counts, len(counts) - k)[len(counts) - k:].sum())


def _histogram(x: np.ndarray, t: Field) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values and their counts, in increasing order (counted, not
    sorted, where the alphabet is small)."""
    if _rans is not None and x.dtype in (np.uint8, np.uint16) and len(x):
        keys, counts = _rans.key_counts(np.ascontiguousarray(x), x.itemsize)
        return np.frombuffer(keys, np.uint32), np.frombuffer(counts, np.int64)
    if t.bits <= 16:
        counts = np.bincount(x, minlength=1)
        values = np.flatnonzero(counts)
        return values, counts[values]
    return np.unique(x, return_counts=True)


@lru_cache(maxsize=None)
def halves(bits: int) -> BitFields:
    """A word's high and low halves as two fields (32- or 64-bit words)."""
    half = bits // 2
    return BitFields(groups=[[[half, half]], [[0, half]]])


def coders_for(t: Field, opaque: bool = False) -> list[Production]:
    """The coder leaves that take values of type t."""
    out = []
    for coder in BYTE_CODERS if opaque else CODERS:
        try:
            coder.accepts(t)
        except ProgramError:
            continue
        out.append(coder)
    return out


def proposals(v: Value) -> list[Production]:
    t, x = v.t, v.joined
    out: list[Production] = coders_for(t, v.opaque)
    if v.depth >= MAX_DEPTH or not len(x):
        return out
    if len(x) < SMALL_VALUE * len(v.slices) and not v.is_constant:
        return out  # a few stray values (exceptions, counts): structure cannot pay
    if v.is_constant:
        # A value of one element per chunk (a count, a start) differs from
        # chunk to chunk even when the sample's few agree: not a constant.
        if len(x) >= 16 * len(v.slices):
            out.append(Constant(value=int(x[0])))
        return out
    lengths = [len(s) for s in v.slices]
    # What the parent operator declares about its children (see Operator).
    records_field = v.parent is not None and v.parent.splits_records
    try_delta = v.parent is None or v.parent.delta_children or v.parent.typed_children
    signed = v.parent is not None and v.parent.signed_children
    ranked = v.parent is not None and v.parent.ranked_children
    if v.reference is not None:
        out += [XorBase(), SubBase()]
    if v.records:
        op = Records(fields=v.records)
        if all(n % op.record_bytes == 0 for n in lengths):
            out.append(op)
    elif v.opaque and v.depth == 0:
        # Bytes no parser typed: read them as words, as ZipNN reads a
        # whole file as one float array. Where they are numbers (an unknown
        # format's tensors), the words' fields and their joint statistics
        # show; where not, the search says so.
        # As typed floats of each width (the float operators then apply as
        # on a parsed tensor: exponent apart from sign and mantissa,
        # partitions by exponent, ranks of few values), and as untyped
        # 2-byte words (integers; HALF_FIELDS splits them as F16). Not as
        # untyped 4-byte words: the same numbers as F32's, which the search
        # would spend its budget on twice.
        out += _likely_views(v, lengths)
        out += [op for op in WORD_VIEWS[:1] if all(n % op.record_bytes == 0 for n in lengths)]
    if records_field and t.bits == 8:
        out.append(NIBBLES)  # packed 4-bit quants: high and low nibbles apart
    if records_field and t.bits == 16:
        out.append(HALF_FIELDS)  # f16 scales: exponent, sign+mantissa
    if isinstance(t, Tensor) and t.dtype.is_float and t.bits > 8:
        out += [FloatFields(grouping="e|sm"), FloatFields(grouping="s|e|m")]
        p = _float_partition(v)
        if p is not None:
            out.append(p)
    if t.bits > 8:
        out.append(BytePlanes())
    if t.bits in (32, 64) and not v.opaque:
        # High and low halves: an entropy coder then sees a float's sign,
        # exponent and top mantissa bits as one symbol, and the low half's
        # own structure (values of a lower precision have it all zero).
        out.append(halves(t.bits))
    if t.bits in (1, 2, 4):
        out.append(PackBits())
    if t.bits > 1:
        zeros = low_zeros(x)
        if 0 < zeros < t.bits:
            out.append(LowZeroBits(shift=zeros))
    integer_like = not (isinstance(t, Tensor) and t.dtype.is_float) and not v.opaque
    if isinstance(t, Tensor) and t.dtype.is_float and t.bits > 8 and v.depth == 0:
        # Differences of neighbouring bit patterns: where a tensor's values
        # change smoothly (Adam's second moments), a float of one sign is
        # monotone in its bits, so the difference is small.
        out.append(Delta(stride=1))
    if integer_like and t.bits >= 8 and try_delta:
        out += [Delta(stride=1), XorDelta(stride=1)]
        if v.row and v.row > 1 and all(n % v.row == 0 for n in lengths):
            out += [Delta(stride=v.row), XorDelta(stride=v.row)]
        first = v.slices[0]
        if len(first) > 2:
            step = int(first[1]) - int(first[0])
            if np.all(np.diff(first) == first.dtype.type(step % (1 << (8 * first.itemsize)))):
                out.append(Affine(step=step % (1 << t.bits)))
    if signed and t.bits in (8, 16, 32, 64):
        out.append(ZigZag())
    if v.depth == 0 and v.row and 1 < v.row < len(x) and all(n % v.row == 0 for n in lengths):
        out.append(Transpose(cols=v.row))
        rows = x.reshape(-1, v.row)
        # Rows with equal heads may differ, equal rows never have other heads:
        # as many distinct heads is enough to tell (a sort of 8-byte keys),
        # where a sort of whole rows cost 0.8 ms a value (easyocr's weights).
        limit = 0.9 * len(rows)
        if _distinct(_row_heads(rows)) < limit and _distinct(rows.view(np.dtype((np.void, v.row * x.itemsize)))) < limit:
            out.append(RowDedup(row=v.row))
    if t.bits <= 16 or v.depth == 0:
        seen = x if t.bits <= 16 else x[:: max(1, len(x) // 4096)]
        values, counts = _histogram(seen, t)
        top = int(np.argmax(counts))
        if 0.9 <= counts[top] / len(seen) < 1:
            out.append(Sparse(value=int(values[top])))
        if t.bits > 8 and len(values) > 1 and _top_sum(counts, 255) >= 0.95 * len(seen):
            order = np.argsort(-counts, kind="stable")[:255]
            out.append(Rank(symbols=[int(values[i]) for i in order]))
        if 4 < t.bits <= 8 and len(values) > 2 and not v.opaque and not ranked:
            # Ranks of a small alphabet in 4 bits, packed two to a byte: the
            # entropy coder then codes pairs, which wastes less than coding
            # single skewed symbols (exponents: about 0.04 bits per value).
            order = np.argsort(-counts, kind="stable")[:15]
            if counts[order].sum() >= 0.99 * len(seen):
                top = [int(values[i]) for i in order]
                unused = (u for u in range(1 << t.bits) if u not in set(top))
                out.append(Rank(symbols=top + [next(unused) for _ in range(15 - len(top))]))
    return out


def child_row(op: Operator, v: Value) -> int | None:
    """The row length of op's children: v's, where op keeps element order."""
    return v.row if op.keeps_order else None
