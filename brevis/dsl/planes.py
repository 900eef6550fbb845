"""Byte planes: the k-th byte of every word, side by side."""

from __future__ import annotations

import numpy as np

from .operator import Operator, read_children, register
from .types import Field

try:
    from ..native import _layout
except ImportError:  # a source tree that was never built: numpy's passes
    _layout = None


@register
class BytePlanes(Operator):
    """Split words into byte planes, least significant byte first.

    A b-bit field gives ceil(b/8) planes; the last holds the leftover bits.
    Inverse: interleave the planes back into little-endian words.
    Memory of the inverse: at most 3 times its output.
    """

    id = "byte_planes"
    keeps_order = True
    delta_children = True
    params: dict = {}

    def output_types(self, t):
        full, rest = divmod(t.bits, 8)
        return [Field(8)] * full + ([Field(rest)] if rest else [])

    def output_names(self, t):
        return [f"byte{i}" for i in range(len(self.output_types(t)))]

    def forward(self, x, t):
        planes = len(self.output_types(t))
        as_bytes = x.view(np.uint8).reshape(len(x), x.itemsize)
        return [np.ascontiguousarray(as_bytes[:, i]) for i in range(planes)]

    writes_into = True

    def inverse(self, n, t, read, out=None):
        size = t.container.itemsize
        planes = read_children(read, 0, [n] * len(self.child_types(t)))
        if _layout is not None and size in (1, 2, 4, 8):  # one write a word, in C
            out = np.empty(n, t.container) if out is None else out
            _layout.interleave([np.ascontiguousarray(p, dtype=np.uint8) for p in planes], out)
            return out
        if size == 2 and len(planes) == 2 and planes[0].dtype == planes[1].dtype == np.uint8:
            # One widening copy, one shift and one OR: about twice as fast as
            # interleaving through a strided (n, 2) byte view.
            out = planes[0].astype(t.container)
            out |= np.left_shift(planes[1], t.container.type(8), dtype=t.container)
            return out
        out = np.zeros((n, size), np.uint8)
        for i, plane in enumerate(planes):
            out[:, i] = plane
        return out.view(t.container).reshape(n)
