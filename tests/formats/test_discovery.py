"""Structure found in bytes no parser typed (issue 13): the same tensors
as a safetensors file, as bare arrays behind a made-up header at any
offset, and as a safetensors file whose header was damaged, come within
1 % of the parsed size; whatever discovery guesses, every byte comes back."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from safetensors.numpy import save_file

import brevis
from brevis.formats import discovery, layout

RNG = np.random.default_rng(3)
TENSORS = {f"l{i}.weight": (RNG.standard_normal((256, 512)) * 0.02).astype(np.float32) for i in range(4)}
TENSORS["l4.half"] = (RNG.standard_normal((256, 256)) * 0.05).astype(np.float16)


def compressed(path, tmp_path) -> int:
    out = tmp_path / (path.name + ".brv")
    brevis.compress([path], out)
    assert brevis.verify(out, sources=[path])["ok"]
    return out.stat().st_size


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    path = tmp_path_factory.mktemp("parsed") / "model.safetensors"
    save_file(TENSORS, path)
    return path


@pytest.mark.parametrize("header", [0, 1, 2, 3, 13, 4096 + 7])
def test_bare_arrays_behind_a_made_up_header(parsed, tmp_path, header):
    raw = b"".join(v.tobytes() for v in TENSORS.values())
    path = tmp_path / "model.bin"
    path.write_bytes(b"MYFMT" + bytes(range(256)) * 20 if header > 4096 else b"\x07" * header)
    if header > 4096:
        path.write_bytes(path.read_bytes()[:header] + raw)
    else:
        path.write_bytes(b"\x07" * header + raw)
    assert compressed(path, tmp_path) <= compressed(parsed, tmp_path) * 1.01


def test_a_safetensors_file_whose_header_was_damaged(parsed, tmp_path):
    data = bytearray(parsed.read_bytes())
    data[8] = ord("[")  # the JSON header no longer parses
    path = tmp_path / "damaged.safetensors"
    path.write_bytes(bytes(data))
    with open(path, "rb") as f:
        assert layout(f, len(data), path.name)[0] == "bytes"
    assert compressed(path, tmp_path) <= compressed(parsed, tmp_path) * 1.01


def test_parsers_can_be_switched_off(parsed, tmp_path, monkeypatch):
    with_parsers = compressed(parsed, tmp_path)
    monkeypatch.setenv("BREVIS_PARSERS", "off")
    with open(parsed, "rb") as f:
        fmt, segments = layout(f, parsed.stat().st_size, parsed.name)
    assert fmt == "bytes" and all(s.dtype is None for s in segments)
    (tmp_path / "off").mkdir()
    assert compressed(parsed, tmp_path / "off") <= with_parsers * 1.01


@pytest.mark.parametrize("make", [
    lambda n: RNG.integers(0, 256, n, dtype=np.uint8).tobytes(),  # noise: no phase wins
    lambda n: (b"the quick brown fox " * n)[:n],  # text
    lambda n: np.arange(n // 4, dtype=np.uint32).tobytes()[1:],  # a counter, one byte off
])
def test_whatever_discovery_guesses_every_byte_comes_back(tmp_path, make):
    data = make(1 << 17)
    segments = discovery.cut(io.BytesIO(data), len(data))
    assert sum(s.length for s in segments) == len(data) and segments[0].offset == 0
    path = tmp_path / "blob"
    path.write_bytes(data)
    brevis.compress([path], tmp_path / "blob.brv")
    brevis.decompress(tmp_path / "blob.brv", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == data if (tmp_path / "out").is_file() else \
        (tmp_path / "out" / "blob").read_bytes() == data


def test_the_phase_of_floats():
    words = (RNG.standard_normal(1 << 16) * 0.02).astype(np.float32).tobytes()
    for p in range(4):
        assert discovery.phase(np.frombuffer(b"\x00" * p + words, dtype=np.uint8)[:1 << 18]) == p
    # F16 needs no phase: its low byte is 8 bits of mantissa, so its words
    # read one byte off cost what aligned ones do (the header tests above
    # hold an F16 tensor).
