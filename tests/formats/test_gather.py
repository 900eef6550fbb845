"""Gathered byte spans (formats/gather.py): the small spans between a file's
tensors coded as one segment, put back where they lie on every path that
rebuilds a file, and an index whose ranges do not tile its file refused."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

import brevis
from brevis.archive import format as archive_format
from brevis.archive.format import HEADER, HEADER_SIZE
from brevis.archive.index import Index, pieces
from brevis.archive.reader import ArchiveReader
from brevis.errors import FormatError, UnsupportedVersion
from brevis.formats import Segment
from brevis.formats.gather import GATHER_BYTES, GATHER_SPAN, gather
from brevis.dtypes import DTYPES

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


def _short(o):
    _gathered(o)["ranges"][0][1] += 1


@pytest.mark.parametrize("edit, message", [
    (_swap_first_two, "not in file order"),
    (_overlap, "not in file order"),  # within a segment, an overlap is a range out of order
    (_past_end, "past the end of its file"),
    (_across, "across a gathered range"),
    (_tensor_with_ranges, "or hold a tensor"),
    (_short, "do not add up to the segment"),
    (lambda o: _gathered(o).update(ranges=[[0, 0]]), "malformed ranges"),
    (lambda o: _gathered(o).update(ranges=[]), "do not add up to the segment"),
])
def test_ranges_that_do_not_tile_the_file_are_refused(archive, edit, message):
    obj, end = _index(archive)
    Index.from_json(obj, HEADER_SIZE, end)
    edit(obj)
    with pytest.raises(FormatError, match=re.escape(message)):
        Index.from_json(obj, HEADER_SIZE, end)
