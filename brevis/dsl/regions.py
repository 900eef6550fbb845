"""Regular and repeated regions: progressions, repeated rows, sparse values."""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, NotApplicable, ProgramError
from .operator import Operator, register
from .types import Field

INDEX = Field(32)  # positions and counts: chunks hold at most 2^26 elements


def _word_mask(t: Field) -> int:
    return (1 << t.bits) - 1


@register
class Affine(Operator):
    """x[i] = start + step * i modulo 2^bits (position ids, aranges).

    `step` is in the config; each chunk stores its start (one value).
    Inverse: rebuild the progression.
    """

    id = "affine"
    params = {"step": int}

    @classmethod
    def validate(cls, config):
        if not 0 <= config["step"] < 1 << 64:
            raise ProgramError("affine: step must be an unsigned 64-bit integer (two's complement)")

    def output_types(self, t):
        return [Field(t.bits)]

    def output_names(self, t):
        return ["start"]

    def _progression(self, start, n, t):
        word = t.container.type
        i = np.arange(n, dtype=t.container)
        y = word(start) + i * word(self._config["step"] & _word_mask(t))
        if t.bits < 8 * t.container.itemsize:
            y &= word(_word_mask(t))
        return y

    def forward(self, x, t):
        if not len(x):
            return [x[:0].astype(t.container)]
        if not np.array_equal(x, self._progression(int(x[0]), len(x), t)):
            raise NotApplicable("not an arithmetic progression")
        return [x[:1].astype(t.container)]

    def inverse(self, n, t, read):
        start = read(0, 1 if n else 0)
        return self._progression(int(start[0]), n, t) if n else np.zeros(0, t.container)


@register
class RowDedup(Operator):
    """Rows of `row` elements stored once each, plus which row goes where.

    Children: the row index of every row (first occurrences numbered in
    order, so the number of distinct rows follows from the indices), then
    the distinct rows. Inverse: gather the distinct rows by index.
    """

    id = "row_dedup"
    params = {"row": int}

    @classmethod
    def validate(cls, config):
        if not 1 <= config["row"] <= 1 << 26:
            raise ProgramError("row_dedup: row must be in 1..2^26")

    def output_types(self, t):
        return [INDEX, Field(t.bits)]

    def output_names(self, t):
        return ["index", "rows"]

    def forward(self, x, t):
        r = self._config["row"]
        if len(x) % r:
            raise NotApplicable("chunk is not whole rows")
        rows = np.ascontiguousarray(x).reshape(-1, r)
        keys = rows.view(np.dtype((np.void, r * x.itemsize))).reshape(-1)
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        index = rank[inverse.reshape(-1)].astype(np.uint32)
        return [index, rows[np.sort(first)].reshape(-1)]

    def inverse(self, n, t, read):
        r = self._config["row"]
        if n % r:
            raise FormatError("row_dedup: chunk is not whole rows")
        index = read(0, n // r).astype(np.int64)
        if len(index):
            running = np.maximum.accumulate(index)
            if index[0] != 0 or np.any(index[1:] > running[:-1] + 1):
                raise FormatError("row_dedup: row indices out of order")
            distinct = int(running[-1]) + 1
        else:
            distinct = 0
        rows = read(1, distinct * r).reshape(distinct, r)
        return rows[index].reshape(-1).astype(t.container, copy=False)


@register
class Sparse(Operator):
    """Mostly `value`: store only where the others are and what they are.

    Children: the count of exceptions (one value), the gaps between their
    positions, their values. Inverse: fill with `value`, then scatter.
    """

    id = "sparse"
    params = {"value": int}

    @classmethod
    def validate(cls, config):
        if not 0 <= config["value"] < 1 << 64:
            raise ProgramError("sparse: value must be an unsigned 64-bit integer")

    def output_types(self, t):
        if self._config["value"] > _word_mask(t):
            raise ProgramError(f"sparse: {self._config['value']} does not fit in {t}")
        return [INDEX, INDEX, Field(t.bits)]

    def output_names(self, t):
        return ["count", "gaps", "values"]

    def forward(self, x, t):
        pos = np.flatnonzero(x != x.dtype.type(self._config["value"]))
        gaps = np.diff(pos, prepend=-1) - 1
        return [np.array([len(pos)], np.uint32), gaps.astype(np.uint32), x[pos].astype(t.container)]

    def inverse(self, n, t, read):
        count = int(read(0, 1)[0])
        if count > n:
            raise FormatError("sparse: more exceptions than elements")
        gaps = read(1, count).astype(np.int64)
        pos = np.cumsum(gaps + 1) - 1
        if count and pos[-1] >= n:
            raise FormatError("sparse: exception position out of range")
        values = read(2, count)
        out = np.full(n, self._config["value"], dtype=t.container)
        out[pos] = values
        return out
