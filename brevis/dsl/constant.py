"""Constant values: norm weights of all ones, zero biases, unused fields."""

from __future__ import annotations

import numpy as np

from ..errors import NotApplicable, ProgramError
from .operator import Operator, register


@register
class Constant(Operator):
    """Every element equals `value`; nothing is stored.

    Forward: check that the value is constant. Inverse: repeat the value n times.
    Memory of the inverse: at most 1 times its output. Nothing is stored,
    so an archive may declare many of these chunks: the index's limits
    (archive.format.max_entries) bound how many.
    """

    id = "constant"
    params = {"value": int}

    @classmethod
    def validate(cls, config):
        if not 0 <= config["value"] < 1 << 64:
            raise ProgramError("constant: value must be an unsigned 64-bit integer")

    def describe(self) -> str:
        return f"constant({self._config['value']:#x})"

    def output_types(self, t):
        if self._config["value"] >= 1 << t.bits:
            raise ProgramError(f"constant: {self._config['value']} does not fit in {t}")
        return []

    def forward(self, x, t):
        if len(x) and not np.all(x == x.dtype.type(self._config["value"])):
            raise NotApplicable("values are not constant")
        return []

    writes_into = True  # filled in the chunk's place

    def inverse(self, n, t, read, out=None):
        if out is None:
            return np.full(n, self._config["value"], dtype=t.container)
        out.fill(self._config["value"])
        return out
