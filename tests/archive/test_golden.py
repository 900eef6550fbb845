"""Golden archives: written once by scripts/make_golden.py, decoded by every later version.

Each tests/golden/<version>/ holds archive.brv, the source folder it was
made from, SHA256SUMS (every file) and EMPTY_DIRS. These tests never
rewrite them: a failure here means the current code no longer reads an
archive an earlier Brevis wrote.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import brevis
from brevis.archive.reader import ArchiveReader
from brevis.errors import BrevisError
from brevis.dtypes import DTYPES
from helpers import largest_stream, sha256_file, tree

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
VERSIONS = sorted(p for p in GOLDEN.iterdir() if (p / "archive.brv").is_file())


def sums(folder: Path) -> dict[bytes, str]:
    out = {}
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        out[os.fsencode(name)] = digest
    return out


def empty_dirs(folder: Path) -> set[bytes]:
    return {os.fsencode(d) for d in (folder / "EMPTY_DIRS").read_text().split()}


def test_there_is_a_golden_archive():
    assert [p.name for p in VERSIONS][:1] == ["v1"]


def test_golden_folder_is_small():
    total = sum(p.stat().st_size for p in GOLDEN.rglob("*") if p.is_file())
    assert total < 800_000, "keep golden archives small (each version under ~350 KB)"


@pytest.mark.parametrize("folder", VERSIONS, ids=lambda p: p.name)
def test_committed_source_matches_its_sums(folder):
    """The committed source is what the archive was made of (no line-ending rewrites)."""
    files, _ = tree(folder / "source")
    assert files == sums(folder)


@pytest.mark.parametrize("folder", VERSIONS, ids=lambda p: p.name)
def test_golden_decodes_to_recorded_sums(folder, tmp_path):
    out = tmp_path / "out"
    brevis.decompress(folder / "archive.brv", out, threads=1)
    files, dirs = tree(out)
    assert files == sums(folder)
    assert dirs == empty_dirs(folder)


@pytest.mark.parametrize("folder", VERSIONS, ids=lambda p: p.name)
def test_golden_decodes_with_threads(folder, tmp_path):
    out = tmp_path / "out"
    brevis.decompress(folder / "archive.brv", out, threads=3)
    assert tree(out)[0] == sums(folder)


@pytest.mark.parametrize("folder", VERSIONS, ids=lambda p: p.name)
def test_golden_verifies(folder):
    report = brevis.verify(folder / "archive.brv", threads=1)
    assert report["ok"], report["problems"]
    # Against the committed source too (git keeps no empty folders; verify checks files).
    report = brevis.verify(folder / "archive.brv", [folder / "source"], threads=1)
    assert report["ok"], report["problems"]


@pytest.mark.parametrize("folder", VERSIONS, ids=lambda p: p.name)
def test_a_damaged_stream_of_every_version_is_named(folder, tmp_path):
    """Each version's stream checks (CRC-32, XXH3-64) and digests (SHA-256,
    BLAKE3, XXH3-128): decompress and unpack check a chunk's streams once it
    fails, verify before decoding; all three name the damaged stream."""
    data = bytearray((folder / "archive.brv").read_bytes())
    off, length, _ = largest_stream(folder / "archive.brv")
    data[off + length // 2] ^= 0x10
    path = tmp_path / "bad.brv"
    path.write_bytes(bytes(data))
    told = f"stream [0-9]+ at offset {off} is damaged"
    with pytest.raises(BrevisError, match=told):
        brevis.decompress(path, tmp_path / "out", threads=1)
    with pytest.raises(BrevisError, match=told):
        brevis.unpack(bytes(data), threads=2)
    report = brevis.verify(path, threads=1)
    assert not report["ok"] and any(re.search(told, p["error"]) for p in report["problems"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.brv"]


@pytest.mark.parametrize("folder", VERSIONS, ids=lambda p: p.name)
def test_golden_inspects(folder):
    info = brevis.inspect(folder / "archive.brv")
    assert {os.fsencode(f["path"]) for f in info["files"]} == set(sums(folder))
    assert {os.fsencode(d) for d in info["dirs"]} == empty_dirs(folder)
    for f in info["files"]:
        for s in f["segments"]:
            for p in s["programs"]:
                assert p["program"]


def test_v1_covers_every_dtype_and_edge_case():
    """What v1 was made to contain (see scripts/make_golden.py)."""
    with ArchiveReader(GOLDEN / "v1" / "archive.brv") as reader:
        index = reader.index
    files = {f.path: f for f in index.files}
    assert {"model.safetensors", "config.json", "tokenizer.model", "empty.bin", "sub/README.md",
            "sub/deeper/adapter.safetensors"} <= set(files)
    assert files["empty.bin"].size == 0
    segments = {s.name: s for s in files["model.safetensors"].segments}
    dtypes = {s.dtype.name for s in segments.values() if s.dtype}
    assert dtypes == set(DTYPES)
    assert segments["empty"].length == 0 and segments["empty"].shape == (0, 8)
    assert segments["scalar"].shape == ()
    assert any(len(s.chunks) > 1 for s in segments.values())
    assert sha256_file(GOLDEN / "v1" / "source" / "model.safetensors") == sums(GOLDEN / "v1")[b"model.safetensors"]


def test_v4_holds_wide_ans_blocks():
    """What v4 was made to contain: a chunk whose `ans` stream has wide blocks
    (32 states, 66,000 values: not a whole number of groups of 32), beside
    streams that keep four states."""
    from brevis.dsl import entropy

    with ArchiveReader(GOLDEN / "v4" / "archive.brv") as reader:
        segments = {s.name: s for f in reader.index.files for s in f.segments}
        codes = segments["layer.codes"]
        assert [p.to_json() for p in codes.programs] == [["ans", {}]] and codes.chunks[0].n == 66_000
        first = reader._stored(codes.chunks[0].streams)[0][0]
        assert first & entropy.WIDE
        norm = segments["norm.weight"]
        assert not reader._stored(norm.chunks[0].streams)[0][0] & entropy.WIDE


def test_v5_holds_an_lzma_stream():
    """What v5 was made to contain: the bytes of a format no parser knows
    coded by the `lzma` leaf (a 4-byte lane as its literal context)."""
    with ArchiveReader(GOLDEN / "v5" / "archive.brv") as reader:
        assert reader.version == 5
        segments = {(f.path, s.name): s for f in reader.index.files for s in f.segments}
        (span,) = [s for (path, _), s in segments.items() if path == "weights.madeup"]
        assert [p.to_json() for p in span.programs] == [["lzma", {"preset": 6, "lc": 2, "lp": 2, "pb": 2}]]


def test_v6_holds_a_view():
    """What v6 was made to contain: the bytes of a format no parser knows
    read as an F32 tensor (the `view` operator) by the program stored."""
    with ArchiveReader(GOLDEN / "v6" / "archive.brv") as reader:
        assert reader.version == 6
        (span,) = [s for f in reader.index.files if f.path == "weights.madeup" for s in f.segments]
        assert {p.to_json()[0] for p in span.programs} == {"view"}
        assert all(p.to_json()[1] == {"dtype": "F32"} for p in span.programs)


def test_v7_checks_chunks_with_xxh3_128():
    """What v7 was made to contain: every chunk's digest is the XXH3-128 of
    its bytes, checked in the decoding call for an `ans` chunk decoded in
    a batch and after decoding for the others."""
    from xxhash import xxh3_128_digest

    with ArchiveReader(GOLDEN / "v7" / "archive.brv") as reader:
        assert reader.version == 7
        work = [(s, c) for f in reader.index.files for s in f.segments for c in s.chunks]
        assert {s.programs[c.program].to_json()[0] for s, c in work} >= {"ans", "view"}
        for seg, chunk in work:
            assert chunk.digest == xxh3_128_digest(bytes(reader.decode_chunk(seg, chunk)))
        assert all(d is not None for d in reader.decode_chunks([(s, c, None, None, None) for s, c in work]))


def test_v8_holds_gathered_tensors():
    """What v8 was made to contain: small F32 and BF16 tensors gathered by
    dtype (`members`; a scalar among them), a tensor too large to gather
    and an empty one apart, and a norm two files repeat stored once, apart;
    each member reads back as the bytes at its place in its file."""
    source = GOLDEN / "v8" / "source"
    with ArchiveReader(GOLDEN / "v8" / "archive.brv") as reader:
        assert reader.version == 8
        files = {f.path: f for f in reader.index.files}
        model = files["model.safetensors"]
        gathered = {s.dtype.name: s for s in model.segments if s.members}
        assert set(gathered) == {"F32", "BF16"}
        assert ("scalar", ()) in gathered["F32"].members
        apart = {s.name for s in model.segments if s.dtype is not None and not s.members}
        assert apart == {"embed.weight", "empty", "final.norm"}
        norms = [s for f in files.values() for s in f.segments if s.name == "final.norm"]
        assert len(norms) == 2 and norms[0].chunks[0].streams == norms[1].chunks[0].streams
    with brevis.open(GOLDEN / "v8" / "archive.brv", ml_dtypes=False) as a:
        for key in a:
            f, t = a._entries[key]
            data = (source / f.path).read_bytes()[t.offset:t.offset + t.length]
            assert a[key].tobytes() == data and a[key].shape == tuple(t.shape), key
