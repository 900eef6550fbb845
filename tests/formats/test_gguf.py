"""GGUF v2/v3: metadata of every value type, plain and block-quantized tensors, alignment."""

from __future__ import annotations

import io
import random
import struct

import numpy as np
import pytest
from formats_util import corpus_files, hostile, parse_bytes, parse_file, roundtrip, tensors
from helpers import gguf_array as _array
from helpers import gguf_kv as _kv
from helpers import gguf_str as _str
from helpers import make_gguf

from brevis.formats import ParseError, gguf, layout


def sample():
    rng = np.random.default_rng(1)
    return [
        ("token_embd.weight", 1, (64, 10), rng.standard_normal((10, 64)).astype(np.float16).tobytes()),
        ("norm.weight", 0, (64,), rng.standard_normal(64).astype(np.float32).tobytes()),
        ("blk.0.q8", 8, (64, 3), rng.integers(0, 256, 3 * 2 * 34, dtype=np.uint8).tobytes()),
        ("blk.0.q4k", 12, (256, 2), rng.integers(0, 256, 2 * 144, dtype=np.uint8).tobytes()),
        ("blk.0.bf16", 30, (40,), rng.integers(0, 1 << 16, 40, dtype=np.uint16).tobytes()),
        ("blk.0.tiny", 0, (3,), rng.standard_normal(3).astype(np.float32).tobytes()),  # < MIN_TENSOR_BYTES
        ("blk.0.odd", 99, (5,), b"\x01" * 5),  # an unknown type: its bytes stay in a gap
        ("blk.0.i32", 26, (4, 8), np.arange(32, dtype=np.int32).tobytes()),
    ]


@pytest.mark.parametrize("alignment", [None, 64, 1])
@pytest.mark.parametrize("version", [2, 3])
def test_fixture(alignment, version):
    data = make_gguf(sample(), alignment=alignment, version=version)
    segs = parse_bytes(gguf, data, "m.gguf")
    by_name = {s.name: s for s in segs}
    assert (by_name["token_embd.weight"].dtype.name, by_name["token_embd.weight"].shape) == ("F16", (10, 64))
    assert (by_name["norm.weight"].dtype.name, by_name["norm.weight"].shape) == ("F32", (64,))
    assert by_name["blk.0.q8"].dtype is None and by_name["blk.0.q8"].length == 6 * 34
    assert by_name["blk.0.q4k"].dtype is None and by_name["blk.0.q4k"].length == 2 * 144
    assert by_name["blk.0.bf16"].dtype.name == "BF16"
    assert by_name["blk.0.i32"].shape == (8, 4)
    assert "blk.0.odd" not in by_name and "blk.0.tiny" not in by_name
    scores = by_name["metadata/tokenizer.ggml.scores"]
    assert scores.dtype.name == "F32" and scores.shape == (100,)
    assert np.frombuffer(data[scores.offset:scores.end], "<f4")[7] == np.float32(-1.0)
    assert "metadata/x.short" not in by_name
    for name, _, _, blob in sample():
        if name in by_name:
            s = by_name[name]
            assert data[s.offset:s.end] == blob


def test_detect():
    data = make_gguf(sample())
    assert gguf.detect(io.BytesIO(data), len(data), "anything")
    assert not gguf.detect(io.BytesIO(b"GGUF" + struct.pack("<I", 1) + bytes(40)), 48, "x.gguf")
    assert not gguf.detect(io.BytesIO(b"GGML" + bytes(44)), 48, "x.gguf")
    assert layout(io.BytesIO(data), len(data), "m.gguf")[0] == "gguf"


def test_long_vocabulary_crosses_the_read_window():
    # 200,000 tokens (about 2.6 MB) are skipped in one loop that reads
    # through the 1 MiB window and refills it: the tensors are still found.
    small = gguf.parse(io.BytesIO(make_gguf(sample())), len(make_gguf(sample())))
    data = make_gguf(sample(), vocabulary=200_000)
    assert len(data) > 2 * gguf._Reader.WINDOW
    big = gguf.parse(io.BytesIO(data), len(data))
    assert [(s.name, s.length) for s in big if s.dtype] == [(s.name, s.length) for s in small if s.dtype]


def _outcome(data: bytes) -> object:
    try:
        return gguf.parse(io.BytesIO(data), len(data))
    except ParseError:
        return "error"


def test_window_size_changes_nothing(monkeypatch):
    """Wherever the read window ends (in a length, in a string, between them), the vocabulary
    is skipped the same way, on the fixture, its prefixes and flipped copies."""
    data = make_gguf(sample())
    rng = random.Random(13)
    variants = [data] + [data[:rng.randrange(len(data))] for _ in range(100)]
    for _ in range(200):
        b = bytearray(data)
        i = rng.randrange(len(b) // 2)  # the header, where the vocabulary is
        b[i] = rng.randrange(256)
        variants.append(bytes(b))
    for v in variants:
        expect = _outcome(v)
        for window in (9, 13, 100):
            monkeypatch.setattr(gguf._Reader, "WINDOW", window)
            assert _outcome(v) == expect
        monkeypatch.undo()


@pytest.mark.skipif(gguf._layout is None, reason="the C extension is not built")
def test_the_compiled_walk_over_strings_is_the_loops():
    """_layout.skip_strings walks a window's length-prefixed strings as the
    Python loop does: where it stops (a length not whole in the buffer; a
    string's bytes past its end; a length that would pass 2^64) and how
    many it counted, from any offset, inside the buffer or past it."""
    rng = random.Random(5)
    for _ in range(2000):
        parts = []
        for _ in range(rng.randrange(6)):
            n = rng.choice([0, 1, 7, rng.randrange(40), rng.randrange(1 << 64), (1 << 64) - rng.randrange(1, 20)])
            parts.append(struct.pack("<Q", n) + bytes(min(n, rng.randrange(48))))
        buf = b"".join(parts)
        buf = buf[:rng.randrange(len(buf) + 1)] if rng.random() < 0.5 else buf
        off, count = rng.randrange(len(buf) + 10), rng.randrange(8)
        off = 0 if rng.random() < 0.5 else off
        assert gguf._layout.skip_strings(buf, off, count) == gguf._walk_strings_py(buf, off, count)


def test_the_python_walk_over_strings_parses_alike(monkeypatch):
    """Without the extension the loop walks the vocabulary: the same
    outcome on the fixture, its prefixes and flipped copies, at any window."""
    data = make_gguf(sample())
    rng = random.Random(17)
    variants = [data] + [data[:rng.randrange(len(data))] for _ in range(40)]
    for _ in range(60):
        b = bytearray(data)
        b[rng.randrange(len(b) // 2)] = rng.randrange(256)
        variants.append(bytes(b))
    for v in variants:
        expect = _outcome(v)
        monkeypatch.setattr(gguf, "_walk_strings", gguf._walk_strings_py)
        for window in (9, 100, gguf._Reader.WINDOW):
            monkeypatch.setattr(gguf._Reader, "WINDOW", window)
            assert _outcome(v) == expect
        monkeypatch.undo()


@pytest.mark.parametrize("mutate", ["huge_kv", "huge_tensors", "huge_string", "huge_array", "huge_token",
                                    "bad_alignment",
                                    "misfit_block", "tensor_past_end", "overlap", "too_many_dims", "bad_vtype"])
def test_malformed(mutate):
    t = sample()[:2]
    if mutate == "misfit_block":
        t = [("q", 8, (33,), b"\0" * 34)]
    if mutate == "tensor_past_end":
        t = [("a", 0, (1000,), b"\0" * 16)]
    data = bytearray(make_gguf(t, alignment=0 if mutate == "bad_alignment" else None))
    kv_at = 24
    if mutate == "huge_kv":
        struct.pack_into("<Q", data, 16, 1 << 60)
    elif mutate == "huge_tensors":
        struct.pack_into("<Q", data, 8, 1 << 40)
    elif mutate == "huge_string":
        struct.pack_into("<Q", data, kv_at, 1 << 62)
    elif mutate == "huge_token":  # one token of the vocabulary claims more bytes than the file has
        at = data.find(b"tok7") - 8
        struct.pack_into("<Q", data, at, 1 << 40)
    elif mutate == "huge_array":
        at = data.find(b"tokenizer.ggml.scores") + len("tokenizer.ggml.scores") + 4 + 4
        struct.pack_into("<Q", data, at, 1 << 61)
    elif mutate == "overlap":
        at = data.find(b"norm.weight") + len("norm.weight") + 4 + 8 + 4
        struct.pack_into("<Q", data, at, 0)
    elif mutate == "too_many_dims":
        at = data.find(b"norm.weight") + len("norm.weight")
        struct.pack_into("<I", data, at, 1000)
    elif mutate == "bad_vtype":
        struct.pack_into("<I", data, kv_at + 8 + len("general.architecture"), 77)
    with pytest.raises(ParseError):
        gguf.parse(io.BytesIO(bytes(data)), len(data))
    assert layout(io.BytesIO(bytes(data)), len(data), "m.gguf")[0] == "bytes"


def test_hostile():
    data = make_gguf(sample())
    seen = hostile(gguf, data, "m.gguf", seed=11, cuts=300, flips=600)
    assert seen.get("error", 0) > 0 and seen.get("parsed", 0) > 0


def test_fixture_roundtrip(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.gguf").write_bytes(make_gguf(sample(), alignment=64))
    roundtrip([src / "m.gguf"], tmp_path, "gguf")


EXPECTED_CORPUS = {
    "nomic-embed-v1.5-f16/*.gguf": ({"F16", "F32"}, 0.99),
    "smollm2-135m-q4_1/*.gguf": ({"F32"}, 0.0),
    "gemma3-270m-q4km/*.gguf": ({"F32"}, 0.0),
}


@pytest.mark.parametrize("pattern", sorted(EXPECTED_CORPUS))
def test_corpus(pattern):
    kinds, float_share = EXPECTED_CORPUS[pattern]
    for p in corpus_files(pattern):
        segs = parse_file(gguf, p)
        weights = [s for s in segs if not s.name.startswith(("metadata/", "__"))]
        assert len(weights) > 100
        assert {s.dtype.name for s in tensors(weights)} <= kinds
        data_section = p.stat().st_size - min(s.offset for s in weights)
        assert sum(s.length for s in weights) > 0.99 * data_section  # only alignment padding between
        assert sum(s.length for s in tensors(weights)) >= float_share * data_section


def test_corpus_hostile_header():
    """Cut-down real headers: the metadata parses (or not), nothing else escapes."""
    for p in corpus_files("*/*.gguf")[:2]:
        with open(p, "rb") as f:
            data = f.read(256 << 10)
        hostile(gguf, data, p.name, seed=12, cuts=40, flips=40, region=(0, 4096))
