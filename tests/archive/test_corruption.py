"""Damaged archives: every truncation and every bit flip is reported as a BrevisError.

Never another exception type, never a hang, never a wrong file passed off
as right. Also crafted archives: a newer version, a bad magic, and indexes
that declare huge sizes or unsafe paths, rewritten with a valid digest and
footer so only the reader's validation can catch them.
"""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import brevis
from brevis.archive.format import FOOTER, FOOTER_SIZE, HEADER, HEADER_SIZE, VERSION, Footer, index_digest
from brevis.archive.reader import ArchiveReader
from brevis.errors import BrevisError, FormatError, TruncatedError, UnsupportedVersion
from helpers import (deadline, inline_programs, join, largest_stream, small_checkpoint, split, tree,
                     write_safetensors)



@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, Path, bytes]:
    """(source folder, archive, archive bytes): a few KB, several programs."""
    root = tmp_path_factory.mktemp("corruption")
    src = small_checkpoint(root / "src", elements=1024)
    archive = root / "small.brv"
    brevis.compress([src], archive, threads=1)
    data = archive.read_bytes()
    assert 1000 < len(data) < 8000, len(data)
    return src, archive, data


def outcome(path: Path, src: Path) -> str:
    """'error' (a BrevisError), 'reported' (verify ok=False) or 'ok'; anything else raises."""
    try:
        with deadline(20, f"verify {path.name}"):
            report = brevis.verify(path, threads=1)
    except BrevisError:
        return "error"
    return "ok" if report["ok"] else "reported"


def test_intact_archive_verifies(small):
    src, archive, _ = small
    assert brevis.verify(archive, [src], threads=1)["ok"]


def test_every_truncation_is_an_error(small, tmp_path):
    src, _, data = small
    path = tmp_path / "cut.brv"
    for length in range(len(data)):
        path.write_bytes(data[:length])
        with pytest.raises(BrevisError) as info:
            with deadline(20, f"prefix {length}"):
                brevis.verify(path, threads=1)
        assert isinstance(info.value, FormatError), (length, info.value)
        with pytest.raises(FormatError):
            ArchiveReader(path).close()
    # The shortest prefixes say "truncated", not "not an archive".
    for length in (0, 1, 8, HEADER_SIZE, HEADER_SIZE + FOOTER_SIZE - 1, len(data) - 1):
        path.write_bytes(data[:length])
        with pytest.raises(TruncatedError):
            ArchiveReader(path)


def zstd_streams(archive: Path) -> list[tuple[int, int]]:
    """(offset, length) of every stream a zstd coder wrote."""
    out = []
    with ArchiveReader(archive) as reader:
        for f in reader.index.files:
            for seg in f.segments:
                for c in seg.chunks:
                    leaves = seg.programs[c.program].leaves()
                    out += [(o, ln) for (o, ln, _), leaf in zip(c.streams, leaves) if leaf.id == "zstd"]
    return out


def test_every_bit_flip_is_detected(small, tmp_path):
    """Flip one bit at every offset: verify must raise or report a problem.

    Every byte of an archive is covered by a check: header fields, the CRC-32
    of every stored stream (which also covers bits a zstd decoder never
    reads, such as padding after an FSE table description), the chunk
    digests of the original bytes, the index digest and the footer.
    """
    src, archive, data = small
    path = tmp_path / "flip.brv"
    undetected = []
    for offset in range(len(data)):
        damaged = bytearray(data)
        damaged[offset] ^= 1 << (offset * 5 % 8)  # a different bit at each offset
        path.write_bytes(damaged)
        if outcome(path, src) == "ok":
            undetected.append(offset)
    assert undetected == [], f"bit flips not detected at offsets {undetected}"


def test_zstd_frame_header_flips_are_detected(small, tmp_path):
    """Every bit of every zstd frame header (the unused bit too) is checked."""
    src, archive, data = small
    path = tmp_path / "fhd.brv"
    streams = zstd_streams(archive)
    assert streams
    for offset, length in streams:
        for pos in range(offset, offset + min(length, 7)):  # magic, descriptor, content size
            for bit in range(8):
                damaged = bytearray(data)
                damaged[pos] ^= 1 << bit
                path.write_bytes(damaged)
                assert outcome(path, src) != "ok", (offset, pos - offset, bit)


def test_random_overwrites_are_detected(small, tmp_path):
    src, _, data = small
    rng = np.random.default_rng(7)
    path = tmp_path / "overwrite.brv"
    for _ in range(150):
        damaged = bytearray(data)
        start = int(rng.integers(0, len(data)))
        length = int(rng.integers(1, 9))
        for i in range(start, min(start + length, len(data))):
            damaged[i] = (damaged[i] + int(rng.integers(1, 256))) % 256
        path.write_bytes(damaged)
        assert outcome(path, src) != "ok", (start, length)


def test_damaged_archive_decompresses_to_nothing(small, tmp_path):
    src, _, data = small
    off, length, _ = largest_stream(small[1])
    damaged = bytearray(data)
    damaged[off + length // 2] ^= 0x10
    path = tmp_path / "bad.brv"
    path.write_bytes(damaged)
    with pytest.raises(BrevisError):
        brevis.decompress(path, tmp_path / "out", threads=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.brv"]


def test_decompress_tells_the_damaged_stream_of_any_leaf(small, tmp_path):
    """decompress and unpack check a chunk's streams only where it fails
    (does not decode, or not to its digest): the damaged stream is still
    named, whichever leaf codes it."""
    src, archive, data = small
    with ArchiveReader(archive) as reader:
        found = {}
        for f in reader.index.files:
            for seg in f.segments:
                for c in seg.chunks:
                    for k, ((off, length, _), leaf) in enumerate(zip(c.streams, seg.programs[c.program].leaves())):
                        if length > 16:
                            found.setdefault(leaf.id, (seg.name, k, off, length))
    assert {"zstd", "ans"} <= set(found), found
    for name, k, off, length in found.values():
        damaged = bytearray(data)
        damaged[off + length // 2] ^= 0x08
        path = tmp_path / "bad.brv"
        path.write_bytes(damaged)
        told = f"{name!r}: stream {k} at offset {off} is damaged"
        with pytest.raises(BrevisError, match=told):
            brevis.decompress(path, tmp_path / "out", threads=1)
        with pytest.raises(BrevisError, match=told):
            brevis.unpack(bytes(damaged))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.brv"]


def test_a_stream_check_alone_wrong_is_found_by_verify_alone(small, tmp_path):
    """Streams intact, every stream's recorded check wrong (what damage to
    bits no decoder reads comes to): decompress and unpack give every byte
    back, each chunk matching its digest; verify, which checks every stream
    before decoding it, names each chunk's first stream."""
    src, _, data = small
    head, index = split(data)
    for f in index["files"]:
        for seg in f["segments"]:
            for chunk in seg["chunks"]:
                for loc in chunk[2]:
                    loc[2] ^= 1
    path = tmp_path / "checks.brv"
    path.write_bytes(join(head, index))
    out = tmp_path / "out"
    brevis.decompress(path, out, threads=1)
    assert tree(out) == tree(src)
    assert all(bytes(v) == (src / k).read_bytes() for k, v in brevis.unpack(path.read_bytes()).items())
    report = brevis.verify(path, threads=1)
    assert not report["ok"] and all("stream 0 at offset" in p["error"] for p in report["problems"])


@pytest.fixture(scope="module")
def many_small(tmp_path_factory) -> tuple[Path, Path]:
    """A checkpoint of 40 small F32 tensors, each one `ans` chunk: the
    chunks a job decodes in one batch (entropy.decode_batch)."""
    root = tmp_path_factory.mktemp("batch")
    rng = np.random.default_rng(11)
    src = root / "m.safetensors"
    # 5,000 values (20 KB): more than formats/gather.py gathers with others.
    write_safetensors(src, {f"t{i}": ("F32", (5000,), (rng.standard_normal(5000) * 0.05).astype(np.float32).tobytes())
                            for i in range(40)})
    archive = root / "m.brv"
    brevis.compress([src], archive, threads=1)
    with ArchiveReader(archive) as reader:
        programs = [str(seg.programs[c.program].node.id) for f in reader.index.files for seg in f.segments
                    for c in seg.chunks if seg.name.startswith("t")]
    assert programs.count("ans") >= 30, programs
    return src, archive


@pytest.mark.parametrize("which", [0, 17, 39])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_damaged_chunk_among_batched_ones_is_found(many_small, tmp_path, which, threads):
    """Damage to any one of a run of batched chunks: decompress raises and
    writes nothing; verify (which decodes chunk by chunk) names that tensor."""
    src, archive = many_small
    with ArchiveReader(archive) as reader:
        seg = next(s for f in reader.index.files for s in f.segments if s.name == f"t{which}")
        off, length, _ = seg.chunks[0].streams[0]
    data = bytearray(archive.read_bytes())
    for flip in (off + length // 2, off + length - 1):  # inside the stream: its check fails
        damaged = bytearray(data)
        damaged[flip] ^= 0x04
        path = tmp_path / "bad.brv"
        path.write_bytes(damaged)
        with pytest.raises(BrevisError, match=f"'t{which}': stream 0 at offset {off} is damaged"):
            brevis.decompress(path, tmp_path / "out", threads=threads, processes=False)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.brv"]
        with pytest.raises(BrevisError, match=f"'t{which}': stream 0 at offset {off} is damaged"):
            brevis.unpack(bytes(damaged), threads=threads)
        report = brevis.verify(path, threads=1)
        assert not report["ok"]
        assert f"t{which}" in json.dumps(report)
    out = tmp_path / "good"
    brevis.decompress(archive, out, threads=threads, processes=False)
    assert (out / "m.safetensors").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_verify_tells_every_damaged_chunk_of_a_batch_in_order(many_small, tmp_path, threads):
    """verify decodes a window in batches, and chunk by chunk where a batch
    finds damage: each damaged tensor is reported once, in file order."""
    src, archive = many_small
    data = bytearray(archive.read_bytes())
    with ArchiveReader(archive) as reader:
        segs = {s.name: s for f in reader.index.files for s in f.segments}
    for name in ("t30", "t5", "t12"):
        off, length, _ = segs[name].chunks[0].streams[0]
        data[off + length // 3] ^= 0x20
    path = tmp_path / "bad.brv"
    path.write_bytes(bytes(data))
    report = brevis.verify(path, threads=threads)
    assert not report["ok"]
    assert [p["segment"] for p in report["problems"]] == ["t5", "t12", "t30"], report["problems"]
    assert all("damaged" in p["error"] for p in report["problems"])


# ------------------------------------------------------------ crafted headers
def test_newer_version_is_unsupported(small, tmp_path):
    _, _, data = small
    magic, version, flags, reserved = HEADER.unpack(data[:HEADER_SIZE])
    for newer in (VERSION + 1, 0xFFFF):  # VERSION: the newest this Brevis reads (2: with links)
        path = tmp_path / f"v{newer}.brv"
        path.write_bytes(HEADER.pack(magic, newer, flags, reserved) + data[HEADER_SIZE:])
        with pytest.raises(UnsupportedVersion, match="newer"):
            ArchiveReader(path)
        with pytest.raises(UnsupportedVersion):
            brevis.verify(path)
        with pytest.raises(UnsupportedVersion):
            brevis.inspect(path)
        with pytest.raises(UnsupportedVersion):
            brevis.decompress(path, tmp_path / "out")
    path = tmp_path / "v0.brv"
    path.write_bytes(HEADER.pack(magic, 0, flags, reserved) + data[HEADER_SIZE:])
    with pytest.raises(FormatError) as info:
        ArchiveReader(path)
    assert not isinstance(info.value, UnsupportedVersion)


@pytest.mark.parametrize("content", [
    b"PK\x03\x04" + bytes(100),  # a zip (a .pth)
    b'{"not": "an archive"}\n' * 10,
    bytes(range(256)) * 4,
])
def test_not_an_archive(tmp_path, content):
    path = tmp_path / "x.brv"
    path.write_bytes(content)
    with pytest.raises(FormatError, match="magic") as info:
        ArchiveReader(path)
    assert not isinstance(info.value, TruncatedError)


def test_bad_magic(small, tmp_path):
    _, _, data = small
    for i in range(8):
        damaged = bytearray(data)
        damaged[i] ^= 0x20
        path = tmp_path / "magic.brv"
        path.write_bytes(damaged)
        with pytest.raises(FormatError, match="magic"):
            ArchiveReader(path)


def test_unknown_flags_and_reserved_bits(small, tmp_path):
    _, _, data = small
    magic, version, flags, reserved = HEADER.unpack(data[:HEADER_SIZE])
    for f, r in ((1, 0), (0x8000, 0), (0, 1), (0, 1 << 31)):
        path = tmp_path / "flags.brv"
        path.write_bytes(HEADER.pack(magic, version, f, r) + data[HEADER_SIZE:])
        with pytest.raises(FormatError):
            ArchiveReader(path)


def test_archive_paths_that_are_not_archives(tmp_path):
    with pytest.raises(BrevisError):
        ArchiveReader(tmp_path / "missing.brv")
    with pytest.raises(BrevisError):
        ArchiveReader(tmp_path)
    empty = tmp_path / "empty.brv"
    empty.write_bytes(b"")
    with pytest.raises(TruncatedError):
        ArchiveReader(empty)


# ------------------------------------------------------------ crafted indexes
def test_rewriting_the_index_unchanged_still_reads(small, tmp_path):
    src, _, data = small
    head, index = split(data)
    path = tmp_path / "same.brv"
    path.write_bytes(join(head, index))
    assert brevis.verify(path, [src], threads=1)["ok"]


def tensor_segment(index: dict) -> dict:
    for f in index["files"]:
        for s in f["segments"]:
            if s["dtype"] and s["chunks"]:
                return s
    raise AssertionError("no tensor segment")


def test_huge_chunk_is_refused_before_allocating(small, tmp_path):
    _, _, data = small
    head, index = split(data)
    n = 1 << 40
    for f in index["files"]:
        seg = next((s for s in f["segments"] if s["dtype"] == "F32" and s["chunks"]), None)
        if seg:
            f["size"] += n * 4 - seg["length"]
            seg["length"] = n * 4
            seg["shape"] = [n]
            seg["chunks"] = [[0, n, seg["chunks"][0][2], seg["chunks"][0][3]]]
            break
    path = tmp_path / "huge.brv"
    path.write_bytes(join(head, index))
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="out of bounds"):
            ArchiveReader(path)
        for call in (lambda: brevis.verify(path), lambda: brevis.decompress(path, tmp_path / "out"),
                     lambda: brevis.inspect(path)):
            with pytest.raises(FormatError):
                call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"{peak} bytes allocated while refusing the archive"
    assert not (tmp_path / "out").exists()


def test_huge_declared_index_is_refused(small, tmp_path):
    _, _, data = small
    footer = Footer.unpack(data[-FOOTER_SIZE:], len(data))
    for raw in (0, (1 << 30) + 1, 1 << 63):
        path = tmp_path / "index.brv"
        bad = Footer(footer.index_offset, footer.index_length, raw, footer.digest)
        path.write_bytes(data[:-FOOTER_SIZE] + bad.pack())
        with pytest.raises(FormatError):
            ArchiveReader(path)


def test_footer_that_points_elsewhere(small, tmp_path):
    _, _, data = small
    offset, length, raw, digest, magic = FOOTER.unpack(data[-FOOTER_SIZE:])
    for o, ln in ((0, length), (offset + 1, length), (offset, length + 1), (offset, 1 << 63),
                  ((1 << 64) - 1, length)):
        path = tmp_path / "footer.brv"
        path.write_bytes(data[:-FOOTER_SIZE] + FOOTER.pack(o, ln, raw, digest, magic))
        with pytest.raises(FormatError):
            ArchiveReader(path)


def edit(fn):
    """An index edit: fn(index) changes it in place."""
    return fn


def _set(path, value):
    def fn(index):
        obj = index
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return fn


def _segment(fn):
    return lambda index: fn(tensor_segment(index))


CRAFTED = {
    "not an object": lambda i: i.clear() or i.update({"files": "x"}),
    "path with ..": _set(["files", 0, "path"], "../escape.txt"),
    "absolute path": _set(["files", 0, "path"], "/tmp/escape.txt"),
    "empty path": _set(["files", 0, "path"], ""),
    "NUL in path": _set(["files", 0, "path"], "a\x00b"),
    "empty component": _set(["files", 0, "path"], "a//b"),
    "dir escapes": _set(["dirs"], ["../up"]),
    "duplicate path": lambda i: i["files"].append(dict(i["files"][0])),
    "file under a file": lambda i: i["dirs"].append(i["files"][0]["path"] + "/inside"),
    "negative size": _set(["files", 0, "size"], -1),
    "size mismatch": lambda i: i["files"][0].update(size=i["files"][0]["size"] + 1),
    "size as float": lambda i: i["files"][0].update(size=float(i["files"][0]["size"])),
    "size as bool": lambda i: i["files"][-1].update(size=True),
    "unknown dtype": _segment(lambda s: s.update(dtype="F128")),
    "shape disagrees": _segment(lambda s: s.update(shape=[s["length"]])),
    "negative dim": _segment(lambda s: s.update(shape=[-1])),
    "shape of bytes": lambda i: next(s for f in i["files"] for s in f["segments"] if s["dtype"] is None).update(shape=[1]),
    "chunk names no program": _segment(lambda s: s["chunks"][0].__setitem__(0, 5)),
    "chunk of zero": _segment(lambda s: s["chunks"][0].__setitem__(1, 0)),
    "chunk too many streams": _segment(lambda s: s["chunks"][0][2].append([16, 0])),
    "stream outside region": _segment(lambda s: s["chunks"][0][2].__setitem__(0, [16, 1 << 40])) ,
    "stream into header": _segment(lambda s: s["chunks"][0][2].__setitem__(0, [0, 4])),
    "negative stream": _segment(lambda s: s["chunks"][0][2].__setitem__(0, [16, -1])),
    "bad digest": _segment(lambda s: s["chunks"][0].__setitem__(3, "zz" * 16)),
    "short digest": _segment(lambda s: s["chunks"][0].__setitem__(3, "00")),
    "malformed chunk": _segment(lambda s: s["chunks"].__setitem__(0, [0, 1])),
    "table not a list": _set(["programs"], {"0": ["raw", {}]}),
    "program number outside the table": _segment(lambda s: s["programs"].__setitem__(0, 1 << 20)),
    "negative program number": _segment(lambda s: s["programs"].__setitem__(0, -1)),
    "program number as bool": _segment(lambda s: s["programs"].__setitem__(0, False)),
    "program beside a table": _segment(lambda s: s["programs"].__setitem__(0, ["raw", {}])),
    "missing key": lambda i: i.pop("dirs"),
    "created_by not a string": _set(["created_by"], 1),
}

# A segment's first program, written wrong: in the program table (format
# version 9) and, the table undone, in the segment itself (versions 1 to 8).
BAD_PROGRAMS = {
    "unknown production": ["nope", {}],
    "self in config": ["raw", {"self": 1}],
    "ill-typed program": ["pack_bits", {}, [["raw", {}]]],
    "program as string": "raw",
    "deep program": json.loads('["byte_planes",{},[' * 40 + '["raw",{}]' + ']]' * 40),
}


def _in_table(bad):
    return lambda i: i["programs"].__setitem__(tensor_segment(i)["programs"][0], bad)


def _in_segment(bad):
    return lambda i: inline_programs(i) or tensor_segment(i)["programs"].__setitem__(0, bad)


for _name, _bad in BAD_PROGRAMS.items():
    CRAFTED[f"{_name} (table)"] = _in_table(_bad)
    CRAFTED[f"{_name} (in the segment)"] = _in_segment(_bad)


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_index_is_refused(small, tmp_path, name):
    _, _, data = small
    head, index = split(data)
    CRAFTED[name](index)
    path = tmp_path / "crafted.brv"
    path.write_bytes(join(head, index))
    with pytest.raises(FormatError):
        ArchiveReader(path)
    out = tmp_path / "out"
    with pytest.raises(FormatError):
        brevis.decompress(path, out)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["crafted.brv"]


@pytest.mark.parametrize("raw", [
    b"not json",
    b"[1, 2",
    b"[" * 100_000 + b"]" * 100_000,  # nesting deep enough to exhaust the recursion limit
    b'{"files": [], "dirs": [], "created_by": "\xff"}',  # not ASCII
    b"null",
])
def test_index_that_is_not_valid_json(small, tmp_path, raw):
    _, _, data = small
    head, _ = split(data)
    path = tmp_path / "json.brv"
    path.write_bytes(join(head, raw))
    with pytest.raises(FormatError):
        ArchiveReader(path)


def test_index_that_is_not_zstd(small, tmp_path):
    _, _, data = small
    head, index = split(data)
    raw = json.dumps(index).encode()
    path = tmp_path / "plain.brv"
    path.write_bytes(head + raw + Footer(len(head), len(raw), len(raw), index_digest(raw, VERSION)).pack())
    with pytest.raises(FormatError):
        ArchiveReader(path)


def test_safetensors_with_many_chunks_survives_flips_in_streams(tmp_path):
    """A larger tensor cut into many chunks: flips inside its streams show in verify."""
    rng = np.random.default_rng(3)
    src = tmp_path / "src"
    src.mkdir()
    w = (rng.standard_normal(8192) * 0.02).astype(np.float32)
    write_safetensors(src / "w.safetensors", {"w": ("F32", (8192,), w.tobytes())})
    archive = tmp_path / "w.brv"
    brevis.compress([src], archive, threads=1, chunk_bytes=4096)
    data = archive.read_bytes()
    with ArchiveReader(archive) as reader:
        seg = reader.index.files[0].segments[-1]
        assert len(seg.chunks) >= 8
        streams = [s for c in seg.chunks for s in c.streams if s[1]]
    path = tmp_path / "flip.brv"
    for off, length, _ in streams[:: max(1, len(streams) // 10)]:
        for pos in (off, off + length // 2, off + length - 1):
            damaged = bytearray(data)
            damaged[pos] ^= 0x04
            path.write_bytes(damaged)
            report = brevis.verify(path, threads=2)
            assert not report["ok"]
            assert len(report["problems"]) == 1
            assert report["problems"][0]["file"] == "w.safetensors"


def test_an_index_parsed_before_is_reused_only_for_the_same_stored_index(small, tmp_path):
    """The reader keeps the last index it parsed, keyed by the footer (the
    SHA-256 of the stored index): reopening the same archive reuses it; a
    damaged index or another archive at the same path is read afresh."""
    _, archive, data = small
    with ArchiveReader(archive) as first, ArchiveReader(archive) as again:
        assert again.index is first.index
    copy = tmp_path / "copy.brv"
    damaged = bytearray(data)
    footer = Footer.unpack(data[-FOOTER_SIZE:], len(data))
    damaged[footer.index_offset + 3] ^= 0x10
    copy.write_bytes(bytes(damaged))
    with pytest.raises(FormatError, match="index checksum"):
        ArchiveReader(copy)
    head, index = split(data)
    index["files"][0]["path"] = "renamed.bin"
    copy.write_bytes(join(head, index))
    with ArchiveReader(copy) as other:
        assert other.index is not first.index and other.index.files[0].path == "renamed.bin"
