"""Decoding jobs (codec/chunks.py): the chunks that decode in one call of
the C decoder (into their place in memory, or beside it and then written),
among those that do not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import brevis
from brevis.archive.reader import ArchiveReader
from brevis.errors import ChecksumError
from helpers import write_safetensors


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A header (zstd: decoded as usual), then w1 and w2 (`ans`) around a bias
    stored raw: the three decode in one call into their place."""
    root = tmp_path_factory.mktemp("chunks")
    rng = np.random.default_rng(4)
    write_safetensors(root / "m.safetensors", {
        "w1": ("F16", (65536,), (rng.standard_normal(65536) * 0.02).astype(np.float16).tobytes()),
        "bias": ("F32", (8,), rng.standard_normal(8).astype(np.float32).tobytes()),
        "w2": ("F16", (65536,), (rng.standard_normal(65536) * 0.03).astype(np.float16).tobytes()),
    })
    brevis.compress([root / "m.safetensors"], root / "m.brv")
    return root


def streams_of(archive) -> dict[str, tuple[int, str]]:
    """Each segment's first stream offset and the lane of its first chunk (None: decoded as usual)."""
    with ArchiveReader(archive) as reader:
        return {seg.name: (seg.chunks[0].streams[0][0], seg.in_one_call[seg.chunks[0].program])
                for seg in reader.index.files[0].segments}


def test_the_in_place_lane_takes_ans_and_raw_leaves(mixed):
    lanes = {name: lane for name, (_, lane) in streams_of(mixed / "m.brv").items()}
    assert lanes == {"__header__": None, "w1": (2, 16), "bias": (0, 0), "w2": (2, 16)}
    data = (mixed / "m.brv").read_bytes()
    want = (mixed / "m.safetensors").read_bytes()
    for threads in (1, 2):
        assert bytes(brevis.unpack(data, threads=threads)["m.safetensors"]) == want
        out = mixed / f"out{threads}"
        brevis.decompress(mixed / "m.brv", out, threads=threads)  # into a file: decoded beside, then written
        assert (out / "m.safetensors").read_bytes() == want


@pytest.mark.parametrize("damaged, named", [(["w2"], "w2"), (["bias", "w2"], "bias"), (["__header__", "w2"], "__header__"),
                                            (["__header__"], "__header__")])
def test_the_first_damaged_chunk_is_named_in_or_out_of_the_lane(mixed, damaged, named, tmp_path):
    """Damage in the lane's call sends the whole window the usual way, which
    names the first damaged chunk in file order, in the lane or not."""
    streams = streams_of(mixed / "m.brv")
    data = bytearray((mixed / "m.brv").read_bytes())
    for name in damaged:
        data[streams[name][0] + 2] ^= 0x40
    (tmp_path / "d.brv").write_bytes(data)
    for threads in (1, 2):
        with pytest.raises(ChecksumError, match=f"'{named}'"):
            brevis.unpack(bytes(data), threads=threads)
        with pytest.raises(ChecksumError, match=f"'{named}'"):
            brevis.decompress(tmp_path / "d.brv", tmp_path / f"out{threads}", threads=threads)
        assert not (tmp_path / f"out{threads}").exists()


def _written(tmp_path, size: int, parts: list, offset: int) -> bytes:
    """The bytes of a file staged at `size` (as decompress stages one: all
    zeros) after WriteInPlace.put_run(parts, offset)."""
    from brevis.codec import chunks

    path = tmp_path / "staged"
    with open(path, "wb") as f:
        f.truncate(size)
    sink = chunks.WriteInPlace(str(path), "shown")
    fd = sink.open()
    try:
        sink.put_run(fd, parts, offset)
    finally:
        sink.close(fd)
    return path.read_bytes()


def test_a_run_of_pieces_is_written_in_one_call_its_zeros_left_as_holes(tmp_path, monkeypatch):
    from brevis.codec import chunks

    calls = []
    real = chunks._pwritev

    def recording(fd, views, offset):
        calls.append((offset, [len(v) for v in views]))
        return real(fd, views, offset)

    monkeypatch.setattr(chunks, "_pwritev", recording)
    parts = [b"a" * 100, b"\0" * 300, b"b" * 50, b"c" * 7, np.zeros(64, np.uint8), b"\0" * 7 + b"d"]
    got = _written(tmp_path, 1000 + sum(len(p) for p in parts), parts, 1000)
    assert calls == [(1000, [100]), (1400, [50, 7]), (1521, [8])]  # the zero pieces not written
    assert got == b"\0" * 1000 + b"".join(bytes(memoryview(p)) for p in parts)


@pytest.mark.parametrize("most", [None, 1, 5, 64])
def test_short_writes_are_written_on_from_where_they_stopped(tmp_path, monkeypatch, most):
    """pwritev may write less than asked (most bytes a call), or be missing (None: pwrite a piece at a time)."""
    import os

    from brevis.codec import chunks

    def short(fd, views, offset):
        return os.pwrite(fd, b"".join(bytes(v) for v in views)[:most], offset)

    monkeypatch.setattr(chunks, "_pwritev", None if most is None else short)
    rng = np.random.default_rng(most or 0)
    parts = [rng.integers(1, 256, n, dtype=np.uint8) for n in (3, 17, 1, 40, 9)]
    assert _written(tmp_path, 77, parts, 7) == b"\0" * 7 + b"".join(p.tobytes() for p in parts)


@pytest.fixture(scope="module")
def gathered(tmp_path_factory):
    """Many small tensors between large ones: the small ones gathered into
    segments whose chunks lie in many pieces of the file."""
    root = tmp_path_factory.mktemp("gathered")
    rng = np.random.default_rng(5)
    tensors = {}
    for i in range(6):
        tensors[f"l{i}.weight"] = ("F32", (64, 64), (rng.standard_normal(4096) * 0.05).astype(np.float32).tobytes())
        tensors[f"l{i}.bias"] = ("F32", (64,), (rng.standard_normal(64) * 0.01).astype(np.float32).tobytes())
        tensors[f"l{i}.scale"] = ("F32", (3,), rng.standard_normal(3).astype(np.float32).tobytes())
    write_safetensors(root / "g.safetensors", tensors)
    brevis.compress([root / "g.safetensors"], root / "g.brv")
    return root


@pytest.mark.parametrize("kernel", [True, False])
def test_gathered_chunks_go_to_their_pieces_in_memory(gathered, kernel, monkeypatch):
    """unpack puts a gathered segment's chunk in its places at once
    (_layout.scatter), or a piece at a time without the extension."""
    from brevis.codec import chunks

    with ArchiveReader(gathered / "g.brv") as reader:
        assert any(seg.members is not None and len(seg.ranges) > 1 for seg in reader.index.files[0].segments)
    if not kernel:
        monkeypatch.setattr(chunks, "_layout", None)
    elif chunks._layout is None:
        pytest.skip("the C extension is not built")
    for threads in (1, 2):
        got = brevis.unpack(gathered / "g.brv", threads=threads)
        assert bytes(got["g.safetensors"]) == (gathered / "g.safetensors").read_bytes()


def test_gathered_pieces_are_written_in_file_order_each_run_at_once(gathered, tmp_path, monkeypatch):
    """decompress writes a window's pieces sorted by their place in the
    file, and pieces that follow one another, of any segments, in one
    pwritev: in decoding order the gathered biases' and scales' pieces
    alternate with each other's, which was a call each."""
    from brevis.codec import chunks

    if chunks._pwritev is None:
        pytest.skip("no pwritev here")
    calls = []
    real = chunks._pwritev

    def recording(fd, views, offset):
        calls.append((offset, sum(len(v) for v in views)))
        return real(fd, views, offset)

    monkeypatch.setattr(chunks, "_pwritev", recording)
    brevis.decompress(gathered / "g.brv", tmp_path / "out", threads=1)
    assert (tmp_path / "out" / "g.safetensors").read_bytes() == (gathered / "g.safetensors").read_bytes()
    assert calls == sorted(calls)
    assert not {offset + n for offset, n in calls} & {offset for offset, _ in calls}  # no run cut in two


# ------------------------------------------------------------ repeated chunks
@pytest.fixture(scope="module")
def repeated(tmp_path_factory):
    """Two files holding the same tensors (an export in two formats, as
    silero-vad ships), a third with one of them and one of its own: the
    writer points the later copies' chunks at the first copy's streams."""
    root = tmp_path_factory.mktemp("repeats")
    rng = np.random.default_rng(8)
    w = (rng.standard_normal(100_000) * 0.02).astype(np.float32).tobytes()
    v = (rng.standard_normal(30_000) * 0.05).astype(np.float16).tobytes()
    src = root / "src"
    src.mkdir()
    write_safetensors(src / "a.safetensors", {"w": ("F32", (100_000,), w), "v": ("F16", (30_000,), v)})
    write_safetensors(src / "b.safetensors", {"v": ("F16", (30_000,), v), "w": ("F32", (100_000,), w)})
    write_safetensors(src / "c.safetensors", {"x": ("F32", (5_000,), w[:20_000]), "w": ("F32", (100_000,), w)})
    archive = root / "r.brv"
    brevis.compress(src, archive, chunk_bytes=64 << 10)
    return src, archive


def test_repeated_chunks_are_found_by_their_streams(repeated):
    from brevis.codec.chunks import find_repeats

    _, archive = repeated
    with ArchiveReader(archive) as reader:
        index = reader.index
        found = find_repeats(index)
        names = [f.path for f in index.files]
        assert found, "the later copies' chunks repeat the first's"
        for (i, s, c), (fi, fs, fstart, start) in found.items():
            seg, first = index.files[i].segments[s], index.files[fi].segments[fs]
            assert (fi, fs) < (i, s)  # an earlier chunk of the archive
            assert seg.chunks[c].streams == next(ch.streams for k, ch in enumerate(first.chunks)
                                                 if sum(x.n for x in first.chunks[:k]) * first.itemsize == fstart)
        assert {names[i] for i, _, _ in found} == {"b.safetensors", "c.safetensors"}
        assert not find_repeats(index, files={names.index("c.safetensors")})  # alone, nothing repeats


@pytest.mark.parametrize("threads", [1, 2])
def test_repeated_chunks_decode_once_and_are_copied(repeated, tmp_path, monkeypatch, threads):
    """unpack and decompress (threads, worker processes) decode each stream
    once, and give every byte back; decompress of one file decodes its own."""
    from brevis.codec import chunks

    src, archive = repeated
    decoded = []
    real = chunks.decode_in_place
    monkeypatch.setattr(chunks, "decode_in_place", lambda calls: decoded.extend(c[0].tobytes() for c in calls)
                        or real(calls))
    got = brevis.unpack(archive.read_bytes(), threads=threads)
    assert {k: bytes(v) for k, v in got.items()} == {p.name: p.read_bytes() for p in src.iterdir()}
    assert decoded and len(decoded) == len(set(decoded))  # no stream decoded twice
    for processes in (False, True) if threads > 1 else (False,):
        out = tmp_path / f"out-{processes}"
        brevis.decompress(archive, out, threads=threads, processes=processes)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == {p.name: p.read_bytes() for p in src.iterdir()}
    one = tmp_path / "one"
    brevis.decompress(archive, one, threads=threads, only=["c.safetensors"])
    assert (one / "c.safetensors").read_bytes() == (src / "c.safetensors").read_bytes()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts this process's descriptors in /proc")
def test_repeats_put_by_their_source_leave_no_file_open(repeated, tmp_path, monkeypatch):
    """decompress puts a repeated chunk where it belongs from the job that
    decodes the chunk it repeats, without reading anything back from the
    files; each file it writes is opened once a window and closed, also
    where a write fails part way."""
    from brevis.codec import chunks
    from brevis.errors import IOFailure

    src, archive = repeated
    source = {p.name: p.read_bytes() for p in src.iterdir()}

    read_back, copy = [], chunks.copy_repeats
    monkeypatch.setattr(chunks, "copy_repeats", lambda decoder, sink_of, repeats: read_back.extend(repeats)
                        or copy(decoder, sink_of, repeats))
    before = len(list(Path("/proc/self/fd").iterdir()))
    for threads in (1, 2):
        out = tmp_path / f"out{threads}"
        brevis.decompress(archive, out, threads=threads)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == source
    assert len(list(Path("/proc/self/fd").iterdir())) == before
    assert not read_back
    brevis.unpack(archive.read_bytes())
    assert read_back  # unpack's copies are views of its buffers

    real, writes = chunks.WriteInPlace.put_run, []

    def fails_late(self, fd, parts, offset):
        writes.append(self.path)
        if len(writes) == 5:
            raise IOFailure("cannot write it: no")
        return real(self, fd, parts, offset)

    monkeypatch.setattr(chunks.WriteInPlace, "put_run", fails_late)
    with pytest.raises(IOFailure, match="no"):
        brevis.decompress(archive, tmp_path / "again", threads=1)
    assert not (tmp_path / "again").exists()
    assert len(list(Path("/proc/self/fd").iterdir())) == before


def test_a_damaged_stream_shared_by_repeats_fails_the_first(repeated, tmp_path):
    """The stream the copies share is decoded (and found damaged) with the
    first: decompress raises, names it, and leaves nothing."""
    src, archive = repeated
    from brevis.codec.chunks import find_repeats

    with ArchiveReader(archive) as reader:
        (i, s, c), _ = next(iter(find_repeats(reader.index).items()))
        off, length, _ = reader.index.files[i].segments[s].chunks[c].streams[0]
    data = bytearray(archive.read_bytes())
    data[off + length // 2] ^= 0x20
    bad = tmp_path / "bad.brv"
    bad.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=f"at offset {off} is damaged"):
        brevis.decompress(bad, tmp_path / "out", threads=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.brv"]
