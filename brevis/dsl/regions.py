"""Regular and repeated regions: progressions, repeated rows, sparse values."""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, NotApplicable, ProgramError
from .operator import Operator, register
from .types import Field

INDEX = Field(32)  # positions and counts: chunks hold at most 2^26 elements
# Index children (row numbers, gaps) are checked and used block by block,
# as 4-byte integers: widening a whole chunk's to 8 bytes, with temporaries,
# cost 6 to 10 times the chunk (3.4 GiB for a 64 MiB chunk).
BLOCK = 1 << 16


def _word_mask(t: Field) -> int:
    return (1 << t.bits) - 1


@register
class Affine(Operator):
    """x[i] = start + step * i modulo 2^bits (position ids, aranges).

    `step` is in the config; each chunk stores its start (one value).
    Inverse: rebuild the progression. Memory of the inverse: at most 1
    times its output (built in place).
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
        y = np.arange(n, dtype=t.container)  # in place from here: no temporaries
        y *= word(self._config["step"] & _word_mask(t))
        y += word(start)
        if t.bits < 8 * t.container.itemsize:
            y &= word(_word_mask(t))
        return y

    def forward(self, x, t):
        if not len(x):
            return [x[:0].astype(t.container)]
        if not np.array_equal(x, self._progression(int(x[0]), len(x), t)):
            raise NotApplicable("not an arithmetic progression")
        return [x[:1].astype(t.container)]

    def child_share(self, t, i):
        return 0  # the start: one element (see dsl/memory.py)

    def child_counts(self, n, t):
        return (1 if n else 0,)

    def inverse(self, n, t, read):
        start = read(0, 1 if n else 0)
        return self._progression(int(start[0]), n, t) if n else np.zeros(0, t.container)


@register
class RowDedup(Operator):
    """Rows of `row` elements stored once each, plus which row goes where.

    Children: the row index of every row (first occurrences numbered in
    order, so the number of distinct rows follows from the indices), then
    the distinct rows. Inverse: gather the distinct rows by index.
    Memory of the inverse: at most 6 times its output (rows of one byte:
    4-byte row numbers, the distinct rows, the output; then blocks of BLOCK
    row numbers).
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

    def child_share(self, t, i):
        return 1 / self._config["row"] if i == 0 else 1  # one row number per row (see dsl/memory.py)

    def child_counts(self, n, t):
        rows, rest = divmod(n, self._config["row"])
        return None if rest else (rows, None)  # the distinct rows: as the row numbers say

    def inverse(self, n, t, read):
        r = self._config["row"]
        if n % r:
            raise FormatError("row_dedup: chunk is not whole rows")
        index = read(0, n // r)  # u32, checked and used block by block
        highest = -1  # the running maximum before the block
        for i in range(0, len(index), BLOCK):
            block = index[i:i + BLOCK]
            before = np.maximum.accumulate(block)
            # Each row number is at most one above the maximum of those before it.
            if int(block[0]) > highest + 1 or (len(block) > 1 and np.any(block[1:] > before[:-1] + np.uint64(1))):
                raise FormatError("row_dedup: row indices out of order")
            highest = max(highest, int(before[-1]))
        distinct = highest + 1
        rows = read(1, distinct * r).reshape(distinct, r)
        out = np.empty(n, t.container)
        whole = out.reshape(-1, r)
        for i in range(0, len(index), BLOCK):
            # mode="clip": indices are checked above, and "raise" would buffer the output.
            np.take(rows, index[i:i + BLOCK], axis=0, out=whole[i:i + BLOCK], mode="clip")
        return out


@register
class Sparse(Operator):
    """Mostly `value`: store only where the others are and what they are.

    Children: the count of exceptions (one value), the gaps between their
    positions, their values. Inverse: fill with `value`, then scatter.
    Memory of the inverse: at most 6 times its output (bytes, every one an
    exception: 4-byte gaps, the values, the output; then blocks of BLOCK
    positions).
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

    def held_while_reading(self, t, i, types):
        """Bytes per element held while child i decodes (see dsl/memory.py): the gaps, for the values."""
        return 4 if i == 2 else 0

    def child_share(self, t, i):
        return 0 if i == 0 else 1  # the count is one element

    def child_counts(self, n, t):
        return (1, None, None)  # the positions and values: as many as the count says

    def inverse(self, n, t, read):
        count = int(read(0, 1)[0])
        if count > n:
            raise FormatError("sparse: more exceptions than elements")
        gaps = read(1, count)  # u32, turned into positions block by block
        values = read(2, count)
        out = np.full(n, self._config["value"], dtype=t.container)
        last = -1  # the position before the block
        for i in range(0, count, BLOCK):
            pos = gaps[i:i + BLOCK].astype(np.int64)
            pos += 1
            np.cumsum(pos, out=pos)
            pos += last
            last = int(pos[-1])
            if last >= n:
                raise FormatError("sparse: exception position out of range")
            out[pos] = values[i:i + BLOCK]
        return out
