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
"""

from __future__ import annotations

from . import Segment

GATHER_SPAN = 64 << 10  # byte spans up to this long are gathered; longer ones are coded alone
GATHER_BYTES = 1 << 20  # the most a gathered segment holds (about a chunk)
NAME = "__gathered__"


def gatherable(s: Segment) -> bool:
    """A small byte span: no records, no repeated region (a repeat's copy
    is stored once, alone), not gathered already, at most GATHER_SPAN."""
    return (s.dtype is None and s.records is None and s.ranges is None and s.region is None
            and 0 < s.length <= GATHER_SPAN)


def gather(segments: list[Segment], kind=None) -> list[Segment]:
    """The same tiling with the small byte spans (no records, no repeated
    region, at most GATHER_SPAN) gathered, in file order, into segments of at most
    GATHER_BYTES placed after the others; unchanged where fewer than two.
    `kind(span)`: spans of one kind only are gathered together (None: all
    one kind)."""
    small = [s for s in segments if gatherable(s)]
    if len(small) < 2:
        return segments
    groups: list[list[Segment]] = []
    last: dict = {}  # kind -> its open group
    for s in small:
        k = kind(s) if kind is not None else None
        g = last.get(k)
        if g is None or sum(x.length for x in g) + s.length > GATHER_BYTES:
            g = last[k] = []
            groups.append(g)
        g.append(s)
    gathered = {id(s) for g in groups if len(g) > 1 for s in g}
    rest = [s for s in segments if id(s) not in gathered]
    return rest + [Segment(g[0].offset, sum(s.length for s in g), NAME, ranges=tuple((s.offset, s.length) for s in g))
                   for g in groups if len(g) > 1]
