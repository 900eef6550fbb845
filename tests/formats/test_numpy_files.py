"""NumPy .npy and .npz: arrays typed by their header, everything else left to discovery."""

from __future__ import annotations

import io

import numpy as np
import pytest
from formats_util import check_tiling, hostile, parse_bytes, roundtrip, tensors

import brevis
from brevis.formats import ParseError, layout, numpy_files

RNG = np.random.default_rng(7)
W = (RNG.standard_normal((96, 48)) * 0.05).astype(np.float32)


def npy(a: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    f = io.BytesIO()
    if version is None:
        np.save(f, a)
    else:
        np.lib.format.write_array(f, a, version=version)
    return f.getvalue()


@pytest.mark.parametrize("a", [W, W.astype(np.float16), W.astype(np.float64), np.arange(1000, dtype=np.int64),
                               np.arange(300, dtype=np.uint8), np.array([True, False] * 50), np.zeros((0, 4), np.float32),
                               np.float32(3.5).reshape(())], ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_npy_arrays_are_typed(a):
    data = npy(a)
    (t,) = tensors(parse_bytes(numpy_files, data, "x.npy"))
    assert (t.name, t.shape) == ("array", a.shape)
    assert t.dtype.itemsize == a.dtype.itemsize
    assert data[t.offset:t.end] == a.tobytes()


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_every_npy_version(version):
    (t,) = tensors(parse_bytes(numpy_files, npy(W, version), "x.npy"))
    assert t.dtype.name == "F32" and t.shape == W.shape


def test_fortran_order_is_the_transpose():
    a = np.asfortranarray(W)
    data = npy(a)
    (t,) = tensors(parse_bytes(numpy_files, data, "x.npy"))
    assert t.shape == (48, 96) and data[t.offset:t.end] == a.T.tobytes()


@pytest.mark.parametrize("a", [W.astype(">f4"), np.array([{"k": 1}], dtype=object),
                               np.zeros(4, dtype=[("x", "<f4"), ("y", "<i2")]), np.array(["ab", "cd"])],
                         ids=["big-endian", "object", "structured", "strings"])
def test_arrays_that_are_not_plain_numbers_go_to_discovery(a, tmp_path):
    data = npy(a) if a.dtype != object else _object_npy(a)
    with pytest.raises(ParseError):
        numpy_files.parse(io.BytesIO(data), len(data))
    fmt, segments = layout(io.BytesIO(data), len(data), "x.npy")
    assert fmt == "bytes"
    check_tiling(segments, len(data))


def _object_npy(a) -> bytes:
    f = io.BytesIO()
    np.save(f, a, allow_pickle=True)
    return f.getvalue()


def test_npz_members_are_named_and_typed(tmp_path):
    np.savez(tmp_path / "w.npz", weight=W, bias=np.arange(48, dtype=np.float32), half=W.astype(np.float16))
    data = (tmp_path / "w.npz").read_bytes()
    got = {t.name: t for t in tensors(parse_bytes(numpy_files, data, "w.npz"))}
    assert sorted(got) == ["bias", "half", "weight"]
    assert got["weight"].shape == W.shape and data[got["weight"].offset:got["weight"].end] == W.tobytes()
    np.savez_compressed(tmp_path / "c.npz", weight=W)  # deflated members: bytes, for discovery
    data = (tmp_path / "c.npz").read_bytes()
    with pytest.raises(ParseError):
        numpy_files.parse(io.BytesIO(data), len(data))


def test_round_trip_and_names_for_brevis_open(tmp_path):
    np.save(tmp_path / "a.npy", W)
    np.savez(tmp_path / "m.npz", weight=W, steps=np.arange(7, dtype=np.int64))
    info = roundtrip([tmp_path / "a.npy", tmp_path / "m.npz"], tmp_path, "numpy")
    assert {s["name"] for f in info["files"] for s in f["segments"] if s["dtype"] != "bytes"} == {
        "array", "weight", "steps"}
    with brevis.open(tmp_path / "a.brv") as a:
        assert a["weight"].tobytes() == W.tobytes()
        assert a["array"].tobytes() == W.tobytes()


def test_damaged_npy_files_parse_or_refuse():
    data = npy(W)
    seen = hostile(numpy_files, data, "x.npy", seed=3, region=(0, 140))
    assert seen.get("parsed", 0) and seen.get("error", 0), seen


def test_a_huge_header_is_refused():
    data = bytearray(npy(W, (2, 0)))
    data[8:12] = (1 << 30).to_bytes(4, "little")
    with pytest.raises(ParseError):
        numpy_files.parse(io.BytesIO(bytes(data)), len(data))
