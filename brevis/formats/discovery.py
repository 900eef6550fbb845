"""Cutting a file no parser knows, from its bytes alone.

Numbers stored by an unknown format are words of 2, 4 or 8 bytes from
some offset on; the search reads an opaque span as typed floats of each
width (the `view` operator) and as 2-byte words (see synth/proposals.py),
which only works where the words start at the span's start. Here a
sample of the file tells the offset: the bytes of one word depend on each
other (a float's sign, exponent and top mantissa bits), the last byte of
a word and the first of the next hardly (see phase). The file is then cut
into the bytes before that phase and the rest, so that the rest starts on
a word. A wrong guess only costs ratio: the cut is just two byte segments.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import BinaryIO

import numpy as np

from . import Segment, opaque
from .gguf import BLOCK_FIELDS

try:
    from ..native import _rans
except ImportError:  # an unbuilt tree: numpy's bincount
    _rans = None

SAMPLE_BYTES = 1 << 18  # from the middle of the file
MIN_FILE_BYTES = 1 << 16  # smaller files keep one segment
MIN_GAIN = 0.01  # of the sample's bits: a phase must win by this much to cut
CHANGE_BLOCK = 1 << 12  # bytes per histogram (more in long spans: at most CHANGE_BLOCKS of them)
CHANGE_BLOCKS = 1 << 12
CHANGE_BLOCK_LEAST, CHANGE_SHORT_BLOCKS = 1 << 10, 32  # ... fewer bytes where a span holds fewer blocks than this
LANES = 4  # a byte's statistics are counted by its offset mod 4: the planes of 4-byte words, or a phase's shift
KEYS = LANES * 256
CHANGE_MIN_BLOCKS = 4  # the shortest piece, in blocks
CHANGE_PROBES = 256  # candidate cuts measured at first in a piece
REFINE_STEP = 1 << 10  # a cut is placed to this many bytes from counts, then to the byte
CHANGE_GAIN_BITS = 8192  # a cut must save this much order-0 entropy: a segment's entry and a coder's model
KIND_GAIN_BITS = 2048  # pieces are gathered where that costs less than this (kinds)
READ_BYTES = 16 << 20
RECORD_MIN_BYTES = 1 << 18  # shorter spans are not searched for blocks
RECORD_SAMPLE = 1 << 18
RECORD_GAIN = 0.012  # of the bits of plain lanes, a layout must save (a wrong one saves at most 0.6 % on the corpus)
PHASE_BLOCK = 1 << 14  # bytes whose blocks' phase is measured at once ...
PHASE_FINE = 1 << 10  # ... and, where it changes, finer
# block bytes -> field layout ([count, width] in storage order), one layout per size
LAYOUTS: dict[int, tuple[tuple[int, int], ...]] = {}
for _fields in BLOCK_FIELDS.values():
    LAYOUTS.setdefault(sum(c * w for c, w in _fields), _fields)


def _pair_bits(sample: np.ndarray, stride: int, at: int) -> float:
    """Order-0 entropy, in bits, of the little-endian 16-bit pairs that
    start `at` bytes into every `stride`-byte step of the sample (the last
    byte of a step pairs with the first of the next)."""
    n = (len(sample) - at - 2) // stride
    pairs = sample[at: at + n * stride].reshape(n, stride)[:, :2]
    return _symbol_bits(pairs[:, 0].astype(np.intp) | pairs[:, 1].astype(np.intp) << 8)


def _symbol_bits(values: np.ndarray) -> float:
    """Order-0 entropy, in bits per value."""
    return float(_row_bits(np.bincount(values))) / len(values)


def _linked_bits(sample: np.ndarray, stride: int) -> np.ndarray:
    """For each lane a of a `stride`-byte step: the bits of information
    a byte in lane a and the next byte share (their mutual information)."""
    n = len(sample) // stride
    lanes = [_symbol_bits(sample[a: n * stride: stride].astype(np.intp)) for a in range(stride)]
    return np.array([lanes[a] + lanes[(a + 1) % stride] - _pair_bits(sample, stride, a) for a in range(stride)])


def phase(sample: np.ndarray) -> int:
    """The offset (mod the word size) at which the sample's words start; 0
    where no offset is clear. The bytes of one word depend on each other
    (a float's sign, exponent and top mantissa bits; an integer's high
    bytes), the last byte of a word and the first of the next hardly: a
    word starts after the pair of neighbouring bytes that share the least.
    (The entropy of each byte lane does not tell: a shift only rotates the
    lanes; nor does that of a word's top two bytes alone: where the low
    byte of a float has few values, the top byte and the next word's low
    byte read as a likely pair.) One such pair in every 4 bytes: 4-byte
    words; two, of one parity: 2-byte words."""
    if len(sample) < 64:
        return 0
    gap = MIN_GAIN * 16
    shared = _linked_bits(sample, 4)
    order = np.argsort(shared, kind="stable")
    least = int(order[0])
    if shared[order[1]] - shared[least] > gap:
        return (least + 1) % 4
    if (order[1] - least) % 2 == 0 and shared[order[2]] - shared[order[1]] > gap:
        return (least + 1) % 2
    return 0


def cut(f: BinaryIO, size: int) -> list[Segment]:
    """The segments of an unparsed file: one, or the bytes before the
    phase its words start at and the rest."""
    def read(offset: int, n: int) -> bytes:
        f.seek(offset)
        return f.read(n)

    whole = opaque(size)
    return split(whole[0], read, "__header__", words=False) if whole else whole


def split(seg: Segment, read, head_name: str | None = None, words: bool = True) -> list[Segment]:
    """A byte segment as the bytes before the phase its words start at
    (named `head_name`, else as the segment) and the rest; where `words`,
    the rest as a body of whole 8-byte words and the few bytes after it
    (a chunk of words with a byte over cannot be read as words: its coder
    would fall back to one for bytes). Itself alone where it is short, or
    starts on its phase (and holds whole words). `read(offset in the
    file, n)`."""
    if seg.length < MIN_FILE_BYTES:
        return [seg]
    start = max(0, seg.length // 2 - SAMPLE_BYTES // 2)
    start -= start % 8  # the sample's phase is the segment's
    sample = np.frombuffer(read(seg.offset + start, min(SAMPLE_BYTES, seg.length - start)), dtype=np.uint8)
    p = phase(sample) if len(sample) >= 1024 else 0
    body = (seg.length - p) // 8 * 8 if words else seg.length - p
    if not p and body == seg.length:
        return [seg]
    out = [replace(seg, length=p, name=seg.name if head_name is None else head_name, region=None)] if p else []
    out.append(replace(seg, offset=seg.offset + p, length=body))
    if p + body < seg.length:
        out.append(replace(seg, offset=seg.offset + p + body, length=seg.length - p - body, region=None))
    return out


def _phase0(seg: Segment) -> int:
    """Where lanes and cuts count from: the file's start, as formats align
    arrays; a repeat's copy's own start, so that every copy, wherever it
    lies, is cut alike."""
    return seg.offset if seg.region is None else 0


def _keys(data: np.ndarray, offset: int) -> np.ndarray:
    """Each byte's key: its lane (`offset`, from _phase0, mod LANES) and its value."""
    keys = data.astype(np.uint16)
    for i in range(LANES):
        keys[i::LANES] |= np.uint16((offset + i) % LANES << 8)
    return keys


def _block_histograms(seg: Segment, read, block: int) -> np.ndarray:
    """Counts of each key (_keys) in each `block` bytes of the segment (the last block may be short)."""
    out, step = [], max(READ_BYTES, block)
    for at in range(0, seg.length, step):
        data = np.frombuffer(read(seg.offset + at, min(step, seg.length - at)), dtype=np.uint8)
        keys = _keys(data, _phase0(seg) + at)
        if _rans is not None:
            h = np.frombuffer(_rans.histogram(keys, 2, 0, KEYS, block.bit_length() - 1), dtype=np.int64)
        else:
            ids = np.arange(len(data), dtype=np.intp) // block
            h = np.bincount(ids * KEYS + keys, minlength=(int(ids[-1]) + 1) * KEYS)
        out.append(h.reshape(-1, KEYS))
    return np.concatenate(out)


def _xlogx(c: np.ndarray) -> np.ndarray:
    """c log2 c for each count (0 at 0): from _xlogx_table where every count
    is in it (a third of the time: discovery asks this of arrays of tens of
    thousands of counts, hundreds of times a file), else computed."""
    if c.dtype.kind in "iu" and c.size:
        top = int(c.max())
        if top <= XLOGX_TOP:
            return _xlogx_table(top)[c]
    return _computed_xlogx(c)


def _computed_xlogx(c: np.ndarray) -> np.ndarray:
    c = c.astype(np.float64)
    return c * np.log2(np.where(c > 0, c, 1))


XLOGX_TOP = RECORD_SAMPLE  # counts of a sample at most (a lane's, a block's are fewer)


_table = np.zeros(1)  # _xlogx_table's, as far as it is made


def _xlogx_table(top: int) -> np.ndarray:
    """c log2 c for c = 0..top at least (top <= XLOGX_TOP), by the same
    steps: the same doubles _xlogx computes. Made as far as a process's
    counts reach, doubling (all of it, 2 MiB, took 7-8 ms on the AMD EPYC:
    5 % of compressing a 0.46 MB checkpoint, whose counts stay below 2^15)."""
    global _table
    table = _table  # (threads may plan at once: each keeps the table it read or made)
    if top >= len(table):
        table = _computed_xlogx(np.arange(min(XLOGX_TOP + 1, max(2 * len(table), 1 << top.bit_length(), 1024))))
        if len(table) > len(_table):
            _table = table
    return table


def _row_bits(counts: np.ndarray) -> np.ndarray:
    """Order-0 bits of each row of counts (n log n - sum c log c, along the last axis)."""
    return _xlogx(counts.sum(axis=-1)) - _xlogx(counts).sum(axis=-1)


def _bits(counts: np.ndarray) -> np.ndarray:
    """Bits to code each row of key counts with an order-0 model per lane."""
    return _row_bits(counts.reshape(*counts.shape[:-1], LANES, 256)).sum(axis=-1)


def kinds(pieces: list[Segment], read) -> list[int]:
    """A label per piece, so that the pieces of one label read alike: their
    bytes' statistics in each lane (as `changes` counts them) are such that
    coded as one segment they cost about what they cost apart. Greedy, in
    order: a piece joins the kind whose merged counts grow least, where by
    less than KIND_GAIN_BITS (about what a segment of its own costs: an
    index entry and a coder's model), else starts a kind. Lanes count
    from each piece's start (a piece starts on its words' phase)."""
    sums = np.zeros((0, KEYS), np.int64)  # a row per kind, and its bits:
    bits = np.zeros(0)
    labels = []
    for p in pieces:
        h = _lane_counts(np.frombuffer(read(p.offset, p.length), np.uint8), 0, LANES).reshape(KEYS)
        # The piece alone and merged into every kind, in one call (a row's
        # bits are the same doubles whatever rows lie beside it): thousands
        # of small tensors, three calls of a dozen numpy steps each before.
        both = _bits(np.vstack([h, sums + h]))
        own, merged = both[0], both[1:]
        grown = merged - bits - own
        k = int(np.argmin(grown)) if len(grown) else -1
        if k < 0 or grown[k] >= KIND_GAIN_BITS:
            sums, bits = np.vstack([sums, h]), np.append(bits, own)
            k = len(sums) - 1
        else:
            sums[k] += h
            bits[k] = merged[k]
        labels.append(k)
    return labels


def _prefix(rows: np.ndarray) -> np.ndarray:
    """A row of zeros, then the running sums of the rows (of counts). Row by
    row: numpy's cumsum along the first axis walks each column with a
    stride, 3 to 10 times slower (70 ms against 13 for 4096 blocks of 1024
    keys, 1.5 against 0.4 for a layout's 584 lanes of 256)."""
    out = np.empty((len(rows) + 1, rows.shape[1]), np.int64)
    out[0] = 0
    for i, row in enumerate(rows):
        np.add(out[i], row, out=out[i + 1])
    return out


def change_points(hist: np.ndarray, min_blocks: int = CHANGE_MIN_BLOCKS,
                  gain_bits: float = CHANGE_GAIN_BITS) -> list[int]:
    """Block numbers (sorted) where to cut a run of block histograms:
    binary segmentation, each cut the one that saves the most order-0
    entropy in its piece, while one saves at least `gain_bits`."""
    prefix = _prefix(hist)

    def gains(a: int, b: int, ks: np.ndarray) -> np.ndarray:
        return _bits(prefix[b] - prefix[a]) - _bits(prefix[ks] - prefix[a]) - _bits(prefix[b] - prefix[ks])

    cuts, todo = [], [(0, len(hist))]
    while todo:
        a, b = todo.pop()
        if b - a < 2 * min_blocks:
            continue
        # Every CHANGE_PROBES-th candidate first, then every one near the best of them.
        lo, hi = a + min_blocks, b - min_blocks
        step = max(1, (hi - lo) // CHANGE_PROBES)
        ks = np.arange(lo, hi + 1, step)
        best = int(ks[np.argmax(gains(a, b, ks))])
        ks = np.arange(max(lo, best - step), min(hi, best + step) + 1)
        g = gains(a, b, ks)
        if g.max() >= gain_bits:
            k = int(ks[np.argmax(g)])
            cuts.append(k)
            todo += [(a, k), (k, b)]
    return sorted(cuts)


def _moved(keys: np.ndarray, counts: np.ndarray, into: int) -> np.ndarray:
    """How sum(c log c) over `counts` changes as keys[:j] move in (into=1)
    or out (into=-1), for j = 0..len(keys): each key changes one count by
    one, from its count before plus or minus its rank among equal keys."""
    order = np.argsort(keys, kind="stable")
    first = np.searchsorted(keys[order], np.arange(len(counts)))
    rank = np.empty(len(keys), np.int64)
    rank[order] = np.arange(len(keys)) - first[keys[order]]
    c = counts[keys] + into * rank
    return np.concatenate([[0.0], np.cumsum(_xlogx(c + into) - _xlogx(c))])


def _refine(seg: Segment, read, hist: np.ndarray, block: int, cuts: list[int]) -> list[int]:
    """Each cut (a block number) moved to the byte, within the blocks on
    either side of it, that splits the bytes between its neighbouring cuts
    at the least cost (_bits). Returns offsets in the segment."""
    prefix = _prefix(hist)
    bounds = [0] + cuts + [len(hist)]
    out = []
    for i, k in enumerate(cuts):
        a, b = bounds[i], bounds[i + 2]
        lo, hi = (k - 1) * block, min((k + 1) * block, seg.length)
        keys = _keys(np.frombuffer(read(seg.offset + lo, hi - lo), dtype=np.uint8), _phase0(seg) + lo).astype(np.intp)
        left = prefix[k - 1] - prefix[a]  # counts left of the window
        right = prefix[b] - prefix[k - 1]  # the window's and after
        if len(keys) > 4 * REFINE_STEP:  # first to REFINE_STEP bytes, from counts of steps
            steps = np.arange(len(keys)) // REFINE_STEP
            counts = np.bincount(steps * KEYS + keys, minlength=(int(steps[-1]) + 1) * KEYS).reshape(-1, KEYS)
            moved = _prefix(counts)
            t = int(np.argmin(_bits(left + moved) + _bits(right - moved)))
            first = max(0, t - 1) * REFINE_STEP
            left, right = left + moved[max(0, t - 1)], right - moved[max(0, t - 1)]
            keys = keys[first: first + 2 * REFINE_STEP]
            lo += first
        out.append(lo + _best_byte(keys, left, right))
    return out


def _best_byte(keys: np.ndarray, left: np.ndarray, right: np.ndarray) -> int:
    """The j at which moving keys[:j] from the counts `right` (which hold
    them) to `left` leaves the least cost (_bits) on the two sides."""
    lanes = keys >> 8
    nl, nr = left.reshape(LANES, 256).sum(axis=1), right.reshape(LANES, 256).sum(axis=1)
    cost = (_xlogx(nl).sum() + _moved(lanes, nl, 1) - _xlogx(left).sum() - _moved(keys, left, 1)
            + _xlogx(nr).sum() + _moved(lanes, nr, -1) - _xlogx(right).sum() - _moved(keys, right, -1))
    return int(np.argmin(cost))


def changes(seg: Segment, read) -> list[Segment]:
    """A byte segment cut where its byte statistics change (each piece as
    the segment, but for its place); itself alone where they do not.
    `read(offset in the file, n)`."""
    block = CHANGE_BLOCK
    while seg.length > block * CHANGE_BLOCKS:
        block *= 2
    while block > CHANGE_BLOCK_LEAST and seg.length < block * CHANGE_SHORT_BLOCKS:
        block //= 2  # a short span (a small file's header and first tensors): finer blocks
    if seg.length < 2 * CHANGE_MIN_BLOCKS * block:
        return [seg]
    hist = _block_histograms(seg, read, block)
    cuts = change_points(hist)
    if not cuts:
        return [seg]
    # On a multiple of 8 (from _phase0): where a format aligns its arrays,
    # that is where they start (a cut a few bytes off costs nothing).
    at = [(_phase0(seg) + a + 4) // 8 * 8 - _phase0(seg) for a in _refine(seg, read, hist, block, cuts)]
    at = sorted({0, seg.length} | {a for a in at if 0 < a < seg.length})
    return [replace(seg, offset=seg.offset + a, length=b - a) for a, b in zip(at, at[1:]) if b > a]


@functools.lru_cache(maxsize=64)
def _lane_pattern(period: int, n: int) -> np.ndarray:
    """(i % period) * 256 for i < n + period: sliced, the lanes of any n bytes."""
    return (np.arange(n + period, dtype=np.int32) % period) * 256


def _lane_counts(x: np.ndarray, start: int, period: int) -> np.ndarray:
    """Counts of each byte value at each offset mod `period` (x[0] at `start`): (period, 256)."""
    if _rans is not None:  # one pass in C, 3 to 7 times numpy's (which makes an index array first)
        return np.frombuffer(_rans.lane_histogram(x, start, period), np.int64).reshape(period, 256)
    size = max(PHASE_BLOCK, 1 << (len(x) - 1).bit_length())  # a few sizes, so that the patterns are kept
    lanes = _lane_pattern(period, size)[start % period: start % period + len(x)]
    return np.bincount(lanes + x, minlength=period * 256).reshape(period, 256)


def _field_bits(counts: np.ndarray, fields, rotations: np.ndarray | None = None) -> np.ndarray:
    """For each r (of `rotations`, else every one), the bits of the bytes counted (lane counts of blocks of
    len(counts) bytes) with blocks starting at offset r mod the block size
    and one model per field: a field of 1-byte items pools its lanes, a
    wider one keeps a model per byte of its items."""
    period = len(counts)
    doubled = np.concatenate([counts, counts])
    r = np.arange(period) if rotations is None else np.asarray(rotations)
    # Every rotation's pooled lanes from running sums; one rotation's (each
    # block's phase, in `blocks`) summed directly: the same counts.
    prefix = _prefix(doubled) if len(r) > 1 else None
    bits, at = np.zeros(len(r)), 0
    for count, width in fields:
        if width == 1 and prefix is not None:
            pooled = [prefix[r + at + count] - prefix[r + at]]
        elif width == 1:
            pooled = [doubled[r[0] + at: r[0] + at + count].sum(axis=0, keepdims=True)]
        elif count == 1:  # one item (a block's scale): each of its bytes' lanes as it is
            pooled = [doubled[r + at + b] for b in range(width)]
        else:  # byte b of every item: lanes at + b, at + b + width, ...
            pooled = [doubled[r[:, None] + at + b + width * np.arange(count)].sum(axis=1) for b in range(width)]
        for c in pooled:
            bits += _row_bits(c)
        at += count * width
    return bits


def _lanes_bits(x: np.ndarray, start: int) -> float:
    """The bytes' order-0 bits with a model per lane (offset mod LANES), as _bits counts them."""
    return float(_row_bits(_lane_counts(x, start, LANES)).sum())


def block_layout(x: np.ndarray, start: int = 0):
    """(block bytes, fields) of the block layout that codes the sample (x[0]
    at offset `start`) RECORD_GAIN better than plain lanes; None if none does."""
    base, best = _lanes_bits(x, start), None
    for period, fields in sorted(LAYOUTS.items()):
        if len(x) < 64 * period:
            continue
        bits = float(_field_bits(_lane_counts(x, start, period), fields).min())
        if best is None or bits < best[0]:
            best = (bits, period, fields)
    if best is None or best[0] > base * (1 - RECORD_GAIN):
        return None
    return best[1], best[2]


def holds_blocks(seg: Segment, read, probes: int = 4) -> bool:
    """Whether any of `probes` samples spread over a byte segment reads as
    blocks of a known layout (block_layout): where none does, its pieces
    are not searched one by one (on a 235 MB file of BF16 that search took
    a fifth of the compression's time)."""
    return any(probe_reads_as_blocks(np.frombuffer(read(offset, n), np.uint8), start)
               for offset, n, start in block_probes(seg, probes))


def block_probes(seg: Segment, probes: int = 4) -> list[tuple[int, int, int]]:
    """holds_blocks' samples of the segment: (offset in the file, bytes,
    the lanes' count at its first byte), none where it is too short."""
    if seg.length < RECORD_MIN_BYTES:
        return []
    room = max(0, seg.length - RECORD_SAMPLE)
    ats = [room * i // max(1, probes - 1) for i in range(probes)]
    return [(seg.offset + at, min(RECORD_SAMPLE, seg.length - at), _phase0(seg) + at) for at in ats]


def probe_reads_as_blocks(x: np.ndarray, start: int) -> bool:
    """One of holds_blocks' samples (x[0] at lane count `start`) reads as blocks of a known layout."""
    return block_layout(x, start) is not None


def _phase_of(x: np.ndarray, start: int, period: int, fields, last: int = -1) -> int:
    """Where blocks start (offset mod period) in x, or -1 where blocks of
    this layout do not fit it better than plain lanes. The phase `last`
    (the bytes before's) is tried first: most blocks follow their
    neighbours, and one phase costs a period's worth less to measure."""
    counts, bar = _lane_counts(x, start, period), _lanes_bits(x, start) * (1 - RECORD_GAIN)
    if last >= 0 and _field_bits(counts, fields, [last])[0] < bar:
        return last
    bits = _field_bits(counts, fields)
    r = int(np.argmin(bits))
    return r if bits[r] < bar else -1


def blocks(seg: Segment, read) -> list[Segment]:
    """A byte segment as runs of whole blocks of a known layout (segments
    of records) and the bytes around them; itself alone where it is short
    or no layout fits. Offsets count from _phase0."""
    if seg.length < RECORD_MIN_BYTES:
        return [seg]
    origin = _phase0(seg)
    mid = max(0, seg.length // 2 - RECORD_SAMPLE // 2)
    found = block_layout(np.frombuffer(read(seg.offset + mid, min(RECORD_SAMPLE, seg.length - mid)), np.uint8),
                         origin + mid)
    if found is None:
        return [seg]
    period, fields = found
    phases: list[int] = []  # the phase of each PHASE_BLOCK bytes
    for at in range(0, seg.length, READ_BYTES):
        data = np.frombuffer(read(seg.offset + at, min(READ_BYTES, seg.length - at)), np.uint8)
        for i in range(0, len(data), PHASE_BLOCK):
            phases.append(_phase_of(data[i:i + PHASE_BLOCK], origin + at + i, period, fields,
                                    phases[-1] if phases else -1))
    for i in range(1, len(phases) - 1):  # one block off between two that agree: noise
        if phases[i - 1] == phases[i + 1] != phases[i]:
            phases[i] = phases[i - 1]
    cuts, run_phases = [0], [phases[0]]  # where each run of one phase starts, and its phase
    for i in range(1, len(phases)):
        if phases[i] != phases[i - 1]:
            cut = _fine_cut(seg, read, origin, (i - 1) * PHASE_BLOCK, phases[i - 1], phases[i], period, fields)
            cuts.append(max(cut, cuts[-1]))
            run_phases.append(phases[i])
    cuts.append(seg.length)
    out: list[Segment] = []
    for a, b, phase in zip(cuts, cuts[1:], run_phases):
        first = a + (phase - origin - a) % period if phase >= 0 else b
        whole = (b - first) // period * period if first < b else 0
        if not whole:
            out.append(replace(seg, offset=seg.offset + a, length=b - a))
            continue
        if first > a:
            out.append(replace(seg, offset=seg.offset + a, length=first - a, region=None))
        out.append(replace(seg, offset=seg.offset + first, length=whole, records=fields))
        if first + whole < b:
            out.append(replace(seg, offset=seg.offset + first + whole, length=b - first - whole, region=None))
    return [s for s in out if s.length]


def _fine_cut(seg: Segment, read, origin: int, lo: int, left: int, right: int, period: int, fields) -> int:
    """Where, in the two PHASE_BLOCKs from `lo`, blocks of phase `left` give
    way to `right` (either may be -1: none), to PHASE_FINE bytes."""
    data = np.frombuffer(read(seg.offset + lo, min(2 * PHASE_BLOCK, seg.length - lo)), np.uint8)
    pieces = [data[i:i + PHASE_FINE] for i in range(0, len(data), PHASE_FINE)]

    def cost(x, at, phase):
        if phase < 0:
            return _lanes_bits(x, at)
        return float(_field_bits(_lane_counts(x, at, period), fields)[phase])

    costs_left = [cost(x, origin + lo + i * PHASE_FINE, left) for i, x in enumerate(pieces)]
    costs_right = [cost(x, origin + lo + i * PHASE_FINE, right) for i, x in enumerate(pieces)]
    totals = [sum(costs_left[:k]) + sum(costs_right[k:]) for k in range(1, len(pieces))]
    return lo + (1 + int(np.argmin(totals))) * PHASE_FINE
