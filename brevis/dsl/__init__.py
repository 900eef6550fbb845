"""The typed DSL: value types, operators, coders, programs, interpreter."""

from . import coders, constant, delta, entropy, fields, planes, records, reference, regions, symbols, views  # noqa: F401
from .coders import Lzma, Raw, Zstd
from .entropy import Ans
from .constant import Constant
from .delta import Delta, Transpose, XorDelta, ZigZag
from .fields import BitFields, FloatFields, LowZeroBits, PackBits
from .interpreter import decode, encode
from .operator import REGISTRY
from .planes import BytePlanes
from .records import Records
from .reference import SubBase, XorBase
from .regions import Affine, RowDedup, Sparse
from .symbols import Partition, Rank
from .program import Program
from .types import Field, Tensor, tensor
from .views import View

__all__ = [
    "Ans", "Affine", "Delta", "Records", "SubBase", "XorBase", "Partition", "Rank", "RowDedup", "Sparse", "Transpose", "XorDelta", "ZigZag",
    "REGISTRY", "BitFields", "BytePlanes", "Constant", "Field",
    "FloatFields", "LowZeroBits", "Lzma", "PackBits", "Program", "Raw",
    "Tensor", "View", "Zstd", "decode", "encode", "tensor",
]
