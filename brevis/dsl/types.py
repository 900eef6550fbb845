"""Types of the values a program passes between operators.

A value is a flat numpy array of unsigned integers. Its type says how many
of the bits are significant (`Field`), and, for a tensor, which element
type the bits are (`Tensor`), so operators that need the float layout can
check for it. A byte stream is `Field(8)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from ..dtypes import DType, uint_for_bits


@dataclass(frozen=True)
class Field:
    """A stream of unsigned integers below 2**bits."""

    bits: int

    def __post_init__(self):
        if not 1 <= self.bits <= 64:
            raise ValueError(f"a field has 1..64 bits, not {self.bits}")

    @cached_property  # asked at every chunk decoded; a frozen type's is fixed
    def container(self) -> np.dtype:
        return uint_for_bits(self.bits)

    def __str__(self) -> str:
        return f"u{self.bits}"


@dataclass(frozen=True)
class Tensor(Field):
    """The elements of a tensor, as their unsigned bit patterns."""

    dtype: DType = None  # type: ignore[assignment]

    def __str__(self) -> str:
        return self.dtype.name


BYTES = Field(8)


@lru_cache(maxsize=None)
def tensor(dtype: DType) -> Tensor:
    """The value type of a tensor of dtype (one per dtype: read for every
    segment and chunk when decoding)."""
    return Tensor(dtype.bits, dtype)
