"""Every production of the DSL round-trips every value it accepts, bit for bit,
and refuses (NotApplicable) exactly the values it cannot represent.

CASES maps each production id of brevis.dsl.REGISTRY to example programs
that use it. The per-production tests run over the registry, so a
production registered without examples here fails them (and
test_every_production_has_cases names it). Inputs are random bit patterns of every
dtype (NaN payloads, -0.0, subnormals, infinities included) and of every
Field(k), k in 1..64, with lengths 0, 1, 3, 7, 1023 and others.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from brevis.dsl import (REGISTRY, Ans, SubBase, XorBase, Affine, BitFields, BytePlanes, Constant, Delta, FloatFields, LowZeroBits,
                        Lzma, PackBits, Partition, Program, Rank, Raw, Records, RowDedup, Sparse, Transpose, XorDelta,
                        View, ZigZag, Zstd, encode)
from brevis.dsl.operator import Coder
from brevis.dsl.types import BYTES, Field, Tensor, tensor
from brevis.dtypes import DTYPES
from brevis.errors import FormatError, NotApplicable, ProgramError
from helpers import as_bytes, roundtrip

# ------------------------------------------------------------------ types
TENSOR_TYPES = [tensor(d) for d in DTYPES.values()]
FIELD_TYPES = [Field(k) for k in range(1, 65)]
ALL_TYPES = TENSOR_TYPES + FIELD_TYPES

LEAVES = [
    Raw(),
    Zstd.at_level(1),
    Zstd.entropy(),
    Zstd(level=-7, strategy=0, window_log=0, hash_log=0, chain_log=0, min_match=0),
    Zstd(level=9, strategy=9, window_log=10, hash_log=6, chain_log=6, min_match=3),
]


def leaf(i: int = 0) -> Program:
    return Program.leaf(LEAVES[i % len(LEAVES)])


def leaves_for(op, t: Field, salt: int = 0) -> Program:
    return Program.op(op, *(leaf(salt + i) for i in range(len(op.output_types(t)))))


def mask(bits: int) -> int:
    return (1 << bits) - 1


# ------------------------------------------------------------------ cases
@dataclass
class Case:
    """One example program, built for a value type (None: does not apply)."""

    name: str
    build: Callable[[Field], Program | None]
    # Whether the forward direction must accept x (else: NotApplicable).
    accepts: Callable[[np.ndarray, Field], bool] = lambda x, t: True
    # Turn any input into one the program accepts.
    admit: Callable[[np.ndarray, Field], np.ndarray] = lambda x, t: x
    # An input the program must refuse, made from an accepted one (None: none exists).
    refuse: Callable[[np.ndarray, Field], np.ndarray | None] = lambda x, t: None

    def __repr__(self):
        return self.name


def _only(pred):
    def wrap(build):
        return lambda t: build(t) if pred(t) else None
    return wrap


# ---- coders
def zstd_case(z: Zstd) -> Case:
    return Case(f"zstd:{z.describe()}", lambda t: Program.leaf(z))


ZSTD_CONFIGS = LEAVES[1:] + [
    Zstd.at_level(0),
    Zstd.at_level(3),
    Zstd.at_level(19),
    Zstd(level=3, strategy=1, window_log=31, hash_log=6, chain_log=6, min_match=7),
    Zstd(level=1, strategy=5, window_log=0, hash_log=30, chain_log=30, min_match=4),
]

LZMA_CONFIGS = [
    Lzma(preset=0, lc=3, lp=0, pb=2),  # xz's literal context, fastest
    Lzma(preset=6, lc=2, lp=2, pb=2),  # a 4-byte word's lane
    Lzma(preset=9, lc=0, lp=4, pb=4),
    Lzma(preset=1, lc=4, lp=0, pb=0),
]


# ---- constant
def constant_case(name: str, value_of: Callable[[Field], int]) -> Case:
    def build(t):
        return Program.op(Constant(value=value_of(t)))

    def accepts(x, t):
        return bool(np.all(x == x.dtype.type(value_of(t))))

    def admit(x, t):
        return np.full(len(x), value_of(t), dtype=t.container)

    def refuse(x, t):
        if not len(x):
            return None
        y = admit(x, t).copy()
        y[len(y) // 2] ^= y.dtype.type(1)
        return y

    return Case(name, build, accepts, admit, refuse)


# ---- low zero bits
def low_zero_case(name: str, shift_of: Callable[[Field], int | None],
                  child: Callable[[Field], Program]) -> Case:
    def build(t):
        s = shift_of(t)
        if s is None or not 1 <= s < t.bits:
            return None
        return Program.op(LowZeroBits(shift=s), child(Field(t.bits - s)))

    def low(t):
        return t.container.type(mask(shift_of(t)))

    def accepts(x, t):
        return not np.any(x & low(t))

    def admit(x, t):
        return x & ~low(t)

    def refuse(x, t):
        if not len(x):
            return None
        y = admit(x, t).copy()
        y[-1] |= t.container.type(1 << (shift_of(t) - 1))
        return y

    return Case(name, build, accepts, admit, refuse)


def planes_or_leaf(t: Field, salt: int = 0) -> Program:
    if t.bits <= 8:
        return leaf(salt)
    return leaves_for(BytePlanes(), t, salt)


def mantissa_low_zero_case(keep: int) -> Case:
    """float_fields whose mantissa field drops all but `keep` high bits (an upcast)."""

    def shift(t):
        return t.dtype.mantissa_bits - keep

    def build(t):
        if not (isinstance(t, Tensor) and t.dtype.is_float and 1 <= shift(t) < t.dtype.mantissa_bits):
            return None
        op = FloatFields(grouping="s|e|m")
        s_t, e_t, m_t = op.output_types(t)
        return Program.op(op, leaf(0), planes_or_leaf(e_t, 1),
                          Program.op(LowZeroBits(shift=shift(t)), planes_or_leaf(Field(m_t.bits - shift(t)), 2)))

    def low(t):
        return t.container.type(mask(shift(t)))

    def refuse(x, t):
        if not len(x):
            return None
        y = (x & ~low(t)).copy()
        y[0] |= t.container.type(1)
        return y

    return Case(f"float_fields>low_zero_bits(keep={keep})", build,
                accepts=lambda x, t: not np.any(x & low(t)),
                admit=lambda x, t: x & ~low(t), refuse=refuse)


# ---- bit fields
def bit_fields_case(name: str, groups_of: Callable[[int], list | None], child=None) -> Case:
    def build(t):
        groups = groups_of(t.bits)
        if groups is None:
            return None
        op = BitFields(groups=groups)
        types = op.output_types(t)
        kids = [child(ct, i) if child else leaf(i) for i, ct in enumerate(types)]
        if any(k is None for k in kids):
            return None
        return Program.op(op, *kids)

    return Case(name, build)


def pack_child(ct: Field, i: int) -> Program | None:
    if ct.bits not in (1, 2, 4):
        return None
    return Program.op(PackBits(), leaf(i))


def every(width):
    """Groups of `width` bits; at most 16 of them (wider words: the other cases)."""
    return lambda b: [[[i, width]] for i in range(0, b, width)] if b % width == 0 and b // width <= 16 else None


# ---- float fields
FLOAT = _only(lambda t: isinstance(t, Tensor) and t.dtype.is_float)


def float_case(grouping: str, nested: bool = False) -> Case:
    def build(t):
        op = FloatFields(grouping=grouping)
        if not nested:
            return leaves_for(op, t)
        return Program.op(op, *(planes_or_leaf(ct, i) for i, ct in enumerate(op.output_types(t))))

    return Case(f"float_fields({grouping}{',nested' if nested else ''})", FLOAT(build))


# ---- neighbours
def strided_case(op_cls, stride: int, nested: bool = False) -> Case:
    def build(t):
        child = planes_or_leaf(t, stride) if nested else leaf(stride)
        return Program.op(op_cls(stride=stride), child)

    return Case(f"{op_cls.id}({stride}{',nested' if nested else ''})", build)


ZIGZAG = _only(lambda t: t.bits in (8, 16, 32, 64))


def zigzag_cases() -> list[Case]:
    return [
        Case("zigzag", ZIGZAG(lambda t: Program.op(ZigZag(), leaf(1)))),
        Case("zigzag>raw", ZIGZAG(lambda t: Program.op(ZigZag(), leaf(0)))),
        Case("delta>zigzag>byte_planes", ZIGZAG(lambda t: Program.op(
            Delta(stride=1), Program.op(ZigZag(), planes_or_leaf(Field(t.bits), 2))))),
    ]


def transpose_case(cols: int) -> Case:
    def admit(x, t):
        return x[: len(x) - len(x) % cols]

    def refuse(x, t):
        return None if cols == 1 else np.concatenate([x, np.zeros(1, t.container)])

    return Case(f"transpose({cols})", lambda t: Program.op(Transpose(cols=cols), planes_or_leaf(t, cols)),
                accepts=lambda x, t: len(x) % cols == 0, admit=admit, refuse=refuse)


# ---- regions
def affine_case(name: str, step_of: Callable[[Field], int]) -> Case:
    def progression(start, n, t):
        return ((start + step_of(t) * np.arange(n, dtype=object)) % (1 << t.bits)).astype(t.container)

    def accepts(x, t):
        return not len(x) or as_bytes(progression(int(x[0]), len(x), t)) == as_bytes(x)

    def admit(x, t):
        return progression(int(x[0]) if len(x) else 0, len(x), t)

    def refuse(x, t):
        if len(x) < 2:
            return None  # one element is always a progression
        y = x.copy()
        y[-1] ^= t.container.type(1)
        return y

    return Case(name, lambda t: Program.op(Affine(step=step_of(t)), leaf(3)), accepts, admit, refuse)


def row_dedup_case(row: int) -> Case:
    def admit(x, t):
        rows = x[: len(x) - len(x) % row].reshape(-1, row)
        if len(rows) > 1:  # repeat a few rows, out of order
            rows = rows[(np.arange(len(rows)) * 5) % min(len(rows), 3)]
        return rows.reshape(-1)

    def refuse(x, t):
        return None if row == 1 else np.concatenate([x, np.zeros(1, t.container)])

    return Case(f"row_dedup({row})",
                lambda t: Program.op(RowDedup(row=row), leaf(row), planes_or_leaf(Field(t.bits), row + 1)),
                accepts=lambda x, t: len(x) % row == 0, admit=admit, refuse=refuse)


def sparse_case(name: str, value_of: Callable[[Field], int]) -> Case:
    def admit(x, t):
        y = x.copy()
        y[np.arange(len(y)) % 5 != 2] = t.container.type(value_of(t))
        return y

    return Case(name, lambda t: Program.op(Sparse(value=value_of(t)), leaf(0), leaf(1),
                                           planes_or_leaf(Field(t.bits), 2)), admit=admit)


# ---- symbols
def rank_case(name: str, symbols_of: Callable[[Field], list[int]]) -> Case:
    def build(t):
        op = Rank(symbols=symbols_of(t))
        ranks_t, exc_t = op.output_types(t)
        return Program.op(op, leaf(len(op.config["symbols"])), planes_or_leaf(exc_t, 1))

    def admit(x, t):
        symbols = symbols_of(t)
        if not symbols:
            return x
        y = x.copy()
        y[np.arange(len(y)) % 3 != 0] = np.array(symbols, dtype=np.uint64).astype(t.container)[
            np.arange(len(y))[np.arange(len(y)) % 3 != 0] % len(symbols)]
        return y

    return Case(name, build, admit=admit)


def partition_case(name: str, split: Callable[[Field], tuple[list, list, list] | None]) -> Case:
    def build(t):
        parts = split(t)
        if parts is None:
            return None
        context, rest, classes = parts
        op = Partition(context=context, rest=rest, classes=classes)
        types = op.output_types(t)
        return Program.op(op, *(planes_or_leaf(ct, i) for i, ct in enumerate(types)))

    return Case(name, build)


def _high_context(t):
    b = t.bits
    if b < 2:
        return None
    w = min(4, b - 1)
    return [[b - w, w]], [[0, b - w]], [[0], [1, mask(w)], []]


def _ends_context(t):
    b = t.bits
    if b < 3:
        return None
    return [[0, 1], [b - 1, 1]], [[1, b - 2]], [[3]]


def _exponent_context(t):
    if not (isinstance(t, Tensor) and t.dtype.is_float):
        return None
    e, m = t.dtype.exponent_bits, t.dtype.mantissa_bits
    bias = mask(e - 1)
    return [[m, e]], [[m + e, 1], [0, m]], [[bias], [bias - 1, bias - 2], [0, mask(e)]]


# ---- records
def records_case(fields: list[list[int]]) -> Case:
    size = sum(c * w for c, w in fields)

    def build(t):
        if t.bits != 8:
            return None
        op = Records(fields=fields)
        return Program.op(op, *(planes_or_leaf(ct, i) for i, ct in enumerate(op.output_types(t))))

    def refuse(x, t):
        return None if size == 1 else np.concatenate([x, np.zeros(1, t.container)])

    return Case(f"records({fields})", build, accepts=lambda x, t: len(x) % size == 0,
                admit=lambda x, t: x[: len(x) - len(x) % size], refuse=refuse)


def view_case(dtype: str, child: Callable[[Field], Program]) -> Case:
    size = DTYPES[dtype].itemsize

    def build(t):
        if t.bits != 8:
            return None
        op = View(dtype=dtype)
        return Program.op(op, child(op.output_types(t)[0]))

    def refuse(x, t):
        return None if size == 1 else np.concatenate([x, np.zeros(1, t.container)])

    return Case(f"view({dtype})", build, accepts=lambda x, t: len(x) % size == 0,
                admit=lambda x, t: x[: len(x) - len(x) % size], refuse=refuse)


# ---- against a base tensor (the round trip passes a reference)
def reference_case(cls) -> Case:
    def build(t):
        if not isinstance(t, Tensor):
            return None
        return Program.op(cls(), planes_or_leaf(Field(t.bits), 1))

    return Case(cls.id, build)


CASES: dict[str, list[Case]] = {
    "raw": [Case("raw", lambda t: Program.leaf(Raw()))],
    "zstd": [zstd_case(z) for z in ZSTD_CONFIGS],
    "lzma": [Case(f"lzma:{z.describe()}", lambda t, z=z: Program.leaf(z)) for z in LZMA_CONFIGS],
    "ans": [Case("ans", _only(lambda t: t.bits <= 32)(lambda t: Program.leaf(Ans()))),
            Case("byte_planes>ans", _only(lambda t: t.bits <= 64)(
                lambda t: Program.op(BytePlanes(), *(Program.leaf(Ans()) for _ in BytePlanes().output_types(t)))))],
    "constant": [
        constant_case("constant(0)", lambda t: 0),
        constant_case("constant(max)", lambda t: mask(t.bits)),
        constant_case("constant(pattern)", lambda t: 0x5A5A5A5A5A5A5A5A & mask(t.bits)),
    ],
    "bit_fields": [
        bit_fields_case("bit_fields(identity)", lambda b: [[[0, b]]]),
        bit_fields_case("bit_fields(halves)", lambda b: [[[b // 2, b - b // 2]], [[0, b // 2]]] if b >= 2 else None),
        bit_fields_case("bit_fields(bits)", lambda b: [[[i, 1]] for i in reversed(range(b))] if b <= 24 else None),
        bit_fields_case("bit_fields(ends+middle)",
                        lambda b: [[[b - 1, 1], [0, 1]], [[1, b - 2]]] if b >= 3 else None),
    ],
    "float_fields": [float_case(g) for g in ("s|e|m", "e|sm", "sem", "m|e|s", "es|m", "me|s", "s|me")]
    + [float_case("s|e|m", nested=True), float_case("e|sm", nested=True)],
    "low_zero_bits": [
        low_zero_case("low_zero_bits(1)", lambda t: 1, lambda ct: leaf(1)),
        low_zero_case("low_zero_bits(half)", lambda t: t.bits // 2, planes_or_leaf),
        low_zero_case("low_zero_bits(all but one)", lambda t: t.bits - 1, lambda ct: leaf(2)),
        mantissa_low_zero_case(0 + 2),
    ],
    "pack_bits": [
        Case("pack_bits>raw", _only(lambda t: t.bits in (1, 2, 4))(lambda t: Program.op(PackBits(), leaf(0)))),
        Case("pack_bits>zstd", _only(lambda t: t.bits in (1, 2, 4))(lambda t: Program.op(PackBits(), leaf(1)))),
        bit_fields_case("bit_fields(1-bit)>pack_bits", every(1), pack_child),
        bit_fields_case("bit_fields(2-bit)>pack_bits", every(2), pack_child),
        bit_fields_case("bit_fields(4-bit)>pack_bits", every(4), pack_child),
    ],
    # (a raw child: its value is a view of the stream, which the inverse must not write)
    "delta": [strided_case(Delta, s, nested=s == 1) for s in (1, 2, 3, 64, 1 << 26)]
             + [Case(f"delta({s})>raw", lambda t, s=s: Program.op(Delta(stride=s), leaf(0))) for s in (1, 3)],
    "xor_delta": [strided_case(XorDelta, s, nested=s == 2) for s in (1, 2, 7, 1 << 20)]
                 + [Case("xor_delta(1)>raw", lambda t: Program.op(XorDelta(stride=1), leaf(0)))],
    "zigzag": zigzag_cases(),
    "transpose": [transpose_case(c) for c in (1, 2, 3, 8)],
    "affine": [
        affine_case("affine(0)", lambda t: 0),
        affine_case("affine(1)", lambda t: 1),
        affine_case("affine(-1)", lambda t: mask(t.bits)),
        affine_case("affine(2^63+3)", lambda t: ((1 << 63) + 3) & mask(t.bits)),
    ],
    "row_dedup": [row_dedup_case(r) for r in (1, 2, 3, 16)],
    "sparse": [
        sparse_case("sparse(0)", lambda t: 0),
        sparse_case("sparse(max)", lambda t: mask(t.bits)),
    ],
    "rank": [
        rank_case("rank([])", lambda t: []),
        rank_case("rank(specials)", lambda t: special_patterns(t)[:5]),
        rank_case("rank(255)", lambda t: [v for v in range(255) if v < 1 << t.bits][::-1]),
    ],
    "partition": [
        partition_case("partition(high bits)", _high_context),
        partition_case("partition(end bits)", _ends_context),
        partition_case("partition(exponent)", _exponent_context),
    ],
    "xor_base": [reference_case(XorBase)],
    "sub_base": [reference_case(SubBase)],
    "records": [records_case(f) for f in ([[1, 1]], [[1, 2], [32, 1]], [[2, 4], [1, 8], [3, 1]], [[1, 2], [1, 1]])],
    "view": [view_case("F32", lambda ct: leaves_for(FloatFields(grouping="e|sm"), ct, 1)),
             view_case("BF16", lambda ct: planes_or_leaf(ct, 2)),
             view_case("F64", lambda ct: Program.op(halves64(), leaf(1), leaf(3))),
             view_case("I8", lambda ct: leaf(2)),
             view_case("F16", lambda ct: Program.leaf(Ans()))],
    "byte_planes": [
        Case("byte_planes", lambda t: leaves_for(BytePlanes(), t)),
        Case("byte_planes>byte_planes",
             lambda t: Program.op(BytePlanes(), *(Program.op(BytePlanes(), leaf(i))
                                                  for i, _ in enumerate(BytePlanes().output_types(t))))),
    ],
}


def halves64() -> BitFields:
    return BitFields(groups=[[[32, 32]], [[0, 32]]])


def applicable(prod: str, t: Field) -> list[Case]:
    return [c for c in CASES[prod] if c.build(t) is not None]


def cases_of(prod: str) -> list[Case]:
    """The cases of a registered production; a test failure naming it if it has none."""
    if not CASES.get(prod):
        pytest.fail(f"production {prod!r} is registered but has no round-trip cases in CASES")
    return CASES[prod]


@functools.cache
def instances(prod: str) -> tuple:
    """Every configuration of production `prod` that its cases build, on any type."""
    found: list = []

    def walk(p: Program) -> None:
        if p.node.id == prod and p.node not in found:
            found.append(p.node)
        for c in p.children:
            walk(c)

    for case in CASES.get(prod, []):
        for t in ALL_TYPES:
            p = case.build(t)
            if p is not None:
                walk(p)
    return tuple(found)


def takes_type(node, t: Field) -> bool:
    """Whether the type rule of a configured production accepts values of type t."""
    try:
        node.accepts(t) if isinstance(node, Coder) else node.output_types(t)
    except ProgramError:
        return False
    return True


# ------------------------------------------------------------------ values
def special_patterns(t: Field) -> list[int]:
    """Edge bit patterns: for floats ±0, ±inf, NaNs with payloads, subnormals."""
    b = t.bits
    out = {0, 1, mask(b), 1 << (b - 1), mask(b - 1) if b > 1 else 0}
    if isinstance(t, Tensor) and t.dtype.is_float:
        e, m = t.dtype.exponent_bits, t.dtype.mantissa_bits
        sign, exp, man = 1 << (e + m), mask(e) << m, mask(m)
        for s in (0, sign):
            out |= {
                s,  # ±0
                s | exp,  # ±inf (F8_E4M3: a NaN)
                s | exp | 1,  # signalling NaN, smallest payload
                s | exp | (1 << (m - 1)),  # quiet NaN
                s | exp | man,  # NaN, all payload bits
                s | exp | (0x5 & man),  # NaN with an odd payload
                s | 1,  # smallest subnormal
                s | man,  # largest subnormal
                s | (1 << m),  # smallest normal
                s | (exp - 1),  # largest finite
                s | ((mask(e - 1)) << m),  # 1.0
            }
    return sorted(out)


LENGTHS = [0, 1, 2, 3, 7, 8, 9, 16, 31, 33, 64, 100, 257, 1023]
MODES = ["random", "specials", "mixed", "constant", "few"]


def random_bits(rng: np.random.Generator, n: int, bits: int) -> np.ndarray:
    words = rng.integers(0, 1 << 64, size=n, dtype=np.uint64, endpoint=False) if bits == 64 else \
        rng.integers(0, 1 << bits, size=n, dtype=np.uint64)
    return words


def bulk(t: Field, n: int, seed: int, mode: str) -> np.ndarray:
    """n values of type t made with numpy (fast enough for long arrays)."""
    rng = np.random.default_rng(seed)
    specials = np.array(special_patterns(t), dtype=np.uint64)
    if mode == "random":
        x = random_bits(rng, n, t.bits)
    elif mode == "specials":
        x = rng.choice(specials, n)
    elif mode == "mixed":
        x = np.where(rng.random(n) < 0.3, rng.choice(specials, n), random_bits(rng, n, t.bits))
    elif mode == "constant":
        x = np.full(n, specials[seed % len(specials)], dtype=np.uint64)
    else:  # a few distinct values: repeats for rank, row_dedup, sparse
        x = rng.choice(np.concatenate([specials[:2], random_bits(rng, 2, t.bits)]), n)
    return x.astype(t.container)


@functools.cache
def values(t: Field) -> st.SearchStrategy[np.ndarray]:
    """Short arrays drawn element by element (they shrink well), longer ones in bulk."""
    elements = st.one_of(st.sampled_from(special_patterns(t)), st.integers(0, mask(t.bits)))
    short = st.integers(0, 9).flatmap(lambda n: hnp.arrays(t.container, n, elements=elements))
    long = st.builds(bulk, st.just(t), st.sampled_from(LENGTHS), st.integers(0, 2**32 - 1),
                     st.sampled_from(MODES))
    return st.one_of(short, long)


def fixed_values(t: Field, seed: int) -> list[np.ndarray]:
    """Deterministic inputs: empty, one element, odd lengths, specials, random bits."""
    specials = np.array(special_patterns(t), dtype=np.uint64).astype(t.container)
    long = 1023 if isinstance(t, Tensor) else 257
    return [bulk(t, 0, seed, "random"), bulk(t, 1, seed, "random"), bulk(t, 7, seed, "few"),
            np.concatenate([specials[::-1], bulk(t, long, seed, "mixed")])]


# ------------------------------------------------------------------ the check
def check_case(case: Case, t: Field, x: np.ndarray) -> None:
    program = case.build(t)
    assert program is not None
    x = np.ascontiguousarray(x, dtype=t.container)
    if case.accepts(x, t):
        roundtrip(program, t, x)
    else:
        with pytest.raises(NotApplicable):
            encode(program, x, t)
    admitted = np.ascontiguousarray(case.admit(x, t), dtype=t.container)
    assert case.accepts(admitted, t)
    if as_bytes(admitted) != as_bytes(x):
        roundtrip(program, t, admitted)
    refused = case.refuse(admitted, t)
    if refused is not None:
        assert not case.accepts(refused, t)
        with pytest.raises(NotApplicable):
            encode(program, refused, t)


# ------------------------------------------------------------------ tests
def test_every_production_has_cases():
    missing = sorted(p for p in REGISTRY if not CASES.get(p))
    assert not missing, f"registered productions without round-trip cases in CASES: {missing}"
    unknown = sorted(set(CASES) - set(REGISTRY))
    assert not unknown, f"CASES names productions that are not registered: {unknown}"


@pytest.mark.parametrize("prod", sorted(REGISTRY))
def test_cases_use_their_production_and_apply_somewhere(prod):
    for case in cases_of(prod):
        built = [case.build(t) for t in ALL_TYPES]
        built = [p for p in built if p is not None]
        assert built, f"{case.name} applies to no type"

        def ids(p):
            return {p.node.id} | set().union(*(ids(c) for c in p.children))

        assert all(prod in ids(p) for p in built), f"{case.name} does not use {prod}"


@functools.cache
def cases_and_types(prod: str, kind: str) -> st.SearchStrategy[tuple[Case, Field]]:
    """(case, type) pairs of a production on tensor types or on Field(1..64)."""
    types = TENSOR_TYPES if kind == "tensor" else FIELD_TYPES
    return st.sampled_from([(c, t) for t in types for c in applicable(prod, t)])


def test_every_production_applies_to_tensors():
    assert {t.dtype.name for t in TENSOR_TYPES} == set(DTYPES)
    for prod in CASES:
        assert any(applicable(prod, t) for t in TENSOR_TYPES), prod
    # Wherever a configuration's type rule takes a tensor type, a case covers it.
    for t in TENSOR_TYPES:
        for prod in CASES:
            if any(takes_type(node, t) for node in instances(prod)):
                assert applicable(prod, t), (prod, t)


@pytest.mark.parametrize("prod", sorted(REGISTRY))
@settings(max_examples=50)
@given(data=st.data())
def test_roundtrip_tensor(prod, data):
    """Random bit patterns of every dtype, NaN payloads and subnormals included."""
    cases_of(prod)
    case, t = data.draw(cases_and_types(prod, "tensor"), label="case, type")
    x = data.draw(values(t), label="x")
    check_case(case, t, x)


FIELD_PRODUCTIONS = [p for p in sorted(CASES) if any(applicable(p, f) for f in FIELD_TYPES)]


def test_field_productions():
    # Today float_fields (a float tensor) and the base operators (a tensor).
    for prod in sorted(set(CASES) - set(FIELD_PRODUCTIONS)):
        takes = [f for node in instances(prod) for f in FIELD_TYPES if takes_type(node, f)]
        assert not takes, f"{prod} takes {takes[0]} but has no case on fields"


@pytest.mark.parametrize("prod", FIELD_PRODUCTIONS)
@settings(max_examples=40)
@given(data=st.data())
def test_roundtrip_field(prod, data):
    """Field(k) values for k in 1..64."""
    case, t = data.draw(cases_and_types(prod, "field"), label="case, type")
    x = data.draw(values(t), label="x")
    check_case(case, t, x)


@pytest.mark.parametrize("t", ALL_TYPES, ids=str)
def test_roundtrip_every_case_on_fixed_values(t):
    """Every case on every type, deterministically (hypothesis samples; this covers)."""
    for prod in sorted(CASES):
        for case in applicable(prod, t):
            for i, x in enumerate(fixed_values(t, seed=t.bits)):
                check_case(case, t, x)


def test_every_field_width_is_covered_by_every_general_production():
    for t in FIELD_TYPES:
        for prod in ("raw", "zstd", "constant", "bit_fields", "byte_planes"):
            assert applicable(prod, t), (prod, t)
        if t.bits >= 2:
            assert applicable("low_zero_bits", t)


# ---- refusals
@pytest.mark.parametrize("t", ALL_TYPES, ids=str)
def test_constant_refuses_non_constant_values(t):
    c = Constant(value=mask(t.bits))
    p = Program.op(c)
    assert p.check(t) == 0
    x = np.full(9, mask(t.bits), dtype=t.container)
    roundtrip(p, t, x)
    roundtrip(p, t, x[:0])
    x[4] = 0
    with pytest.raises(NotApplicable):
        encode(p, x, t)
    with pytest.raises(NotApplicable):
        encode(Program.op(Constant(value=0)), np.arange(3, dtype=t.container) % 2, t)


@pytest.mark.parametrize("t", [t for t in ALL_TYPES if t.bits >= 2], ids=str)
def test_low_zero_bits_refuses_set_low_bits(t):
    for shift in sorted({1, t.bits // 2, t.bits - 1}):
        p = Program.op(LowZeroBits(shift=shift), leaf(shift))
        ok = np.array([0, mask(t.bits) & ~mask(shift), 1 << shift, 1 << (t.bits - 1)], dtype=np.uint64)
        x = ok.astype(t.container)
        roundtrip(p, t, x)
        for bit in range(shift):
            bad = x.copy()
            bad[1] |= t.container.type(1 << bit)
            with pytest.raises(NotApplicable):
                encode(p, bad, t)


def draw_tiling(data, bits: int, max_cuts: int) -> list[list[int]]:
    """A random tiling of a word of `bits` bits into [low bit, width] ranges, in random order."""
    cuts = sorted(data.draw(st.sets(st.integers(1, bits - 1), max_size=min(bits - 1, max_cuts)), label="cuts")) \
        if bits > 1 else []
    bounds = [0] + cuts + [bits]
    return data.draw(st.permutations([[lo, hi - lo] for lo, hi in zip(bounds, bounds[1:])]), label="order")


@settings(max_examples=100)
@given(data=st.data())
def test_random_bit_field_tilings(data):
    """Any tiling of the word into ranges, grouped in any order, round-trips."""
    t = data.draw(st.sampled_from(ALL_TYPES), label="t")
    ranges = draw_tiling(data, t.bits, 12)
    groups, rest = [], list(ranges)
    while rest:
        k = data.draw(st.integers(1, len(rest)), label="group size")
        groups.append(rest[:k])
        rest = rest[k:]
    op = BitFields(groups=groups)
    program = Program.op(op, *(leaf(i) for i in range(len(groups))))
    roundtrip(program, t, data.draw(values(t), label="x"))


# ---- configuration through JSON
@pytest.mark.parametrize("prod", sorted(REGISTRY))
def test_config_roundtrips_through_json(prod):
    for case in cases_of(prod):
        for t in ALL_TYPES:
            p = case.build(t)
            if p is None:
                continue
            text = json.dumps(p.to_json())
            q = Program.from_json(json.loads(text))
            assert q == p
            assert hash(q) == hash(p)
            assert json.dumps(q.to_json()) == text
            assert q.check(t) == p.check(t)
            assert q.describe(t) == p.describe(t)


@settings(max_examples=100)
@given(level=st.integers(-7, 22), strategy=st.integers(0, 9),
       window_log=st.sampled_from([0, 10, 17, 31]), hash_log=st.sampled_from([0, 6, 12, 30]),
       chain_log=st.sampled_from([0, 6, 16, 30]), min_match=st.sampled_from([0, 3, 5, 7]))
def test_zstd_configs_roundtrip_through_json(**config):
    p = Program.leaf(Zstd(**config))
    assert Program.from_json(json.loads(json.dumps(p.to_json()))) == p


def test_zstd_codes_at_the_level_it_names():
    # Until 2026-12-06 a level with no parameter set coded as level 3 (from_level
    # took the zeros as zstd's defaults): a program's text must say what it did.
    import zstandard

    rng = np.random.default_rng(7)  # words of a Zipf law: what the higher levels' longer searches find more of
    words = [bytes(rng.choice(list(b"abcdefghijklmnopqrstuvwxyz"), int(rng.integers(3, 10)))) for _ in range(2000)]
    text = b" ".join(words[i] for i in np.minimum(rng.zipf(1.3, 6000), 2000) - 1)
    x = np.frombuffer(text, np.uint8)
    sizes = {}
    for level in (1, 3, 9, 19):
        data = Zstd.at_level(level).encode(x, BYTES)
        assert data == zstandard.ZstdCompressor(level=level, write_content_size=True,
                                                write_checksum=False).compress(text)
        assert as_bytes(Zstd.at_level(level).decode(memoryview(data), len(x), BYTES)) == text
        sizes[level] = len(data)
    assert sizes[19] < sizes[3] < sizes[1]
    # Parameters set override the level's, the rest stay the level's.
    tuned = Zstd(level=19, strategy=0, window_log=10, hash_log=0, chain_log=0, min_match=0).encode(x, BYTES)
    params = zstandard.ZstdCompressionParameters.from_level(19, window_log=10, write_content_size=True,
                                                            write_checksum=False)
    assert tuned == zstandard.ZstdCompressor(compression_params=params).compress(text)


# ---- coders refuse streams of the wrong size
@pytest.mark.parametrize("coder", [Raw(), Zstd.at_level(3), Ans(), Lzma(preset=6, lc=2, lp=2, pb=2)], ids=str)
def test_coder_rejects_streams_of_the_wrong_length(coder):
    """Through decode and decode_into (a coder's own way into a chunk's place) alike."""
    t = Field(16)
    x = np.arange(10, dtype=np.uint16)
    data = coder.encode(x, t)
    assert as_bytes(coder.decode(memoryview(data), 10, t)) == as_bytes(x)
    for n in (0, 9, 11):
        with pytest.raises(FormatError):
            coder.decode(memoryview(data), n, t)
        with pytest.raises(FormatError):
            coder.decode_into(memoryview(data), n, t, np.empty(n, np.uint16))
    bad = [data[:-1], b"\x00" * len(data) if coder.id == "zstd" else data + b"\x00"]
    for stream in bad:
        with pytest.raises(FormatError):
            coder.decode(memoryview(stream), 10, t)
        with pytest.raises(FormatError):
            coder.decode_into(memoryview(stream), 10, t, np.empty(10, np.uint16))


# ---- stream layouts against plain per-element references (the archive format must not change)
def _reference_fields(x: np.ndarray, groups) -> list[np.ndarray]:
    """Each group's ranges packed high to low, one Python integer at a time."""
    out = []
    for group in groups:
        values = []
        for v in x.tolist():
            acc = 0
            for low, w in group:
                acc = (acc << w) | ((v >> low) & mask(w))
            values.append(acc)
        out.append(np.array(values, dtype=np.uint64).astype(Field(sum(w for _, w in group)).container))
    return out


@settings(max_examples=60)
@given(data=st.data())
def test_bit_fields_streams_match_a_reference(data):
    t = data.draw(st.sampled_from(ALL_TYPES), label="t")
    ranges = draw_tiling(data, t.bits, 6)
    k = data.draw(st.integers(1, len(ranges)), label="groups")
    groups = [ranges[i::k] for i in range(k)]
    x = data.draw(values(t), label="x")
    op = BitFields(groups=groups)
    got = op.forward(x, t)
    for g, r, ft in zip(got, _reference_fields(x, groups), op.output_types(t)):
        assert g.dtype == ft.container and g.tolist() == r.tolist()
    assert as_bytes(op.inverse(len(x), t, lambda i, n: got[i])) == as_bytes(x)


@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 1001])
def test_pack_bits_layout(bits, n):
    """Element i in bits (i mod 8/k)*k of byte i div (8/k); the padding is zero."""
    per = 8 // bits
    x = np.random.default_rng(n * 8 + bits).integers(0, 1 << bits, n).astype(np.uint8)
    expected = [0] * PackBits.packed_length(n, bits)
    for i, v in enumerate(x.tolist()):
        expected[i // per] |= v << (i % per * bits)
    (packed,) = PackBits().forward(x, Field(bits))
    assert packed.dtype == np.uint8 and packed.tolist() == expected
    frozen = packed.copy()
    frozen.flags.writeable = False  # decoded streams are read-only buffers
    out = PackBits().inverse(n, Field(bits), lambda i, m: frozen[:m])
    assert out.dtype == np.uint8 and out.tolist() == x.tolist()


@pytest.mark.parametrize("classes", [[[0], [3, 5], [7]], [[0], [3], [7]], [], [[v] for v in range(0, 40, 2)]],
                         ids=["few", "singletons", "none", "many"])
@pytest.mark.parametrize("native", [True, False], ids=["c", "numpy"])
def test_partition_across_blocks(classes, native, monkeypatch):
    """Sub-streams are each class's elements in order, however the chunk is cut into
    blocks internally (few classes, one value per class, and many take different paths),
    split in C (classify, split_classes) or by numpy."""
    from brevis.dsl import symbols
    from brevis.dsl.symbols import BLOCK

    if not native:
        monkeypatch.setattr(symbols, "_layout", None)
    elif symbols._layout is None:
        pytest.skip("the C extension is not built")

    t = tensor(DTYPES["F32"])
    n = 3 * BLOCK + 17
    rng = np.random.default_rng(len(classes))
    x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    x = (x & np.uint32(0x807FFFFF)) | (rng.integers(0, 48, n).astype(np.uint32) << np.uint32(23))
    op = Partition(context=[[23, 8]], rest=[[31, 1], [0, 23]], classes=classes)
    got = op.forward(x, t)
    context = (x >> np.uint32(23)) & np.uint32(0xFF)
    rest = ((x >> np.uint32(8)) & np.uint32(0x800000)) | (x & np.uint32(0x7FFFFF))
    member = [np.isin(context, c) for c in classes]
    classed = np.any(member, axis=0) if member else np.zeros(n, bool)
    expected = [context.astype(np.uint8)] + [rest[m] for m in member] + [rest[~classed]]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and np.array_equal(g, e)
    frozen = [g.copy() for g in got]
    for g in frozen:
        g.flags.writeable = False
    out = op.inverse(n, t, lambda i, m: frozen[i][:m] if len(frozen[i]) == m else pytest.fail("wrong count"))
    assert as_bytes(out) == as_bytes(x)


def _siblings_case(kind: str) -> tuple[Program, np.ndarray, Field]:
    """A program whose operator reads its children together (read_children):
    `ans` leaves among others, as the search writes them."""
    rng = np.random.default_rng(7)
    n = 5000
    if kind == "partition":
        t = tensor(DTYPES["F32"])
        x = (rng.integers(0, 1 << 23, n).astype(np.uint32) | (rng.integers(120, 128, n).astype(np.uint32) << np.uint32(23)))
        op = Partition(context=[[23, 8]], rest=[[31, 1], [0, 23]], classes=[[124], [123], [125]])
        kids = [Program.leaf(Ans()), Program.leaf(Ans()), Program.op(BytePlanes(), *[Program.leaf(Raw())] * 3),
                Program.leaf(Zstd.at_level(1)), Program.leaf(Ans())]
        return Program.op(op, *kids), x, t
    t = tensor(DTYPES["BF16"])
    x = rng.normal(0, 0.05, n).astype(np.float32).view(np.uint32) >> np.uint32(16)
    return Program.op(BytePlanes(), Program.leaf(Ans()), Program.leaf(Ans())), x.astype(np.uint16), t


@pytest.mark.parametrize("kind", ["partition", "byte_planes"])
def test_children_read_together_decode_as_read_one_by_one(kind):
    """The interpreter's read.many (the `ans` children in one call) gives
    what reading each child alone gives; a stream among them cut short is
    a FormatError."""
    from brevis.dsl import decode

    program, x, t = _siblings_case(kind)
    streams = [memoryview(s) for s in encode(program, x, t)]
    assert as_bytes(decode(program, t, len(x), streams)) == as_bytes(x)
    if all(isinstance(c.node, Coder) for c in program.children):  # read one by one, without read.many
        values = [c.node.decode(s, len(v), ct) for c, s, v, ct in
                  zip(program.children, streams, program.node.forward(x, t), program.node.child_types(t))]
        assert as_bytes(program.node.inverse(len(x), t, lambda i, m: values[i][:m])) == as_bytes(x)
    with pytest.raises(FormatError):  # the last `ans` stream cut short
        decode(program, t, len(x), streams[:-1] + [streams[-1][:len(streams[-1]) // 2]])


@pytest.mark.parametrize("op", [Delta(stride=1), Delta(stride=7), XorDelta(stride=3)], ids=lambda o: o.id)
@pytest.mark.parametrize("leaf", [Ans(), Raw()], ids=lambda c: c.id)
def test_running_sums_decode_in_their_place(op, leaf):
    """A delta's child decodes straight into the chunk's place (read_child_into),
    an unaligned one too (an ONNX tensor at an odd offset), and comes back whole."""
    from brevis.dsl import decode

    t = tensor(DTYPES["F32"])
    x = np.random.default_rng(3).normal(0, 1, 3001).astype(np.float32).view(np.uint32)
    program = Program.op(op, Program.leaf(leaf))
    streams = [memoryview(s) for s in encode(program, x, t)]
    place = np.zeros(4 * len(x) + 1, np.uint8)[1:].view(np.uint32)  # unaligned
    assert decode(program, t, len(x), streams, out=place) is place
    assert as_bytes(place) == as_bytes(x)


@pytest.mark.parametrize("program", [
    Program.op(Records(fields=[[1, 2], [16, 1]]), Program.leaf(Ans()), Program.leaf(Raw())),
    Program.op(View(dtype="F32"), Program.leaf(Ans())),
], ids=["records", "view"])
def test_byte_roots_decode_into_a_place_in_pieces(program):
    """records and view rebuild a chunk in its place where it is one piece
    of memory; a place with gaps (a strided view) gets the same bytes, put
    there by the interpreter, not lost in a copy reshape made."""
    from brevis.dsl import decode

    t = Field(8)
    x = np.random.default_rng(5).integers(0, 256, 18 * 200).astype(np.uint8)
    streams = [memoryview(s) for s in encode(program, x, t)]
    place = np.zeros(2 * len(x), np.uint8)[::2]
    assert decode(program, t, len(x), streams, out=place) is place
    assert as_bytes(place) == as_bytes(x)


@pytest.mark.parametrize("config", [dict(preset=10, lc=3, lp=0, pb=2), dict(preset=6, lc=3, lp=2, pb=2),
                                    dict(preset=6, lc=5, lp=0, pb=2), dict(preset=6, lc=0, lp=0, pb=5),
                                    dict(preset=-1, lc=0, lp=0, pb=0)])
def test_lzma_refuses_configurations_lzma2_does_not_take(config):
    with pytest.raises(ProgramError):
        Program.from_json(["lzma", config])


def test_lzma_dictionary_comes_from_the_declared_length():
    """Both directions size the dictionary from the value's length (never
    from the stream): the data's size, within LZMA2's limits."""
    from brevis.dsl.coders import lzma_dictionary

    assert [lzma_dictionary(n) for n in (0, 1, 4096, 4097, 1 << 20)] == [4096, 4096, 4096, 4097, 1 << 20]
    assert lzma_dictionary(1 << 40) == 1 << 30


def test_a_leaf_decoded_ahead_with_another_count_is_not_taken():
    """A value decoded ahead whose count is not the one its leaf reads (a
    wrong child_counts claim) is left where it was given, and the leaf
    decodes its stream: the same bytes, and the round trip's check of the
    claims finds it there."""
    from brevis.dsl import decode

    program = Program.op(Records(fields=[[1, 2], [4, 1]]), Program.leaf(Raw()), Program.leaf(Raw()))
    x = np.arange(60, dtype=np.uint8)
    streams = [memoryview(s) for s in encode(program, x, Field(8))]
    wrong = np.zeros(41, np.uint8)  # field 1 holds 40 bytes
    ready = {1: wrong}
    assert as_bytes(decode(program, Field(8), len(x), streams, None, None, ready)) == as_bytes(x)
    assert ready == {1: wrong}
    ready = {1: np.frombuffer(bytes(streams[1]), np.uint8).copy()}
    assert as_bytes(decode(program, Field(8), len(x), streams, None, None, ready)) == as_bytes(x)
    assert not ready
