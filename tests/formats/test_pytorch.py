"""PyTorch checkpoints: zip archives (torch.save, TorchScript) and legacy pickles."""

from __future__ import annotations

import collections
import io
import pickle
import random
import struct
import sys
import types
import zipfile

import numpy as np
import pytest
from formats_util import (check_tiling, corpus_files, hostile, parse_bytes, parse_file, roundtrip,
                          taesd_files, tensors)

from brevis.formats import ParseError, layout, pytorch

# ------------------------------------------------------------ fixtures: fake torch for pickling


class _Storage:
    def __init__(self, cls, key: str, numel: int):
        self.cls, self.key, self.numel = cls, key, numel


class _Tensor:
    def __init__(self, storage: _Storage, offset: int, size: tuple, stride: tuple):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self):
        return sys.modules["torch._utils"]._rebuild_tensor_v2, self.args


@pytest.fixture
def fake_torch(monkeypatch):
    """Just enough of a `torch` module for pickle to name its classes (nothing is loaded back)."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):  # pragma: no cover - never called
        raise AssertionError("unpickled")

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    torch._utils = utils
    for name in pytorch.STORAGE_DTYPES:
        cls = type(name, (), {"__module__": "torch"})
        setattr(torch, name, cls)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)
    return torch


def _pickle(obj, pid, protocol: int = 2) -> bytes:
    class P(pickle.Pickler):
        def persistent_id(self, o):
            return pid(o) if isinstance(o, _Storage) else None

    buf = io.BytesIO()
    P(buf, protocol=protocol).dump(obj)
    return buf.getvalue()


def make_zip(torch, tensors_: dict, *, prefix="archive", compress_pkl=False, protocol=2,
             extra: dict | None = None) -> bytes:
    """A torch.save-like zip: name -> (storage class name, np array) stored members, 64-aligned."""
    state = collections.OrderedDict()
    members = {}
    for i, (name, (cls, arr)) in enumerate(tensors_.items()):
        st = _Storage(getattr(torch, cls), str(i), arr.size)
        state[name] = _Tensor(st, 0, arr.shape, tuple(s // arr.itemsize for s in arr.strides))
        members[f"{prefix}/data/{i}"] = arr.tobytes()
    pkl = _pickle(state, lambda s: ("storage", s.cls, s.key, "cpu", s.numel), protocol)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(zipfile.ZipInfo(f"{prefix}/data.pkl"), pkl,
                   zipfile.ZIP_DEFLATED if compress_pkl else zipfile.ZIP_STORED)
        z.writestr(f"{prefix}/byteorder", b"little")
        for name, data in {**members, **(extra or {})}.items():
            info = zipfile.ZipInfo(name)
            pad = -(buf.tell() + 30 + len(name) + 4) % 64  # torch aligns storages to 64
            info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
            z.writestr(info, data, zipfile.ZIP_STORED)
        z.writestr(f"{prefix}/version", b"3\n")
    return buf.getvalue()


def make_legacy(torch, tensors_: dict) -> bytes:
    """A pre-1.6 torch.save: five pickles, then each storage as int64 count + elements."""
    state = collections.OrderedDict()
    keys, blobs = [], []
    for i, (name, (cls, arr)) in enumerate(tensors_.items()):
        key = str(1000 + i)
        st = _Storage(getattr(torch, cls), key, arr.size)
        state[name] = _Tensor(st, 0, arr.shape, tuple(s // arr.itemsize for s in arr.strides))
        keys.append(key)
        blobs.append(struct.pack("<q", arr.size) + arr.tobytes())
    out = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
    out += pickle.dumps(1001, protocol=2)
    out += pickle.dumps({"protocol_version": 1001, "little_endian": True,
                         "type_sizes": {"short": 2, "int": 4, "long": 8}}, protocol=2)
    out += _pickle(state, lambda s: ("storage", s.cls, s.key, "cpu", s.numel, None))
    out += pickle.dumps(keys, protocol=2)
    return out + b"".join(blobs)


def sample_tensors():
    rng = np.random.default_rng(0)
    return {
        "conv.weight": ("HalfStorage", rng.standard_normal((8, 4, 3, 3)).astype(np.float16)),
        "conv.bias": ("FloatStorage", rng.standard_normal(16).astype(np.float32)),
        "bn.num_batches_tracked": ("LongStorage", np.array(7, dtype=np.int64)),
        "emb": ("BFloat16Storage", rng.integers(0, 1 << 16, (16, 5), dtype=np.uint16)),
        "mask": ("BoolStorage", rng.integers(0, 2, 100).astype(np.bool_)),
        "q": ("CharStorage", rng.integers(-128, 128, 65, dtype=np.int8)),
    }


# num_batches_tracked (8 bytes) is under MIN_TENSOR_BYTES: it stays in the bytes around it
EXPECT = {"conv.weight": ("F16", (8, 4, 3, 3)), "conv.bias": ("F32", (16,)),
          "emb": ("BF16", (16, 5)), "mask": ("BOOL", (100,)), "q": ("I8", (65,))}


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
    st = _Storage(fake_torch.FloatStorage, "0", 24)
    obj = {"a": _Tensor(st, 0, (4, 6), (6, 1)), "b": _Tensor(st, 6, (3,), (1,))}
    pkl = _pickle(obj, lambda s: ("storage", s.cls, s.key, "cpu", s.numel))
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


def _walk_outcome(data: bytes, start: int, fast: bool) -> str:
    try:
        return repr(pytorch._walk(data, start, fast=fast))  # repr: memo can make lists recursive
    except Exception as e:  # the same failure, message included: legacy reads grow on it
        return f"{type(e).__name__}: {e}"


def check_fast_walk(data: bytes, start: int = 0, *, seed: int, cuts: int = 50, flips: int = 200) -> None:
    """The fast walk finds what the genops walk finds, or fails the same way, on `data`,
    its prefixes and copies with bytes flipped."""
    rng = random.Random(seed)
    variants = [data] + [data[:rng.randrange(start, len(data))] for _ in range(cuts)]
    for _ in range(flips):
        b = bytearray(data)
        for _ in range(rng.choice((1, 2, 4))):
            i = rng.randrange(start, len(b))
            b[i] = rng.randrange(256) if rng.random() < 0.5 else b[i] ^ (1 << rng.randrange(8))
        variants.append(bytes(b))
    for v in variants:
        assert _walk_outcome(v, start, True) == _walk_outcome(v, start, False)


@pytest.mark.filterwarnings("ignore:invalid escape sequence")  # a flipped GLOBAL, in pickletools
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_fast_walk_matches_genops(fake_torch, protocol):
    arr = np.arange(24, dtype=np.float32)
    st = _Storage(fake_torch.FloatStorage, "0", 24)
    obj = {"a": _Tensor(st, 0, (4, 6), (6, 1)), "b": [_Tensor(st, 6, (3,), (1,)), 1.5, -7, 1 << 40],
           "c": (True, None, b"raw", "x" * 300, {1, 2}), "d": [arr.dtype.name] * 3}
    pkl = _pickle(obj, lambda s: ("storage", s.cls, s.key, "cpu", s.numel), protocol)
    assert _walk_outcome(pkl, 0, True).startswith("_Walk(")
    check_fast_walk(pkl, seed=protocol)


def test_fast_walk_matches_genops_legacy(fake_torch):
    data = make_legacy(fake_torch, sample_tensors())
    start = 0
    for _ in range(3):  # the pickles before the state dict
        start = pytorch._walk(data, start).end
    check_fast_walk(data, start, seed=9)


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
    with zipfile.ZipFile(p) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        check_fast_walk(z.read(name), seed=10, cuts=20, flips=100)


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
