"""Coding a tensor against a reference: the same tensor in a base model.

A fine-tune shares sign, exponent and high mantissa bits with its base, so
the difference of bit patterns is mostly small. These operators declare
uses_reference: the interpreter passes them the reference chunk (the base
tensor's elements at the same positions) in forward_ref and inverse_ref,
and the type checker allows them only at the root of a program.
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, ProgramError
from .operator import Operator, register
from .types import Field, Tensor


class ReferenceOperator(Operator):
    """A tensor against its reference r: one difference child. Inverse: undo
    the difference with the same r (a subclass says which)."""

    uses_reference = True
    # The difference keeps element order too, but keeps_order stays
    # undeclared: the search never carried a row length below a base, and
    # declaring it would change the programs chosen (and so the archives).
    params: dict = {}

    def output_types(self, t):
        if not isinstance(t, Tensor):
            raise ProgramError(f"{self.id} needs a tensor, not {t}")
        return [Field(t.bits)]

    def output_names(self, t):
        return ["difference"]

    def child_counts(self, n, t):
        return (n,)

    # Without a reference there is nothing to code against.
    def forward(self, x, t):
        raise ProgramError(f"{self.id} needs the reference tensor")

    def inverse(self, n, t, read):
        raise FormatError(f"{self.id} needs the base model it was coded against")

    @staticmethod
    def _check(ref: np.ndarray, n: int, t) -> np.ndarray:
        if ref is None or len(ref) != n:
            raise FormatError("the base tensor does not fit this chunk")
        return ref.astype(t.container, copy=False)


@register
class XorBase(ReferenceOperator):
    """y = x xor reference. Inverse: x = y xor reference.

    Memory of the inverse: at most 3 times its output (the reference aside)."""

    id = "xor_base"

    def forward_ref(self, x, t, ref):
        return [x ^ self._check(ref, len(x), t)]

    def inverse_ref(self, n, t, read, ref):
        return read(0, n).astype(t.container) ^ self._check(ref, n, t)


@register
class SubBase(ReferenceOperator):
    """y = x - reference modulo 2^bits (of the bit patterns). Inverse: x = y + reference.

    Memory of the inverse: at most 3 times its output (the reference aside)."""

    id = "sub_base"
    signed_children = True

    def forward_ref(self, x, t, ref):
        return [x - self._check(ref, len(x), t)]

    def inverse_ref(self, n, t, read, ref):
        return read(0, n).astype(t.container) + self._check(ref, n, t)
