"""Element types Brevis understands, and their bit layout.

Tensor data is only ever handled through unsigned integer views of the same
width, so every bit pattern (NaN payloads, -0.0, subnormals) is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # safetensors spelling: "BF16", "F32", "I8", ...
    itemsize: int
    kind: str  # "float", "int", "uint", "bool"
    exponent_bits: int = 0  # float layout: 1 sign bit, exponent, mantissa
    mantissa_bits: int = 0

    @property
    def bits(self) -> int:
        return 8 * self.itemsize

    @property
    def uint(self) -> np.dtype:
        """The unsigned view used for every operation on the data."""
        return uint_for_bits(self.bits)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"


_ALL = [
    DType("BF16", 2, "float", 8, 7),
    DType("F16", 2, "float", 5, 10),
    DType("F32", 4, "float", 8, 23),
    DType("F64", 8, "float", 11, 52),
    DType("F8_E4M3", 1, "float", 4, 3),
    DType("F8_E5M2", 1, "float", 5, 2),
    DType("I8", 1, "int"),
    DType("I16", 2, "int"),
    DType("I32", 4, "int"),
    DType("I64", 8, "int"),
    DType("U8", 1, "uint"),
    DType("U16", 2, "uint"),
    DType("U32", 4, "uint"),
    DType("U64", 8, "uint"),
    DType("BOOL", 1, "bool"),
]

DTYPES: dict[str, DType] = {d.name: d for d in _ALL}


def lookup(name: str) -> DType | None:
    return DTYPES.get(name)


@lru_cache(maxsize=None)
def uint_for_bits(bits: int) -> np.dtype:
    """Smallest little-endian unsigned container holding `bits` bits."""
    for width, dt in ((8, "<u1"), (16, "<u2"), (32, "<u4"), (64, "<u8")):
        if bits <= width:
            return np.dtype(dt)
    raise ValueError(f"no unsigned container for {bits} bits")
