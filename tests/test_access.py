"""Random access: brevis.open (a Mapping of tensors), brevis ls, brevis extract.

Every comparison is of raw bytes, never of float values.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import brevis
from brevis.access import UnknownTensor
from brevis.archive.format import HEADER_SIZE
from brevis.archive.reader import ArchiveReader
from brevis.errors import InvalidArgument, OutputExists
from helpers import REPO, small_checkpoint, write_safetensors

PTH = REPO / "examples" / "taesd" / "taef2_decoder.pth"


# ------------------------------------------------------------ sources
def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype, shape, raw bytes), parsed by hand (no dtype conversions)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    ends = sorted(v["data_offsets"] for v in header.values())
    assert [e[0] for e in ends] == [0] + [e[1] for e in ends[:-1]] and (not ends or ends[-1][1] == len(body))
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def many_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """A safetensors file of every dtype, a scalar, an empty tensor and one of 3 chunks."""
    rng = np.random.default_rng(7)
    t: dict[str, tuple[str, tuple[int, ...], bytes]] = {}
    for i in range(24):
        t[f"blocks.{i}.weight"] = ("F16", (16, 24), rng.standard_normal(384).astype(np.float16).tobytes())
    for name, np_dt in (("F32", "<f4"), ("F64", "<f8"), ("I8", "i1"), ("I16", "<i2"), ("I32", "<i4"),
                        ("I64", "<i8"), ("U8", "u1"), ("U16", "<u2"), ("U32", "<u4"), ("U64", "<u8")):
        t[f"typed.{name}"] = (name, (5, 7), rng.integers(0, 256, 35 * np.dtype(np_dt).itemsize,
                                                          dtype=np.uint8).tobytes())
    t["typed.BOOL"] = ("BOOL", (9,), (rng.random(9) < 0.5).tobytes())
    t["typed.BF16"] = ("BF16", (3, 11), rng.integers(0, 1 << 16, 33, dtype=np.uint16).tobytes())
    t["typed.F8_E4M3"] = ("F8_E4M3", (13,), rng.integers(0, 256, 13, dtype=np.uint8).tobytes())
    t["typed.F8_E5M2"] = ("F8_E5M2", (2, 2), rng.integers(0, 256, 4, dtype=np.uint8).tobytes())
    t["scalar"] = ("F32", (), np.float32(-0.0).tobytes())
    t["empty"] = ("F32", (0, 4), b"")
    t["big"] = ("F32", (768, 1024), rng.standard_normal(768 * 1024).astype(np.float32).tobytes())  # 3 chunks
    write_safetensors(path, t, metadata={"format": "pt"})
    return t


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("access")
    src = folder / "ckpt"
    src.mkdir()
    many_tensors(src / "model.safetensors")
    (src / "config.json").write_text('{"layers": 24}\n')
    archive = folder / "many.brv"
    brevis.compress([src], archive, effort=0, threads=2)
    return src / "model.safetensors", archive


@pytest.fixture(scope="module")
def two_files(tmp_path_factory) -> Path:
    """Two checkpoints with the same tensor names, and one tensor only b has."""
    folder = tmp_path_factory.mktemp("two")
    a = small_checkpoint(folder / "a", seed=1, elements=256)
    b = small_checkpoint(folder / "b", seed=2, elements=256)
    write_safetensors(b / "extra.safetensors", {"only.here": ("I32", (3,), b"\x01\0\0\0\x02\0\0\0\x03\0\0\0")})
    archive = folder / "two.brv"
    brevis.compress([a, b], archive, effort=0, threads=1)
    return archive


@pytest.fixture(scope="module")
def taesd(tmp_path_factory) -> Path:
    if not PTH.is_file():
        pytest.skip(f"{PTH} not found")
    archive = tmp_path_factory.mktemp("taesd") / "taesd.brv"
    brevis.compress([PTH], archive, effort=0, threads=2)
    return archive


# ------------------------------------------------------------ the mapping
def test_mapping_gives_the_original_tensors(many):
    source, archive = many
    original = read_safetensors(source)
    with brevis.open(archive, ml_dtypes=False) as ckpt:
        assert isinstance(ckpt, Mapping)
        assert list(ckpt) == list(original) and len(ckpt) == len(original)  # archive order
        for name, (dtype, shape, raw) in original.items():
            x = ckpt[name]
            assert x.tobytes() == raw, name
            assert list(x.shape) == shape and not x.flags.writeable
            info = ckpt.info(name)
            assert (info["key"], info["name"], info["file"], info["dtype"]) == (name, name, "model.safetensors", dtype)
            assert info["shape"] == shape and info["original_bytes"] == len(raw)
            assert len(info["programs"]) == (1 if raw else 0)  # an empty tensor has no chunk
        assert ckpt["typed.F32"].dtype == np.float32 and ckpt["typed.I16"].dtype == np.int16
        assert ckpt["blocks.0.weight"].dtype == np.float16 and ckpt["typed.F64"].dtype == np.float64
        assert ckpt["typed.U64"].dtype == np.uint64 and ckpt["typed.BOOL"].dtype == np.bool_
        assert ckpt["typed.BF16"].dtype == np.uint16 and ckpt["typed.F8_E4M3"].dtype == np.uint8
        assert ckpt["scalar"].shape == () and np.signbit(ckpt["scalar"])
        assert ckpt["empty"].shape == (0, 4)
        assert ckpt.info("big")["chunks"] == 3
        with pytest.raises(ValueError):
            ckpt["big"][0, 0] = 1
        with pytest.raises(KeyError, match="brevis ls"):
            ckpt["nope"]
        assert "nope" not in ckpt and 3 not in ckpt and ckpt.get("nope") is None
        files = ckpt.files()
        assert [f["path"] for f in files] == ["config.json", "model.safetensors"]
        assert files[0]["tensors"] == [] and len(files[1]["tensors"]) == len(original)
        assert files[1]["original_bytes"] == source.stat().st_size
    with pytest.raises(InvalidArgument, match="closed"):
        ckpt["scalar"]
    assert "scalar" in ckpt  # the index stays readable


def test_exotic_dtypes_with_ml_dtypes(many):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    source, archive = many
    original = read_safetensors(source)
    with brevis.open(archive) as ckpt:
        for name, dt in (("typed.BF16", ml_dtypes.bfloat16), ("typed.F8_E4M3", ml_dtypes.float8_e4m3fn),
                         ("typed.F8_E5M2", ml_dtypes.float8_e5m2)):
            assert ckpt[name].dtype == dt and ckpt[name].tobytes() == original[name][2]


def test_ml_dtypes_required(many, monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import fails
    with pytest.raises(InvalidArgument, match="ml_dtypes"):
        brevis.open(many[1], ml_dtypes=True)
    with brevis.open(many[1]) as ckpt:
        assert ckpt["typed.BF16"].dtype == np.uint16


def test_names_across_files(two_files):
    with brevis.open(two_files) as ckpt:
        keys = list(ckpt)
        assert keys[0] == "a/model.safetensors::layer.weight"  # a name two files share is qualified
        assert "only.here" in keys and len(keys) == 9  # a unique one stays plain (issue 15, item 8)
        assert ckpt["only.here"].tobytes() == ckpt["b/extra.safetensors::only.here"].tobytes()
        assert "b/extra.safetensors::only.here" in ckpt and "b/extra.safetensors::only.here" not in keys
        assert ckpt.key("b/extra.safetensors::only.here") == "only.here"
        with pytest.raises(UnknownTensor, match="b/model.safetensors::layer.bias") as e:
            ckpt["layer.bias"]  # in both files
        assert isinstance(e.value, KeyError) and isinstance(e.value, InvalidArgument)
        assert "layer.bias" not in ckpt
        assert ckpt["a/model.safetensors::layer.bias"].tobytes() != ckpt["b/model.safetensors::layer.bias"].tobytes()


def test_same_name_twice_in_one_file():
    from brevis.access import name_tensors
    from brevis.archive.index import FileEntry, Index, SegmentEntry
    from brevis.dtypes import DTYPES

    seg = lambda name: SegmentEntry(name, DTYPES["U8"], (1,), 1)  # noqa: E731
    index = Index([FileEntry("f.bin", 4, "x", [seg("w"), SegmentEntry("hdr", None, None, 1), seg("w"), seg("v")])])
    entries, aliases, ambiguous = name_tensors(index)
    assert list(entries) == ["f.bin::w", "f.bin::w#1", "v"]
    assert aliases == {"f.bin::v": "v"} and ambiguous == {"w": ["f.bin::w", "f.bin::w#1"]}


def test_threads_read_the_same(many):
    _, archive = many
    with brevis.open(archive) as ckpt:
        expected = {k: ckpt[k].tobytes() for k in ckpt}

        def read_all(seed: int) -> dict[str, bytes]:
            names = list(ckpt)
            random.Random(seed).shuffle(names)
            return {k: ckpt[k].tobytes() for k in names}

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(read_all, range(8)))
    assert all(r == expected for r in results)


# ------------------------------------------------------------ what is read
class Recorder:
    def __init__(self, monkeypatch):
        self.ranges: list[tuple[int, int]] = []
        original = ArchiveReader.read

        def read(reader, offset, length, allow_short=False):
            self.ranges.append((offset, length))
            return original(reader, offset, length, allow_short)

        monkeypatch.setattr(ArchiveReader, "read", read)

    def take(self) -> list[tuple[int, int]]:
        out, self.ranges = self.ranges, []
        return out


def streams_of(archive: Path, file: str, name: str) -> list[tuple[int, int]]:
    with ArchiveReader(archive) as r:
        seg = next(t.segment for f in r.index.files if f.path == file for t in f.tensors() if t.name == name)
        return [(off, ln) for c in seg.chunks for off, ln, _ in c.streams]


def inside(ranges, allowed) -> bool:
    """Every range read lies inside the allowed ones (streams that lie back
    to back count as one: they are read with one pread)."""
    merged: list[list[int]] = []
    for a, n in sorted(allowed):
        if merged and merged[-1][0] + merged[-1][1] == a:
            merged[-1][1] += n
        else:
            merged.append([a, n])
    return all(any(a <= off and off + ln <= a + n for a, n in merged) for off, ln in ranges)


def test_one_tensor_reads_only_its_streams(many, monkeypatch):
    _, archive = many
    size = archive.stat().st_size
    rec = Recorder(monkeypatch)
    with brevis.open(archive) as ckpt:
        opened = rec.take()
        index_offset = ckpt._reader.footer.index_offset
        # Opening reads the header, the footer and the index, once each.
        assert inside(opened, [(0, HEADER_SIZE), (index_offset, size - index_offset)])
        assert sum(n for _, n in opened) == HEADER_SIZE + size - index_offset
        for name in ("blocks.5.weight", "big", "typed.BF16"):
            x = ckpt[name]
            read = rec.take()
            streams = streams_of(archive, "model.safetensors", name)
            assert read and inside(read, streams), name
            assert sum(n for _, n in read) == sum(n for _, n in streams)
            assert x.nbytes == ckpt.info(name)["original_bytes"]
            rec.take()
        assert sum(n for _, n in streams_of(archive, "model.safetensors", "blocks.5.weight")) < size / 100


def test_a_damaged_stream_read_in_place_is_an_error(tmp_path):
    """Chunks that one leaf codes decode straight into the tensor's array;
    a flipped byte in any of a tensor's streams is still a BrevisError, and
    the other tensors read as before."""
    from brevis.errors import BrevisError

    rng = np.random.default_rng(3)
    weights = (rng.standard_normal(300_000) * 0.02).astype(np.float32)
    other = rng.standard_normal(1000).astype(np.float32)
    write_safetensors(tmp_path / "m.safetensors", {"w": ("F32", (300_000,), weights.tobytes()),
                                                   "other": ("F32", (1000,), other.tobytes())})
    archive = tmp_path / "m.brv"
    brevis.compress([tmp_path / "m.safetensors"], archive, threads=1)
    with brevis.open(archive) as ckpt:
        assert "ans" in ckpt.info("w")["programs"], ckpt.info("w")["programs"]
        assert ckpt["w"].tobytes() == weights.tobytes()
    data = archive.read_bytes()
    for off, n in streams_of(archive, "m.safetensors", "w"):
        for at in rng.integers(off, off + n, 4):
            damaged = bytearray(data)
            damaged[at] ^= 1 << int(rng.integers(8))
            path = tmp_path / "damaged.brv"
            path.write_bytes(bytes(damaged))
            with brevis.open(path) as ckpt:
                with pytest.raises(BrevisError):
                    ckpt["w"]
                assert ckpt["other"].tobytes() == other.tobytes()


def test_runs_of_streams_read_as_one_give_each_chunks_streams(many):
    with ArchiveReader(many[1]) as r:
        chunks = [c for f in r.index.files for s in f.segments for c in s.chunks]
        for most in (1, 1 << 12, 1 << 30):
            runs = r.read_runs(chunks, most)
            assert [[bytes(v) for v in got] for got in runs] == \
                [[bytes(v) for v in r._stored(c.streams)] for c in chunks]


def test_ls_decodes_nothing(many, monkeypatch):
    _, archive = many
    rec = Recorder(monkeypatch)

    def refuse(*a):
        raise AssertionError("ls decoded a chunk")

    monkeypatch.setattr(ArchiveReader, "decode_chunk", refuse)
    r = brevis.ls(archive)
    index_offset = r["archive_bytes"] - sum(n for off, n in rec.ranges if off > HEADER_SIZE)
    assert inside(rec.take(), [(0, HEADER_SIZE), (index_offset, r["archive_bytes"] - index_offset)])
    assert [f["path"] for f in r["files"]] == ["config.json", "model.safetensors"]
    big = next(t for t in r["files"][1]["tensors"] if t["key"] == "big")
    assert big == {"key": "big", "name": "big", "dtype": "F32", "shape": [768, 1024],
                   "original_bytes": 768 * 1024 * 4, "stored_bytes": big["stored_bytes"]}


# ------------------------------------------------------------ extract
def test_extract_is_bit_identical_to_safetensors_source(many, tmp_path):
    source, archive = many
    original = read_safetensors(source)
    names = ["typed.BF16", "big", "scalar", "empty", "typed.F8_E5M2", "typed.BOOL", "blocks.3.weight"]
    out = tmp_path / "part.safetensors"
    r = brevis.extract(archive, names, out, threads=2)
    assert r["tensors"] == names and r["output_bytes"] == out.stat().st_size
    got = read_safetensors(out)
    assert list(got) == names
    for n in names:
        assert got[n] == original[n], n
    from safetensors import safe_open

    with safe_open(str(out), "np") as f:  # the reference parser accepts it
        assert sorted(f.keys()) == sorted(names)
        assert f.get_slice("typed.BF16").get_dtype() == "BF16"
        assert f.get_tensor("big").tobytes() == original["big"][2]
    assert sorted(os.listdir(tmp_path)) == ["part.safetensors"]


def test_extract_is_bit_identical_to_pytorch_source(taesd, tmp_path):
    out = tmp_path / "all.safetensors"
    with brevis.open(taesd) as ckpt:
        names = list(ckpt)
    brevis.extract(taesd, names, out, threads=2)
    got = read_safetensors(out)
    assert len(got) > 50 and all(dtype == "F16" for dtype, _, _ in got.values())
    # Every typed storage of the zip (stored uncompressed there) comes back as one tensor.
    with zipfile.ZipFile(PTH) as z:
        storages = sorted(z.read(n) for n in z.namelist() if "/data/" in n and z.getinfo(n).file_size >= 64)
    assert sorted(raw for _, _, raw in got.values()) == storages
    # And under its state-dict name, with its shape.
    torch = pytest.importorskip("torch")
    state = torch.load(PTH, map_location="cpu", weights_only=True)
    for name, (_, shape, raw) in got.items():
        t = state[name]
        assert list(t.shape) == shape and t.is_contiguous() and t.storage_offset() == 0
        assert t.untyped_storage().nbytes() == len(raw) and t.numpy().tobytes() == raw, name


def test_extract_names_across_files(two_files, tmp_path):
    out = tmp_path / "x.safetensors"
    brevis.extract(two_files, ["a/model.safetensors::layer.bias", "b/model.safetensors::layer.bias",
                               "only.here", "a/model.safetensors::norm.weight"], out)
    got = read_safetensors(out)
    # The same name twice keeps the keys; unique names stay bare.
    assert list(got) == ["a/model.safetensors::layer.bias", "b/model.safetensors::layer.bias",
                         "only.here", "norm.weight"]
    assert got["only.here"] == ("I32", [3], b"\x01\0\0\0\x02\0\0\0\x03\0\0\0")


def test_extract_refuses(many, tmp_path):
    _, archive = many
    out = tmp_path / "x.safetensors"
    out.write_bytes(b"keep")
    with pytest.raises(OutputExists):
        brevis.extract(archive, ["scalar"], out)
    assert out.read_bytes() == b"keep"
    brevis.extract(archive, ["scalar"], out, force=True)
    assert read_safetensors(out)["scalar"][2] == np.float32(-0.0).tobytes()
    with pytest.raises(UnknownTensor, match="'nope', 'nada'"):
        brevis.extract(archive, ["scalar", "nope", "nada"], tmp_path / "y.safetensors")
    with pytest.raises(InvalidArgument, match="does not exist"):
        brevis.extract(archive, ["scalar"], tmp_path / "no" / "y.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["x.safetensors"]


def test_extract_refuses_to_replace_its_own_archive(many, tmp_path, capsys):
    """`extract A.brv NAME -o A.brv -f` once replaced the archive it read (issue 16)."""
    _, archive = many
    before = archive.read_bytes()
    link = tmp_path / "link.brv"
    link.symlink_to(archive)
    for out in (archive, link):
        with pytest.raises(InvalidArgument, match="also an input"):
            brevis.extract(archive, ["scalar"], out, force=True)
    assert archive.read_bytes() == before
    code, _, err = run(capsys, "extract", archive, "scalar", "-o", archive, "-f")
    assert code == 2 and "also an input" in err and archive.read_bytes() == before


def run(capsys, *args) -> tuple[int, str, str]:
    """The CLI in this process: (exit code, stdout, stderr)."""
    from brevis.cli import main

    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_ls_and_extract(many, tmp_path, capsys):
    source, archive = many
    code, out, err = run(capsys, "ls", archive)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"config.json  [bytes]  {(source.parent / 'config.json').stat().st_size} bytes"
    tensors = len(read_safetensors(source))
    assert lines[1] == f"model.safetensors  [safetensors]  {source.stat().st_size} bytes  {tensors} tensors"
    assert "  big  F32[768x1024]  3145728" in lines and "  scalar  F32[]  4" in lines
    code, out, _ = run(capsys, "ls", archive, "--json")
    assert code == 0 and json.loads(out)["tensor_count"] == tensors

    out = tmp_path / "x.safetensors"
    code, stdout, err = run(capsys, "extract", archive, "big", "typed.BF16", "-o", out, "-q")
    assert code == 0 and stdout == "", err
    assert read_safetensors(out)["typed.BF16"] == read_safetensors(source)["typed.BF16"]
    code, _, err = run(capsys, "extract", archive, "big", "-o", out)
    assert code == 7 and "--force" in err
    code, stdout, _ = run(capsys, "extract", archive, "big", "-o", out, "-f", "--json")
    assert code == 0 and json.loads(stdout)["tensors"] == ["big"]
    assert sorted(os.listdir(tmp_path)) == ["x.safetensors"]


def test_cli_unknown_name(many, tmp_path):
    _, archive = many
    r = subprocess.run([sys.executable, "-m", "brevis", "extract", str(archive), "nope", "-o", str(tmp_path / "y")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"brevis: invalid argument: no tensor 'nope' in {archive} (`brevis ls {archive}` lists the names)"]
    assert os.listdir(tmp_path) == []
