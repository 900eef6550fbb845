"""The `ans` coder: the C loops against the Python reference, the model it
chooses, and damaged or hostile streams (a FormatError, never a crash)."""

from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest

from brevis.dsl import entropy
from brevis.dsl.entropy import Ans, choose_trie, precision
from brevis.dsl.types import Field
from brevis.errors import FormatError
from helpers import before_unreadable_page

pytestmark = pytest.mark.skipif(entropy._rans is None, reason="the C extension is not built")


def values(kind: str, n: int, bits: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    top = (1 << bits) - 1
    if kind == "uniform":
        x = rng.integers(0, top, n, endpoint=True, dtype=np.uint64)
    elif kind == "bell":  # float-like: a few exponents, smooth within them
        x = np.clip(np.abs(rng.normal(top / 2, top / 40, n)), 0, top).astype(np.uint64)
    elif kind == "constant":
        x = np.full(n, top // 3, dtype=np.uint64)
    elif kind == "clusters":  # a few values far apart, each with a two-bit spread: offsets of two bits or so
        x = rng.integers(0, 8, n, dtype=np.uint64) * (top // 8) + rng.integers(0, 4, n, dtype=np.uint64)
    else:  # one dominant value and rare others
        x = np.where(rng.random(n) < 0.97, 5 & top, rng.integers(0, top, n, endpoint=True, dtype=np.uint64))
    return x.astype(Field(bits).container)


CASES = [(kind, n, bits) for kind in ("uniform", "bell", "constant", "skewed")
         for n in (1, 3, 4, 5, 1000) for bits in (1, 5, 8, 12, 16, 17, 24, 32)]


@pytest.mark.parametrize("kind,n,bits", CASES)
def test_c_and_python_agree_and_round_trip(kind, n, bits, monkeypatch):
    t, x = Field(bits), values(kind, n, bits)
    stream = Ans().encode(x, t)
    assert np.array_equal(Ans().decode(memoryview(stream), n, t), x)
    monkeypatch.setattr(entropy, "_rans", None)
    assert Ans().encode(x, t) == stream
    assert np.array_equal(Ans().decode(memoryview(stream), n, t), x)


@pytest.mark.parametrize("bits", [16, 32])
def test_c_and_python_agree_on_a_block_of_many_values(bits, monkeypatch):
    """At least as many values as keys: the C loops count keys in four histograms."""
    t, x = Field(bits), values("bell", 70_000, bits, seed=8)
    monkeypatch.setattr(entropy, "choose_block", lambda values, t, counts=None: 0)
    stream = Ans().encode(x, t)
    assert np.array_equal(Ans().decode(memoryview(stream), len(x), t), x)
    monkeypatch.setattr(entropy, "_rans", None)
    assert Ans().encode(x, t) == stream


@pytest.mark.parametrize("lanes", [entropy.LANES, entropy.WIDE_LANES])
@pytest.mark.parametrize("bits", [1, 5, 8, 12, 16, 17, 24, 32])
def test_both_c_encoding_kernels_write_the_same_block(bits, lanes):
    """With BMI2, on wide blocks AVX2, for 8-bit values the offsets 64 at a
    time with AVX-512 VBMI, and a wide block of at most 64 bins with its
    model in registers (simd 1; simd 4: the 512-bit gathers alone), where
    the CPU has them, and without: the same steps, the same bytes (blocks
    of one bin, the only ones whose state bound is 2^32, always without
    AVX2, and their steps left out: they change no state; lengths around
    the kernel's 64 values and with tails)."""
    for kind in ("uniform", "bell", "constant", "skewed") + (("clusters",) if bits >= 5 else ()):
        for n in (1, 7, 8, 9, 17, 64, 65, 1000, 70_000):
            x = values(kind, n, bits, seed=n)
            width = entropy._width(Field(bits))
            fast, gathers, plain = (entropy._rans.encode_block(x, width, bits, entropy.BIN_COST, entropy.NODE_COST,
                                                               lanes, simd) for simd in (1, 4, 0))
            assert fast == gathers == plain


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_wide_blocks_of_few_bins_encode_alike_with_their_models_in_registers(bits, monkeypatch):
    """A wide block's model of up to 32 bins (four tables of fields) and of
    33 to 64 at a precision up to 12 bits (two tables, three fields packed
    in one) are looked up by permutes where the CPU has AVX-512 (simd 1):
    the same bytes as the gathers (simd 4) and the loop (simd 0), around
    both limits, and every decoder gives the values back."""
    rng = np.random.default_rng(bits)
    container = Field(bits).container
    for distinct in (30, 32, 33, 40, 48, 63, 64, 65, 70):
        symbols = (np.arange(distinct, dtype=np.uint64) * ((1 << bits) // 97)).astype(container)
        weights = np.exp(-np.arange(distinct) / 12)
        for n in (5000, 70_000):
            x = rng.choice(symbols, n, p=weights / weights.sum())
            coded = {entropy._rans.encode_block(x, x.itemsize, bits, entropy.BIN_COST, entropy.NODE_COST,
                                                entropy.WIDE_LANES, simd) for simd in (1, 4, 0)}
            assert len(coded) == 1
    stream = Ans().encode(x, Field(bits))
    assert all(np.array_equal(v, x) for v in decoders(stream, len(x), Field(bits), monkeypatch))


@pytest.mark.parametrize("bits", [4, 12, 23])
def test_a_key_past_a_narrow_fields_bits_is_refused(bits, monkeypatch):
    """A field narrower than its container (nibbles in bytes, an F32's
    23-bit mantissas in 32-bit words) whose values do lie below its bits
    are counted in histograms (one pass tells they do): the stream Python
    codes from its own counts, and the values back; a value past them is
    refused, by the encoder and by the search's estimates, with blocks of
    more values than keys and of fewer."""
    t = Field(bits)
    width = entropy._width(t)
    c_rans = entropy._rans
    for n in (50, 70_000):
        x = values("bell", n, bits, seed=bits)
        stream = Ans().encode(x, t)
        with monkeypatch.context() as m:
            m.setattr(entropy, "_rans", None)
            assert Ans().encode(x, t) == stream
        assert np.array_equal(Ans().decode(memoryview(stream), n, t), x)
        x[n // 2] = 1 << bits
        with pytest.raises(ValueError, match="out of range"):
            c_rans.encode_block(x, width, bits, entropy.BIN_COST, entropy.NODE_COST, entropy.WIDE_LANES)
        shift = max(0, bits - 16)
        with pytest.raises(ValueError, match="out of range"):
            c_rans.trie_cost(x, width, shift, bits - shift, entropy.BIN_COST, entropy.NODE_COST)


@pytest.mark.parametrize("keys", [6000, 9000])
def test_wide_blocks_of_more_than_4096_bins_code_alike(keys, monkeypatch):
    """A wide block of thousands of equally common 16-bit values takes a
    bin each and a precision above 12 bits (13, 14): the AVX2 coder then
    reads two records a bin, where it reads one up to 12 (every other case
    here), and the decoders' tables are 2^13 and 2^14 items; the same
    bytes as the loop either way, and every decoder gives the values back."""
    x = np.random.default_rng(3).permutation(np.repeat(np.arange(keys, dtype=np.uint16) * 7, 40))
    args = (x, 2, 16, entropy.BIN_COST, entropy.NODE_COST, entropy.WIDE_LANES)
    fast = entropy._rans.encode_block(*args, 1)
    assert fast[0] > 12 and fast == entropy._rans.encode_block(*args, 0)
    monkeypatch.setattr(entropy, "choose_block", lambda values, t, counts=None: 0)  # one block: the one above
    stream = Ans().encode(x, Field(16))
    assert all(np.array_equal(v, x) for v in decoders(stream, len(x), Field(16), monkeypatch))


@pytest.mark.parametrize("n", [16, 17, 1001])
def test_a_value_outside_its_bin_is_refused_by_both_encoding_kernels(n):
    """Counts that add up but put a byte's values under another key (a
    caller's mistake): the byte falls in no bin of its own, and both loops
    of the bins and offsets (the table of 256 entries, and the loop of
    three tables with simd 0) refuse the block rather than code it, at
    lengths inside the eight-value loop and in its tail."""
    x = np.where(np.arange(n) % 3 == 0, 200, 10).astype(np.uint8)
    counts = np.bincount(x, minlength=256).astype(np.int64)
    counts[199], counts[200] = counts[200], 0  # 200's values claimed by 199
    for simd in (1, 0):
        with pytest.raises(ValueError, match="outside its bin"):
            entropy._rans.encode_block(x, 1, 8, entropy.BIN_COST, entropy.NODE_COST, entropy.LANES, simd, counts)


@pytest.mark.parametrize("bits", [1, 4, 5, 8])
def test_a_block_coded_from_its_counts_is_the_block_coded_from_its_values(bits):
    """encode_block given a byte field's counts (choose_block's, 256 a
    block) writes the bytes it writes counting the values itself; counts
    that are not the block's are refused, never coded."""
    width = 1
    for kind in ("uniform", "bell", "constant", "skewed") + (("clusters",) if bits >= 5 else ()):
        for n in (1, 65, 1000, 70_000):
            x = values(kind, n, bits, seed=n + bits)
            counts = np.bincount(x, minlength=256).astype(np.int64)
            for lanes in (entropy.LANES, entropy.WIDE_LANES):
                args = (x, width, bits, entropy.BIN_COST, entropy.NODE_COST, lanes, 1)
                assert entropy._rans.encode_block(*args, counts) == entropy._rans.encode_block(*args)
    x = values("bell", 5000, 5)
    args = (x, 1, 5, entropy.BIN_COST, entropy.NODE_COST, entropy.LANES, 1)
    counts = np.bincount(x, minlength=256).astype(np.int64)
    wrong = [counts.astype(np.int32), counts.copy()]  # int32: not a row of int64 counts
    wrong[-1][0] += 1  # one value too many
    past = counts.copy()
    past[40] += 1
    past[int(np.argmax(counts))] -= 1
    wrong.append(past)  # a key past 2**5
    negative = counts.copy()
    negative[1] -= counts.sum() + 1
    negative[2] += counts.sum() + 1
    wrong.append(negative)
    for w in wrong:
        with pytest.raises(ValueError):
            entropy._rans.encode_block(*args, w)
    with pytest.raises(ValueError):  # a field of more than 16 bits has no such counts
        entropy._rans.encode_block(values("bell", 100, 20), 4, 20, entropy.BIN_COST, entropy.NODE_COST,
                                   entropy.LANES, 1, np.zeros(256, np.int64))


def _stream_of_blocks(x: np.ndarray, t: Field, block_log: int, counts: list) -> bytes:
    """A stream as the blocks' bytes joined (encode_block each, a varint length before each of several)."""
    lanes = entropy.lanes_for(len(x), block_log)
    flag = entropy.WIDE if lanes == entropy.WIDE_LANES else 0
    size = 1 << block_log if block_log else len(x)
    parts = [bytes([flag | block_log])]
    for k, start in enumerate(range(0, len(x), size)):
        block = entropy._encode_block(x[start: start + size], t, lanes, counts[k] if counts else None)
        parts += [entropy._varint([len(block)]) if block_log else b"", block]
    return b"".join(parts)


@pytest.mark.parametrize("bits", [3, 8, 12, 16, 23, 32])
@pytest.mark.parametrize("n", [1, 4097, 70_001])
def test_a_stream_written_in_one_call_is_its_blocks_joined(bits, n):
    """encode_stream writes each block in place, after its length: the
    bytes of encode_block's blocks joined, with the choice's counts (a byte
    field's) and without, at the chosen block size and at others."""
    t = Field(bits)
    for kind in ("bell", "skewed", "uniform"):
        x = values(kind, n, bits, seed=n)
        counts: list = []
        chosen = entropy.choose_block(x, t, counts)
        for block_log, given in {(chosen, bool(counts)), (0, False), (12, False), (13, False)}:
            c = counts if given else []
            stream = Ans()._encode_blocks(x, t, block_log, c)
            assert stream == _stream_of_blocks(x, t, block_log, c), (kind, block_log)
            assert np.array_equal(Ans().decode(memoryview(stream), n, t), x)


def test_a_stream_refuses_what_is_not_its_blocks():
    x, t = values("bell", 9000, 8), Field(8)
    args = (x, 1, 8, entropy.BIN_COST, entropy.NODE_COST, entropy.LANES, 1)
    one = np.bincount(x, minlength=256).astype(np.int64)
    # fewer counts than blocks; the whole's counts for each block; a count too many; not int64; no block size
    for wrong in ((12, [one]), (12, [one] * 3),
                  (0, [one + (np.arange(256) == 7)]), (0, [one[:-1].astype(np.int32)]), (-1, None), (41, None)):
        with pytest.raises(ValueError):
            entropy._rans.encode_stream(*args, *wrong)
    with pytest.raises(ValueError):
        entropy._rans.encode_stream(x[:0], *args[1:], 0, None)  # an empty stream is not coded
    assert entropy._rans.encode_stream(*args, 0, [one]) == _stream_of_blocks(x, t, 0, [one])


@pytest.mark.parametrize("bits", [3, 8, 12])
def test_choose_block_hands_over_each_blocks_counts_of_a_byte_field(bits, monkeypatch):
    """For a field of at most 8 bits the counts choose_block appends are
    each chosen block's counts of its values (one row where one model);
    for a wider field it appends none. Ans codes the same stream either way."""
    rng = np.random.default_rng(bits)
    top = (1 << bits) - 1
    scales = np.repeat([1.0, 12.0, 3.0, 40.0, 2.0], 1 << 14)
    drifting = np.minimum(np.abs(rng.normal(0, 1, len(scales))) * scales * (top / 60), top).astype(Field(bits).container)
    stationary = values("bell", 50_000, bits, seed=2)
    t = Field(bits)
    for x in (drifting, stationary[:9000], stationary):
        counts: list = []
        block_log = entropy.choose_block(x, t, counts)
        if bits > 8:
            assert counts == []
            continue
        size = 1 << block_log if block_log else len(x)
        assert len(counts) == -(-len(x) // size)
        for k, row in enumerate(counts):
            assert np.array_equal(row, np.bincount(x[k * size: (k + 1) * size], minlength=256))
    assert entropy.choose_block(drifting, t) in entropy.BLOCK_LOGS
    streams = [Ans().encode(x, t) for x in (drifting, stationary)]
    plain = entropy.choose_block
    monkeypatch.setattr(entropy, "choose_block", lambda v, t, counts=None: plain(v, t))  # counts not handed over
    assert [Ans().encode(x, t) for x in (drifting, stationary)] == streams


@pytest.mark.parametrize("width,shift,key_bits", [(1, 0, 8), (1, 3, 5), (1, 5, 3), (2, 0, 16), (2, 0, 12), (2, 4, 12),
                                                   (4, 16, 16), (4, 8, 16)])
def test_the_c_trie_counts_as_numpy_does(width, shift, key_bits):
    """trie_values: the keys value >> shift counted (four histograms where
    there are at least as many values as keys, a constant shift for 8 and
    16-bit values as the coder asks, else one at a time) and the trie
    chosen as trie_of_counts chooses it from numpy's counts (fewer keys
    than the 16 its scan of the counts skips at a time, too)."""
    rng = np.random.default_rng(width * 100 + shift)
    for n in (1, 300, 5000, 70_000):
        x = np.minimum(np.abs(rng.normal(0, 0.1, n)) * (1 << key_bits), (1 << key_bits) - 1).astype(np.int64)
        x = ((x << shift) | rng.integers(0, 1 << shift, n)).astype(f"<u{width}")
        counts = np.bincount((x >> shift).astype(np.intp), minlength=1 << key_bits)
        codes, bins = entropy.trie_of_counts(counts, key_bits)
        got_codes, firsts, levels, _, got_counts = entropy._rans.trie_values(
            x, width, shift, key_bits, entropy.BIN_COST, entropy.NODE_COST)
        assert list(got_codes) == codes
        assert list(zip(np.frombuffer(firsts, np.uint32).tolist(), list(levels))) == bins
        assert np.array_equal(np.frombuffer(got_counts, np.int64),
                              np.add.reduceat(counts, [b[0] for b in bins])[:len(bins)])


@pytest.mark.parametrize("width,shift,key_bits", [(1, 0, 8), (1, 0, 5), (2, 0, 16), (4, 16, 16)])
def test_the_tries_cost_is_the_cost_of_the_trie_it_counts(width, shift, key_bits):
    """trie_cost: trie_values' bins, codes and bits, counted up the levels
    instead of walking the trie (near-distinct keys, a few, one, none)."""
    rng = np.random.default_rng(width + key_bits)
    top = (1 << (8 * width)) - 1
    cases = [np.zeros(0, f"<u{width}"), np.full(100, top & 0x1234_5678 & ~((1 << shift) - 1) & (
        (1 << (shift + key_bits)) - 1), f"<u{width}")]
    for n in (1, 7, 2048, 70_000):
        cases.append(rng.integers(0, 1 << (shift + key_bits), n).astype(f"<u{width}"))
        spread = np.abs(rng.normal(0, 30, n)).astype(np.int64) % (1 << key_bits)
        cases.append((spread << shift).astype(f"<u{width}"))
    for x in cases:
        for factor in (1.0, 5.5, 300.0):
            costs = (entropy.BIN_COST / factor, entropy.NODE_COST / factor)
            codes, _, levels, bits, _ = entropy._rans.trie_values(x, width, shift, key_bits, *costs)
            assert entropy._rans.trie_cost(x, width, shift, key_bits, *costs) == (len(levels), len(codes), bits)


def test_blocks_coded_one_after_another_do_not_share_their_bins(monkeypatch):
    """encode_block keeps a key -> bin table between calls (and clears the
    keys it used): a block whose keys the one before never had, or had in
    other bins, codes as the Python encoder codes it."""
    t = Field(16)
    monkeypatch.setattr(entropy, "choose_block", lambda values, t, counts=None: 0)
    blocks = [values("bell", 5000, 16, seed=1), values("uniform", 3000, 16, seed=2),
              values("bell", 70_000, 16, seed=3) ^ np.uint16(0x8000), values("constant", 100, 16)]
    streams = [Ans().encode(x, t) for x in blocks]
    monkeypatch.setattr(entropy, "_rans", None)
    assert [Ans().encode(x, t) for x in blocks] == streams


@pytest.mark.parametrize("width,shift,keys", [(1, 0, 256), (2, 8, 256), (2, 6, 1024), (2, 4, 256), (2, 2, 4096),
                                               (4, 24, 256)])
@pytest.mark.parametrize("block_log", [0, 10, 12])
def test_the_c_histogram_counts_as_numpy_does(width, shift, keys, block_log):
    """Counted four at a time per block (small histograms) or one at a time:
    the counts numpy's bincount gives, any length; a key past the histogram
    is refused."""
    rng = np.random.default_rng(width + shift)
    for n in (1, 5, 4097, 10_003):
        x = rng.integers(0, keys << shift, n).astype(f"<u{width}")
        ids = (np.arange(n) >> block_log) if block_log else np.zeros(n, dtype=np.intp)
        expected = np.bincount(ids * keys + (x >> shift).astype(np.intp), minlength=(int(ids[-1]) + 1) * keys)
        counted = np.frombuffer(entropy._rans.histogram(x, width, shift, keys, block_log), dtype=np.int64)
        assert np.array_equal(counted, expected)
        if keys << shift < 1 << (8 * width):  # a key past the histogram can be written
            x[-1] = keys << shift
            with pytest.raises(ValueError):
                entropy._rans.histogram(x, width, shift, keys, block_log)


def test_skewed_fields_cost_their_entropy():
    """A field with one bit of information a value costs about one bit (Huffman
    cannot go below one bit for the likeliest symbol; rANS can)."""
    rng = np.random.default_rng(1)
    for p in (0.5, 0.9):
        x = np.where(rng.random(1 << 18) < p, 0x40, 0xC0).astype(np.uint8)
        h = -(p * np.log2(p) + (1 - p) * np.log2(1 - p))
        bits = 8 * len(Ans().encode(x, Field(8))) / len(x)
        assert bits < h * 1.01 + 0.001


def test_the_trie_stops_where_the_model_would_cost_more():
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 1 << 16, 4096)  # flat: one bin beats 4096
    codes, bins = choose_trie(keys, 16)
    assert len(bins) < 8
    keys = np.repeat([3, 1000, 40000], 2000)  # three values: three single-key bins
    codes, bins = choose_trie(keys, 16)
    assert sorted(bins) == [(3, 0), (1000, 0), (40000, 0)]


def test_precision_has_a_slot_for_every_bin():
    for n, bins in ((1, 1), (10, 3), (1 << 20, 40000), (5, 65536)):
        assert 1 << precision(n, bins) >= bins


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_every_truncation_and_many_flips_fail_cleanly(bits):
    t, x = Field(bits), values("bell", 300, bits, seed=3)
    stream = Ans().encode(x, t)
    for cut in range(len(stream)):
        with pytest.raises(FormatError):
            Ans().decode(memoryview(stream[:cut]), len(x), t)
    rng = np.random.default_rng(4)
    for _ in range(300):
        damaged = bytearray(stream)
        damaged[rng.integers(len(damaged))] ^= 1 << rng.integers(8)
        try:
            out = Ans().decode(memoryview(bytes(damaged)), len(x), t)
        except FormatError:
            continue
        assert len(out) == len(x) and out.dtype == t.container  # offsets carry no check; the chunk CRC does


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_the_c_stream_decoder_agrees_with_python_on_damaged_blocked_streams(bits, monkeypatch):
    """Many batches of the C fast path, over several blocks: on every flip the
    C decoder and the Python one both refuse the stream or both give the same
    values (the fast path reads zeros past a stream's end, then refuses it)."""
    monkeypatch.setattr(entropy, "choose_block", lambda values, t, counts=None: 12)
    t, x = Field(bits), values("bell", (5 << 12) + 77, bits, seed=6)
    stream = Ans().encode(x, t)
    assert stream[0] == 12
    c_rans = entropy._rans

    def both(data: bytes):
        """The C decoder (with and without BMI2) and the Python one."""
        results = []
        for module in (c_rans, None):
            monkeypatch.setattr(entropy, "_rans", module)
            try:
                results.append(Ans().decode(memoryview(data), len(x), t))
            except FormatError:
                results.append(None)
        monkeypatch.setattr(entropy, "_rans", c_rans)
        plain = np.empty(len(x), dtype=f"<u{entropy._width(t)}")
        try:
            c_rans.decode_stream(data, len(x), entropy._width(t), t.bits, plain, False)
            results.append(plain)
        except ValueError:
            results.append(None)
        return results

    c, py, plain = both(stream)
    assert np.array_equal(c, x) and np.array_equal(py, x) and np.array_equal(plain, x)
    rng = np.random.default_rng(7)
    for _ in range(40):
        damaged = bytearray(stream)
        damaged[rng.integers(len(damaged))] ^= 1 << rng.integers(8)
        c, py, plain = both(bytes(damaged))
        assert (c is None) == (py is None) == (plain is None)
        assert c is None or (np.array_equal(c, py) and np.array_equal(c, plain))
    for cut in rng.integers(1, len(stream), 10):
        assert both(stream[:cut]) == [None, None, None]


def test_hostile_models_are_refused():
    t = Field(16)
    with pytest.raises(FormatError):
        Ans().decode(memoryview(bytes([17])), 4, t)  # precision out of range
    with pytest.raises(FormatError):
        Ans().decode(memoryview(bytes([8, 0b11])), 4, t)  # invalid trie code
    # A trie that splits below a single key.
    splits = [2] * (2 ** 16 - 1) + [1] * 2 ** 16
    with pytest.raises(FormatError):
        Ans().decode(memoryview(bytes([8]) + entropy._pack_codes(splits)), 4, t)
    with pytest.raises(FormatError):
        Ans().decode(memoryview(b""), 4, t)
    with pytest.raises(FormatError):
        Ans().decode(memoryview(b"\x01"), 0, t)


def test_a_value_that_changes_along_its_length_gets_a_model_per_block(monkeypatch):
    rng = np.random.default_rng(5)
    scales = np.repeat([1.0, 40.0, 3.0, 900.0, 7.0], 1 << 14)
    x = (np.abs(rng.normal(0, 1, len(scales))) * scales).astype(np.uint16)
    t = Field(16)
    assert entropy.choose_block(x, t) in entropy.BLOCK_LOGS
    stream = Ans().encode(x, t)
    assert stream[0] & ~entropy.WIDE in entropy.BLOCK_LOGS
    assert np.array_equal(Ans().decode(memoryview(stream), len(x), t), x)
    stationary = rng.integers(0, 1 << 16, len(x)).astype(np.uint16)
    assert entropy.choose_block(stationary, t) == 0
    for cut in (1, 2, len(stream) // 2, len(stream) - 1):
        with pytest.raises(FormatError):
            Ans().decode(memoryview(stream[:cut]), len(x), t)
    with pytest.raises(FormatError):
        Ans().decode(memoryview(stream + b"\x00"), len(x), t)
    part = x[: 3 << 14]
    in_c = Ans().encode(part, t)
    monkeypatch.setattr(entropy, "_rans", None)
    assert Ans().encode(part, t) == in_c


def test_threads_code_as_one_thread_does():
    """The C loops share scratch tables; those are used only under the GIL
    (ranks read one with the GIL released, and threads mixed up bins)."""
    from concurrent.futures import ThreadPoolExecutor

    t = Field(16)
    inputs = [values(kind, 200_000, 16, seed) for seed in range(4) for kind in ("bell", "uniform", "skewed")]
    alone = [Ans().encode(x, t) for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            assert list(pool.map(lambda x: Ans().encode(x, t), inputs)) == alone
            assert all(np.array_equal(y, x) for y, x in
                       zip(pool.map(lambda s: Ans().decode(memoryview(s), 200_000, t), alone), inputs))


# ---------------------------------------------------------------- wide blocks

# decode_stream's simd: 1 every kernel the CPU runs (the 512-bit wide kernel
# and AVX-512 builds where it has them, a small model's permutes too), 4 the
# 512-bit wide kernel with its gathers alone, 3 the AVX-512 builds of the
# 256-bit kernels, 2 their AVX2 builds, 0 none (the plain loops)
SIMD_LEVELS = (1, 4, 3, 2, 0)


def decoders(stream: bytes, n: int, t: Field, monkeypatch) -> list:
    """The values from every decoder of a stream: C with its SIMD kernels
    (AVX-512 builds where the CPU has them), with their AVX2 builds, without
    them, and Python; None where one refuses."""
    c_rans, results = entropy._rans, []
    for simd in SIMD_LEVELS:
        out = np.empty(n, dtype=f"<u{entropy._width(t)}")
        try:
            c_rans.decode_stream(stream, n, entropy._width(t), t.bits, out, simd)
            results.append(out)
        except ValueError:
            results.append(None)
    monkeypatch.setattr(entropy, "_rans", None)
    try:
        results.append(Ans().decode(memoryview(stream), n, t))
    except FormatError:
        results.append(None)
    monkeypatch.setattr(entropy, "_rans", c_rans)
    return results


def test_wide_blocks_are_written_for_long_blocks():
    """Their 112 more bytes of states pay only on long blocks."""
    for n, block_log, lanes in ((entropy.WIDE_MIN, 0, 32), (entropy.WIDE_MIN - 1, 0, 4), (1 << 20, 16, 32),
                                (1 << 20, 14, 4), (1 << 20, 0, 32), ((1 << 16) + 5, 16, 32)):
        assert entropy.lanes_for(n, block_log) == lanes
    x = values("bell", entropy.WIDE_MIN + 5, 12, seed=9)
    stream = Ans().encode(x, Field(12))
    assert stream[0] == entropy.WIDE
    assert np.array_equal(Ans().decode(memoryview(stream), len(x), Field(12)), x)


@pytest.mark.parametrize("kind", ["uniform", "bell", "constant", "skewed"])
@pytest.mark.parametrize("bits", [1, 4, 8, 12, 16, 17, 21, 22, 24, 32])
@pytest.mark.parametrize("n", [64, 95, 1000])
def test_wide_blocks_c_python_and_both_c_kernels_agree(kind, bits, n, monkeypatch):
    """Short wide streams (WIDE_MIN lowered): whole groups of 32 through the
    kernel, the rest one value at a time; the C and Python encoders write the
    same bytes, and every decoder gives the values back."""
    monkeypatch.setattr(entropy, "WIDE_MIN", 32)
    t, x = Field(bits), values(kind, n, bits, seed=bits)
    stream = Ans().encode(x, t)
    assert stream[0] & entropy.WIDE
    for out in decoders(stream, n, t, monkeypatch):
        assert np.array_equal(out, x)
    monkeypatch.setattr(entropy, "_rans", None)
    assert Ans().encode(x, t) == stream


@pytest.mark.parametrize("top", [16, 24, 27, 28, 29, 31, 32])
def test_wide_32_bit_offsets_either_side_of_the_near_kernel(top, monkeypatch):
    """32-bit values of `top` bits, uniform: one bin, its offsets `top` bits
    wide (31: a vector's last lane starts up to 59 bytes and 7 bits past its
    first byte). The 512-bit kernel reads offsets of at most 31 bits
    (NEAR_BITS) from the 64 bytes at a vector's first, 32-bit ones by
    gathers; the 256-bit ones read those of at most 27 bits
    (NEAR_AVX2_BITS) from the 16 bytes at each half's first, wider ones by
    gathers; every decoder gives the values back."""
    monkeypatch.setattr(entropy, "WIDE_MIN", 32)
    x = np.random.default_rng(top).integers(0, 1 << top, 5000, dtype=np.uint64).astype(np.uint32)
    _, bins = entropy.trie_of_counts(np.bincount(x >> 16, minlength=1 << 16), 16)
    assert 16 + max(level for _, level in bins) == top
    t = Field(32)
    stream = Ans().encode(x, t)
    assert stream[0] & entropy.WIDE
    for out in decoders(stream, len(x), t, monkeypatch):
        assert np.array_equal(out, x)


def few_values(n: int, bits: int, k: int, skew: float, seed: int, spread: int = 0) -> np.ndarray:
    """k values `spread` bits apart (each with that many random low bits:
    bins with offset bits), of Zipf-like weights 1 / (i + 1) ** skew."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, k + 1) ** skew
    x = rng.choice(k, n, p=p / p.sum()).astype(np.uint64) << np.uint64(spread)
    if spread:
        x += rng.integers(0, 1 << spread, n, dtype=np.uint64)
    return x.astype(Field(bits).container)


def crowded_values(n: int, bits: int, rare: int, seed: int) -> np.ndarray:
    """One common value and `rare` others of a small, equal weight: the
    rare ones' bins start inside one bucket of slots."""
    p = np.array([1.0] + [0.012 / rare] * rare)
    return np.random.default_rng(seed).choice(len(p), n, p=p / p.sum()).astype(Field(bits).container)


SMALL_MODELS = ([("few", bits, k, skew, spread) for bits, spread in ((4, 0), (8, 0), (8, 2), (16, 0), (16, 4),
                                                                     (24, 0), (24, 9), (32, 0), (32, 20), (32, 28))
                 for k in (2, 4, 9, 16, 24, 40) for skew in (0.0, 1.0, 3.0) if (k - 1) << spread < 1 << bits]
                + [("crowded", bits, rare, 0, 0) for bits in (4, 8, 16, 32) for rare in (2, 3, 5, 12)])


@pytest.mark.parametrize("kind,bits,k,skew,spread", SMALL_MODELS)
def test_wide_blocks_of_small_models_decode_alike(kind, bits, k, skew, spread, monkeypatch):
    """Wide blocks of at most 32 bins (32-bit values: offsets of at most 31
    bits): the 512-bit kernel looks their bins up by permutes (simd 1)
    where it would gather (simd 4); every decoder gives the values back,
    and damage alike. The
    cases (checked with a build that printed each block's model): 1 to 9
    bins, with and without offset bits (24 and 32-bit values: 8 to 30 of
    them), 0 or 1 step past a bucket's first bin, and blocks needing 2 to
    4 (crowded ones; 40 values of skew 3, 9 bins), which keep to the
    gathers."""
    monkeypatch.setattr(entropy, "WIDE_MIN", 32)
    n = 5000
    x = (few_values(n, bits, k, skew, seed=k, spread=spread) if kind == "few"
         else crowded_values(n, bits, k, seed=k))
    t = Field(bits)
    stream = Ans().encode(x, t)
    assert stream[0] & entropy.WIDE
    for out in decoders(stream, n, t, monkeypatch):
        assert np.array_equal(out, x)
    assert_damage_alike(stream, n, t, monkeypatch, np.random.default_rng(k), flips=3, extra_cuts=[len(stream) - 1])


def assert_damage_alike(stream: bytes, n: int, t: Field, monkeypatch, rng, flips: int, extra_cuts: list[int]):
    """`flips` copies of the stream with one bit flipped: every decoder
    refuses the same ones or gives the same values; cut short (at ten
    random places and `extra_cuts`): every decoder refuses it."""
    for _ in range(flips):
        damaged = bytearray(stream)
        damaged[rng.integers(len(damaged))] ^= 1 << rng.integers(8)
        first, *others = decoders(bytes(damaged), n, t, monkeypatch)
        assert all((first is None) == (other is None) for other in others)
        assert first is None or all(np.array_equal(first, other) for other in others)
    for cut in list(rng.integers(1, len(stream), 10)) + extra_cuts:
        assert decoders(stream[:cut], n, t, monkeypatch) == [None] * (len(SIMD_LEVELS) + 1)


@pytest.mark.parametrize("n", [3_000, 30_000])
def test_narrow_blocks_with_few_offset_bytes(n, monkeypatch):
    """A narrow block whose offsets are fewer bytes than a batch may read
    (exponent bytes: the rare values binned coarsely, with offsets) reads
    its last offsets from a copy padded with zeros, with unchecked loads:
    every decoder gives the values back, and flipped or cut, every decoder
    refuses the same streams or gives the same values."""
    monkeypatch.setattr(entropy, "choose_block", lambda values, t, counts=None: 0)
    rng = np.random.default_rng(5)
    x = rng.choice(np.array([120, 121, 122, 123], np.uint8), n, p=[0.4, 0.3, 0.2, 0.1])
    rare = rng.random(n) < 0.01
    x[rare] = rng.integers(0, 256, int(rare.sum()), dtype=np.uint8)
    t = Field(8)
    stream = Ans().encode(x, t)
    assert stream[0] == 0  # one narrow block
    for out in decoders(stream, n, t, monkeypatch):
        assert np.array_equal(out, x)
    assert_damage_alike(stream, n, t, monkeypatch, rng, 30, [len(stream) - 1])


@pytest.mark.parametrize("bits", [4, 8, 16, 20, 32])
def test_damaged_wide_streams_fail_alike_in_every_decoder(bits, monkeypatch):
    """Blocked wide streams, flipped and cut: the kernels read zeros past a
    stream's end and refuse it after the group, the scalar loop at once;
    every decoder refuses the same streams or gives the same values."""
    monkeypatch.setattr(entropy, "WIDE_MIN", 1 << 12)
    monkeypatch.setattr(entropy, "choose_block", lambda values, t, counts=None: 12)
    t, x = Field(bits), values("bell", (3 << 12) + 77, bits, seed=11)
    stream = Ans().encode(x, t)
    assert stream[0] == entropy.WIDE | 12
    rng = np.random.default_rng(12)
    assert_damage_alike(stream, len(x), t, monkeypatch, rng, 40, [1, 2, 140])
    # A block whose rANS part (four states, each 2**16) is shorter than its 32 states.
    block = bytes([8, 0b01, 0xFF, 0x01, 16]) + (1 << 16).to_bytes(4, "little") * 4 + bytes(2)  # + 16 offset bits
    for module in (entropy._rans, None):
        monkeypatch.setattr(entropy, "_rans", module)
        assert np.array_equal(Ans().decode(memoryview(b"\x00" + block), 1, Field(16)), [0])
        with pytest.raises(FormatError, match="damaged"):
            Ans().decode(memoryview(bytes([entropy.WIDE]) + block), 1, Field(16))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes")
@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("bits", [4, 8, 16, 24, 32])
def test_kernels_read_nothing_past_a_damaged_stream(bits, wide, monkeypatch):
    """Each damaged or cut stream ends just before a page that may not be
    read: a kernel reading past it (the wide ones, or the four-state
    batches' unchecked loads) would crash the test process. (24 bits: the
    512-bit kernel's 32-bit values whose offsets it reads 64 bytes at a
    time; 32: those it gathers.)"""
    monkeypatch.setattr(entropy, "WIDE_MIN", 32 if wide else 1 << 30)
    t, x = Field(bits), values("bell", 3000, bits, seed=13)
    stream = Ans().encode(x, t)
    assert bool(stream[0] & entropy.WIDE) == wide
    rng = np.random.default_rng(14)
    for trial in range(30):
        data = bytearray(stream)
        data[rng.integers(len(data))] ^= 1 << rng.integers(8)
        data = bytes(data[: rng.integers(1, len(data) + 1)] if trial % 2 else data)
        with before_unreadable_page(data) as view:
            for simd in SIMD_LEVELS:
                out = np.empty(len(x), dtype=t.container)
                try:
                    entropy._rans.decode_stream(view, len(x), entropy._width(t), bits, out, simd)
                except ValueError:
                    pass


def damaged(stream: bytes, trial: int, rng) -> bytes:
    """Trial 0: the stream whole; later ones: a bit flipped, and every
    third cut short too."""
    data = bytearray(stream)
    if trial:
        data[rng.integers(len(data))] ^= 1 << rng.integers(8)
    return bytes(data[: rng.integers(1, len(data) + 1)] if trial % 3 == 2 else data)


def python_decoded(data: bytes, n: int, t: Field, monkeypatch):
    """What the Python decoder makes of data: its n values, or None where it refuses it."""
    c_rans = entropy._rans
    monkeypatch.setattr(entropy, "_rans", None)
    try:
        return Ans().decode(memoryview(data), n, t)
    except FormatError:
        return None
    finally:
        monkeypatch.setattr(entropy, "_rans", c_rans)


def c_decodes_alike(view, n: int, t: Field, want, out: np.ndarray):
    """decode_stream of view into out, at every SIMD level (SIMD_LEVELS),
    refuses it where `want` is None, else gives want; returns the last
    result."""
    for simd in SIMD_LEVELS:
        try:
            entropy._rans.decode_stream(view, n, entropy._width(t), t.bits, out, simd)
            got = out
        except ValueError:
            got = None
        assert (got is None) == (want is None)
        assert got is None or np.array_equal(got, want)
    return got


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes")
@pytest.mark.parametrize("bits", [4, 8, 16, 32])
def test_blocks_read_ahead_into_their_stream_only(bits, monkeypatch):
    """A narrow block's batches read ahead into what follows it in its
    stream (its offsets, the next block): blocks of 2**10 values, the
    stream ending just before a page that may not be read. Whole, it
    decodes to its values; damaged or cut, it is refused or decodes as the
    Python decoder does, and nothing past it is read."""
    monkeypatch.setattr(entropy, "choose_block", lambda values, t, counts=None: 10)
    t, x = Field(bits), values("bell", (9 << 10) + 300, bits, seed=15)
    stream = Ans().encode(x, t)
    assert stream[0] == 10
    rng = np.random.default_rng(16)
    for trial in range(31):
        data = damaged(stream, trial, rng)
        expected = python_decoded(data, len(x), t, monkeypatch)
        with before_unreadable_page(data) as view:
            got = c_decodes_alike(view, len(x), t, expected, np.empty(len(x), dtype=t.container))
            if not trial:
                assert np.array_equal(got, x)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes")
@pytest.mark.parametrize("block_log", [0, 10])
@pytest.mark.parametrize("bits", [8, 16, 32])
def test_narrow_offsets_keep_their_loads_inside_the_stream(bits, block_log, monkeypatch):
    """A block's unchecked offset loads go on until a batch's values, none
    wider than the block's widest offset, could read past its stream:
    offsets of about two bits, one block or blocks of 2**10 values, alone
    and eight together (the engine), the streams ending just before a page
    that may not be read. Whole, they decode to their values; damaged or
    cut, as the Python decoder does, and nothing past them is read."""
    monkeypatch.setattr(entropy, "WIDE_MIN", 1 << 30)
    monkeypatch.setattr(entropy, "choose_block", lambda values, t, counts=None: block_log)
    t = Field(bits)
    xs = [values("clusters", n, bits, seed=n) for n in (5000, 3000, 9000, 2600, 7000, 4100, 6000, 3300, 8000)]
    streams = [Ans().encode(x, t) for x in xs]
    w = entropy._width(t)
    rng = np.random.default_rng(bits + block_log)
    for trial in range(12):
        datas = [damaged(s, trial, rng) for s in streams]
        expected = [python_decoded(data, len(x), t, monkeypatch) for data, x in zip(datas, xs)]
        with contextlib.ExitStack() as stack:
            views = [stack.enter_context(before_unreadable_page(data)) for data in datas]
            outs = [np.empty(len(x), dtype=t.container) for x in xs]
            for view, x, out, want in zip(views, xs, outs, expected):
                c_decodes_alike(view, len(x), t, want, out)
            failed = entropy._rans.decode_streams([(v, len(x), w, bits, o) for v, x, o in zip(views, xs, outs)])
            first = next((k for k, want in enumerate(expected) if want is None), None)
            assert (failed is None) == (first is None)
            assert failed is None or failed[0] == first
            if first is None:
                assert all(np.array_equal(o, want) for o, want in zip(outs, expected))
            if not trial:
                assert all(np.array_equal(o, x) for o, x in zip(outs, xs))
            del views, outs


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_a_batch_decodes_as_each_stream_alone_and_names_a_damaged_one(bits):
    """entropy.decode_batch (one call, the GIL released once) against
    Ans().decode per stream; a stream that does not decode is named by its
    position, whatever came before it."""
    t = Field(bits)
    xs = [values(kind, n, bits, seed=n) for kind, n in (("bell", 700), ("skewed", 3), ("uniform", 5000), ("bell", 1))]
    streams = [Ans().encode(x, t) for x in xs]
    outs = [np.empty(len(x), dtype=t.container) for x in xs]
    assert all(entropy.batchable(Ans(), t, o) for o in outs)
    entropy.decode_batch([(memoryview(s), len(x), t, o) for s, x, o in zip(streams, xs, outs)])
    assert all(np.array_equal(o, x) for o, x in zip(outs, xs))
    for bad in range(len(streams)):
        damaged = list(streams)
        damaged[bad] = damaged[bad][: len(damaged[bad]) // 2]  # cut: never decodes
        with pytest.raises(FormatError) as info:
            entropy.decode_batch([(memoryview(s), len(x), t, o) for s, x, o in zip(damaged, xs, outs)])
        assert info.value.position == bad
        with pytest.raises(FormatError):
            Ans().decode(memoryview(damaged[bad]), len(xs[bad]), t)
    with pytest.raises(ValueError):
        entropy._rans.decode_streams([(streams[0], len(xs[0]) + 1, entropy._width(t), bits, outs[0])])


def narrow_streams(bits_list, sizes, monkeypatch):
    """(stream, n, width, bits, values) of narrow `ans` streams of these
    sizes, fields cycling through bits_list; the longest in blocks of 2**12."""
    monkeypatch.setattr(entropy, "WIDE_MIN", 1 << 30)
    blocked = entropy.choose_block
    monkeypatch.setattr(entropy, "choose_block", lambda v, t, counts=None: 12 if len(v) >= 30000 else blocked(v, t, counts))
    out = []
    for j, n in enumerate(sizes):
        bits = bits_list[j % len(bits_list)]
        t = Field(bits)
        x = values(("bell", "skewed", "uniform", "constant", "bell")[j % 5], n, bits, seed=j)
        stream = Ans().encode(x, t)
        assert not stream[0] & entropy.WIDE
        out.append((stream, n, entropy._width(t), bits, x))
    return out


SIZES = [600, 5000, 513, 20000, 9000, 700, 3000, 40000, 1200, 64, 2048, 7777, 100000, 511, 4096, 33000]


@pytest.mark.parametrize("bits_list", [[3], [8], [12], [16], [17], [24], [32], [8, 16, 24, 32, 5], [21, 24, 27], [24, 31]])
def test_narrow_blocks_decoded_together_agree_with_each_alone(bits_list, monkeypatch):
    """A call's narrow blocks go eight at a time through the AVX2 engine
    (where the CPU has it), whatever their lengths, widths and streams:
    every value as the scalar loop gives it, one stream at a time. (32-bit
    values: where every block's offsets are at most 27 bits wide, [21, 24, 27],
    the engine reads them as 16 bytes a half, else, [24, 31], by gathers.)"""
    items = narrow_streams(bits_list, SIZES, monkeypatch)
    outs = [np.empty(n * w, np.uint8) for _, n, w, _, _ in items]
    assert entropy._rans.decode_streams([(s, n, w, b, o) for (s, n, w, b, _), o in zip(items, outs)]) is None
    for (s, n, w, b, x), o in zip(items, outs):
        alone = np.empty(n * w, np.uint8)
        entropy._rans.decode_stream(s, n, w, b, alone, False)
        assert np.array_equal(alone.view(x.dtype), x)
        assert np.array_equal(o.view(x.dtype), x)
        entropy._rans.decode_stream(s, n, w, b, alone)  # a blocked stream alone: its own blocks share the engine
        assert np.array_equal(alone.view(x.dtype), x)


def test_engines_on_many_threads_agree_with_one(monkeypatch):
    """Calls on several threads at once, each with engines of three widths
    (more arenas than the extension keeps between calls, taken and given
    back under its lock): every value as one thread decodes it."""
    from concurrent.futures import ThreadPoolExecutor

    items = narrow_streams([8, 16, 24, 32, 5], SIZES, monkeypatch)

    def decode(_):
        outs = [np.empty(n * w, np.uint8) for _, n, w, _, _ in items]
        assert entropy._rans.decode_streams([(s, n, w, b, o) for (s, n, w, b, _), o in zip(items, outs)]) is None
        return outs

    with ThreadPoolExecutor(6) as pool:
        for outs in pool.map(decode, range(24)):
            for (_, _, _, _, x), o in zip(items, outs):
                assert np.array_equal(o.view(x.dtype), x)


@pytest.mark.parametrize("bits_list", [[8], [16], [32], [12, 24]])
def test_damaged_blocks_decoded_together_name_the_first_damaged_stream(bits_list, monkeypatch):
    """Flipped and cut streams among good ones: decode_streams names the
    first stream that the scalar loop refuses, and where none is refused
    gives the scalar loop's values."""
    items = narrow_streams(bits_list, SIZES, monkeypatch)
    rng = np.random.default_rng(sum(bits_list))
    for trial in range(30):
        damaged = [bytearray(s) for s, *_ in items]
        for _ in range(1 + trial % 3):
            j = rng.integers(len(damaged))
            if trial % 4 == 3:
                damaged[j] = damaged[j][: rng.integers(1, len(damaged[j]))]
            else:
                damaged[j][rng.integers(len(damaged[j]))] ^= 1 << rng.integers(8)
        first, want = None, []
        for (_, n, w, b, _), s in zip(items, damaged):
            alone = np.empty(n * w, np.uint8)
            try:
                entropy._rans.decode_stream(bytes(s), n, w, b, alone, False)
            except ValueError:
                first = len(want) if first is None else first
            want.append(alone)
        outs = [np.empty(n * w, np.uint8) for _, n, w, _, _ in items]
        got = entropy._rans.decode_streams([(bytes(s), n, w, b, o) for (_, n, w, b, _), s, o in zip(items, damaged, outs)])
        if first is None:
            assert got is None
            assert all(np.array_equal(o, a) for o, a in zip(outs, want))
        else:
            assert got is not None and got[0] == first


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through ctypes")
@pytest.mark.parametrize("bits", [4, 16, 32])
def test_blocks_decoded_together_read_nothing_past_their_streams(bits, monkeypatch):
    """Nine damaged or cut streams in one call, each ending just before a
    page that may not be read: the engine's kernel, which reads ahead of
    every slot, would crash the test process."""
    items = narrow_streams([bits], [3000, 5000, 2000, 4000, 3500, 6000, 2500, 9000, 1500], monkeypatch)
    rng = np.random.default_rng(bits + 1)
    for trial in range(12):
        with contextlib.ExitStack() as stack:
            calls = []
            for k, (s, n, w, b, _) in enumerate(items):
                data = bytearray(s)
                data[rng.integers(len(data))] ^= 1 << rng.integers(8)
                data = bytes(data[: rng.integers(1, len(data) + 1)] if (trial + k) % 2 else data)
                calls.append((stack.enter_context(before_unreadable_page(data)), n, w, b, np.empty(n * w, np.uint8)))
            entropy._rans.decode_streams(calls)
            calls.clear()


@pytest.mark.parametrize("sizes", [[5000, 9000, 7000], [5000, 9000, 7000, 20000], [600, 600, 600, 600, 600]])
@pytest.mark.parametrize("bits", [8, 16, 24])
def test_few_blocks_decode_together_as_each_alone(sizes, bits, monkeypatch):
    """Three to five blocks: the engine's kernel of two vectors (four slots)."""
    items = narrow_streams([bits], sizes, monkeypatch)
    outs = [np.empty(n * w, np.uint8) for _, n, w, _, _ in items]
    assert entropy._rans.decode_streams([(s, n, w, b, o) for (s, n, w, b, _), o in zip(items, outs)]) is None
    assert all(np.array_equal(o.view(x.dtype), x) for (*_, x), o in zip(items, outs))


def unaligned(nbytes: int, shift: int) -> np.ndarray:
    """nbytes of a buffer that start `shift` bytes past an aligned address."""
    return np.zeros(nbytes + 8, np.uint8)[shift: shift + nbytes]


@pytest.mark.parametrize("shift", [1, 2, 3])
@pytest.mark.parametrize("bits", [8, 12, 16, 24, 32])
def test_every_kernel_stores_into_places_of_any_alignment(bits, shift, monkeypatch):
    """A tensor at an odd offset of its file (ONNX) decodes in its place:
    the engine's blocks (eight, four, alone), wide blocks with and without
    AVX2, and the scalar loops all store values at any byte."""
    items = narrow_streams([bits], SIZES, monkeypatch)
    outs = [unaligned(n * w, shift) for _, n, w, _, _ in items]
    assert entropy._rans.decode_streams([(s, n, w, b, o) for (s, n, w, b, _), o in zip(items, outs)]) is None
    assert all(o.tobytes() == x.tobytes() for (*_, x), o in zip(items, outs))
    for few in (items[:3], items[:1]):
        outs = [unaligned(n * w, shift) for _, n, w, _, _ in few]
        assert entropy._rans.decode_streams([(s, n, w, b, o) for (s, n, w, b, _), o in zip(few, outs)]) is None
        assert all(o.tobytes() == x.tobytes() for (*_, x), o in zip(few, outs))
    s, n, w, b, x = items[3]
    for simd in SIMD_LEVELS:
        out = unaligned(n * w, shift)
        entropy._rans.decode_stream(s, n, w, b, out, simd)
        assert out.tobytes() == x.tobytes()
    monkeypatch.setattr(entropy, "WIDE_MIN", 32)
    t, x = Field(bits), values("bell", 5000, bits, seed=shift)
    stream = Ans().encode(x, t)
    assert stream[0] & entropy.WIDE
    for simd in SIMD_LEVELS:
        out = unaligned(len(x) * x.itemsize, shift)
        entropy._rans.decode_stream(stream, len(x), x.itemsize, bits, out, simd)
        assert out.tobytes() == x.tobytes()


def test_a_batch_checks_its_streams_before_and_its_digests_after_decoding(monkeypatch):
    """decode_streams' checks: a stream's XXH3-64 low 32 bits before anything
    decodes (kind 1), the decoded bytes' XXH3-128 after (kind 2), each
    naming the first that fails; with both right, the values come back."""
    from xxhash import xxh3_64_intdigest, xxh3_128_digest

    items = narrow_streams([12], [700, 5000, 3000], monkeypatch)
    checks = [(xxh3_64_intdigest(s) & 0xFFFFFFFF, xxh3_128_digest(x.tobytes())) for s, *_, x in items]

    def run(checks):
        outs = [np.empty(n * w, np.uint8) for _, n, w, _, _ in items]
        got = entropy._rans.decode_streams([(s, n, w, b, o, *c) for (s, n, w, b, _), o, c in zip(items, outs, checks)])
        return got, outs

    got, outs = run(checks)
    assert got is None and all(o.tobytes() == x.tobytes() for (*_, x), o in zip(items, outs))
    assert entropy._rans.digest(outs[1]) == checks[1][1]
    for k in (2, 1):
        bad = list(checks)
        bad[k] = (bad[k][0] ^ 1, bad[k][1])
        bad[2] = (bad[2][0], bytes(16))  # a wrong digest further on: the check comes first
        assert run(bad)[0][0::2] == (k, 1)
    bad = list(checks)
    bad[1] = (-1, bytes(16))
    assert run(bad)[0][0::2] == (1, 2)
    with pytest.raises(ValueError):
        run([(c, b"short") for c, _ in checks])


def test_a_batch_copies_raw_streams_among_coded_ones(monkeypatch):
    """Width and bits 0: the stream is the n bytes (the `raw` leaf), copied
    into place with the same checks; a raw stream of another length does
    not decode (kind 0, by position), and a raw call with bits is refused."""
    from xxhash import xxh3_64_intdigest, xxh3_128_digest

    items = narrow_streams([12], [700, 3000], monkeypatch)
    raw = np.random.default_rng(9).integers(0, 256, 37, dtype=np.uint8).tobytes()
    calls = [(s, n, w, b) for s, n, w, b, _ in items]
    calls.insert(1, (raw, len(raw), 0, 0))
    want = [items[0][4].tobytes(), raw, items[1][4].tobytes()]
    checks = [(xxh3_64_intdigest(s) & 0xFFFFFFFF, xxh3_128_digest(w)) for (s, *_), w in zip(calls, want)]

    def run(calls, checks):
        outs = [np.empty(len(w), np.uint8) for w in want]
        return entropy._rans.decode_streams([(*c, o, *k) for c, o, k in zip(calls, outs, checks)]), outs

    got, outs = run(calls, checks)
    assert got is None and [o.tobytes() for o in outs] == want
    bad = list(checks)
    bad[1] = (bad[1][0], bytes(16))
    assert run(calls, bad)[0][0::2] == (1, 2)
    short = list(calls)
    short[1] = (raw[:-1], len(raw), 0, 0)
    got, _ = run(short, [(-1, None)] * 3)
    assert got[0] == 1 and got[2] == 0 and "raw" in got[1]
    with pytest.raises(ValueError, match="raw"):
        run([calls[0], (raw, len(raw), 0, 8), calls[2]], [(-1, None)] * 3)


def test_a_sample_estimates_its_chunk_as_the_chunk_codes():
    """estimate of a 16th of a chunk with factor 16, scaled up, comes closer
    to what coding the chunk gives than the sample's own estimate: the trie
    a chunk of 256 keys pays for is finer than a sample's. A factor of 1
    is the sample's own estimate."""
    rng = np.random.default_rng(3)
    for spread in (6, 12, 25):
        chunk = np.clip(np.round(rng.laplace(128, spread, 1 << 16)), 0, 255).astype(np.uint8)
        sample, factor = chunk[:4096], 16
        actual = len(Ans().encode(chunk, Field(8)))
        length, model = Ans().estimate(sample, Field(8))
        plain = (length - model) * factor + model
        length, model = Ans().estimate(sample, Field(8), factor)
        chunked = (length - model) * factor + model
        assert abs(chunked - actual) < abs(plain - actual), (spread, actual, plain, chunked)
        assert Ans().estimate(sample, Field(8), 1) == Ans().estimate(sample, Field(8))


def test_block_bits_in_c_are_numpys_doubles():
    """choose_block's bits per block size from one C call (numpy's pairwise
    sums emulated, the padding's rows skipped) are the doubles numpy's
    takes and sums give, to the bit: the choice, and so the archive, is
    the same either way (choose_block checks this once before using it)."""
    rng = np.random.default_rng(21)
    xlogx = entropy._xlogx(1 << entropy.BLOCK_LOGS[-1])
    fine = entropy.BLOCK_LOGS[0]
    group = 1 << (entropy.BLOCK_LOGS[-1] - fine)
    assert entropy._c_block_bits_agree()
    for case in range(600):
        rows = int(rng.integers(3, 200))
        padded = -(-rows // group) * group
        hist = np.zeros((padded, 256), np.int64)
        keys = int(rng.integers(1, 257))
        spread = float(rng.choice([0.01, 0.5, 3.0]))
        hist[:rows, :keys] = rng.multinomial(1 << fine, rng.dirichlet(np.full(keys, spread)), size=rows)
        if case % 3 == 0:
            hist[rows - 1] //= 5  # a last block cut short
        expected = tuple(entropy._block_bits_numpy(hist, xlogx, fine))
        assert entropy._block_bits_c(hist, xlogx, fine, rows) == expected
        assert entropy._block_bits_c(hist, xlogx, fine) == expected
    hist = np.zeros((16, 256), np.int64)
    hist[:3, 7] = 4096
    with pytest.raises(ValueError):  # counts in the rows said to be padding
        entropy._block_bits_c(hist, xlogx, fine, 2)
    with pytest.raises(ValueError):  # not a whole number of the coarsest blocks
        entropy._block_bits_c(hist[:15], xlogx, fine, 3)
    with pytest.raises(ValueError):  # a count past the table
        entropy._block_bits_c(hist, xlogx[:100], fine, 3)


def test_choose_block_decides_as_numpy_does(monkeypatch):
    """The same choices with the bits from C and from numpy, on values that
    call for each block size (and on the ties a single block makes: its
    bits equal the whole value's, to the rounding)."""
    rng = np.random.default_rng(4)
    cases = []
    for n in (8193, 16_384, 40_000, 65_536, 300_000):
        for scales in ([1.0], [1.0, 30.0], [1.0, 5.0, 200.0, 2.0]):
            reps = -(-n // len(scales))
            x = np.abs(rng.normal(0, 1, n)) * np.repeat(scales, reps)[:n]
            cases.append(np.minimum(x * 300, 65535).astype(np.uint16))
    t = Field(16)
    in_c = [entropy.choose_block(x, t) for x in cases]
    monkeypatch.setattr(entropy, "_C_BLOCK_BITS", False)
    assert [entropy.choose_block(x, t) for x in cases] == in_c
    assert len(set(in_c)) > 1


@pytest.mark.parametrize("kind", ["bell", "uniform", "skewed"])
@pytest.mark.parametrize("n", [1, 1000, 40_000, 300_000])
def test_a_stream_within_a_bound_is_the_stream(kind, n):
    """encode_within: the stream encode makes, where it is within the
    bound (by more than the few bytes the one model's estimate may be off:
    it decides whether to code); None where it is not (one byte short of
    it), a model per block or not: the bound held on the stream itself."""
    t = Field(16)
    x = values(kind, n, 16, seed=n)
    if kind == "bell" and n == 300_000:  # drifting statistics: a model per block
        x[n // 2:] = (x[n // 2:] >> 4).astype(x.dtype)
    stream = Ans().encode(x, t)
    assert Ans().encode_within(x, t, len(stream) + 64) == stream
    assert Ans().encode_within(x, t, len(stream)) in (stream, None)
    assert Ans().encode_within(x, t, len(stream) - 1) is None
    assert Ans().encode_within(x, t, 0) is None
