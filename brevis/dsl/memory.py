"""How much memory decoding a program may take, from its structure alone.

Every operator states the memory of its inverse as a multiple of its
output ("Memory of the inverse: at most K times its output", in its
docstring, measured by tests/robustness/test_robust_memory.py). Nesting
multiplies what a single operator bounds: an operator holds some of its
children (sparse its gaps, bit_fields its output) while the next one
decodes, and that child may hold more while its own children decode; 14
levels of `sparse` under `sparse` held 58 times the chunk (3.7 GiB for
64 MiB). `peak_bytes` bounds a program's peak, in bytes per element of the
value it decodes, and readers refuse a chunk whose program would take more
than MAX_DECODE_BYTES (the writer checks the same before publishing: it
reads its own index back; and chunk jobs fall back to the plain program
first).

A child holds at most as many elements as its parent (the reader checks
every data-dependent count), so per-element figures add up.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .operator import Coder, Operator
from .types import Field

# The most decoding one chunk may take (peak_bytes x its elements): readers
# refuse a chunk over it, and a chunk job codes such a chunk with the plain
# program instead. The programs the search finds take up to 12 bytes per
# element (sparse over BOOL, its gaps in byte planes), 12 MiB for a chunk of
# the default 1 MiB; bit_fields into eight 1-bit sparse fields of a 64 MiB
# byte chunk take exactly this much.
MAX_DECODE_BYTES = 512 << 20


def chunk_fits(program, t: Field, n: int) -> bool:
    """Whether decoding a chunk of n elements with this program stays within MAX_DECODE_BYTES."""
    return cached_peak(program, t) * n <= MAX_DECODE_BYTES


# Compiled with the module: the first index an unpack reads would otherwise
# pay the compilation (0.1 ms) inside the call.
_STATED = re.compile(r"Memory of the inverse: at most (\d+) times")


@lru_cache(maxsize=None)
def stated_factor(cls: type) -> int:
    """K of "Memory of the inverse: at most K times its output" in the class's docstring (3 if none)."""
    m = _STATED.search(" ".join((cls.__doc__ or "").split()))
    return int(m.group(1)) if m else 3


def width(t: Field) -> int:
    return t.container.itemsize


def share(node: Operator, t: Field, i: int) -> float:
    """At most how many elements child i holds per element of the node's
    value: the node's own `child_share(t, i)` if it has one, else 1."""
    own = getattr(node, "child_share", None)
    return own(t, i) if own is not None else 1.0


def held_while_reading(node: Operator, t: Field, i: int, types) -> float:
    """Bytes per element `node` holds while its child i decodes: the node's
    own `held_while_reading(t, i, types)` if it has one, else every earlier
    child's value."""
    own = getattr(node, "held_while_reading", None)
    if own is not None:
        return own(t, i, types)
    return sum(share(node, t, j) * width(c) for j, c in enumerate(types[:i]))


def peak_bytes(program, t: Field) -> float:
    """A bound on the peak memory of decoding `program` for values of type t,
    in bytes per element."""
    node = program.node
    if isinstance(node, Coder):
        return width(t)
    types = node.child_types(t)
    peak = stated_factor(type(node)) * width(t)
    for i, (child, ct) in enumerate(zip(program.children, types)):
        peak = max(peak, held_while_reading(node, t, i, types) + share(node, t, i) * cached_peak(child, ct))
    return peak


def cached_peak(program, t: Field) -> float:
    """peak_bytes, kept on the program for each type it is asked for: an
    index's programs share their subtrees (Program.from_json's memo), each
    measured once."""
    peaks = program.__dict__.setdefault("_peaks", {})
    peak = peaks.get(t)
    if peak is None:
        peak = peaks[t] = peak_bytes(program, t)
    return peak


def factor(program, t: Field) -> float:
    """peak_bytes as a multiple of the value's own bytes."""
    return peak_bytes(program, t) / width(t)
