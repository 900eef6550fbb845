"""The typed DSL: value types, operators, coders, programs, interpreter."""

from . import coders, constant, fields, planes  # noqa: F401  (register productions)
from .coders import Raw, Zstd
from .constant import Constant
from .fields import BitFields, FloatFields, LowZeroBits, PackBits
from .interpreter import decode, encode
from .operator import REGISTRY, Coder, Operator
from .planes import BytePlanes
from .program import Program
from .types import BYTES, Field, Tensor, tensor

__all__ = [
    "BYTES", "REGISTRY", "BitFields", "BytePlanes", "Coder", "Constant", "Field",
    "FloatFields", "LowZeroBits", "Operator", "PackBits", "Program", "Raw",
    "Tensor", "Zstd", "decode", "encode", "tensor",
]
