"""Bytes read as a typed tensor: the typing discovery finds in untyped bytes."""

from __future__ import annotations

import numpy as np

from ..dtypes import DTYPES
from ..errors import FormatError, NotApplicable, ProgramError
from .operator import Operator, register
from .types import tensor


@register
class View(Operator):
    """Read a byte stream as the little-endian elements of `dtype`.

    Where a span no parser typed holds numbers (an unknown format's
    tensors), its one child is them as `Tensor(dtype)`: n / itemsize
    elements, on which the float operators (fields, partitions, deltas of
    bit patterns) apply as on a parsed tensor. Inverse: the elements'
    bytes, in order. Memory of the inverse: at most 2 times its output.
    """

    id = "view"
    params = {"dtype": str}
    typed_children = True

    @classmethod
    def validate(cls, config):
        if config["dtype"] not in DTYPES:
            raise ProgramError(f"view: unknown dtype {config['dtype']!r}")

    @property
    def dtype(self):
        return DTYPES[self._config["dtype"]]

    def output_types(self, t):
        if t.bits != 8:
            raise ProgramError(f"view needs bytes, not {t}")
        return [tensor(self.dtype)]

    def output_names(self, t):
        return ["elements"]

    def child_share(self, t, i):
        return 1 / self.dtype.itemsize  # elements per byte

    def child_counts(self, n, t):
        elements, rest = divmod(n, self.dtype.itemsize)
        return None if rest else (elements,)

    def forward(self, x, t):
        if len(x) % self.dtype.itemsize:
            raise NotApplicable("not whole elements")
        return [np.ascontiguousarray(x).view(self.dtype.uint)]

    # Into the chunk's place (its child decodes there, as the elements: a
    # place at any byte is fine, every decoder stores unaligned).
    writes_into = True

    def inverse(self, n, t, read, out=None):
        size = self.dtype.itemsize
        if n % size:
            raise FormatError(f"view: {n} bytes are not whole {self.dtype.name} elements")
        if out is None or not out.flags.c_contiguous:  # (inverse_into copies it into a place in pieces)
            return np.ascontiguousarray(read(0, n // size)).view(np.uint8)
        read.into(0, n // size, out.view(tensor(self.dtype).container))  # (the type into() checks)
        return out
