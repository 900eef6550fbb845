"""The `ans` coder leaf: binned rANS for fields of up to 32 bits.

zstd's entropy stage is Huffman, which spends a whole number of bits per
symbol and sees one byte at a time: on a float's exponent (about 2.6 bits
of information) it loses 0.03-0.1 bits a value, and it cannot see that
within one exponent the top mantissa bits of bell-shaped weights are not
flat, or that a tensor's 16-bit values have 10 bits of entropy. This coder
codes each value as a *bin* (rANS, in -log2(frequency) bits) and an
*offset* in the bin (raw bits). The bins are the leaves of a binary trie
over the value's top 16 bits (all of them for narrower fields), chosen
per stream by dynamic programming: a node is split where what its halves'
distinct frequencies save pays for one more entry in the model. Where the
trie reaches single values it is an order-0 code of the field; where it
stops early it is pcodec's binning in bit-pattern space (a float's bins
are an exponent and a mantissa prefix).

Stream layout (little-endian; docs/FORMAT.md): a byte, the block size
(0: one block; B: blocks of 2**B values, each after its varint length)
with WIDE set where the blocks have 32 states instead of 4, then blocks:

    u8 P                      bin frequencies sum to 2**P, 1 <= P <= 16
    trie                      2-bit codes in pre-order, four to a byte, low bits
                              first: 0 empty, 1 bin, 2 split (never below 1 key)
    varint freq - 1           per bin, in trie order
    varint rans length        then the rANS bytes: 4 (wide: 32) x u32 final states, u16 words
    offset bits               the rest: each value's low obits, LSB first

An empty value is an empty stream. Wide blocks (format version 4) decode
1.6 to 2.5 times faster where the CPU has AVX2, eight states a vector and
four vectors in flight, for 112 more bytes of final states a block:
written where the blocks hold WIDE_MIN values or more. Narrow blocks keep
four states; where the CPU has AVX2, those of one decode call (a batch of
chunks: decode_batch) decode eight blocks at a time, two to a vector, 1.5
to 1.6 times faster than one at a time. The hot loops are C
(brevis/native/_rans.c); `_encode_py` and `_decode_py` are the same
algorithm in Python, for a tree where the extension is not built (slow).
"""

from __future__ import annotations

import numpy as np

from ..errors import FormatError, ProgramError
from .coders import Raw
from .operator import Coder, register
from .types import Field

try:
    from ..native import _rans
except ImportError:  # a source tree that was never built: the slow path
    _rans = None

LANES = 4
WIDE_LANES = 32  # a wide block's states
WIDE = 0x80  # in a stream's first byte: its blocks are wide
# A wide block's 112 more bytes of states are at most 0.03 % of a block of
# 2**16 four-bit values, 0.01 % of 16-bit ones.
WIDE_MIN = 1 << 16
STATE_LOW = 1 << 16
MAX_BITS = 32
KEY_BITS = 16  # the trie is over a value's top 16 bits at most
EMPTY, BIN, SPLIT = 0, 1, 2
# Model cost estimates in bits, for choosing the trie: a bin's code and
# frequency varint, an inner node's or an empty node's code.
BIN_COST, NODE_COST = 14.0, 2.0
# Blocks: values per model 2**12, 2**14 or 2**16 where the data changes along the
# value; a reader accepts 2**10..2**24. MODEL_BITS: a used 12-bit key's
# share of a block's model, for choosing.
BLOCK_LOGS = (12, 14, 16)
BLOCK_KEY_BITS = 8  # the top bits whose statistics decide
MIN_BLOCK_LOG, MAX_BLOCK_LOG = 10, 24
MODEL_BITS = 10.0


def _varint(values) -> bytes:
    out = bytearray()
    for v in values:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _read_varint(data: memoryview, pos: int, what: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 28:
            raise FormatError(f"ans stream: truncated or overlong {what}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def precision(n: int, bins: int) -> int:
    """P for n values in `bins` bins: a slot for every bin, and no finer
    than n can tell apart (a finer P only makes the model dearer). At most
    12 where the bins allow: against 13, archives of astra (BF16) -0.012 %,
    taesd -0.012 %, minilm +0.002 % (cheaper frequencies), and the decoder's
    slot tables half the size (BF16 blocks decode 8-16 % faster); 11 cost
    astra +0.04 %."""
    return max(min(12, max(n.bit_length() + 1, 8)), (bins - 1).bit_length(), 1)


def normalize(counts: np.ndarray, p: int) -> np.ndarray:
    """Frequencies summing to 2**p, each >= 1, close to counts' shares."""
    total = 1 << p
    freq = np.maximum(1, np.rint(counts * (total / counts.sum()))).astype(np.int64)
    excess = int(freq.sum()) - total
    order = np.argsort(-freq, kind="stable")
    if excess < 0:
        freq[order[0]] -= excess
    while excess > 0:  # take from the largest, never below 1
        for i in order:
            take = min(excess, int(freq[i]) - 1, max(1, int(freq[i]) // 8))
            freq[i] -= take
            excess -= take
            if not excess:
                break
    return freq


def choose_trie(keys: np.ndarray, key_bits: int) -> tuple[list[int], list[tuple[int, int]]]:
    """choose_trie over the counts of these keys."""
    return trie_of_counts(np.bincount(keys, minlength=1 << key_bits), key_bits)


def trie_of_counts(counts: np.ndarray, key_bits: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The trie that minimizes the estimated size: its codes in pre-order
    and its bins as (first key, level) in order (the Python equivalent of
    _rans.trie_values, which the encoder uses where the extension is built).

    Bottom-up over the levels, on the occupied nodes only (a sample of a
    few thousand values occupies a few thousand of 65,536 keys): a node's
    best cost is the lesser of coding it as one bin (n*level bits of
    offsets, -n*log2(n) for its frequency, plus BIN_COST) and its halves'
    best costs plus NODE_COST (an empty half costs NODE_COST).
    """
    ids = np.flatnonzero(counts)
    counts = counts[ids].astype(np.float64)
    best = BIN_COST - counts * np.log2(counts)
    nodes = [ids]  # per level: the occupied nodes, sorted
    splits = [np.zeros(len(ids), dtype=bool)]  # per level: whether each is split
    for level in range(1, key_bits + 1):
        halved = ids >> 1  # sorted: a parent's halves are neighbours
        first = np.flatnonzero(np.diff(halved, prepend=-1))
        parents = halved[first]
        present = np.diff(np.append(first, len(ids)))
        counts = np.add.reduceat(counts, first)
        halves = np.add.reduceat(best, first) + NODE_COST * (3 - present)
        leaf = counts * level - counts * np.log2(counts) + BIN_COST
        split = halves < leaf
        ids, best = parents, np.where(split, halves, leaf)
        nodes.append(ids)
        splits.append(split)
    codes: list[int] = []
    bins: list[tuple[int, int]] = []
    stack = [(key_bits, 0)]
    while stack:
        level, node = stack.pop()
        at = nodes[level]
        i = int(np.searchsorted(at, node))
        if i == len(at) or at[i] != node:
            codes.append(EMPTY)  # a split node's half that no key reaches
        elif splits[level][i]:
            codes.append(SPLIT)
            stack += [(level - 1, 2 * node + 1), (level - 1, 2 * node)]
        else:
            codes.append(BIN)
            bins.append((node << level, level))
    return codes, bins


def read_trie(data: memoryview, pos: int, key_bits: int) -> tuple[list[tuple[int, int]], int]:
    """The bins of a stored trie, and the position after it."""
    bins: list[tuple[int, int]] = []
    stack = [(key_bits, 0)]
    i = 0
    while stack:
        if pos + i // 4 >= len(data):
            raise FormatError("ans stream: truncated trie")
        code = (data[pos + i // 4] >> (2 * (i % 4))) & 3
        i += 1
        level, node = stack.pop()
        if code == SPLIT and level:
            stack += [(level - 1, 2 * node + 1), (level - 1, 2 * node)]
        elif code == BIN:
            bins.append((node << level, level))
        elif code != EMPTY:
            raise FormatError("ans stream: invalid trie code")
    if i % 4 and data[pos + i // 4] >> (2 * (i % 4)):
        raise FormatError("ans stream: trie padding is not zero")
    return bins, pos + (i + 3) // 4


def _trie_length(data: memoryview, pos: int) -> tuple[int, int]:
    """(bins, position after the trie) of a trie written by this encoder."""
    bins, open_nodes, i = 0, 1, 0
    while open_nodes:
        code = (data[pos + i // 4] >> (2 * (i % 4))) & 3
        i += 1
        open_nodes += 1 if code == SPLIT else -1
        bins += code == BIN
    return bins, pos + (i + 3) // 4


def _pack_codes(codes: list[int]) -> bytes:
    padded = np.zeros((len(codes) + 3) // 4 * 4, dtype=np.uint8)
    padded[: len(codes)] = codes
    quads = padded.reshape(-1, 4)
    return (quads[:, 0] | quads[:, 1] << 2 | quads[:, 2] << 4 | quads[:, 3] << 6).astype(np.uint8).tobytes()


def _width(t: Field) -> int:
    return 1 if t.bits <= 8 else 2 if t.bits <= 16 else 4


def lanes_for(n: int, block_log: int) -> int:
    """The states of a stream's blocks: 32 (wide) where its blocks hold
    WIDE_MIN values or more (the last may hold fewer), else 4."""
    size = 1 << block_log if block_log else n
    return WIDE_LANES if min(n, size) >= WIDE_MIN else LANES


def _encode_block(values: np.ndarray, t: Field, lanes: int = LANES, counts: np.ndarray | None = None) -> bytes:
    """One block: its model, rANS part and offsets (in C where built; the
    same bytes in Python). `counts`: the block's count of each value (a
    field of at most 8 bits), where made already (choose_block)."""
    n = len(values)
    width = _width(t)
    if _rans is not None:
        return _rans.encode_block(values, width, t.bits, BIN_COST, NODE_COST, lanes, 1, counts)
    shift = max(0, t.bits - KEY_BITS)
    key_bits = t.bits - shift
    key_counts = np.bincount((values >> values.dtype.type(shift)).astype(np.intp), minlength=1 << key_bits)
    codes, bins = trie_of_counts(key_counts, key_bits)
    first = np.array([b[0] for b in bins], dtype=np.int64)
    level = np.array([b[1] for b in bins], dtype=np.int64)
    counts = np.add.reduceat(key_counts, first)
    # Each key's bin: the bins tile the occupied keys in increasing order.
    starts = np.zeros(1 << key_bits, dtype=np.int32)
    starts[first] = 1
    rank = (np.cumsum(starts) - 1).astype(np.uint16)[values >> values.dtype.type(shift)]
    p = precision(n, len(first))
    freq = normalize(counts, p)
    cum = np.concatenate(([0], np.cumsum(freq)[:-1]))
    lower = (first << shift).astype(np.uint32)
    obits = (level + shift).astype(np.uint8)
    body, offsets = _encode_py(rank, values, width, freq.astype(np.uint32), cum.astype(np.uint32), lower, obits, p,
                               lanes)
    model = bytes([p]) + _pack_codes(codes) + _varint((freq - 1).tolist())
    return model + _varint([len(body)]) + body + offsets


def _decode_block(data: memoryview, t: Field, out: np.ndarray, lanes: int = LANES) -> None:
    """Decode one block into out (len(out) values), in Python (the C
    extension decodes whole streams: _rans.decode_stream)."""
    n = len(out)
    if not len(data):
        raise FormatError("ans stream: empty block")
    shift = max(0, t.bits - KEY_BITS)
    width = _width(t)
    p = data[0]
    if not 1 <= p <= 16:
        raise FormatError(f"ans stream: precision {p} out of range")
    bins, pos = read_trie(data, 1, t.bits - shift)
    if not 1 <= len(bins) <= 1 << p:
        raise FormatError(f"ans stream: {len(bins)} bins at precision {p}")
    freq = np.empty(len(bins), dtype=np.int64)
    for i in range(len(bins)):
        freq[i], pos = _read_varint(data, pos, "frequencies")
    freq += 1
    if int(freq.sum()) != 1 << p:
        raise FormatError("ans stream: frequencies do not sum to 2**P")
    length, pos = _read_varint(data, pos, "length")
    if length > len(data) - pos:
        raise FormatError("ans stream: truncated")
    cum = np.concatenate(([0], np.cumsum(freq)[:-1]))
    lower = np.array([b[0] << shift for b in bins], dtype=np.uint32)
    obits = np.array([b[1] + shift for b in bins], dtype=np.uint8)
    try:
        _decode_py(
            data[pos: pos + length], data[pos + length:], n, width, freq.astype(np.uint32),
            cum.astype(np.uint32), lower, obits, p, out, lanes)
    except ValueError as e:
        raise FormatError(f"ans stream: {e}") from None


def choose_block(values: np.ndarray, t: Field, counts: list | None = None) -> int:
    """log2 of the values per model (0: one model for the whole value).

    Weights are not stationary (a classifier's rows, a layer's output
    channels): a model per block of 2**12 values can save more than its
    cost. Decided from the plug-in entropy of the values' top 8 bits per
    block, plus MODEL_BITS per key a block uses; one histogram per block of
    the finest size, summed for the coarser ones.
    `counts`, where given: for a field of at most 8 bits (its top 8 bits
    are the value), each block's count of every value is appended to it,
    one int64 row of 256 a block of the choice, for encode_block to take
    instead of counting the values again (the same counts: a byte field's
    second pass over its values, a tenth of compressing a Q4_K model).
    """
    n, fine = len(values), BLOCK_LOGS[0]
    if n <= 2 << fine:
        return 0
    shift = max(0, t.bits - BLOCK_KEY_BITS)
    KEYS = 1 << BLOCK_KEY_BITS
    if _rans is not None:
        hist = np.frombuffer(_rans.histogram(values, values.itemsize, shift, KEYS, fine), dtype=np.int64)
        hist = hist.reshape(-1, KEYS)
    else:
        ids = np.arange(n, dtype=np.intp) >> fine
        hist = np.bincount(ids * KEYS + (values >> values.dtype.type(shift)).astype(np.intp),
                           minlength=(int(ids[-1]) + 1) * KEYS).reshape(-1, KEYS)
    group = 1 << (BLOCK_LOGS[-1] - fine)  # whole groups of fine blocks for the coarsest size
    rows = len(hist)
    if rows % group:
        hist = np.concatenate([hist, np.zeros((-rows % group, KEYS), dtype=np.int64)])
    xlogx = _xlogx(1 << BLOCK_LOGS[-1])
    whole = hist.sum(axis=0)
    used = whole[whole > 0].astype(np.float64)
    best = n * np.log2(n) - (used * np.log2(used)).sum() + MODEL_BITS * len(used)
    best_log = 0
    for block_log, bits in zip(BLOCK_LOGS, _block_bits(hist, xlogx, fine, rows)):
        if bits < best:
            best, best_log = bits, block_log
    if counts is not None and shift == 0:
        if not best_log:
            counts.append(whole)
        else:
            h = hist.reshape(-1, 1 << (best_log - fine), KEYS).sum(axis=1) if best_log > fine else hist
            counts.extend(h[: -(-n >> best_log)])  # (the rows past them: the padding's zeros)
    return best_log


def _block_bits_numpy(hist: np.ndarray, xlogx: np.ndarray, fine: int, live: int | None = None) -> list[float]:
    """choose_block's bits at each block size of BLOCK_LOGS: per block of
    the size (fine rows of hist summed), the plug-in entropy of its top
    bits plus MODEL_BITS per key it uses. (`live`: the rows before the
    padding's zeros, which _block_bits_c skips.)"""
    out = []
    for block_log in BLOCK_LOGS:
        h = hist.reshape(-1, 1 << (block_log - fine), hist.shape[1]).sum(axis=1) if block_log > fine else hist
        totals = h.sum(axis=1)
        # (take: the same gather as indexing, a third faster on a chunk's 65,536 counts)
        out.append(xlogx.take(totals).sum() - xlogx.take(h).sum() + MODEL_BITS * np.count_nonzero(h))
    return out


def _block_bits_c(hist: np.ndarray, xlogx: np.ndarray, fine: int, live: int | None = None) -> tuple[float, ...]:
    """_block_bits_numpy's doubles in one C call (numpy's sums emulated:
    _rans.block_bits): on a sample slice of 16,384 values 10 us, where its
    dozen numpy calls a block size took 58."""
    return _rans.block_bits(hist, xlogx, hist.shape[1], fine, BLOCK_LOGS, MODEL_BITS, len(hist) if live is None else live)


def _c_block_bits_agree() -> bool:
    """Whether _block_bits_c gives numpy's doubles here (its sums emulate
    numpy 2's pairwise summation; another numpy may sum otherwise): checked
    once a process, before it is used, on a few histograms like
    choose_block's (padded, a level of two rows of blocks, sums split
    past 128 terms) in about 2 ms (a larger check took 25, an eighth of
    compressing a checkpoint of 0.5 MB); the tests check many more."""
    if _rans is None or not hasattr(_rans, "block_bits"):
        return False
    xlogx = _xlogx(1 << BLOCK_LOGS[-1])
    group = 1 << (BLOCK_LOGS[-1] - BLOCK_LOGS[0])
    for rows in (3, 21):
        padded = -(-rows // group) * group
        for every, top in ((1, 16), (37, 300)):  # a fine block's counts of each key, or of a few (below 4,096 a row)
            hist = np.zeros((padded, 1 << BLOCK_KEY_BITS), np.int64)
            cells = np.arange(rows << BLOCK_KEY_BITS, dtype=np.int64).reshape(rows, -1)
            # (counts made by arithmetic: numpy.random's import costs more than the check)
            hist[:rows] = (cells * 2654435761 % 1013) % top * (cells % every == 0)
            expected = tuple(_block_bits_numpy(hist, xlogx, BLOCK_LOGS[0]))
            if any(_block_bits_c(hist, xlogx, BLOCK_LOGS[0], live) != expected for live in (rows, padded)):
                return False
    return True


_C_BLOCK_BITS: bool | None = None  # whether _block_bits_c agrees with numpy here: checked at the first use


def _block_bits(hist: np.ndarray, xlogx: np.ndarray, fine: int, live: int):
    global _C_BLOCK_BITS
    if _rans is None:
        return _block_bits_numpy(hist, xlogx, fine)
    if _C_BLOCK_BITS is None:
        _C_BLOCK_BITS = _c_block_bits_agree()
    return (_block_bits_c if _C_BLOCK_BITS else _block_bits_numpy)(hist, xlogx, fine, live)


_XLOGX: dict[int, np.ndarray] = {}


def _xlogx(top: int) -> np.ndarray:
    """c * log2(c) for c in 0..top (0 at 0), computed once."""
    if top not in _XLOGX:
        c = np.arange(top + 1, dtype=np.float64)
        c[0] = 1.0
        _XLOGX[top] = c * np.log2(c)
    return _XLOGX[top]


@register
class Ans(Coder):
    """Binned rANS over fields of <= 32 bits; inverse: rANS decoding of the
    bins with the stored model, plus each value's offset bits. Memory of
    the inverse: at most 1 times its output, plus 2**P fourteen-byte slots
    (896 KiB at most) and 18 bytes per key of its model (at most 65,536
    keys); a batch (decode_batch) adds 2 MiB of slot tables per width of
    value for the eight-block engine."""

    id = "ans"
    params: dict = {}

    def accepts(self, t: Field) -> None:
        if t.bits > MAX_BITS:
            raise ProgramError(f"ans: fields of at most {MAX_BITS} bits, not {t.bits}")

    def encode(self, x, t):
        self.accepts(t)
        if not len(x):
            return b""
        values, block_log, counts = self._blocks(x, t)
        return self._encode_blocks(values, t, block_log, counts)

    def _blocks(self, x, t: Field) -> tuple[np.ndarray, int, list]:
        """x as contiguous values of t's width, the values per model
        (choose_block's log2) and each block's key counts where choosing
        the blocks made them (what _encode_blocks takes)."""
        values = np.ascontiguousarray(x, dtype=f"<u{_width(t)}")
        counts: list = []
        return values, choose_block(values, t, counts), counts

    def _encode_blocks(self, values: np.ndarray, t: Field, block_log: int, counts: list) -> bytes:
        """The stream of values (contiguous, of t's width) in blocks of
        2**block_log (0: one), with the blocks' counts where choose_block
        made them."""
        lanes = lanes_for(len(values), block_log)
        if _rans is not None:  # the same bytes, each block written in its place (no copy of it, nor a join)
            return _rans.encode_stream(values, _width(t), t.bits, BIN_COST, NODE_COST, lanes, 1, block_log,
                                       counts or None)
        flag = WIDE if lanes == WIDE_LANES else 0
        if not block_log:
            return bytes([flag]) + _encode_block(values, t, lanes, counts[0] if counts else None)
        size = 1 << block_log
        parts = [bytes([flag | block_log])]
        for k, start in enumerate(range(0, len(values), size)):
            block = _encode_block(values[start: start + size], t, lanes, counts[k] if counts else None)
            parts += [_varint([len(block)]), block]
        return b"".join(parts)

    def estimate(self, x, t, factor: float = 1.0):
        """The one-model size from the trie's own cost (entropy of the bins,
        offsets, model), without coding: the search asks this of thousands
        of sample values. A value long enough to take a model per block
        (rarely a sample slice) is coded instead.
        `factor` > 1: x is a sample standing for `factor` times as many
        values coded together (a chunk); the trie is chosen as the chunk's
        would be (a bin's model bits spread over the chunk's values, not the
        sample's: on a sample a large alphabet is binned coarsely, its
        offsets dear), and the sample's plug-in entropy is raised by its
        small-sample bias, (bins - 1) / (2 ln 2) bits less the chunk's.
        (length, model) for the sample either way."""
        self.accepts(t)
        if not len(x) or _rans is None:
            return super().estimate(x, t)
        x, block_log, counts = self._blocks(x, t)
        if block_log:  # a model per block: measured by coding it (the choice made once), as Coder.estimate does
            stream = self._encode_blocks(x, t, block_log, counts)
            return len(stream), self.fixed_bytes(stream)
        return self._one_model(x, t, factor)

    def encode_within(self, x, t, most: int) -> bytes | None:
        """encode(x, t) where the stream is at most `most` bytes, else None:
        coded only where the trie's cost of each model (a pass over the
        values, within a few bytes of each block's stream) says it fits."""
        self.accepts(t)
        if not len(x) or _rans is None:
            stream = self.encode(x, t)
            return stream if len(stream) <= most else None
        values, block_log, counts = self._blocks(x, t)
        size = 1 << block_log if block_log else len(values)
        if sum(self._one_model(values[i:i + size], t, 1.0)[0] for i in range(0, len(values), size)) > most:
            return None
        stream = self._encode_blocks(values, t, block_log, counts)
        return stream if len(stream) <= most else None

    def _one_model(self, x: np.ndarray, t: Field, factor: float) -> tuple[int, int]:
        """estimate's (length, model) of contiguous values that take one model."""
        shift = max(0, t.bits - KEY_BITS)
        n = len(x)
        factor = max(1.0, factor)
        bins, codes, bits = _rans.trie_cost(x, _width(t), shift, t.bits - shift, BIN_COST / factor, NODE_COST / factor)
        nodes = codes - bins
        states = 4 * lanes_for(int(n * factor), 0)
        model_bits = BIN_COST * bins + NODE_COST * nodes
        model = model_bits / 8 + states + 4
        # The trie's cost counts offsets above the key (and its model bits);
        # the shifted-out bits are raw.
        if factor == 1.0:
            total = (bits + n * np.log2(n)) / 8 + n * shift / 8 + states + 4
        else:
            data = bits + n * np.log2(n) - model_bits / factor + (bins - 1) / (2 * np.log(2)) * (1 - 1 / factor)
            total = data / 8 + n * shift / 8 + model
        return int(total), int(model)

    def fixed_bytes(self, stream: bytes) -> int:
        """The model of a one-block stream (precision, trie, frequencies,
        the length varint, the final states). A blocked stream has a model
        per 2**B values: that cost grows with the value, like its data."""
        if not stream or stream[0] & ~WIDE:
            return 0
        data = memoryview(stream)
        bins, pos = _trie_length(data, 2)
        for _ in range(bins):
            _, pos = _read_varint(data, pos, "frequencies")
        _, pos = _read_varint(data, pos, "length")
        return pos + 4 * (WIDE_LANES if stream[0] & WIDE else LANES)

    def decode_into(self, data, n, t, out):
        if not n or not batchable(self, t, out):
            return super().decode_into(data, n, t, out)
        decode_batch([(memoryview(data), n, t, out)])  # without the GIL, into its place

    def decode(self, data, n, t):
        self.accepts(t)
        data = memoryview(data)
        if not n:
            if len(data):
                raise FormatError("ans stream: bytes for an empty value")
            return np.zeros(0, dtype=t.container)
        if not len(data):
            raise FormatError("ans stream: empty")
        block_log, lanes = data[0] & ~WIDE, WIDE_LANES if data[0] & WIDE else LANES
        out = np.empty(n, dtype=f"<u{_width(t)}")
        if _rans is not None:  # every block in one call, without the GIL
            try:
                _rans.decode_stream(data, n, _width(t), t.bits, out)
            except ValueError as e:
                raise FormatError(f"ans stream: {e}") from None
        elif not block_log:
            _decode_block(data[1:], t, out, lanes)
        elif not MIN_BLOCK_LOG <= block_log <= MAX_BLOCK_LOG:
            raise FormatError(f"ans stream: block size 2**{block_log} out of range")
        else:
            pos, size = 1, 1 << block_log
            for start in range(0, n, size):
                length, pos = _read_varint(data, pos, "block length")
                if length > len(data) - pos:
                    raise FormatError("ans stream: truncated block")
                _decode_block(data[pos: pos + length], t, out[start: start + size], lanes)
                pos += length
            if pos != len(data):
                raise FormatError("ans stream: bytes after the last block")
        return out if out.dtype == t.container else out.astype(t.container)


_UINTS = {w: np.dtype(f"<u{w}") for w in (1, 2, 4)}  # the C decoder's outputs, by width


def batchable(node, t: Field, out: np.ndarray | None) -> bool:
    """Whether a chunk that the leaf `node` codes alone can join
    decode_batch, into `out` (or into a new array where None)."""
    if _rans is None or not isinstance(node, Ans) or t.bits > MAX_BITS:
        return False
    dtype = _UINTS[_width(t)]
    if t.container != dtype:
        return False
    # Any alignment: the C decoder stores values unaligned (an ONNX tensor at
    # an odd offset of its file decodes in its place, not beside it and copied).
    return out is None or (out.dtype == dtype and out.flags.c_contiguous and out.flags.writeable)


def narrow(stream) -> bool:
    """Whether an `ans` stream's blocks are narrow (four states): those the
    engine of narrow blocks interleaves with other streams' in a batch
    (decode_batch). A wide block decodes alone, as fast alone as in a batch."""
    return len(stream) > 0 and not stream[0] & WIDE


def in_one_call(program, t: Field, itemsize: int) -> tuple[int, int] | None:
    """(width, bits) where a chunk that `program` codes into values of type
    t (`itemsize` bytes each) decodes straight into its place in a call of
    decode_in_place, without the interpreter: one `ans` leaf that
    batchable() accepts, or (0, 0) one `raw` leaf (its stream is the
    bytes). Else None."""
    if _rans is None or program.children or t.container.itemsize != itemsize:
        return None
    if isinstance(program.node, Raw):
        return 0, 0
    return (_width(t), t.bits) if batchable(program.node, t, None) else None


def decode_in_place(calls: list[tuple]) -> bool:
    """Each (stream, n, width, bits, out, check, digest) decoded into `out`
    in one call that releases the GIL once (_rans.decode_streams; width
    and bits from in_one_call, n bytes for a `raw` stream): whether every
    one decoded and matched its stream check and digest. Its caller finds
    and names the first that did not the usual way."""
    return _rans.decode_streams(calls) is None


def decode_batch(items: list[tuple[memoryview, int, Field, np.ndarray]], checks: list | None = None) -> None:
    """Ans().decode_into for each (stream, n, t, out) of items that
    batchable() accepted, in one call that releases the GIL once for all
    (threads decoding many small chunks hand it over less). `checks`: for
    each item, (its stream's expected check or -1, its bytes' expected
    XXH3-128 or None), compared in the same call (_rans.decode_streams).
    FormatError names the first that fails, with its position (.position)
    and what failed (.kind: 0 it does not decode, 1 its stream's check, 2
    its digest)."""
    calls = []
    for k, (data, n, t, out) in enumerate(items):
        if not len(data):
            error = FormatError("ans stream: empty")
            error.position, error.kind = len(calls), 0
            raise error
        calls.append((data, n, _width(t), t.bits, out, *checks[k]) if checks else (data, n, _width(t), t.bits, out))
    failed = _rans.decode_streams(calls)
    if failed is not None:
        error = FormatError(f"ans stream: {failed[1]}")
        error.position, error.kind = failed[0], failed[2]
        raise error


def _encode_py(rank, values, width, freq, cum, lower, obits, p, lanes=LANES) -> tuple[bytes, bytes]:
    """The C encoder's algorithm in Python (see _rans.c): value i in state i % lanes."""
    rank, values = rank.tolist(), values.tolist()
    freq, cum, lower, obits = freq.tolist(), cum.tolist(), lower.tolist(), obits.tolist()
    acc = fill = 0
    offsets = bytearray()
    for r, v in zip(rank, values):
        acc |= (v - lower[r]) << fill
        fill += obits[r]
        while fill >= 8:
            offsets.append(acc & 0xFF)
            acc >>= 8
            fill -= 8
    if fill:
        offsets.append(acc)
    x = [STATE_LOW] * lanes
    words: list[int] = []
    for i in range(len(rank) - 1, -1, -1):
        r = rank[i]
        f = freq[r]
        xs = x[i % lanes]
        if xs >= (1 << (32 - p)) * f:
            words.append(xs & 0xFFFF)
            xs >>= 16
        x[i % lanes] = ((xs // f) << p) + (xs % f) + cum[r]
    words.reverse()
    body = np.array(x, dtype="<u4").tobytes() + np.array(words, dtype="<u2").tobytes()
    return body, bytes(offsets)


def _decode_py(body, offsets, n, width, freq, cum, lower, obits, p, out, lanes=LANES) -> None:
    """The C decoder's algorithm in Python, with the same checks."""
    if len(body) < 4 * lanes or (len(body) - 4 * lanes) % 2 or int(freq.sum()) != 1 << p:
        raise ValueError("damaged stream")
    slots = np.repeat(np.arange(len(freq)), freq).tolist()
    x = np.frombuffer(body[: 4 * lanes], dtype="<u4").tolist()
    words = np.frombuffer(body[4 * lanes:], dtype="<u2").tolist()
    offsets = bytes(offsets)
    freq, cum, lower, obits = freq.tolist(), cum.tolist(), lower.tolist(), obits.tolist()
    mask, pos, opos, acc, fill = (1 << p) - 1, 0, 0, 0, 0
    values = [0] * n
    if any(v < STATE_LOW for v in x):
        raise ValueError("damaged stream")
    for i in range(n):
        lane = i % lanes
        xs = x[lane]
        slot = xs & mask
        r = slots[slot]
        xs = freq[r] * (xs >> p) + slot - cum[r]
        if xs < STATE_LOW:
            if pos >= len(words):
                raise ValueError("damaged stream")
            xs = (xs << 16) | words[pos]
            pos += 1
        x[lane] = xs
        w = obits[r]
        while fill < w:
            if opos >= len(offsets):
                raise ValueError("damaged stream")
            acc |= offsets[opos] << fill
            opos += 1
            fill += 8
        values[i] = lower[r] + (acc & ((1 << w) - 1))
        acc >>= w
        fill -= w
    if any(v != STATE_LOW for v in x) or pos != len(words) or opos != len(offsets) or acc:
        raise ValueError("damaged stream")
    out[:] = values
