"""Running programs: forward to streams when compressing, inverse to decode.

The decode path needs only the DSL; it never imports search code.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import FormatError
from .operator import Coder, Operator
from .program import Program
from .types import Field


def encode(program: Program, x: np.ndarray, t: Field) -> list[bytes]:
    """Run the forward direction on x; return the streams, leaves in order.

    Raises NotApplicable when an operator cannot represent x.
    """
    streams: list[bytes] = []
    _encode(program, np.ascontiguousarray(x), t, streams)
    return streams


def _encode(program: Program, x: np.ndarray, t: Field, streams: list[bytes]) -> None:
    node = program.node
    if isinstance(node, Coder):
        streams.append(node.encode(x, t))
        return
    assert isinstance(node, Operator)
    values = node.forward(x, t)
    for child, value, ct in zip(program.children, values, node.output_types(t)):
        _encode(child, value, ct, streams)


def decode(program: Program, t: Field, n: int, streams: Sequence[memoryview]) -> np.ndarray:
    """Rebuild n elements of type t from the streams of a checked program."""
    cursor = [0]
    out = _decode(program, t, n, streams, cursor)
    if cursor[0] != len(streams):
        raise FormatError(f"program read {cursor[0]} of {len(streams)} streams")
    if out.dtype != t.container or out.shape != (n,):
        raise FormatError("program produced a value of the wrong shape")
    return out


def _decode(program: Program, t: Field, n: int, streams, cursor: list[int]) -> np.ndarray:
    node = program.node
    if isinstance(node, Coder):
        if cursor[0] >= len(streams):
            raise FormatError("program needs more streams than stored")
        data = streams[cursor[0]]
        cursor[0] += 1
        return node.decode(data, n, t)
    assert isinstance(node, Operator)
    types = node.output_types(t)
    # Children are decoded in order, on demand, so an operator may read the
    # length of a later child from an earlier one.
    decoded: list[np.ndarray] = []

    def read(i: int, count: int) -> np.ndarray:
        if i != len(decoded):
            raise FormatError(f"{node.id} read child {i} out of order")
        if count < 0:
            raise FormatError(f"{node.id}: negative length")
        value = _decode(program.children[i], types[i], count, streams, cursor)
        decoded.append(value)
        return value

    return node.inverse(n, t, read)
