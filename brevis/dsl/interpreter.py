"""Running programs: forward to streams when compressing, inverse to decode.

The decode path needs only the DSL; it never imports search code.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import FormatError
from .entropy import batchable, decode_batch
from .operator import Coder, Operator
from .program import Program
from .types import Field


def encode(program: Program, x: np.ndarray, t: Field, reference: np.ndarray | None = None) -> list[bytes]:
    """Run the forward direction on x; return the streams, leaves in order.

    `reference`: the base tensor's elements at the same positions, for a
    program whose root codes against a base. Raises NotApplicable when an
    operator cannot represent x.
    """
    streams: list[bytes] = []
    _encode(program, np.ascontiguousarray(x), t, streams, reference)
    return streams


def estimate(program: Program, x: np.ndarray, t: Field, reference: np.ndarray | None = None,
             leaf=None) -> list[tuple[int, int]]:
    """What encode() would give, as each leaf's (stream bytes, fixed bytes),
    from Coder.estimate (or leaf(coder, value, type)): the planner's trial
    of a whole program."""
    sizes: list[tuple[int, int]] = []

    def walk(p: Program, value: np.ndarray, vt: Field, ref) -> None:
        if isinstance(p.node, Coder):
            sizes.append(leaf(p.node, value, vt) if leaf else p.node.estimate(value, vt))
            return
        for child, part, ct in zip(p.children, forward(p.node, value, vt, ref), p.node.child_types(vt)):
            walk(child, part, ct, None)

    walk(program, np.ascontiguousarray(x), t, reference)
    return sizes


def forward(node: Operator, x: np.ndarray, t: Field, reference=None) -> list[np.ndarray]:
    """An operator's forward step, given the reference (used by an operator
    with uses_reference, ignored by the others)."""
    return node.forward_ref(x, t, reference)


def _encode(program: Program, x: np.ndarray, t: Field, streams: list[bytes], reference=None) -> None:
    node = program.node
    if isinstance(node, Coder):
        streams.append(node.encode(x, t))
        return
    assert isinstance(node, Operator)
    values = forward(node, x, t, reference)
    for child, value, ct in zip(program.children, values, node.child_types(t)):
        _encode(child, value, ct, streams)


def decode(program: Program, t: Field, n: int, streams: Sequence[memoryview],
           reference: np.ndarray | None = None, out: np.ndarray | None = None,
           ready: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """Rebuild n elements of type t from the streams of a checked program
    (and the base tensor's elements, for a program coded against a base).
    `out`: n elements of t's container to rebuild them in (a program that
    is one leaf decodes straight into it); returned. `ready`: leaves
    decoded ahead (leaves_ahead), by stream position; each is taken (and
    dropped from it) where its leaf reads that many elements, else left
    there, the leaf decoding its stream as usual."""
    if out is not None and isinstance(program.node, Coder):
        if len(streams) != 1:
            raise FormatError(f"program reads 1 of {len(streams)} streams")
        program.node.decode_into(streams[0], n, t, out)
        return out
    cursor = _Cursor(streams, ready)
    value = _decode(program, t, n, cursor, reference, out)
    if cursor.at != len(streams):
        raise FormatError(f"program read {cursor.at} of {len(streams)} streams")
    if value.dtype != t.container or value.shape != (n,):
        raise FormatError("program produced a value of the wrong shape")
    return value


class _Cursor:
    """A chunk's stored streams as its leaves read them, in order, and
    the leaves decoded ahead."""

    __slots__ = ("streams", "at", "ready")

    def __init__(self, streams, ready):
        self.streams, self.at, self.ready = streams, 0, ready

    def next(self):
        """The next stored stream, for the next leaf."""
        if self.at >= len(self.streams):
            raise FormatError("program needs more streams than stored")
        self.at += 1
        return self.streams[self.at - 1]

    def taken(self, n: int, t: Field) -> np.ndarray | None:
        """The next leaf's value where it was decoded ahead with n elements
        of t (dropped from `ready`, its stream passed over), else None (one
        of another count stays in `ready`: the round trip's check of the
        counts claimed finds it there)."""
        if not self.ready:
            return None
        value = self.ready.get(self.at)
        if value is None or len(value) != n or value.dtype != t.container:
            return None
        del self.ready[self.at]
        self.next()
        return value


def leaves_ahead(program: Program, t: Field, n: int) -> tuple[tuple[int, int, Field], ...]:
    """(stream position, elements, type) of each leaf of a program over n
    elements of t that may decode ahead of the others: an `ans` leaf that
    decode_batch takes, whose count n alone decides (Operator.child_counts
    at every node above it). The reader decodes these of many chunks in
    one call, where the engine of narrow blocks has more of them to
    interleave. Kept on the program, per (t, n)."""
    cache = program.__dict__.setdefault("_ahead", {})
    found = cache.get((t, n))
    if found is None:
        leaves = program.leaves()
        found = tuple((at, count, lt) for at, count, lt in leaf_counts(program, t, n)
                      if count and batchable(leaves[at], lt, None))
        if len(cache) < AHEAD_CACHE:
            cache[(t, n)] = found
    return found


AHEAD_CACHE = 64  # (t, n) pairs kept per program: a segment's chunks share a few lengths


def leaf_counts(program: Program, t: Field, n: int) -> list[tuple[int, int, Field]]:
    """(stream position, elements, type) of each leaf whose count n alone
    decides (Operator.child_counts at every node above it)."""
    leaves: list[tuple[int, int, Field]] = []

    def walk(p: Program, t: Field, n: int | None, at: int) -> int:
        if isinstance(p.node, Coder):
            if n is not None:
                leaves.append((at, n, t))
            return at + 1
        types = p.node.child_types(t)
        counts = p.node.child_counts(n, t) if n is not None else None
        for i, child in enumerate(p.children):
            count = counts[i] if counts is not None and i < len(counts) else None
            at = walk(child, types[i], count if count is None or count >= 0 else None, at)
        return at

    walk(program, t, n, 0)
    return leaves


def _decode(program: Program, t: Field, n: int, cursor: _Cursor, reference=None,
            out: np.ndarray | None = None) -> np.ndarray:
    """The value of `program`'s node; `out`: the chunk's place, given for
    a root operator only (decode() puts a root leaf there itself)."""
    node = program.node
    if isinstance(node, Coder):
        value = cursor.taken(n, t)
        if value is not None:
            if out is None:
                return value
            out[:] = value
            return out
        data = cursor.next()
        if out is not None:
            node.decode_into(data, n, t, out)
            return out
        return node.decode(data, n, t)
    assert isinstance(node, Operator)
    types = node.child_types(t)
    # Children are decoded in order, on demand, so an operator may read the
    # length of a later child from an earlier one. Only their number is kept
    # here: an operator that is done with a child frees it (bit_fields folds
    # one child at a time into its output).
    decoded = [0]

    def claim(i: int, count: int) -> None:
        # Child i, of count elements, is the next one read.
        if i != decoded[0]:
            raise FormatError(f"{node.id} read child {i} out of order")
        if count < 0:
            raise FormatError(f"{node.id}: negative length")
        decoded[0] += 1

    def read(i: int, count: int) -> np.ndarray:
        claim(i, count)
        return _decode(program.children[i], types[i], count, cursor)

    def into(i: int, count: int, place: np.ndarray) -> np.ndarray:
        # Child i decoded in `place` (count elements of its container), by
        # its leaf or its root operator where they write into a place.
        claim(i, count)
        if count != len(place) or place.dtype != types[i].container:
            raise FormatError(f"{node.id}: child {i} does not fit its place")
        return _decode(program.children[i], types[i], count, cursor, None, place)

    def many(first: int, counts: Sequence[int]) -> list[np.ndarray]:
        # Children first, first + 1, ... at once: those one `ans` leaf codes
        # decode in one call (decode_batch), which releases the GIL once
        # and interleaves their blocks; the others as read() does.
        values: list = []
        batch = []
        for i, count in enumerate(counts, first):
            claim(i, count)
            child, ct = program.children[i], types[i]
            if count and isinstance(child.node, Coder) and batchable(child.node, ct, None):
                out = cursor.taken(count, ct)
                if out is None:
                    out = np.empty(count, ct.container)
                    batch.append((memoryview(cursor.next()), count, ct, out))
                values.append(out)
            else:
                values.append(_decode(child, ct, count, cursor))
        if batch:
            decode_batch(batch)
        return values

    read.many = many
    read.into = into

    if out is not None:  # the root of a chunk: into the chunk's place
        return node.inverse_into(n, t, read, reference, out)
    return node.inverse_ref(n, t, read, reference)
