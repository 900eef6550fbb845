"""Recoding symbols: frequency ranks with a bound, and context partitions."""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, ProgramError
from .fields import _check_ranges, _join, _split, check_tiling
from .operator import Operator, register
from .types import Field

MAX_LUT_BITS = 16  # lookup tables index values of at most this many bits


def _lookup(values: np.ndarray, keys: list[int], codes: np.ndarray, default: int, bits: int) -> np.ndarray:
    """codes[j] where values == keys[j], `default` elsewhere."""
    if bits <= MAX_LUT_BITS:
        lut = np.full(1 << bits, default, dtype=codes.dtype)
        if keys:
            lut[np.array(keys, dtype=np.int64)] = codes
        return lut[values]
    out = np.full(len(values), default, dtype=codes.dtype)
    if keys:
        order = np.argsort(keys)
        sorted_keys = np.array(keys, dtype=np.uint64)[order]
        at = np.searchsorted(sorted_keys, values.astype(np.uint64))
        at_clipped = np.minimum(at, len(keys) - 1)
        hit = sorted_keys[at_clipped] == values
        out[hit] = codes[order][at_clipped[hit]]
    return out


@register
class Rank(Operator):
    """Replace symbols by their rank in `symbols` (most frequent first).

    Ranks below T = len(symbols) go to the first child; a symbol outside the
    table gets rank T and its value goes to the exceptions child. Inverse:
    look ranks up in the table, take escaped values from the exceptions.
    """

    id = "rank"
    params = {"symbols": list}

    @classmethod
    def validate(cls, config):
        s = config["symbols"]
        if len(s) > 255 or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64 for v in s):
            raise ProgramError("rank: symbols are at most 255 unsigned 64-bit integers")
        if len(set(s)) != len(s):
            raise ProgramError("rank: symbols repeat")

    def output_types(self, t):
        if any(v >> t.bits for v in self._config["symbols"]):
            raise ProgramError(f"rank: a symbol does not fit in {t}")
        return [Field(max(1, len(self._config["symbols"]).bit_length())), Field(t.bits)]

    def output_names(self, t):
        return ["ranks", "exceptions"]

    def forward(self, x, t):
        symbols = self._config["symbols"]
        ranks = _lookup(x, symbols, np.arange(len(symbols), dtype=np.uint8), len(symbols), t.bits)
        return [ranks.astype(np.uint8), x[ranks == len(symbols)].astype(t.container)]

    def inverse(self, n, t, read):
        symbols = self._config["symbols"]
        T = len(symbols)
        ranks = read(0, n)  # small unsigned integers: index the table directly
        if n and int(ranks.max()) > T:
            raise FormatError("rank: rank above the table")
        table = np.array(symbols + [0], dtype=t.container)
        out = np.take(table, ranks)
        escaped = ranks == T
        count = int(np.count_nonzero(escaped))
        exceptions = read(1, count)
        if count:
            out[escaped] = exceptions
        return out


@register
class Partition(Operator):
    """Split one field into sub-streams by the value of another (the context).

    `context` and `rest` are lists of [low, width] bit ranges that tile the
    word. Children: the context field, then one sub-stream of `rest` per
    class in `classes` (lists of context values) and a last one for values
    in no class. Each sub-stream keeps its own statistics (e.g. mantissa
    bits by exponent). Inverse: decode the context, count each class, read
    the sub-streams and put every element back in its place.
    """

    id = "partition"
    params = {"context": list, "rest": list, "classes": list}

    @classmethod
    def validate(cls, config):
        _check_ranges([config["context"], config["rest"]])
        width = sum(w for _, w in config["context"])
        if width > MAX_LUT_BITS:
            raise ProgramError(f"partition: context wider than {MAX_LUT_BITS} bits")
        seen: set[int] = set()
        classes = config["classes"]
        if not isinstance(classes, list) or len(classes) > 255:
            raise ProgramError("partition: classes must be a list of at most 255 lists")
        for c in classes:
            if not isinstance(c, list) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << width for v in c):
                raise ProgramError("partition: a class is a list of context values")
            if seen & set(c):
                raise ProgramError("partition: a context value is in two classes")
            seen |= set(c)

    def _groups(self):
        return [self._config["context"], self._config["rest"]]

    def output_types(self, t):
        check_tiling(self._groups(), t, self.id)
        context = Field(sum(w for _, w in self._config["context"]))
        rest = Field(sum(w for _, w in self._config["rest"]))
        return [context] + [rest] * (len(self._config["classes"]) + 1)

    def output_names(self, t):
        return ["context"] + [f"class{i}" for i in range(len(self._config["classes"]))] + ["other"]

    def _classes_of(self, context: np.ndarray, bits: int) -> np.ndarray:
        keys, codes = [], []
        for j, c in enumerate(self._config["classes"]):
            keys += c
            codes += [j] * len(c)
        return _lookup(context, keys, np.array(codes, dtype=np.uint8), len(self._config["classes"]), bits)

    def forward(self, x, t):
        context, rest = _split(x, self._groups())
        cls = self._classes_of(context, sum(w for _, w in self._config["context"]))
        # A stable sort by class (a radix sort for bytes) keeps each class in order.
        order = np.argsort(cls, kind="stable")
        counts = np.bincount(cls, minlength=len(self._config["classes"]) + 1)
        return [context] + np.split(rest[order], np.cumsum(counts)[:-1])

    def inverse(self, n, t, read):
        types = self.output_types(t)
        context = read(0, n)
        cls = self._classes_of(context, types[0].bits)
        counts = np.bincount(cls, minlength=len(types) - 1)
        parts = [read(j + 1, int(count)) for j, count in enumerate(counts)]
        rest = np.empty(n, dtype=types[1].container)
        rest[np.argsort(cls, kind="stable")] = np.concatenate(parts) if parts else rest[:0]
        return _join(n, t, self._groups(), [context, rest])
