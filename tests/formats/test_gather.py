"""Gathered byte spans and tensors (formats/gather.py): the small spans
between a file's tensors, and its small tensors of one dtype that read
alike, coded as one segment, put back where they lie on every path that
rebuilds a file, the tensors still tensors for every reader of them, and
an index whose ranges do not tile its file, or do not match its
tensors, refused."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

import brevis
from brevis.archive import format as archive_format
from brevis.archive.format import HEADER, HEADER_SIZE
from brevis.archive.index import Index, pieces
from brevis.archive.reader import ArchiveReader
from brevis.errors import FormatError, UnsupportedVersion
from brevis.formats import Segment
from brevis.formats.gather import GATHER_BYTES, GATHER_SPAN, GATHER_TENSOR, TENSORS, gather, gather_tensors
from brevis.dtypes import DTYPES
from helpers import write_safetensors

ROOT = Path(__file__).resolve().parents[2]
TAESD = ROOT / "examples" / "taesd" / "taef2_decoder.pth"


def test_small_spans_are_gathered_in_file_order_and_the_rest_kept():
    f32 = DTYPES["F32"]
    segments = [Segment(0, 10, "__head__"), Segment(10, 400, "a", f32, (100,)), Segment(410, 7, "__gap__"),
                Segment(417, GATHER_SPAN + 1, "__big__"), Segment(417 + GATHER_SPAN + 1, 5, "__tail__")]
    out = gather(segments)
    assert out[:2] == [segments[1], segments[3]]
    (g,) = out[2:]
    assert g.dtype is None and g.length == 22 and g.ranges == ((0, 10), (410, 7), (417 + GATHER_SPAN + 1, 5))
    assert gather(segments[:2]) == segments[:2]  # one span: nothing to gather


def test_small_tensors_are_gathered_by_dtype_in_file_order_and_the_rest_kept():
    f32, f16 = DTYPES["F32"], DTYPES["F16"]
    rng = np.random.default_rng(5)
    segments = [Segment(0, 8, "__header__"), Segment(8, 400, "a.bias", f32, (100,)),
                Segment(408, GATHER_TENSOR + 4, "big", f32, ((GATHER_TENSOR + 4) // 4,)),
                Segment(408 + GATHER_TENSOR + 4, 64, "b.weight", f16, (4, 8)),
                Segment(472 + GATHER_TENSOR + 4, 80, "c.bias", f32, (20,)),
                Segment(552 + GATHER_TENSOR + 4, 32, "d.weight", f16, (16,)),
                Segment(584 + GATHER_TENSOR + 4, 12, "e.alone", f32, (3,))]
    values = {s.offset: (rng.standard_normal(s.length // 4) * 0.02).astype(np.float32).tobytes()
              if s.dtype is f32 else (rng.standard_normal(s.length // 2) * 0.02).astype(np.float16).tobytes()
              for s in segments if s.dtype and s.length <= GATHER_TENSOR and s.name != "e.alone"}
    read = lambda offset, n: values[offset][:n]  # noqa: E731
    out = gather_tensors(segments, set(values), read)
    assert out[:3] == [segments[0], segments[2], segments[6]]  # the big one and the one left alone stay
    by_dtype = {s.dtype.name: s for s in out[3:]}
    assert set(by_dtype) == {"F32", "F16"} and len(out) == 5
    f = by_dtype["F32"]
    assert f.name == TENSORS and f.shape == (120,) and f.length == 480
    assert f.ranges == ((8, 400), (472 + GATHER_TENSOR + 4, 80))
    assert f.members == (("a.bias", (100,)), ("c.bias", (20,)))
    assert by_dtype["F16"].members == (("b.weight", (4, 8)), ("d.weight", (16,)))
    assert gather_tensors(segments, {8}, read) == segments  # one: nothing to do
    # A gathered segment starts where its first tensor did: it is never taken for that tensor again.
    assert gather_tensors(out, set(values), read) == out


def test_gathered_segments_hold_at_most_gather_bytes():
    spans = [Segment(i * GATHER_SPAN, GATHER_SPAN, "__gap__") for i in range(40)]
    out = gather(spans)
    assert all(s.length <= GATHER_BYTES for s in out) and sum(s.length for s in out) == 40 * GATHER_SPAN
    assert [r for s in out for r in s.ranges] == [(s.offset, s.length) for s in spans]


def test_pieces_cut_a_run_of_bytes_at_the_spans():
    placed = ((0, 10), (50, 5), (100, 20))
    assert pieces(placed, 0, 35) == [(0, 0, 10), (50, 10, 5), (100, 15, 20)]
    assert pieces(placed, 12, 8) == [(52, 0, 3), (100, 3, 5)]
    assert pieces(((7, 30),), 4, 6) == [(11, 0, 6)]


def test_pieces_map_every_byte_to_its_place():
    """Any run of a segment's bytes, in or past its pieces (some empty):
    each byte to the file offset its piece gives it, in order, with no
    empty part."""
    rng = np.random.default_rng(5)
    for _ in range(3000):
        placed = tuple((int(rng.integers(0, 1000)), int(rng.integers(0, 12))) for _ in range(rng.integers(1, 7)))
        where = [off + j for off, n in placed for j in range(n)]  # segment byte -> file offset
        start, length = int(rng.integers(-2, len(where) + 3)), int(rng.integers(0, len(where) + 4))
        parts = pieces(placed, start, length)
        assert all(n > 0 for _, _, n in parts)
        got = [(within + j, off + j) for off, within, n in parts for j in range(n)]
        first = max(start, 0)
        assert got == [(i - start, where[i]) for i in range(first, min(start + length, len(where)))]


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    if not TAESD.exists():
        pytest.skip(f"{TAESD} is missing")
    out = tmp_path_factory.mktemp("gather") / "taesd.brv"
    brevis.compress([TAESD], out, threads=1)
    return out


def test_a_pytorch_zip_has_its_spans_gathered_and_comes_back(archive, tmp_path):
    with ArchiveReader(archive) as r:
        (entry,) = r.index.files
        gathered = [s for s in entry.segments if s.ranges]
        assert gathered and sum(len(s.ranges) for s in gathered) > 50
        version = HEADER.unpack(r.read(0, HEADER_SIZE))[1]
    assert version >= archive_format.GATHER_VERSION
    original = TAESD.read_bytes()
    brevis.decompress(archive, tmp_path / "out", threads=2)
    assert (tmp_path / "out" / TAESD.name).read_bytes() == original
    assert brevis.verify(archive, [TAESD])["ok"]
    buf = io.BytesIO()
    brevis.cat(archive, [TAESD.name], buf)
    assert buf.getvalue() == original
    with brevis.open(archive) as a:
        assert a.read_file(TAESD.name) == original
    for threads in (1, 2):  # gathered chunks decoded beside their place, then put in it
        assert bytes(brevis.unpack(archive, threads=threads)[TAESD.name]) == original
        assert bytes(brevis.unpack(archive.read_bytes(), threads=threads)[TAESD.name]) == original


def test_gathered_tensors_stay_tensors(archive, tmp_path):
    """taesd's small F16 tensors are gathered; each reads back as the bytes
    at its place in the file, through brevis.open and extract, and ls and
    inspect list every tensor once."""
    original = TAESD.read_bytes()
    with ArchiveReader(archive) as r:
        (entry,) = r.index.files
        gathered = [s for s in entry.segments if s.members]
        assert gathered and all(s.name == TENSORS and s.dtype is not None for s in gathered)
        tensors = entry.tensors()
        assert [t.offset for t in tensors] == sorted(t.offset for t in tensors)  # file order
        members = [t for t in tensors if t.gathered]
        assert len(members) == sum(len(s.members) for s in gathered) > 10
        assert r.version == archive_format.VERSION >= archive_format.MEMBERS_VERSION
    with brevis.open(archive, ml_dtypes=False) as a:
        assert len(a) == len(tensors)
        for t in members:
            key = next(k for k in a if a.info(k)["name"] == t.name and a._entries[k][1].offset == t.offset)
            x = a[key]
            assert x.tobytes() == original[t.offset:t.offset + t.length] and x.shape == tuple(t.shape)
            assert a.info(key)["gathered_with"] == len(t.segment.members) - 1
        some = [k for k in a if a._entries[k][1].gathered][:3] + [next(k for k in a if not a._entries[k][1].gathered)]
        want = {k: a[k].tobytes() for k in some}
    out = tmp_path / "some.safetensors"
    brevis.extract(archive, some, out, threads=2)
    from safetensors.numpy import load_file

    got = {k: v.tobytes() for k, v in load_file(out).items()}
    assert sorted(got.values()) == sorted(want.values())
    info = brevis.inspect(archive)
    assert info["tensor_count"] == len(tensors) == brevis.ls(archive)["tensor_count"]
    assert all(len(s["members"]) > 1 for f in info["files"] for s in f["segments"] if "members" in s)


def test_verify_names_the_tensors_of_a_damaged_gathered_chunk(archive, tmp_path):
    """A damaged chunk of gathered tensors is reported with the tensors it
    holds, not only as `__tensors__`."""
    data = bytearray(archive.read_bytes())
    with ArchiveReader(archive) as r:
        seg = max((s for f in r.index.files for s in f.segments if s.members), key=lambda s: len(s.members))
        off, length, _ = seg.chunks[0].streams[0]
    data[off + length // 2] ^= 0x20
    bad = tmp_path / "bad.brv"
    bad.write_bytes(bytes(data))
    report = brevis.verify(bad, threads=1)
    assert not report["ok"]
    (problem,) = report["problems"]
    names = [m[0] for m in seg.members]
    assert problem["segment"] == f"{TENSORS} ({', '.join(names[:3])}, and {len(names) - 3} more)"


def test_repeated_small_tensors_stay_apart(tmp_path):
    """A small tensor another repeats is stored once, alone (its chunk
    is shared); the others are gathered."""
    from brevis.codec.plan import gather_small_tensors, scan
    from brevis.fs.sources import collect

    rng = np.random.default_rng(8)
    shared = (rng.standard_normal(64) * 0.1).astype(np.float32).tobytes()
    for name in ("a", "b"):
        tensors = {f"{name}.{i}": ("F32", (64,), (rng.standard_normal(64) * 0.1).astype(np.float32).tobytes())
                   for i in range(4)}
        tensors["norm"] = ("F32", (64,), shared)
        write_safetensors(tmp_path / f"{name}.safetensors", tensors)
    files, _ = collect([tmp_path])
    scanned = [scan(f) for f in files]
    gather_small_tensors(scanned)
    for f in scanned:
        assert [s.name for s in f.segments if s.dtype is not None and not s.members] == ["norm"]
        assert sum(len(s.members) for s in f.segments if s.members) == 4
    scanned = [scan(f) for f in files]
    gather_small_tensors(scanned, base=object())  # against a base, tensors are matched one by one
    assert not any(s.members for f in scanned for s in f.segments)
    archive = tmp_path / "x.brv"
    brevis.compress([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], archive, threads=1)
    with ArchiveReader(archive) as r:
        norms = [s for f in r.index.files for s in f.segments if s.name == "norm"]
        assert len(norms) == 2 and norms[0].chunks[0].streams == norms[1].chunks[0].streams


def test_repeats_two_files_hold_alike_are_gathered_alike(tmp_path):
    """Two files whose repeated small tensors are the same bytes in the same
    order (a checkpoint saved at two precisions) gather them alike: the
    gathered chunks are stored once. A third file holding one of them
    leaves every copy of those alone."""
    from brevis.codec.plan import gather_small_tensors, scan
    from brevis.fs.sources import collect

    rng = np.random.default_rng(9)
    f32 = lambda n: (rng.standard_normal(n) * 0.1).astype(np.float32).tobytes()  # noqa: E731
    shared = {f"block{i}.bias": ("F32", (64,), f32(64)) for i in range(4)}
    write_safetensors(tmp_path / "a.safetensors", {**shared, "a.scale": ("F32", (8,), f32(8)),
                                                    "a.other": ("F32", (16,), f32(16))})
    write_safetensors(tmp_path / "b.safetensors", {**shared, "b.scale": ("I8", (32,), bytes(range(32))),
                                                    "b.qweight": ("I8", (64,), bytes(range(64, 128)))})
    files, _ = collect([tmp_path])
    scanned = [scan(f) for f in files]
    gather_small_tensors(scanned)
    for f in scanned:
        members = [m[0] for s in f.segments if s.members for m in s.members]
        assert sorted(n for n in members if n.startswith("block")) == sorted(shared)
    archive = tmp_path / "ab.brv"
    brevis.compress([tmp_path / "a.safetensors", tmp_path / "b.safetensors"], archive, threads=1)
    with ArchiveReader(archive) as r:
        groups = [s for f in r.index.files for s in f.segments if s.members and s.members[0][0].startswith("block")]
        assert len(groups) == 2 and groups[0].chunks[0].streams == groups[1].chunks[0].streams
    write_safetensors(tmp_path / "c.safetensors", {"block0.bias": shared["block0.bias"], "c.w": ("F32", (8,), f32(8))})
    files, _ = collect([tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "c.safetensors"])
    scanned = [scan(f) for f in files]
    gather_small_tensors(scanned)
    assert not any(m[0].startswith("block") for f in scanned for s in f.segments if s.members for m in s.members)
    with brevis.open(archive, ml_dtypes=False) as a:
        assert a["a.safetensors::block2.bias"].tobytes() == shared["block2.bias"][2]


def test_gathering_holds_one_tensor_at_a_time(tmp_path):
    """Deciding what to gather reads every small tensor, but keeps only a
    digest of each: memory does not grow with the small tensors' bytes
    (2,000 of 16 KB: 32 MB; Python's allocations peak under 4 MB). The
    process's c log2 c table (2 MiB at most, made once: its making peaked
    at 7.8 MB) is made before, as any earlier compression had: run alone,
    the test measured it."""
    import tracemalloc

    from brevis.codec.plan import gather_small_tensors, scan
    from brevis.formats import discovery
    from brevis.fs.sources import collect

    discovery._xlogx_table(discovery.XLOGX_TOP)

    rng = np.random.default_rng(10)
    tensors = {f"t{i}": ("F32", (4000,), (rng.standard_normal(4000) * 0.02).astype(np.float32).tobytes())
               for i in range(2000)}
    write_safetensors(tmp_path / "many.safetensors", tensors)
    del tensors
    files, _ = collect([tmp_path])
    scanned = [scan(f) for f in files]
    tracemalloc.start()
    try:
        gather_small_tensors(scanned)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(len(s.members) for s in scanned[0].segments if s.members) == 2000
    assert peak < 4_000_000, peak


def test_older_readers_refuse_it(archive, monkeypatch):
    monkeypatch.setattr(archive_format, "VERSION", archive_format.GATHER_VERSION - 1)
    with pytest.raises(UnsupportedVersion):
        ArchiveReader(archive)


def _index(archive: Path) -> tuple[dict, int]:
    import zstandard

    with ArchiveReader(archive) as r:
        f = r.footer
        raw = zstandard.ZstdDecompressor().decompress(r.read(f.index_offset, f.index_length),
                                                      max_output_size=f.index_raw_length)
        return json.loads(raw), f.index_offset


def _gathered(o: dict) -> dict:
    return next(s for s in o["files"][0]["segments"] if "ranges" in s)


def _swap_first_two(o):
    r = _gathered(o)["ranges"]
    r[0], r[1] = r[1], r[0]


def _overlap(o):
    r = _gathered(o)["ranges"]
    r[1][0] = r[0][0]


def _past_end(o):
    g = _gathered(o)
    g["ranges"][-1][0] = o["files"][0]["size"]


def _across(o):  # the first span one byte later: the segment before it now runs into it
    _gathered(o)["ranges"][0][0] += 1


def _tensor_with_ranges(o):
    seg = next(s for s in o["files"][0]["segments"] if s.get("dtype"))
    seg["ranges"] = [[0, seg["length"]]]


def _members(o: dict) -> dict:
    return next(s for s in o["files"][0]["segments"] if "members" in s)


def _bytes_with_members(o):
    seg = next(s for s in o["files"][0]["segments"] if "ranges" in s and s["dtype"] is None)
    seg["members"] = [["x", [r[1]]] for r in seg["ranges"]]


def _short(o):
    _gathered(o)["ranges"][0][1] += 1


@pytest.mark.parametrize("edit, message", [
    (_swap_first_two, "not in file order"),
    (_overlap, "not in file order"),  # within a segment, an overlap is a range out of order
    (_past_end, "past the end of its file"),
    (_across, "across a gathered range"),
    (_tensor_with_ranges, "must name their tensors"),
    (_short, "do not add up to the segment"),
    (lambda o: _gathered(o).update(ranges=[[0, 0]]), "malformed ranges"),
    (lambda o: _gathered(o).update(ranges=[]), "do not add up to the segment"),
    (lambda o: _members(o).pop("members"), "must name their tensors"),
    (_bytes_with_members, "must name their tensors, and only they"),
    (lambda o: _members(o)["members"].pop(), "do not match their ranges"),
    (lambda o: _members(o)["members"][0][1].append(2), "do not match their ranges"),
    (lambda o: _members(o)["members"].__setitem__(0, ["x"]), "malformed members"),
    (lambda o: _members(o).update(members="x"), "malformed members"),
    (lambda o: _members(o).update(base={"file": "f", "name": "n", "sha256": "00" * 16}),
     "a gathered segment is coded against a base tensor"),
])
def test_ranges_that_do_not_tile_the_file_are_refused(archive, edit, message):
    obj, end = _index(archive)
    Index.from_json(obj, HEADER_SIZE, end)
    edit(obj)
    with pytest.raises(FormatError, match=re.escape(message)):
        Index.from_json(obj, HEADER_SIZE, end)
