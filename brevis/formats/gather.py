"""Gathering a file's small byte spans into one segment.

A parsed checkpoint leaves bytes between its tensors: pickle framing,
protobuf fields, names and headers, tens to hundreds of bytes each and
hundreds of them. Coded one by one, each span pays for a coder's frame
and model and for an index entry (its digest, its streams' CRCs and
places), and none sees the names and framing its neighbours repeat. A
gathered segment holds several spans' bytes one after another; the index
records where each lies (`ranges`, docs/FORMAT.md), decoding puts them
back. On taesd (three PyTorch zips, 229 spans) the spans took 28.3 KB
coded apart and their index entries about 6 KB more.

Small tensors are gathered too, those of one dtype that read alike
(discovery.kinds) into a typed segment: a checkpoint holds hundreds of
biases and norms of tens to thousands of values, each of which, alone,
pays a coder's model, an index entry and, decoding, a few dozen
microseconds of Python (ppocr: 300 of its 391 tensors are at most 16 KiB,
1.5 % of its bytes). The index names each span's tensor (`members`), so
the tensors stay tensors for `brevis.open`, `ls` and a base.
"""

from __future__ import annotations

from . import Segment

GATHER_SPAN = 64 << 10  # byte spans up to this long are gathered; longer ones are coded alone
GATHER_TENSOR = 16 << 10  # tensors up to this long are gathered with others of their dtype
GATHER_BYTES = 1 << 20  # the most a gathered segment holds (about a chunk)
NAME = "__gathered__"
TENSORS = "__tensors__"  # the name of a segment of gathered tensors


def gatherable(s: Segment) -> bool:
    """A small byte span: no records, no repeated region (a repeat's copy
    is stored once, alone), not gathered already, at most GATHER_SPAN."""
    return (s.dtype is None and s.records is None and s.ranges is None and s.region is None
            and 0 < s.length <= GATHER_SPAN)


def gatherable_tensor(s: Segment) -> bool:
    """A small tensor: typed, not empty, at most GATHER_TENSOR bytes."""
    return (s.dtype is not None and s.shape is not None and s.records is None and s.ranges is None
            and 0 < s.length <= GATHER_TENSOR)


def gather(segments: list[Segment], kind=None) -> list[Segment]:
    """The same tiling with the small byte spans (no records, no repeated
    region, at most GATHER_SPAN) gathered, in file order, into segments of at most
    GATHER_BYTES placed after the others; unchanged where fewer than two.
    `kind(span)`: spans of one kind only are gathered together (None: all
    one kind)."""
    return _gathered(segments, [s for s in segments if gatherable(s)], kind, lambda g: Segment(
        g[0].offset, sum(s.length for s in g), NAME, ranges=tuple((s.offset, s.length) for s in g)))


def gather_tensors(segments: list[Segment], offsets, read) -> list[Segment]:
    """The same tiling with the small tensors (gatherable_tensor) that start
    at `offsets` (the others are left alone) gathered, those of each dtype
    that read alike (discovery.kinds, on their bytes: read(offset, n),
    each read once) together, in file order, into typed segments of at
    most GATHER_BYTES placed after the others: a segment of `TENSORS`,
    one dimension, naming each span's tensor (`members`)."""
    from .discovery import kinds

    # A file's tensors start apart; ranges are listed in file order.
    small = sorted((s for s in segments if gatherable_tensor(s) and s.offset in offsets), key=lambda s: s.offset)
    labels: dict[int, tuple] = {}
    for dtype in sorted({s.dtype.name for s in small}):
        alike = [s for s in small if s.dtype.name == dtype]
        labels.update((id(s), (dtype, k)) for s, k in zip(alike, kinds(alike, read)))
    return _gathered(segments, small, lambda s: labels[id(s)], lambda g: Segment(
        g[0].offset, sum(s.length for s in g), TENSORS, g[0].dtype, (sum(s.length for s in g) // g[0].dtype.itemsize,),
        ranges=tuple((s.offset, s.length) for s in g), members=tuple((s.name, tuple(s.shape)) for s in g)))


def _gathered(segments: list[Segment], small: list[Segment], kind, make) -> list[Segment]:
    """`segments` with `small` (some of them, in file order) gathered: those
    of one kind(s) together (kind None: all one), at most GATHER_BYTES a
    group, each group of two or more made one segment by make(group) and
    placed after the others."""
    if len(small) < 2:
        return segments
    groups: list[list[Segment]] = []
    last: dict = {}  # kind -> its open group and the bytes it holds
    for s in small:
        k = kind(s) if kind is not None else None
        g, held = last.get(k, (None, 0))
        if g is None or held + s.length > GATHER_BYTES:
            g, held = [], 0
            groups.append(g)
        g.append(s)
        last[k] = (g, held + s.length)
    gathered = {id(s) for g in groups if len(g) > 1 for s in g}
    rest = [s for s in segments if id(s) not in gathered]
    return rest + [make(g) for g in groups if len(g) > 1]
