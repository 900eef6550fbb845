"""Pick a program for a segment by trying a handful of candidates on a sample.

Candidate structures are built from the value's type (float fields, byte
planes, constants, low zero bits); every leaf then takes the coder that
codes its sample smallest. The winner and a fallback that always applies
(no operator that can refuse an input) are returned, fully resolved.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dsl import (BytePlanes, Constant, Field, FloatFields, LowZeroBits, PackBits, Program, Raw,
                   Tensor, Zstd)

# Leaf coders in order of preference when sizes tie (fastest first).
LEAF_CODERS = (Raw(), Zstd.entropy(), Zstd.at_level(3))
BYTES_CODERS = LEAF_CODERS + (Zstd.at_level(9),)
SMALL = 4096  # below this many bytes, structure cannot pay for itself
# A slower coder must save this share of the best faster one's size to be chosen.
SPEED_MARGIN = 0.005


@dataclass
class Choice:
    program: Program
    fallback: Program
    estimate: int  # bytes of the winner on the sample


def _best_leaf(x: np.ndarray, t: Field, coders=LEAF_CODERS) -> tuple[Program, int]:
    best = None
    for coder in coders:
        size = len(coder.encode(x, t))
        if best is None or size < best[1] * (1 - SPEED_MARGIN):
            best = (Program.leaf(coder), size)
    return best  # type: ignore[return-value]


def _code_field(x: np.ndarray, t: Field, allow_refusal: bool) -> tuple[Program, int]:
    """Best sub-program for a field: a leaf, or a few structural steps first."""
    options = [_best_leaf(x, t)]
    if len(x) and allow_refusal and np.all(x == x[0]):
        options.append((Program.op(Constant(value=int(x[0]))), 0))
    if t.bits in (1, 2, 4):
        (packed,) = PackBits().forward(x, t)
        leaf, size = _best_leaf(packed, Field(8))
        options.append((Program.op(PackBits(), leaf), size))
    if t.bits > 8:
        source, st, wrap = x, t, None
        if allow_refusal and len(x):
            low = int(np.bitwise_or.reduce(x))
            zeros = (low & -low).bit_length() - 1 if low else 0
            if 0 < zeros < t.bits:
                op = LowZeroBits(shift=zeros)
                (source,) = op.forward(x, t)
                st, wrap = op.output_types(t)[0], op
        if st.bits > 8:
            planes_op = BytePlanes()
            children, total = [], 0
            for plane, pt in zip(planes_op.forward(source, st), planes_op.output_types(st)):
                prog, size = _code_field(plane, pt, allow_refusal)
                children.append(prog)
                total += size
            prog = Program.op(planes_op, *children)
        else:
            prog, total = _best_leaf(source, st)
        options.append((Program.op(wrap, prog) if wrap else prog, total))
    return min(options, key=lambda o: o[1])


def _candidates(x: np.ndarray, t: Field, allow_refusal: bool) -> list[tuple[Program, int]]:
    out = [_best_leaf(x, t, BYTES_CODERS if t.bits == 8 and not isinstance(t, Tensor) else LEAF_CODERS)]
    if len(x) and allow_refusal and np.all(x == x[0]):
        out.append((Program.op(Constant(value=int(x[0]))), 0))
    if isinstance(t, Tensor) and t.dtype.is_float and t.bits > 8:
        for grouping in ("e|sm", "s|e|m"):
            op = FloatFields(grouping=grouping)
            children, total = [], 0
            for value, vt in zip(op.forward(x, t), op.output_types(t)):
                prog, size = _code_field(value, vt, allow_refusal)
                children.append(prog)
                total += size
            out.append((Program.op(op, *children), total))
    if t.bits > 8:
        out.append(_code_field(x, Field(t.bits), allow_refusal))
    return out


def can_refuse(program: Program) -> bool:
    return isinstance(program.node, (Constant, LowZeroBits)) or any(can_refuse(c) for c in program.children)


def choose(sample: np.ndarray, t: Field) -> Choice:
    """The best program for values like `sample` (elements of type t)."""
    x = np.ascontiguousarray(sample).view(t.container)
    if x.nbytes < SMALL:
        prog, size = _best_leaf(x, t, (Raw(), Zstd.at_level(3)))
        return Choice(prog, prog, size)
    options = _candidates(x, t, allow_refusal=True)
    best = min(options, key=lambda o: o[1])
    if not can_refuse(best[0]):
        return Choice(best[0], best[0], best[1])
    safe = min(_candidates(x, t, allow_refusal=False), key=lambda o: o[1])
    return Choice(best[0], safe[0], best[1])
