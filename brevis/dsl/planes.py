"""Byte planes: the k-th byte of every word, side by side."""

from __future__ import annotations

import numpy as np

from .operator import Operator, register
from .types import Field


@register
class BytePlanes(Operator):
    """Split words into byte planes, least significant byte first.

    A b-bit field gives ceil(b/8) planes; the last holds the leftover bits.
    Inverse: interleave the planes back into little-endian words.
    """

    id = "byte_planes"
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

    def inverse(self, n, t, read):
        size = t.container.itemsize
        out = np.zeros((n, size), np.uint8)
        for i in range(len(self.child_types(t))):
            out[:, i] = read(i, n)
        return out.view(t.container).reshape(n)
