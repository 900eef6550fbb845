"""Structure found in bytes no parser typed (issue 13): the same tensors
as a safetensors file, as bare arrays behind a made-up header at any
offset, and as a safetensors file whose header was damaged, come within
1 % of the parsed size; whatever discovery guesses, every byte comes back."""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

import brevis
from brevis.formats import Segment, discovery, layout

RNG = np.random.default_rng(3)
TENSORS = {f"l{i}.weight": (RNG.standard_normal((256, 512)) * 0.02).astype(np.float32) for i in range(4)}
TENSORS["l4.half"] = (RNG.standard_normal((256, 256)) * 0.05).astype(np.float16)


def compressed(path, tmp_path) -> int:
    out = tmp_path / (path.name + ".brv")
    brevis.compress([path], out)
    assert brevis.verify(out, sources=[path])["ok"]
    return out.stat().st_size


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    path = tmp_path_factory.mktemp("parsed") / "model.safetensors"
    save_file(TENSORS, path)
    return path


@pytest.mark.parametrize("header", [0, 1, 2, 3, 13, 4096 + 7])
def test_bare_arrays_behind_a_made_up_header(parsed, tmp_path, header):
    raw = b"".join(v.tobytes() for v in TENSORS.values())
    path = tmp_path / "model.bin"
    path.write_bytes(b"MYFMT" + bytes(range(256)) * 20 if header > 4096 else b"\x07" * header)
    if header > 4096:
        path.write_bytes(path.read_bytes()[:header] + raw)
    else:
        path.write_bytes(b"\x07" * header + raw)
    assert compressed(path, tmp_path) <= compressed(parsed, tmp_path) * 1.01


def test_a_safetensors_file_whose_header_was_damaged(parsed, tmp_path):
    data = bytearray(parsed.read_bytes())
    data[8] = ord("[")  # the JSON header no longer parses
    path = tmp_path / "damaged.safetensors"
    path.write_bytes(bytes(data))
    with open(path, "rb") as f:
        assert layout(f, len(data), path.name)[0] == "bytes"
    assert compressed(path, tmp_path) <= compressed(parsed, tmp_path) * 1.01


def test_parsers_can_be_switched_off(parsed, tmp_path, monkeypatch):
    with_parsers = compressed(parsed, tmp_path)
    monkeypatch.setenv("BREVIS_PARSERS", "off")
    with open(parsed, "rb") as f:
        fmt, segments = layout(f, parsed.stat().st_size, parsed.name)
    assert fmt == "bytes" and all(s.dtype is None for s in segments)
    (tmp_path / "off").mkdir()
    assert compressed(parsed, tmp_path / "off") <= with_parsers * 1.01


@pytest.mark.parametrize("make", [
    lambda n: RNG.integers(0, 256, n, dtype=np.uint8).tobytes(),  # noise: no phase wins
    lambda n: (b"the quick brown fox " * n)[:n],  # text
    lambda n: np.arange(n // 4, dtype=np.uint32).tobytes()[1:],  # a counter, one byte off
])
def test_whatever_discovery_guesses_every_byte_comes_back(tmp_path, make):
    data = make(1 << 17)
    segments = discovery.cut(io.BytesIO(data), len(data))
    assert sum(s.length for s in segments) == len(data) and segments[0].offset == 0
    path = tmp_path / "blob"
    path.write_bytes(data)
    brevis.compress([path], tmp_path / "blob.brv")
    brevis.decompress(tmp_path / "blob.brv", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == data if (tmp_path / "out").is_file() else \
        (tmp_path / "out" / "blob").read_bytes() == data


def test_the_phase_of_floats():
    words = (RNG.standard_normal(1 << 16) * 0.02).astype(np.float32).tobytes()
    for p in range(4):
        assert discovery.phase(np.frombuffer(b"\x00" * p + words, dtype=np.uint8)[:1 << 18]) == p
    # F16 needs no phase: its low byte is 8 bits of mantissa, so its words
    # read one byte off cost what aligned ones do (the header tests above
    # hold an F16 tensor).


def test_the_phase_of_floats_whose_low_byte_has_few_values():
    """A dead low mantissa bit (a PyTorch zip's F32 weights): the low byte
    takes 128 values, so the top byte and the next word's low byte read as
    a likely pair. The word still starts after the pair that shares least."""
    w = (RNG.standard_normal(1 << 15) * 0.03).astype(np.float32).view(np.uint32) & np.uint32(0xFFFFFFFE)
    for p in range(4):
        assert discovery.phase(np.frombuffer(b"Z" * p + w.tobytes(), dtype=np.uint8)) == p
    # BF16: two such pairs in 4 bytes, of one parity (F16's low byte is
    # mantissa, all but independent of its high byte: no phase shows).
    bf16 = ((RNG.standard_normal(1 << 16) * 0.03).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    for p in range(4):
        assert discovery.phase(np.frombuffer(b"Z" * p + bf16.tobytes(), dtype=np.uint8)) == p % 2


def quantized(n: int, scale: float) -> bytes:
    """int8 weights of one width (a quantized tensor's scale sets it)."""
    return np.clip(np.round(RNG.laplace(0, scale, n)), -127, 127).astype(np.int8).tobytes()


def read_of(data: bytes):
    return lambda off, n: data[off:off + n]


def test_cuts_where_the_statistics_change():
    parts = [quantized(150_000, 3), quantized(230_001, 25), quantized(97_003, 8), quantized(120_000, 60)]
    data = b"".join(parts)
    pieces = discovery.changes(Segment(0, len(data)), read_of(data))
    truth = np.cumsum([len(p) for p in parts])[:-1]
    assert len(pieces) == len(parts)
    assert np.abs(np.array([p.offset for p in pieces[1:]]) - truth).max() <= 64
    assert [p.offset for p in pieces] == [0] + [p.end for p in pieces[:-1]] and pieces[-1].end == len(data)


@pytest.mark.parametrize("make", [lambda n: quantized(n, 10), lambda n: RNG.integers(0, 256, n, dtype=np.uint8).tobytes(),
                                  lambda n: (RNG.standard_normal(n // 4) * 0.02).astype(np.float32).tobytes()])
def test_data_of_one_kind_is_not_cut(make):
    data = make(1 << 20)
    assert len(discovery.changes(Segment(0, len(data)), read_of(data))) == 1


def test_quantized_tensors_without_a_parser(tmp_path, monkeypatch):
    """int8 tensors of different scales back to back: discovery cuts them
    apart and comes within 1 % of the parsed file."""
    tensors = {f"t{i}": np.frombuffer(quantized(n, s), np.int8).reshape(-1, 64)
               for i, (n, s) in enumerate([(64 * 3000, 4), (64 * 5000, 30), (64 * 2000, 9), (64 * 4000, 60)])}
    path = tmp_path / "q.safetensors"
    save_file(tensors, path)
    parsed_size = compressed(path, tmp_path)
    monkeypatch.setenv("BREVIS_PARSERS", "off")
    (tmp_path / "off").mkdir()
    assert compressed(path, tmp_path / "off") <= parsed_size * 1.01


def q4_1_blocks(n: int) -> bytes:
    """ggml Q4_1 blocks: an F16 scale and minimum, then 16 bytes of nibbles."""
    scale = (np.abs(RNG.standard_normal(n)) * 0.01 + 0.001).astype(np.float16).view(np.uint8).reshape(n, 2)
    low = (-np.abs(RNG.standard_normal(n)) * 0.05).astype(np.float16).view(np.uint8).reshape(n, 2)
    nibbles = np.clip(np.round(RNG.normal(7.5, 2.5, (n, 32))), 0, 15).astype(np.uint8)
    quants = nibbles[:, :16] | nibbles[:, 16:] << 4
    return np.concatenate([scale, low, quants], axis=1).tobytes()


def test_runs_of_quantized_blocks_at_their_phases():
    """Two tensors of Q4_1 blocks at odd places, with padding between:
    each becomes records of the Q4_1 layout at its own phase (where one
    gives way to the other is found to PHASE_FINE bytes: a block or two
    there may go to the wrong run)."""
    first, second = q4_1_blocks(15_000), q4_1_blocks(12_000)
    data = b"\x05" * 7 + first + bytes(13) + second + b"\x00" * 5
    runs = discovery.blocks(Segment(0, len(data)), read_of(data))
    records = [r for r in runs if r.records]
    assert len(records) == 2 and all(r.records == ((1, 2), (1, 2), (16, 1)) for r in records)
    for r, start, n in zip(records, (7, 7 + len(first) + 13), (len(first), len(second))):
        assert (r.offset - start) % 20 == 0 and abs(r.offset - start) <= 40 and abs(r.length - n) <= 40
    assert [r.offset for r in runs] == [0] + [r.end for r in runs[:-1]] and runs[-1].end == len(data)


@pytest.mark.parametrize("make", [lambda n: quantized(n, 10),
                                  lambda n: (RNG.standard_normal(n // 4) * 0.02).astype(np.float32).tobytes(),
                                  lambda n: (RNG.standard_normal(n // 2) * 0.02).astype(np.float16).tobytes()])
def test_arrays_are_not_taken_for_blocks(make):
    data = make(1 << 20)
    assert discovery.blocks(Segment(0, len(data)), read_of(data)) == [Segment(0, len(data))]


def test_quantized_blocks_without_a_parser(tmp_path, monkeypatch):
    """The blocks of a file no parser knows come within 1 % of the same
    blocks typed by a parser (records)."""
    data = b"HDR" + q4_1_blocks(20_000) + bytes(9) + q4_1_blocks(16_000)
    path = tmp_path / "q.bin"
    path.write_bytes(data)
    from brevis.codec import plan
    typed = tmp_path / "typed.brv"
    fields = ((1, 2), (1, 2), (16, 1))

    def parsed(f, size, name):
        return "made-up", [Segment(0, 3), Segment(3, 400_000, "a", records=fields), Segment(400_003, 9),
                           Segment(400_012, 320_000, "b", records=fields)]
    monkeypatch.setattr(plan, "layout", parsed)
    brevis.compress([path], typed)
    monkeypatch.undo()
    found = tmp_path / "found.brv"
    brevis.compress([path], found)
    assert brevis.verify(found, sources=[path])["ok"]
    assert found.stat().st_size <= typed.stat().st_size * 1.01


def test_samples_measured_by_workers_answer_as_holds_blocks(tmp_path, monkeypatch):
    """A parsed file's long byte spans are probed for quantized blocks by
    the workers, a job a sample (plan._probe_elsewhere, sent before this
    process measures the spans' changes): the answers are holds_blocks',
    and the archive is the one made on one thread."""
    from concurrent.futures import ThreadPoolExecutor

    from brevis.codec import plan
    from brevis.formats import repeats
    from brevis.fs.sources import Source

    blocks, floats = q4_1_blocks(20_000), (RNG.standard_normal(100_000) * 0.02).astype(np.float32).tobytes()
    for name, data, holds in (("q.bin", b"HDR" + blocks, True), ("f.bin", floats, False)):
        (tmp_path / name).write_bytes(data)
        f = plan.scan(Source(name, tmp_path / name))
        spans = [repeats.Span(0, seg, read_of(data)) for seg in f.segments if repeats.searchable(seg)]
        assert discovery.holds_blocks(spans[0].segment, read_of(data)) is holds
        with ThreadPoolExecutor(2) as ex:
            probing = plan._probe_elsewhere([f], spans, list(range(len(spans))), ex)
            assert {k: any(job.result() for job in jobs) for k, jobs in probing.items()} == {0: holds}

    data = b"HDR" + blocks + bytes(9) + floats  # one long span of a format a parser knows (made up here)
    (tmp_path / "m.bin").write_bytes(data)
    monkeypatch.setattr(plan, "layout", lambda f, size, name: ("made-up", [Segment(0, 3), Segment(3, len(data) - 3)]))
    one, two = tmp_path / "one.brv", tmp_path / "two.brv"
    brevis.compress([tmp_path / "m.bin"], one, threads=1)
    brevis.compress([tmp_path / "m.bin"], two, threads=2, processes=True)
    assert one.read_bytes() == two.read_bytes()
    assert brevis.verify(two, sources=[tmp_path / "m.bin"])["ok"]


def test_probes_not_done_are_cancelled_where_discovery_fails(tmp_path, monkeypatch):
    """The probes go to the workers before this process's own measuring:
    where that fails, the jobs not done are cancelled, not left queued."""
    from concurrent.futures import Future

    from brevis.codec import plan
    from brevis.fs.sources import Source

    data = b"HDR" + q4_1_blocks(20_000)
    (tmp_path / "q.bin").write_bytes(data)
    f = plan.scan(Source("q.bin", tmp_path / "q.bin"))
    monkeypatch.setattr(f, "format", "made-up")  # a parsed file's span: probed elsewhere

    class Held:  # an executor whose jobs never start
        def __init__(self):
            self.jobs: list = []

        def submit(self, fn, *args):
            self.jobs.append(Future())
            return self.jobs[-1]

    def fail(*args):
        raise OSError("the disk went away")

    monkeypatch.setattr(plan, "_discover", fail)
    executor = Held()
    with pytest.raises(OSError):
        plan.discover([f], executor=executor)
    assert executor.jobs and all(job.cancelled() for job in executor.jobs)


def test_pieces_cut_for_their_statistics_stay_apart(tmp_path):
    """A small file no parser knows: a text header, then F32 weights and
    int8 quants of 12-24 KB, by turns. Discovery cuts them apart (finer
    blocks in a short span) and gathers again only pieces that read alike:
    each kind keeps a model of its own (as a parser's tensors do)."""
    from brevis.codec.plan import discover, scan
    from brevis.fs.sources import Source

    text = json.dumps({f"layer{i}.weight": [i, 512, 3] for i in range(120)}).encode()[:3000]
    kinds = [i % 2 for i in range(6)]
    arrays = [(RNG.standard_normal(3000 + 1000 * i) * 0.02).astype(np.float32).tobytes() if k else
              quantized(12_000 + 4000 * i, 3) for i, k in enumerate(kinds)]
    path = tmp_path / "model.bin"
    path.write_bytes(text + b"".join(arrays))
    (f,) = scanned = [scan(Source("model.bin", path))]
    discover(scanned)
    starts = np.cumsum([len(text)] + [len(a) for a in arrays])
    kind_at = lambda at: kinds[int(np.searchsorted(starts, at, side="right")) - 1]  # noqa: E731
    pieces = [(at, n) for s in f.segments for at, n in (s.ranges or [(s.offset, s.length)]) if n > 4096]
    assert len(pieces) >= len(arrays)
    for at in starts[1:-1]:  # every array after the first starts a piece, to a few bytes
        assert min(abs(p - at) for p, _ in pieces) <= 64
    for s in f.segments:
        if s.ranges:
            assert len({kind_at(at + n // 2) for at, n in s.ranges if n > 4096}) <= 1, s.ranges


# ---------------------------------------------------------------- the measures' arithmetic
# Discovery's decisions compare these figures: the fast ways of making them
# must give the very numbers the plain ones give (archives stay the same).

@pytest.mark.parametrize("period", [1, 4, 18, 144, 292])
def test_lane_counts_in_c_are_numpys(period, monkeypatch):
    """lane_histogram: any start, any length (a first partial row, whole
    rows, a tail; nothing at all), runs of one byte value as well."""
    x = RNG.integers(0, 256, 10_000).astype(np.uint8)
    x[3000:6000] = 7
    for n in (0, 1, period - 1, period, 5 * period + 3, len(x)):
        for start in (0, 1, period - 1, 12_345):
            fast = discovery._lane_counts(x[:n], start, period) if n else \
                np.frombuffer(discovery._rans.lane_histogram(x[:0], start, period), np.int64).reshape(period, 256)
            with monkeypatch.context() as m:
                m.setattr(discovery, "_rans", None)
                plain = discovery._lane_counts(x[:n], start, period) if n else np.zeros((period, 256), np.int64)
            assert np.array_equal(fast, plain), (n, start)


def test_running_sums_row_by_row_are_cumsums():
    rows = RNG.integers(0, 1 << 20, (300, 256))
    assert np.array_equal(discovery._prefix(rows)[1:], np.cumsum(rows, axis=0))
    assert not discovery._prefix(rows)[0].any() and discovery._prefix(rows[:0]).shape == (1, 256)


def test_xlogx_from_the_table_is_computed_xlogx():
    """The same doubles, bit for bit, for every count the table holds; past
    it (a span's totals) computed as before."""
    def computed(c):
        c = c.astype(np.float64)
        return c * np.log2(np.where(c > 0, c, 1))

    every = np.arange(discovery.XLOGX_TOP + 1)
    assert discovery._xlogx(every).tobytes() == computed(every).tobytes()
    counts = RNG.integers(0, 5000, (64, 1024))
    assert discovery._xlogx(counts).tobytes() == computed(counts).tobytes()
    past = np.array([0, 3, discovery.XLOGX_TOP + 1, 1 << 40])
    assert discovery._xlogx(past).tobytes() == computed(past).tobytes()


@pytest.mark.parametrize("period", sorted(discovery.LAYOUTS))
def test_one_rotations_field_bits_are_those_of_every_rotation(period):
    """Summed directly, one phase's bits are what the running sums give it."""
    fields = discovery.LAYOUTS[period]
    counts = RNG.integers(0, 40, (period, 256))
    every = discovery._field_bits(counts, fields)
    for r in (0, 1, period // 2, period - 1):
        assert discovery._field_bits(counts, fields, [r]).tobytes() == every[r:r + 1].tobytes()


def test_kinds_label_each_piece_as_the_greedy_merge_does():
    """discovery.kinds, which reckons a piece alone and merged into every
    kind in one call, labels pieces as the greedy merge reckoned piece by
    piece: the piece's order-0 bits per lane alone, merged into each kind,
    the kind's own, each row its own call. Pieces of floats of several
    scales, bytes of few values and noise, many of them tiny."""
    rng = np.random.default_rng(21)
    blobs = []
    for i in range(300):
        n = int(rng.choice([8, 64, 512, 3000]))
        kind = i % 3
        if kind == 0:
            blobs.append((rng.standard_normal(n // 4) * 10.0 ** -rng.integers(1, 4)).astype(np.float32).tobytes())
        elif kind == 1:
            blobs.append(rng.integers(0, 4, n, dtype=np.uint8).tobytes())
        else:
            blobs.append(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    data = b"".join(blobs)
    starts = np.cumsum([0] + [len(b) for b in blobs])
    pieces = [Segment(int(a), len(b), f"t{i}") for i, (a, b) in enumerate(zip(starts, blobs))]
    read = lambda at, n: data[at:at + n]  # noqa: E731

    sums, bits, expect = np.zeros((0, discovery.KEYS), np.int64), np.zeros(0), []
    for p in pieces:
        x = np.frombuffer(read(p.offset, p.length), np.uint8)
        h = np.bincount((np.arange(len(x)) % discovery.LANES) * 256 + x, minlength=discovery.KEYS)
        own = discovery._bits(h)
        grown = np.array([discovery._bits(s + h) for s in sums]) - bits - own
        k = int(np.argmin(grown)) if len(grown) else -1
        if k < 0 or grown[k] >= discovery.KIND_GAIN_BITS:
            sums, bits, k = np.vstack([sums, h]), np.append(bits, own), len(sums)
        else:
            sums[k] += h
            bits[k] = discovery._bits(sums[k])
        expect.append(k)
    got = discovery.kinds(pieces, read)
    assert got == expect and 3 <= max(got) + 1 < len(pieces)
