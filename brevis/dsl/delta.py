"""Differences between neighbours: delta, xor-delta, zig-zag, transpose.

`stride` picks the neighbour: 1 is the previous element, the row length
of a 2-D tensor is the element above (a delta along axis 0). The first
`stride` elements of a chunk are kept as they are.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, NotApplicable, ProgramError
from .operator import Operator, read_child_into, register
from .types import Field

try:
    from ..native import _layout
except ImportError:  # a source tree that was never built: numpy's copy
    _layout = None


def _mask(x: np.ndarray, bits: int) -> np.ndarray:
    if bits < 8 * x.itemsize:
        x &= x.dtype.type((1 << bits) - 1)
    return x


def _columns(y: np.ndarray, stride: int) -> tuple[np.ndarray, int]:
    """y padded to whole rows of `stride`, as (rows, stride)."""
    n = len(y)
    if n <= stride:  # one row: no padding (a stride from an archive may be 2^26)
        return y.reshape(1, n), n
    pad = (-n) % stride
    if pad:
        y = np.concatenate([y, np.zeros(pad, y.dtype)])
    return y.reshape(-1, stride), n


def _in_place(y: np.ndarray, t: Field) -> np.ndarray:
    """y, for a C kernel to undo a step in place: y itself where it is a
    writable contiguous array of t's container (a child's value, made for
    this), else a copy (a raw leaf's value is a read-only view of its stream)."""
    y = np.ascontiguousarray(y, dtype=t.container)
    return y if y.flags.writeable else y.copy()


def _running(y: np.ndarray, t: Field, stride: int, xor: bool) -> np.ndarray:
    """Running sums (modulo the container's width) or xors of y per lane of
    `stride`, by the C kernel, in place (_in_place)."""
    y = _in_place(y, t)
    _layout.prefix(y, stride, xor)
    return y


class _Strided(Operator):
    params = {"stride": int}

    @classmethod
    def validate(cls, config):
        if not 1 <= config["stride"] <= 1 << 26:
            raise ProgramError(f"{cls.id}: stride must be in 1..2^26")

    def output_types(self, t):
        return [Field(t.bits)]


@register
class Delta(_Strided):
    """y[i] = x[i] - x[i-stride] modulo 2^bits. Inverse: running sums per lane.

    Memory of the inverse: at most 3 times its output."""

    id = "delta"
    keeps_order = True
    signed_children = True

    def forward(self, x, t):
        s = self._config["stride"]
        y = np.empty(len(x), t.container)
        y[:s] = x[:s]
        if len(x) > s:
            np.subtract(x[s:], x[:-s], out=y[s:], casting="unsafe")  # no temporary
        return [_mask(y, t.bits)]

    writes_into = True

    def inverse(self, n, t, read, out=None):
        if _layout is not None:  # one pass in C, in place (in `out`, where the child decodes into it)
            y = read(0, n) if out is None else read_child_into(read, 0, n, out)
            return _mask(_running(y, t, self._config["stride"], False), t.bits)
        lanes, n = _columns(read(0, n), self._config["stride"])
        out = np.cumsum(lanes, axis=0, dtype=t.container).reshape(-1)[:n]
        return _mask(out, t.bits)


@register
class XorDelta(_Strided):
    """y[i] = x[i] xor x[i-stride]. Inverse: running xor per lane.

    Memory of the inverse: at most 3 times its output."""

    id = "xor_delta"
    keeps_order = True

    def forward(self, x, t):
        s = self._config["stride"]
        y = np.empty(len(x), t.container)
        y[:s] = x[:s]
        if len(x) > s:
            np.bitwise_xor(x[s:], x[:-s], out=y[s:], casting="unsafe")  # no temporary
        return [y]

    writes_into = True

    def inverse(self, n, t, read, out=None):
        if _layout is not None:  # one pass in C, in place (in `out`, where the child decodes into it)
            y = read(0, n) if out is None else read_child_into(read, 0, n, out)
            return _running(y, t, self._config["stride"], True)
        lanes, n = _columns(read(0, n).astype(t.container, copy=False), self._config["stride"])
        return np.bitwise_xor.accumulate(lanes, axis=0).reshape(-1)[:n]


@register
class ZigZag(Operator):
    """Map two's complement v to 2v (v >= 0) or -2v-1 (v < 0), so small
    magnitudes of either sign become small codes. Inverse: (z >> 1) xor -(z & 1).
    Memory of the inverse: at most 3 times its output.
    """

    id = "zigzag"
    keeps_order = True
    params: dict = {}

    def output_types(self, t):
        if t.bits not in (8, 16, 32, 64):
            raise ProgramError(f"zigzag needs an 8, 16, 32 or 64-bit field, not {t}")
        return [Field(t.bits)]

    def forward(self, x, t):
        signed = x.view(np.dtype(f"<i{x.itemsize}"))
        z = (signed << signed.dtype.type(1)) ^ (signed >> signed.dtype.type(t.bits - 1))
        return [z.view(t.container)]

    def inverse(self, n, t, read):
        z = read(0, n)
        if _layout is not None:  # one pass in C, in place (_in_place)
            z = _in_place(z, t)
            _layout.unzigzag(z)
            return z
        word = t.container.type
        # -(z & 1) in unsigned arithmetic is all ones or zero (t.bits fills the word).
        ones = np.bitwise_and(z, word(1), dtype=t.container, casting="unsafe")
        np.negative(ones, out=ones)
        out = np.right_shift(z, word(1), dtype=t.container, casting="unsafe")
        out ^= ones
        return out


@register
class Transpose(Operator):
    """View a chunk as rows of `cols` elements and store it column by column.

    Inverse: transpose back. The chunk length must be a multiple of `cols`.
    Memory of the inverse: at most 2 times its output.
    """

    id = "transpose"
    params = {"cols": int}

    @classmethod
    def validate(cls, config):
        if not 1 <= config["cols"] <= 1 << 26:
            raise ProgramError("transpose: cols must be in 1..2^26")

    def output_types(self, t):
        return [Field(t.bits)]

    def child_counts(self, n, t):
        return None if n % self._config["cols"] else (n,)

    def forward(self, x, t):
        c = self._config["cols"]
        if len(x) % c:
            raise NotApplicable("chunk is not whole rows")
        return [_transposed(x, len(x) // c, c)]

    writes_into = True

    def inverse(self, n, t, read, out=None):
        c = self._config["cols"]
        if n % c:
            raise FormatError("transpose: chunk is not whole rows")
        y = read(0, n).astype(t.container, copy=False)
        return _transposed(y, c, n // c, out)


def _transposed(x: np.ndarray, rows: int, cols: int, out: np.ndarray | None = None) -> np.ndarray:
    """x (rows x cols, row by row) column by column: the C tiled kernel (in
    `out`, of x's dtype, where given), or numpy."""
    x = np.ascontiguousarray(x)
    if _layout is None or x.itemsize not in (1, 2, 4, 8):
        return np.ascontiguousarray(x.reshape(rows, cols).T).reshape(-1)
    out = np.empty_like(x) if out is None else out
    _layout.transpose(x, rows, cols, x.itemsize, out)
    return out
