"""Long repeats in byte spans (formats/repeats.py): found wherever the copies
lie, cut out exactly, stored once, and every byte comes back."""

from __future__ import annotations

import numpy as np
import pytest

import brevis
from brevis.archive.reader import ArchiveReader
from brevis.formats import Segment, repeats

RNG = np.random.default_rng(17)


def noise(n: int) -> bytes:
    return RNG.integers(0, 256, n, dtype=np.uint8).tobytes()


def spans_of(*blobs: bytes) -> list[repeats.Span]:
    return [repeats.Span(i, Segment(0, len(b)), lambda off, n, b=b: b[off:off + n]) for i, b in enumerate(blobs)]


def test_pieces_follow_the_content_not_the_offset():
    body = noise(300_000)
    scale = repeats.Scale(12)
    a, b = repeats.pieces(spans_of(body)[0], scale), repeats.pieces(spans_of(noise(12_345) + body)[0], scale)
    shared = set(a[1].tolist()) & set(b[1].tolist())
    assert len(shared) >= len(a[1]) - 2  # all but the pieces at the start (before the cuts agree)


@pytest.mark.skipif(repeats._chunking is None, reason="the C kernel is not built")
@pytest.mark.parametrize("bits", [6, 9, 12])
@pytest.mark.parametrize("final", [False, True])
def test_the_kernels_pieces_are_the_pythons(monkeypatch, bits, final):
    """The C kernel cuts and keys a block as _cuts over anchors and XXH3-64
    in Python do: on noise, on data of few symbols (anchors far apart: the
    longest pieces), with a copy in it, short and empty blocks."""
    scale = repeats.Scale(bits)
    low = RNG.integers(0, 3, 200_000, dtype=np.uint8)
    low[120_000:125_000] = low[1_000:6_000]
    for data in (np.frombuffer(noise(250_000), np.uint8), low, np.zeros(5, np.uint8), np.zeros(0, np.uint8),
                 np.frombuffer(noise(3 * scale.max_piece + 1), np.uint8)):
        ends, keys = repeats._pieces(data, final, scale)
        with monkeypatch.context() as m:
            m.setattr(repeats, "_chunking", None)
            want_ends, want_keys = repeats._pieces(data, final, scale)
        assert ends.tolist() == want_ends.tolist() and keys.tolist() == want_keys.tolist()
        assert (not final and len(data)) or ends[-1:].tolist() == ([len(data)] if len(data) else [])


@pytest.mark.parametrize("before,after", [(0, 0), (1, 3), (5000, 77), (40_000, 12_000)])
def test_a_copy_in_another_span_is_found_exactly(before, after):
    region = noise(200_000)
    first = noise(70_000) + region + noise(30_000)
    second = noise(before) + region + noise(after)
    found = repeats.regions(spans_of(first, second))
    assert len(found) == 1
    copies = sorted(found[0], key=lambda c: c.span)
    assert [(c.span, c.start, c.end) for c in copies] == [(0, 70_000, 270_000), (1, before, before + 200_000)]


def test_copies_in_one_span_and_three_copies():
    region = noise(50_000)
    blob = noise(20_000) + region + noise(9_000) + region + noise(100_000) + region
    found = repeats.regions(spans_of(blob))
    assert len(found) == 1 and len(found[0]) == 3
    assert all(blob[c.start:c.end] == region for c in found[0])


def test_periodic_data_and_short_repeats_are_left_alone():
    zeros = bytes(1 << 20)
    pattern = bytes(range(256)) * 4096
    short = noise(repeats.Scale.of(2 << 20).min_repeat // 2)
    assert repeats.regions(spans_of(zeros, pattern, noise(1000) + short + noise(1000), short)) == []


@pytest.mark.parametrize("total,bits", [(0, 6), (1 << 20, 6), (100 << 20, 8), (1 << 30, 12), (1 << 40, 12)])
def test_pieces_are_as_short_as_the_input_allows(total, bits):
    scale = repeats.Scale.of(total)
    assert scale.bits == bits and scale.min_piece < 1 << bits < scale.max_piece and scale.min_repeat == 4 << bits


def test_the_small_tensors_two_files_share(tmp_path):
    """A small checkpoint saved twice in two formats no parser knows:
    biases and norms of a few hundred bytes, once each."""
    arrays = [floats(int(n)) for n in RNG.integers(64, 400, 60)]
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(b"".join(x + noise(int(RNG.integers(4, 40))) for x in arrays))
    b.write_bytes(b"".join(noise(int(RNG.integers(100, 3000))) + x for x in arrays[::-1]))
    out = tmp_path / "x.brv"
    brevis.compress([a, b], out)
    assert brevis.verify(out, sources=[a, b])["ok"]
    with ArchiveReader(out) as r:
        copies = [s for f in r.index.files for s in f.segments if s.name == repeats.NAME]
    assert len(copies) >= 60


def test_cut_tiles_each_span():
    region = noise(100_000)
    blobs = [noise(5000) + region + noise(5000), region + noise(100), noise(66_000)]
    spans = spans_of(*blobs)
    cut = repeats.cut(spans, repeats.regions(spans))
    assert set(cut) == {0, 1}
    for k, parts in cut.items():
        assert [p.offset for p in parts] == [0] + [p.end for p in parts[:-1]]
        assert parts[-1].end == len(blobs[k])
        copies = [p for p in parts if p.region is not None]
        assert len(copies) == 1 and blobs[k][copies[0].offset:copies[0].end] == region


def floats(n: int, scale: float = 0.02) -> bytes:
    return (RNG.standard_normal(n) * scale).astype(np.float32).tobytes()


def test_files_sharing_arrays_are_stored_once(tmp_path):
    """Two files of a format no parser knows share 1.5 MB of arrays, at
    different offsets and phases: the archive of both is about that of one."""
    shared = [floats(50_000 + 7 * i, scale) + floats(50_000, 100 * scale)  # cut apart inside
              for i, scale in enumerate([0.02, 3.0, 1e-4, 0.5])]
    a = tmp_path / "a.bin"
    b = tmp_path / "b.bin"
    a.write_bytes(b"AFMT" + b"".join(s + b"\x01" * 3 for s in shared) + floats(20_000))
    b.write_bytes(b"OTHER-FORMAT!" + floats(30_000) + b"".join(shared[::-1]))
    one = tmp_path / "one.brv"
    brevis.compress([a], one)
    both = tmp_path / "both.brv"
    brevis.compress([a, b], both)
    assert brevis.verify(both, sources=[a, b])["ok"]
    assert both.stat().st_size < one.stat().st_size + 0.9 * 30_000 * 4 + 4096
    with ArchiveReader(both) as r:  # the copies share their streams
        streams = [c.streams for f in r.index.files for s in f.segments if s.name == repeats.NAME for c in s.chunks]
    assert len(streams) >= 8 and len({tuple(map(tuple, x)) for x in streams}) <= len(streams) // 2


def test_a_wrong_match_only_costs_ratio(tmp_path, monkeypatch):
    """Copies whose bytes differ (keys that collided) are cut and planned
    as one region; the chunk digest, not the search, decides what is
    shared, so every byte still comes back."""
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(floats(60_000))
    b.write_bytes(floats(60_000))
    wrong = [[repeats.Copy(0, 1000, 101_000), repeats.Copy(1, 5000, 105_000)]]
    monkeypatch.setattr(repeats, "regions", lambda spans: wrong)
    out = tmp_path / "x.brv"
    brevis.compress([a, b], out)
    assert brevis.verify(out, sources=[a, b])["ok"]
    with ArchiveReader(out) as r:
        assert sum(s.name == repeats.NAME for f in r.index.files for s in f.segments) == 2


def test_a_copy_in_a_span_lzma_codes_whole_is_cut_as_the_others(tmp_path):
    """A block of arrays in a text-like file (which LZMA codes whole) and
    in a file of floats: the copies are cut alike wherever they lie, so
    each piece is stored once (a checkpoint and its fine-tune, one of
    them read whole by LZMA)."""
    block = floats(30_000) + b"PK\x03\x04name" + floats(20_000, 3.0)
    words = " ".join(f"token{i} {i * 7 % 1000}" for i in range(60_000)).encode()
    a, b = tmp_path / "vocab.bin", tmp_path / "weights.bin"
    a.write_bytes(words[:300_000] + block + words[300_000:])
    b.write_bytes(b"HDR" + floats(40_000, 0.5) + block + floats(10_000, 0.1))
    out = tmp_path / "x.brv"
    brevis.compress([a, b], out)
    assert brevis.verify(out, sources=[a, b])["ok"]
    with ArchiveReader(out) as r:
        copies = {f.path: [(s.length, tuple(map(tuple, c.streams))) for s in f.segments if s.name == repeats.NAME
                           for c in s.chunks] for f in r.index.files}
    assert copies["vocab.bin"] and copies["vocab.bin"] == copies["weights.bin"]
