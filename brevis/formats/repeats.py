"""Long repeats in byte spans: cut so that each copy is a segment of its own.

A checkpoint's files often hold the same arrays more than once: an ONNX
export beside the TorchScript and safetensors files of one model, an
encoder and a decoder sharing an embedding, a "with past" decoder
repeating the decoder. Where a parser names the tensors, chunks of equal
bytes are stored once (codec/assembler.py, Deduplicator). Where none does,
a copy lies somewhere inside an opaque span, at any offset, and no chunk
of it lines up with a chunk of the first copy.

So every long opaque span is cut into content-defined pieces (a piece
ends where a hash of the 8 bytes before it has its top bits clear; the
same bytes give the same cuts wherever they lie), pieces met more than
once mark the repeats, runs of them that always follow one another make a
region, and each region is widened to the bytes its copies share. Every
copy of a region then becomes one segment of the same bytes: the chunks
of all but the first are stored as pointers to the first's streams (no
change to the archive's format). A mistaken match only costs ratio: the
chunk digest, not this search, decides what is shared.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
from xxhash import xxh3_64_intdigest

from . import Segment

try:
    from ..native import _chunking
except ImportError:  # an unbuilt tree: the numpy equivalent below
    _chunking = None

MIN_SPAN = 4 << 10  # shorter byte spans are not searched
WINDOW = 8  # bytes hashed to place a cut
# Pieces are as short as the input allows, up to about PIECES of them in
# all (the search's time and memory go with their number): 4 KiB on a
# gigabyte, 64 bytes on a small checkpoint, whose repeats (biases and norms
# saved twice) are a few hundred bytes long.
PIECES = 1 << 18
PIECE_BITS = (6, 12)  # log2 of the mean piece's bytes, at least and at most
BLOCK = 16 << 20  # bytes read at a time
NAME = "__repeat__"
_K1 = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class Scale:
    """The pieces' sizes for an input: anchors about every 2**bits bytes."""

    bits: int

    @classmethod
    def of(cls, total: int) -> "Scale":
        return cls(min(PIECE_BITS[1], max(PIECE_BITS[0], (total // PIECES).bit_length() - 1)))

    @property
    def min_piece(self) -> int:
        return 1 << self.bits - 2

    @property
    def max_piece(self) -> int:  # also the most a region is widened by, at each end
        return 8 << self.bits

    @property
    def min_repeat(self) -> int:  # shorter regions are not cut out: their index entries cost more
        return 4 << self.bits



Reader = Callable[[int, int], bytes]  # (offset in the file, length) -> bytes


@dataclass(frozen=True)
class Span:
    """An opaque segment of a file, and how to read it."""

    file: int  # number of the file in the caller's list
    segment: Segment
    read: Reader


def anchors(data: np.ndarray, bits: int) -> np.ndarray:
    """Where pieces may end: the offsets i + 8 (sorted) of the 8-byte
    windows data[i:i+8] whose hash has its top `bits` bits clear. In
    numpy, for a tree without the C kernel (whose pieces() finds them
    itself; its anchors() is the same scan, held to this one by the
    tests)."""
    last = len(data) - WINDOW  # the last window's start
    if last < 0:
        return np.zeros(0, np.int64)
    padded = np.zeros((len(data) // WINDOW + 2) * WINDOW, np.uint8)  # every window's two words exist
    padded[: len(data)] = data
    words = padded.view("<u8")
    found = []
    for k in range(WINDOW):  # the windows at 8j + k, from two aligned words each
        w = words[:-1] if k == 0 else (words[:-1] >> np.uint64(8 * k)) | (words[1:] << np.uint64(64 - 8 * k))
        h = w ^ (w >> np.uint64(29))
        h *= _K1
        at = np.flatnonzero(h >> np.uint64(64 - bits) == 0) * WINDOW + k
        found.append(at[at <= last] + WINDOW)
    return np.sort(np.concatenate(found))


def _cuts(ends: np.ndarray, start: int, stop: int, final: bool, scale: Scale) -> list[int]:
    """Piece ends after `start`: the first anchor end at least the shortest
    piece on, else the longest piece on; up to `stop` (where the data ends;
    the piece there counts only if `final`)."""
    out, pos, least, most = [], start, scale.min_piece, scale.max_piece
    while True:
        j = int(np.searchsorted(ends, pos + least))
        if j < len(ends) and ends[j] <= pos + most:
            pos = int(ends[j])
        elif pos + most <= stop:
            pos += most
        else:
            if final and pos < stop:
                out.append(stop)
            return out
        out.append(pos)


def _pieces(data: np.ndarray, final: bool, scale: Scale) -> tuple[np.ndarray, np.ndarray]:
    """A block's pieces (_cuts over its anchors): their ends (int64) and
    keys (uint64, the XXH3-64 of their bytes), in one call to the C kernel
    where it is built."""
    if _chunking is not None:
        ends, keys = _chunking.pieces(data, scale.bits, scale.min_piece, scale.max_piece, final)
        return np.frombuffer(ends, dtype=np.int64), np.frombuffer(keys, dtype=np.uint64)
    e = np.asarray(_cuts(anchors(data, scale.bits), 0, len(data), final, scale), dtype=np.int64)
    s = np.concatenate(([0], e[:-1])) if len(e) else e
    return e, np.array([xxh3_64_intdigest(data[i:j]) for i, j in zip(s, e)], dtype=np.uint64)


def pieces(span: Span, scale: Scale) -> tuple[np.ndarray, np.ndarray]:
    """The span's content-defined pieces: their ends (offsets in the span)
    and keys (64 bits of a hash of their bytes, XXH3-64: a mistaken match
    only costs ratio, see above)."""
    seg = span.segment
    ends_out: list[np.ndarray] = []
    keys_out: list[np.ndarray] = []
    done, carry = 0, b""  # the span's bytes before `done` are in emitted pieces; `carry` follows them
    while True:
        at = done + len(carry)
        block = span.read(seg.offset + at, min(BLOCK, seg.length - at))
        data = np.frombuffer(carry + block, dtype=np.uint8)
        final = at + len(block) >= seg.length
        e, k = _pieces(data, final, scale)
        if len(e):
            keys_out.append(k)
            ends_out.append(e + done)
        last = int(e[-1]) if len(e) else 0
        done += last
        carry = bytes(data[last:])
        if final:
            break
    if not ends_out:
        return np.zeros(0, np.int64), np.zeros(0, np.uint64)
    return np.concatenate(ends_out), np.concatenate(keys_out)


@dataclass
class Copy:
    """One copy of a repeated region: [start, end) of a span."""

    span: int  # index into the spans
    start: int  # in the span
    end: int


def regions(spans: list[Span]) -> list[list[Copy]]:
    """The repeated regions of the spans: for each, its copies (two or
    more, apart, all of the same bytes by the pieces' keys), widened."""
    ends, keys, owner = [], [], []
    scale = Scale.of(sum(sp.segment.length for sp in spans))
    for i, sp in enumerate(spans):
        e, k = pieces(sp, scale)
        ends.append(e)
        keys.append(k)
        owner.append(np.full(len(e), i))
    if not ends:
        return []
    end = np.concatenate(ends)
    start = np.concatenate([np.concatenate(([0], e[:-1])) if len(e) else e for e in ends])
    key = np.concatenate(keys)
    span = np.concatenate(owner)
    if not len(key):
        return []
    _, ids, counts = np.unique(key, return_inverse=True, return_counts=True)
    ids = ids.ravel()
    same_span = span[1:] == span[:-1]
    # A piece next to a copy of itself is periodic data (zeros, a repeated
    # record): its coder sees that, and cutting there would only scatter it.
    periodic = np.zeros(len(counts), bool)
    periodic[ids[1:][same_span & (ids[1:] == ids[:-1])]] = True
    repeated = (counts >= 2) & ~periodic
    rep = repeated[ids]
    # Neighbours, -1 at a span's end or beside a piece met once.
    nxt = np.full(len(ids), -1)
    nxt[:-1] = np.where(same_span & rep[1:], ids[1:], -1)
    prv = np.full(len(ids), -1)
    prv[1:] = np.where(same_span & rep[:-1], ids[:-1], -1)
    unique_next = _constant_per_key(ids, nxt, len(counts))
    unique_prev = _constant_per_key(ids, prv, len(counts))
    # Piece i joins piece i+1 where every copy of i is followed by i+1's key
    # and every copy of that key preceded by i's: then the runs, and their
    # ends, are the same at every copy.
    link = np.zeros(len(ids), bool)
    link[:-1] = rep[:-1] & rep[1:] & same_span & unique_next[ids[:-1]] & unique_prev[ids[1:]]
    runs: dict[int, list[Copy]] = {}
    i = 0
    while i < len(ids):
        if not rep[i]:
            i += 1
            continue
        j = i
        while link[j]:
            j += 1
        if end[j] - start[i] >= scale.min_repeat:
            runs.setdefault(int(ids[i]), []).append(Copy(int(span[i]), int(start[i]), int(end[j])))
        i = j + 1
    found = [copies for copies in runs.values() if len(copies) >= 2]
    _widen(found, spans, scale.max_piece)
    return found


def _constant_per_key(ids: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """For each key, whether `values` is the same at all its pieces."""
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(lo, ids, values)
    np.maximum.at(hi, ids, values)
    return lo == hi


def _widen(found: list[list[Copy]], spans: list[Span], most: int) -> None:
    """Widen every region at both ends by the bytes all its copies share
    there (a repeat rarely starts on a cut), never into another copy."""
    by_span: dict[int, list[Copy]] = {}
    for copies in found:
        for c in copies:
            by_span.setdefault(c.span, []).append(c)
    room_before, room_after = {}, {}
    for s, cs in by_span.items():
        cs.sort(key=lambda c: c.start)
        for a, b in zip([None] + cs, cs):
            room_before[id(b)] = b.start - (a.end if a else 0)
    for copies in found:
        n = min(most, *(room_before[id(c)] for c in copies))
        if n:
            tails = [_bytes(spans[c.span], c.start - n, n)[::-1] for c in copies]
            k = _common_prefix(tails)
            for c in copies:
                c.start -= k
    for s, cs in by_span.items():
        for a, b in zip(cs, cs[1:] + [None]):
            room_after[id(a)] = (b.start if b else spans[s].segment.length) - a.end
    for copies in found:
        n = min(most, *(room_after[id(c)] for c in copies))
        if n:
            heads = [_bytes(spans[c.span], c.end, n) for c in copies]
            k = _common_prefix(heads)
            for c in copies:
                c.end += k


def _bytes(sp: Span, at: int, n: int) -> np.ndarray:
    return np.frombuffer(sp.read(sp.segment.offset + at, n), dtype=np.uint8)


def _common_prefix(arrays: list[np.ndarray]) -> int:
    """How many leading bytes all the arrays (of one length) share."""
    first = arrays[0]
    differ = np.zeros(len(first), bool)
    for a in arrays[1:]:
        differ |= a != first
    hit = np.flatnonzero(differ)
    return int(hit[0]) if len(hit) else len(first)


def cut(spans: list[Span], found: list[list[Copy]]) -> dict[int, list[Segment]]:
    """The pieces replacing each span that holds a copy of the regions
    `found` (keyed by the span's index): the span's bytes tiled by its
    copies (named NAME, `region` set: segments with one number hold the
    same bytes) and the bytes between them (the span's own name). Spans
    without a copy are not in the result."""
    out: dict[int, list[Segment]] = {}
    copies_in: dict[int, list[tuple[Copy, int]]] = {}
    for number, copies in enumerate(found):
        for c in copies:
            copies_in.setdefault(c.span, []).append((c, number))
    for s, cs in copies_in.items():
        seg = spans[s].segment
        pos, parts = 0, []
        for c, number in sorted(cs, key=lambda x: x[0].start):
            if c.start > pos:
                parts.append(replace(seg, offset=seg.offset + pos, length=c.start - pos))
            parts.append(Segment(seg.offset + c.start, c.end - c.start, NAME, region=number))
            pos = c.end
        if pos < seg.length:
            parts.append(replace(seg, offset=seg.offset + pos, length=seg.length - pos))
        out[s] = parts
    return out


def searchable(seg: Segment) -> bool:
    """Whether a segment is searched for repeats: a long plain byte span."""
    return seg.dtype is None and seg.records is None and seg.ranges is None and seg.length >= MIN_SPAN
