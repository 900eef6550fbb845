"""PyTorch checkpoints: zip archives (torch.save, TorchScript) and legacy pickles."""

from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest
from formats_util import (check_tiling, corpus_files, hostile, parse_bytes, parse_file, roundtrip,
                          taesd_files, tensors)
from torch_util import EXPECT, Storage, Tensor, make_legacy, make_zip, pickle_storages, sample_tensors

from brevis.formats import ParseError, layout, pytorch

# ---------------------------------------------------------------------------- synthetic


@pytest.mark.parametrize("protocol", [2, 4])
@pytest.mark.parametrize("compress_pkl", [False, True])
def test_zip_fixture(fake_torch, protocol, compress_pkl):
    data = make_zip(fake_torch, sample_tensors(), protocol=protocol, compress_pkl=compress_pkl)
    segs = tensors(parse_bytes(pytorch, data, "model.pt"))
    got = [(s.dtype.name, s.shape) for s in segs]
    assert got == list(EXPECT.values())
    for s, (name, (cls, arr)) in zip(segs, [(k, v) for k, v in sample_tensors().items() if k in EXPECT]):
        assert data[s.offset:s.end] == arr.tobytes()
        assert s.name == name  # the state-dict key names the storage


def test_small_tensors_stay_bytes(fake_torch, monkeypatch):
    data = make_zip(fake_torch, sample_tensors())
    monkeypatch.setattr(pytorch, "MIN_TENSOR_BYTES", 0)
    got = [(s.dtype.name, s.shape) for s in tensors(parse_bytes(pytorch, data, "m.pt"))]
    assert ("I64", ()) in got and len(got) == len(EXPECT) + 1


def test_zip_detect_without_extension(fake_torch):
    data = make_zip(fake_torch, sample_tensors())
    assert pytorch.detect(io.BytesIO(data), len(data), "weights")
    fmt, _ = layout(io.BytesIO(data), len(data), "weights")
    assert fmt == "pytorch"


def test_shared_storage_and_views_fall_back_to_flat_shape(fake_torch):
    arr = np.arange(24, dtype=np.float32)
    st = Storage(fake_torch.FloatStorage, "0", 24)
    obj = {"a": Tensor(st, 0, (4, 6), (6, 1)), "b": Tensor(st, 6, (3,), (1,))}
    pkl = pickle_storages(obj, lambda s: ("storage", s.cls, s.key, "cpu", s.numel))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("m/data.pkl", pkl)
        z.writestr("m/data/0", arr.tobytes())
    segs = tensors(parse_bytes(pytorch, buf.getvalue(), "m.pt"))
    assert [(s.dtype.name, s.shape) for s in segs] == [("F32", (24,))]


def test_length_not_a_multiple_of_itemsize_is_bytes(fake_torch):
    data = make_zip(fake_torch, {"x": ("FloatStorage", np.zeros(40, np.float32))})
    # rewrite the member with 15 bytes: rebuild the zip by hand
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(buf, "w") as z:
        for info in src.infolist():
            body = src.read(info)
            z.writestr(info.filename, body[:155] if info.filename.endswith("/data/0") else body)
    segs = parse_bytes(pytorch, buf.getvalue(), "m.pt")
    (seg,) = [s for s in segs if s.name == "x"]
    assert seg.dtype is None and seg.length == 155


def test_deflated_storage_is_not_a_tensor(fake_torch):
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(make_zip(fake_torch, sample_tensors()))) as src, \
            zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info))
    assert tensors(parse_bytes(pytorch, buf.getvalue(), "m.pt")) == []


def test_zip_without_data_pkl_is_bytes():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a/readme.txt", b"hello" * 100)
    data = buf.getvalue()
    with pytest.raises(ParseError):
        pytorch.parse(io.BytesIO(data), len(data))
    fmt, segs = layout(io.BytesIO(data), len(data), "x.pt")
    assert fmt == "bytes" and len(segs) == 1


def test_never_unpickles(fake_torch, tmp_path):
    marker = tmp_path / "pwned"
    evil = (b"\x80\x02cos\nsystem\nq\x00X" + struct.pack("<I", len(f"touch {marker}"))
            + f"touch {marker}".encode() + b"\x85R.")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a/data.pkl", evil)
        z.writestr("a/data/0", b"\0" * 64)
    data = buf.getvalue()
    segs = parse_bytes(pytorch, data, "evil.pt")
    assert tensors(segs) == [] and not marker.exists()
    legacy = make_legacy(fake_torch, {"x": ("FloatStorage", np.ones(3, np.float32))})
    parse_bytes(pytorch, legacy, "evil.pt")
    assert not marker.exists()


def test_legacy_fixture(fake_torch):
    data = make_legacy(fake_torch, sample_tensors())
    segs = tensors(parse_bytes(pytorch, data, "old.pth"))
    assert [(s.dtype.name, s.shape) for s in segs] == list(EXPECT.values())
    for s, (cls, arr) in zip(segs, [v for k, v in sample_tensors().items() if k in EXPECT]):
        assert data[s.offset:s.end] == arr.tobytes()
        assert struct.unpack("<q", data[s.offset - 8:s.offset])[0] == arr.size


def test_legacy_pickles_longer_than_the_first_read(fake_torch, monkeypatch):
    data = make_legacy(fake_torch, sample_tensors())
    expect = parse_bytes(pytorch, data, "old.pth")
    monkeypatch.setattr(pytorch, "LEGACY_PREFIX", 50)
    assert parse_bytes(pytorch, data, "old.pth") == expect


def test_legacy_count_mismatch_is_an_error(fake_torch):
    data = bytearray(make_legacy(fake_torch, {"x": ("FloatStorage", np.ones(3, np.float32))}))
    at = len(data) - 12 - 8
    assert struct.unpack_from("<q", data, at)[0] == 3  # checked even for a tensor too small to keep
    struct.pack_into("<q", data, at, 4)
    with pytest.raises(ParseError):
        pytorch.parse(io.BytesIO(bytes(data)), len(data))


def test_fixture_roundtrip(fake_torch, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "new.pt").write_bytes(make_zip(fake_torch, sample_tensors()))
    (src / "old.pth").write_bytes(make_legacy(fake_torch, sample_tensors()))
    roundtrip([src / "new.pt", src / "old.pth"], tmp_path, "pytorch")


def test_hostile_zip(fake_torch):
    data = make_zip(fake_torch, sample_tensors())
    seen = hostile(pytorch, data, "m.pt", seed=1)
    assert seen.get("error", 0) > 0
    # flips aimed at the pickle and the central directory, where they matter
    hostile(pytorch, data, "m.pt", seed=2, cuts=0, flips=300, region=(0, 2000))
    hostile(pytorch, data, "m.pt", seed=3, cuts=0, flips=300, region=(data.find(b"PK\x01\x02"), len(data)))


def test_hostile_legacy(fake_torch):
    data = make_legacy(fake_torch, sample_tensors())
    seen = hostile(pytorch, data, "m.pth", seed=4, region=(0, len(data) - 900))
    assert seen.get("error", 0) > 0


# ------------------------------------------------------------------------------ corpus


def test_taesd_all_f16():
    for p in taesd_files():
        segs = parse_file(pytorch, p)
        ts = tensors(segs)
        assert len(ts) > 50
        assert {s.dtype.name for s in ts} == {"F16"}
        assert sum(s.length for s in ts) > 0.98 * p.stat().st_size
        assert any(len(s.shape) == 4 for s in ts)


def test_taesd_roundtrip(tmp_path):
    p = min(taesd_files(), key=lambda p: p.stat().st_size)
    info = roundtrip([p], tmp_path, "pytorch")
    (f,) = info["files"]
    assert {s["dtype"] for s in f["segments"]} == {"F16", "bytes"}
    assert f["stored_bytes"] < f["original_bytes"]


def test_taesd_hostile():
    p = min(taesd_files(), key=lambda p: p.stat().st_size)
    data = p.read_bytes()
    # the pickle and the central directory hold all the structure; cut anywhere
    hostile(pytorch, data, p.name, seed=5, cuts=40, flips=0)
    hostile(pytorch, data, p.name, seed=6, cuts=0, flips=50, region=(0, 12000))
    hostile(pytorch, data, p.name, seed=7, cuts=0, flips=30, region=(data.find(b"PK\x01\x02"), len(data)))


EXPECTED_CORPUS = {
    "astra-i3d-resnet152/*.pt": {"BF16", "I64"},
    "pocketnet-v3/*.pt": {"F32"},
    "easyocr-en/*.pth": {"F32", "I64"},
    "silero-vad-v6/*.jit": {"F32"},
    "resemblyzer/*.pt": {"F32"},
}


@pytest.mark.parametrize("pattern", sorted(EXPECTED_CORPUS))
def test_corpus(pattern):
    for p in corpus_files(pattern):
        segs = parse_file(pytorch, p)
        ts = tensors(segs)
        assert ts, p.name
        assert {s.dtype.name for s in ts} <= EXPECTED_CORPUS[pattern]
        share = sum(s.length for s in ts) / p.stat().st_size
        assert share > (0.9 if p.suffix == ".jit" else 0.98), (p.name, share)


def test_corpus_legacy_hostile():
    (p,) = corpus_files("resemblyzer/*.pt")
    with open(p, "rb") as f:
        data = f.read(64 << 10)
    # a cut-down copy: the pickles parse, the storages run past the end
    assert pytorch.detect(io.BytesIO(data), len(data), p.name)
    hostile(pytorch, data, p.name, seed=8, cuts=60, flips=100, region=(0, 6000))


def test_size_check_layout_agrees():
    p = taesd_files()[0]
    size = p.stat().st_size
    with open(p, "rb") as f:
        fmt, segs = layout(f, size, p.name)
    assert fmt == "pytorch"
    check_tiling(segs, size)


def test_detect_is_specific():
    assert not pytorch.detect(io.BytesIO(b"GGUF" + bytes(60)), 64, "x.gguf")
    assert not pytorch.detect(io.BytesIO(bytes(64)), 64, "x.pt")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("word/document.xml", b"<x/>")
    data = buf.getvalue()
    assert not pytorch.detect(io.BytesIO(data), len(data), "report.docx")
