#!/usr/bin/env python3
"""Write a golden archive: tests/golden/<version>/{source/, archive.brv, SHA256SUMS, EMPTY_DIRS}.

Run once per archive format version, with the Brevis of that version, and
commit the result. tests/archive/test_golden.py decodes every committed
golden archive with the current code and compares the SHA-256 of every
file; it never regenerates them. This script refuses to overwrite a golden
folder unless --force is given (only ever for a version not yet released).

    python scripts/make_golden.py            # writes tests/golden/v1
    python scripts/make_golden.py --version v2
    python scripts/make_golden.py --version v4     # wide `ans` blocks
    python scripts/make_golden.py --version v5     # the `lzma` leaf
    python scripts/make_golden.py --version v6     # the `view` operator
    python scripts/make_golden.py --version v7     # chunks checked with XXH3-128
    python scripts/make_golden.py --version v8     # gathered tensors
    python scripts/make_golden.py --version v9     # the index's program table (v8's source)
    python scripts/make_golden.py --productions   # tests/golden/v1/productions/<id>.json

The source folder is deterministic: a safetensors file with one tensor per
dtype (special float values included), an empty and a scalar tensor and a
few larger tensors that give the search something to find; a config.json;
a file that is not a tensor; an empty file; files in a subfolder; and an
empty folder (git does not keep empty folders: EMPTY_DIRS lists them and
the test checks they come back).

--productions writes one fixture per registered production (operator or
coder leaf) that has none yet: small programs using it, the inputs, the
streams today's code writes and the SHA-256 of the decoded bytes; see
PRODUCTION_CASES. tests/archive/test_golden_productions.py decodes every
fixture and re-encodes its input. A fixture that exists is never
rewritten (open mode "x"), whatever the options: to remake one, delete it
by hand, and only if no released Brevis wrote archives using it.
"""

from __future__ import annotations

import argparse
import hashlib
import functools
import json
import os
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import zstandard

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import brevis  # noqa: E402
from brevis.dsl import REGISTRY, Lzma, Program, decode, encode  # noqa: E402
from brevis.dsl.types import Field, Tensor, tensor  # noqa: E402
from brevis.dtypes import DTYPES  # noqa: E402

EMPTY_DIRS = ["empty_dir", "sub/empty_too"]


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]], metadata: dict) -> None:
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, data in tensors.values():
            f.write(data)


def specials(name: str) -> list[int]:
    d = DTYPES[name]
    b = d.bits
    if d.is_float:
        e, m = d.exponent_bits, d.mantissa_bits
        sign, exp, man = 1 << (e + m), ((1 << e) - 1) << m, (1 << m) - 1
        out = []
        for s in (0, sign):
            out += [s, s | exp, s | exp | 1, s | exp | (1 << (m - 1)), s | exp | man, s | 1, s | man,
                    s | (1 << m), s | (exp - 1), s | (((1 << (e - 1)) - 1) << m)]
        return out
    if d.kind == "bool":
        return [0, 1]
    return [0, 1, (1 << b) - 1, 1 << (b - 1), (1 << (b - 1)) - 1]  # 0, 1, -1, min, max


def per_dtype(name: str, rng: np.random.Generator, n: int = 64) -> bytes:
    d = DTYPES[name]
    s = specials(name)
    if d.kind == "bool":
        rest = rng.integers(0, 2, n - len(s), dtype=np.uint64)
    elif d.bits == 64:
        rest = rng.integers(0, 1 << 64, n - len(s), dtype=np.uint64, endpoint=False)
    else:
        rest = rng.integers(0, 1 << d.bits, n - len(s), dtype=np.uint64)
    return np.concatenate([np.array(s, np.uint64), rest]).astype(d.uint).tobytes()


def build_source_gathered(root: Path) -> None:
    """Version 3 (gathered byte spans): a small PyTorch checkpoint (a zip
    whose pickle framing lies between its tensors: the spans Brevis
    gathers), a config.json and the empty folders. Needs torch."""
    import torch

    g = torch.Generator().manual_seed(20261201)
    state = {f"block{i}.{part}": torch.randn(shape, generator=g).to(dtype)
             for i in range(6) for part, shape, dtype in (("weight", (16, 24), torch.float16),
                                                          ("bias", (16,), torch.float32),
                                                          ("scale", (24,), torch.bfloat16))}
    state["steps"] = torch.tensor([1234], dtype=torch.int64)
    torch.save(state, root / "model.pth")
    (root / "config.json").write_text(json.dumps({"blocks": 6, "dtype": "float16"}, indent=2) + "\n")
    for d in EMPTY_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)


def build_source_wide(root: Path) -> None:
    """Version 4 (wide `ans` blocks): a safetensors file whose BF16 weights
    (257 x 257: a block of more than 2**16 values, not a whole number of
    groups of 32) and 4-bit codes take wide blocks, beside a small tensor
    that keeps four states; a config.json and the empty folders."""
    rng = np.random.default_rng(20261202)
    w = (rng.standard_normal((257, 257)) * 0.02).astype(np.float32)
    codes = (rng.integers(0, 16, 66_000) * (rng.random(66_000) < 0.7)).astype(np.uint8)  # 4-bit, mostly 0
    tensors = {
        "layer.weight": ("BF16", [257, 257], bf16(w.ravel()).tobytes()),
        "layer.codes": ("U8", [66_000], codes.tobytes()),
        "norm.weight": ("F32", [257], (1 + rng.standard_normal(257) * 0.1).astype(np.float32).tobytes()),
    }
    write_safetensors(root / "model.safetensors", tensors, {"format": "pt", "golden": "v4"})
    (root / "config.json").write_text(json.dumps({"hidden_size": 257, "torch_dtype": "bfloat16"}, indent=2) + "\n")
    for d in EMPTY_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)


def build_source_lzma(root: Path) -> None:
    """Version 5 (the `lzma` leaf): a file in a made-up format no parser
    knows (names and lengths between F32 arrays that start at odd offsets,
    zero padding to 256 bytes after each, the last three arrays copies of
    the first three), whose bytes LZMA codes best, beside a safetensors file of ordinary weights; a config.json and
    the empty folders."""
    rng = np.random.default_rng(20261203)
    parts = [b"MADEUP\x00\x02"]
    kernels = [(rng.standard_normal(1500 + 100 * i) * 0.05).astype(np.float32) for i in range(3)]
    for i in range(6):  # blocks 3 to 5 repeat 0 to 2 (tied weights)
        name = f"block{i}.conv.weight".encode()
        w = kernels[i % 3]
        parts += [len(name).to_bytes(1, "little"), name, (w.size).to_bytes(4, "little"), w.tobytes()]
        parts.append(bytes(-sum(map(len, parts)) % 256))
    (root / "weights.madeup").write_bytes(b"".join(parts))
    w = (rng.standard_normal((64, 96)) * 0.02).astype(np.float32)
    write_safetensors(root / "model.safetensors", {"layer.weight": ("BF16", [64, 96], bf16(w.ravel()).tobytes())},
                      {"format": "pt", "golden": "v5"})
    (root / "config.json").write_text(json.dumps({"hidden_size": 96, "torch_dtype": "bfloat16"}, indent=2) + "\n")
    for d in EMPTY_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)


def build_source_view(root: Path) -> None:
    """Version 6 (the `view` operator): a file in a made-up format no
    parser knows whose F32 weights (dequantized int8: a few mantissas per
    exponent) lie between names, on 8-byte words, which the search reads
    as typed tensors; beside it a safetensors file, a config.json and the
    empty folders."""
    rng = np.random.default_rng(20261204)
    parts = [b"MADEUP6\x00"]
    for i, n in enumerate((4096, 2048, 1024)):
        name = f"layer{i}.weight".encode().ljust(24, b"\x00")
        k = np.clip(np.round(rng.laplace(0, 12, n)), -127, 127)
        w = bits_of((k * (0.05 / 127)).astype(np.float32))
        parts += [name, n.to_bytes(8, "little"), w.tobytes()]
    (root / "weights.madeup").write_bytes(b"".join(parts))
    w = (rng.standard_normal((32, 64)) * 0.02).astype(np.float32)
    write_safetensors(root / "model.safetensors", {"layer.weight": ("BF16", [32, 64], bf16(w.ravel()).tobytes())},
                      {"format": "pt", "golden": "v6"})
    (root / "config.json").write_text(json.dumps({"hidden_size": 64, "torch_dtype": "bfloat16"}, indent=2) + "\n")
    for d in EMPTY_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)


def build_source_members(root: Path, version: str = "v8") -> None:
    """Version 8 (gathered tensors): a safetensors file whose small F32 and
    BF16 tensors (biases, norms, scales, a scalar) are gathered, by dtype,
    beside a weight too large to gather, an empty tensor and a norm
    that a second file repeats (stored once, alone); a config.json and
    the empty folders."""
    rng = np.random.default_rng(20261205)
    tensors: dict[str, tuple[str, list[int], bytes]] = {}
    w = (rng.standard_normal((144, 64)) * 0.02).astype(np.float32)
    tensors["embed.weight"] = ("BF16", [144, 64], bf16(w.ravel()).tobytes())
    for i in range(6):
        tensors[f"block{i}.bias"] = ("F32", [96], (rng.standard_normal(96) * 0.01).astype(np.float32).tobytes())
        tensors[f"block{i}.norm.weight"] = ("F32", [64], (1 + rng.standard_normal(64) * 0.05).astype(np.float32)
                                            .tobytes())
        tensors[f"block{i}.scale"] = ("BF16", [8, 4], bf16((rng.standard_normal(32) * 0.1).astype(np.float32))
                                      .tobytes())
    tensors["scalar"] = ("F32", [], np.float32(0.5).tobytes())
    tensors["empty"] = ("F32", [0], b"")
    shared = (1 + rng.standard_normal(48) * 0.05).astype(np.float32).tobytes()
    tensors["final.norm"] = ("F32", [48], shared)
    write_safetensors(root / "model.safetensors", tensors, {"format": "pt", "golden": version})
    write_safetensors(root / "head.safetensors", {
        "final.norm": ("F32", [48], shared),
        "head.bias": ("F32", [10], (rng.standard_normal(10) * 0.01).astype(np.float32).tobytes()),
        "head.scale": ("F32", [10], (rng.standard_normal(10) * 0.1).astype(np.float32).tobytes()),
    }, {})
    (root / "config.json").write_text(json.dumps({"blocks": 6, "hidden_size": 64}, indent=2) + "\n")
    for d in EMPTY_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)


def build_source(root: Path) -> None:
    rng = np.random.default_rng(20261130)
    tensors: dict[str, tuple[str, list[int], bytes]] = {}
    for name in DTYPES:
        tensors[f"dtype.{name.lower()}"] = (name, [4, 16], per_dtype(name, rng))
    tensors["empty"] = ("F32", [0, 8], b"")
    tensors["scalar"] = ("F32", [], np.float32(np.pi).tobytes())
    w = (rng.standard_normal((64, 64)) * 0.02).astype(np.float32)
    tensors["layer.weight"] = ("F32", [64, 64], w.tobytes())
    bf16 = (w.view(np.uint32)[:32] >> 16).astype(np.uint16)
    tensors["layer.weight_bf16"] = ("BF16", [32, 64], bf16.tobytes())
    tensors["layer.upcast"] = ("F32", [16, 64], (bf16[:16].astype(np.uint32) << 16).tobytes())
    tensors["norm.weight"] = ("F32", [1024], np.ones(1024, np.float32).tobytes())
    tensors["position_ids"] = ("I64", [1, 512], np.arange(512, dtype=np.int64).tobytes())
    mask = np.zeros(4096, np.uint8)
    mask[rng.integers(0, 4096, 100)] = 1
    tensors["attention.mask"] = ("BOOL", [64, 64], mask.tobytes())
    sparse = np.zeros(2048, np.float16)
    sparse[rng.integers(0, 2048, 60)] = rng.standard_normal(60).astype(np.float16)
    tensors["sparse.f16"] = ("F16", [2048], sparse.tobytes())
    write_safetensors(root / "model.safetensors", tensors, {"format": "pt", "golden": "v1"})

    (root / "config.json").write_text(json.dumps(
        {"architectures": ["GoldenModel"], "hidden_size": 64, "num_layers": 1, "torch_dtype": "float32",
         "vocab": {f"tok{i}": i for i in range(40)}}, indent=2) + "\n")
    # Not a tensor file: text with some repetition, then binary bytes.
    words = [f"piece_{i:04d}\t{rng.integers(-9999, 9999)}" for i in range(150)]
    (root / "tokenizer.model").write_bytes("\n".join(words).encode() + bytes(range(256)))
    (root / "empty.bin").write_bytes(b"")
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "sub" / "README.md").write_text("A file in a subfolder.\n")
    write_safetensors(root / "sub" / "deeper" / "adapter.safetensors", {
        "lora.a": ("F16", [8, 16], (rng.standard_normal(128) * 0.1).astype(np.float16).tobytes()),
        "lora.b": ("F16", [16, 8], np.zeros(128, np.float16).tobytes()),
    }, {})
    for d in EMPTY_DIRS:
        (root / d).mkdir(parents=True)


# ---------------------------------------------------------------- production fixtures
# One small program per case, built from production ids and configs (as an
# archive stores them), so this stays valid however the classes are arranged.
def node(ident: str, *children: Program, **config) -> Program:
    production = REGISTRY[ident](**config)
    return Program(production, tuple(children))


def raw() -> Program:
    return node("raw")


def zstd(level: int, strategy: int = 0, window_log: int = 0, hash_log: int = 0, chain_log: int = 0,
         min_match: int = 0) -> Program:
    return node("zstd", level=level, strategy=strategy, window_log=window_log, hash_log=hash_log,
                chain_log=chain_log, min_match=min_match)


def T(name: str) -> Tensor:
    return tensor(DTYPES[name])


def type_json(t: Field) -> dict:
    return {"dtype": t.dtype.name} if isinstance(t, Tensor) else {"bits": t.bits}


def weights(rng: np.random.Generator, n: int, scale: float = 0.02) -> np.ndarray:
    """A layer's weights, as f32 values."""
    return (rng.standard_normal(n) * scale).astype(np.float32)


def bf16(w: np.ndarray) -> np.ndarray:
    return (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def f16(w: np.ndarray) -> np.ndarray:
    return w.astype(np.float16).view(np.uint16)


def bits_of(w: np.ndarray) -> np.ndarray:
    return w.astype(np.float32).view(np.uint32)


def case(about: str, t: Field, program: Program, x, reference=None) -> dict:
    """Encode x once with today's code; check it decodes back before keeping it."""
    x = np.ascontiguousarray(np.asarray(x).astype(t.container))
    streams_expected = program.check(t)
    ref = None
    if program.uses_reference:
        ref = np.ascontiguousarray(np.asarray(reference).astype(t.container))
        assert len(ref) == len(x)
    streams = encode(program, x, t, ref)
    assert len(streams) == streams_expected
    out = decode(program, t, len(x), [memoryview(b) for b in streams], ref)
    assert out.dtype == t.container and out.tobytes() == x.tobytes(), about
    entry = {"about": about, "type": type_json(t), "n": len(x), "program": program.to_json(),
             "input": x.tobytes().hex()}
    if ref is not None:
        entry["reference"] = ref.tobytes().hex()
    entry["streams"] = [b.hex() for b in streams]
    entry["sha256"] = hashlib.sha256(x.tobytes()).hexdigest()
    return entry


def cases_raw(rng):
    w = weights(rng, 257)
    return [
        case("bf16 weights, odd length", T("BF16"), raw(), bf16(w)),
        case("12-bit field in a 16-bit container", Field(12), raw(), bf16(w[:31]) >> 4),
        case("f64 weights", T("F64"), raw(), w[:9].astype(np.float64).view(np.uint64)),
    ]


def cases_zstd(rng):
    w = weights(rng, 256)
    text = json.dumps({"architectures": ["GoldenModel"], "hidden_size": 64,
                       "vocab": {f"tok{i}": i for i in range(12)}}).encode()
    return [
        case("bf16 weights, the entropy preset", T("BF16"), zstd(1, 1, 17, 6, 6, 7), bf16(w)),
        case("config text at level 3", Field(8), zstd(3), np.frombuffer(text, np.uint8)),
        case("f32 exponents at level 19 with explicit parameters", Field(8),
             zstd(19, 9, 10, 6, 6, 3), (bits_of(w[:100]) >> 23) & 0xFF),
    ]


def lzma_node(preset: int, lc: int, lp: int, pb: int) -> Program:
    return node("lzma", preset=preset, lc=lc, lp=lp, pb=pb)


def cases_lzma(rng):
    w = weights(rng, 200)
    text = json.dumps({"architectures": ["GoldenModel"], "hidden_size": 64,
                       "vocab": {f"tok{i}": i for i in range(24)}}).encode()
    # floats one byte off their words behind a header, then zero padding: an unknown format
    blob = b"HDR\x01" + bytes(3) + bits_of(w).tobytes() + bytes(61) + text[:40]
    return [
        case("config text, xz's literal context", Field(8), lzma_node(6, 3, 0, 2), np.frombuffer(text, np.uint8)),
        case("misaligned f32 and zero runs, a 4-byte lane as context", Field(8), lzma_node(6, 2, 2, 2),
             np.frombuffer(blob, np.uint8)),
        case("bf16 weights, odd length, fastest preset", T("BF16"), lzma_node(0, 0, 1, 1), bf16(w[:61])),
        case("empty", Field(8), lzma_node(6, 3, 0, 2), np.zeros(0, np.uint8)),
    ]


def cases_ans(rng):
    w = weights(rng, 129)
    few = np.where(rng.random(100) < 0.9, 0x3C, 0xBC).astype(np.uint8)
    return [
        case("f32 weights whole (bins over the top 16 bits, 16 offset bits at least)", T("F32"),
             node("ans"), bits_of(w)),
        case("bf16 weights, odd length", T("BF16"), node("ans"), bf16(w)),
        case("f32 exponents (order 0)", Field(8), node("ans"), (bits_of(w) >> 23) & 0xFF),
        case("two values, one bit of information", Field(8), node("ans"), few),
        case("one value", Field(12), node("ans"), np.full(9, 0x123, np.uint16)),
        case("empty", Field(16), node("ans"), np.zeros(0, np.uint16)),
    ]


def cases_constant(rng):
    return [
        case("norm weight of ones", T("F32"), node("constant", value=0x3F800000),
             np.full(128, 0x3F800000, np.uint32)),
        case("all -1 (every bit set)", T("I64"), node("constant", value=(1 << 64) - 1),
             np.full(7, (1 << 64) - 1, np.uint64)),
        case("empty chunk", T("BF16"), node("constant", value=0), np.zeros(0, np.uint16)),
    ]


def cases_affine(rng):
    return [
        case("position ids", T("I64"), node("affine", raw(), step=1), np.arange(160, dtype=np.uint64)),
        case("descending by 3 from 1000 (a negative step, two's complement)", T("I32"),
             node("affine", raw(), step=(1 << 64) - 3),
             (1000 - 3 * np.arange(77, dtype=np.int64)).astype(np.uint32)),
        case("wraps modulo 2^12", Field(12), node("affine", raw(), step=5),
             (4090 + 5 * np.arange(20)) % 4096),
    ]


def cases_bit_fields(rng):
    w = weights(rng, 129)
    return [
        case("f32: exponent, then sign and mantissa in one field (sign highest)", T("F32"),
             node("bit_fields", raw(), raw(), groups=[[[23, 8]], [[31, 1], [0, 23]]]), bits_of(w)),
        case("12-bit field: both end bits, then the middle", Field(12),
             node("bit_fields", raw(), raw(), groups=[[[0, 1], [11, 1]], [[1, 10]]]), bf16(w[:63]) >> 4),
        case("bf16 cut in three, groups not in bit order", T("BF16"),
             node("bit_fields", raw(), raw(), raw(), groups=[[[4, 8]], [[0, 4]], [[12, 4]]]), bf16(w[:40])),
    ]


def cases_float_fields(rng):
    w = weights(rng, 129)
    e4m3 = np.array([0x00, 0x80, 0x7F, 0xFF, 0x01, 0x38, 0xB8, 0x7E], np.uint8)
    return [
        case("bf16 weights, s|e|m", T("BF16"), node("float_fields", raw(), raw(), raw(), grouping="s|e|m"),
             bf16(w)),
        case("f16 weights, e|sm", T("F16"), node("float_fields", raw(), raw(), grouping="e|sm"), f16(w[:65])),
        case("f8_e4m3 specials and weights, m|e|s", T("F8_E4M3"),
             node("float_fields", raw(), raw(), raw(), grouping="m|e|s"),
             np.concatenate([e4m3, rng.integers(0, 256, 32).astype(np.uint8)])),
        case("f64 weights, es|m", T("F64"), node("float_fields", raw(), raw(), grouping="es|m"),
             w[:16].astype(np.float64).view(np.uint64)),
    ]


def cases_low_zero_bits(rng):
    w = weights(rng, 128)
    return [
        case("f32 upcast from bf16", T("F32"), node("low_zero_bits", raw(), shift=16),
             bf16(w).astype(np.uint32) << 16),
        case("11-bit field with 3 low zero bits", Field(11), node("low_zero_bits", raw(), shift=3),
             (bf16(w[:33]) >> 5) & 0x7F8),
    ]


def cases_pack_bits(rng):
    w = weights(rng, 203)
    h = bf16(w)
    quants = np.clip(np.round(w[:99] / np.abs(w[:99]).max() * 7) + 8, 0, 15).astype(np.uint8)
    mask = np.zeros(77, np.uint8)
    mask[rng.integers(0, 77, 9)] = 1
    return [
        case("sign bits of weights, 203 (not whole bytes)", Field(1), node("pack_bits", raw()), h >> 15),
        case("top two mantissa bits, 101 values", Field(2), node("pack_bits", raw()), (h[:101] >> 5) & 3),
        case("4-bit quants, 99 values", Field(4), node("pack_bits", raw()), quants),
        case("bool mask: seven zero bits, then the bit packed", T("BOOL"),
             node("bit_fields", node("constant", value=0), node("pack_bits", raw()), groups=[[[1, 7]], [[0, 1]]]),
             mask),
    ]


def cases_partition(rng):
    h = bf16(weights(rng, 160))
    exps = (h >> 7) & 0xFF
    common = [int(v) for v in np.argsort(-np.bincount(exps, minlength=256), kind="stable")[:6]]
    parts = {"context": [[7, 8]], "rest": [[15, 1], [0, 7]]}

    def program(classes):
        return node("partition", *(raw() for _ in range(len(classes) + 2)), classes=classes, **parts)

    return [
        case("bf16 mantissas by exponent, one exponent per class", T("BF16"),
             program([[v] for v in common[:4]]), h),
        case("bf16 mantissas by exponent, classes of several exponents", T("BF16"),
             program([common[0:2], [common[2]], common[3:6]]), h),
        case("more than a dozen classes (the sorting path)", T("BF16"),
             program([[v] for v in range(112, 126)]), h[:100]),
    ]


def cases_rank(rng):
    exps = ((bf16(weights(rng, 200)) >> 7) & 0xFF).astype(np.uint8)
    symbols = [int(v) for v in np.argsort(-np.bincount(exps, minlength=256), kind="stable")[:6]]
    return [
        case("bf16 exponents, six most frequent ranked", Field(8),
             node("rank", raw(), raw(), symbols=symbols), exps),
        case("empty table: every value escapes", Field(4), node("rank", raw(), raw(), symbols=[]), exps[:10] & 15),
    ]


def cases_byte_planes(rng):
    w = weights(rng, 129)
    return [
        case("f32 weights, four planes", T("F32"), node("byte_planes", raw(), raw(), raw(), raw()), bits_of(w[:65])),
        case("bf16 weights, two planes", T("BF16"), node("byte_planes", raw(), raw()), bf16(w)),
        case("12-bit field: a byte and a 4-bit plane", Field(12), node("byte_planes", raw(), raw()),
             bf16(w[:33]) >> 4),
    ]


def cases_records(rng):
    w = weights(rng, 6 * 32).reshape(6, 32)
    scale = np.abs(w).max(axis=1) / 127
    quants = np.round(w / scale[:, None]).astype(np.int8)
    blocks = b"".join(scale[i].astype(np.float16).tobytes() + quants[i].tobytes() for i in range(6))
    mixed = rng.integers(0, 256, 19 * 5).astype(np.uint8)
    return [
        case("GGUF Q8_0 blocks: f16 scale, 32 int8 quants", Field(8),
             node("records", raw(), raw(), fields=[[1, 2], [32, 1]]), np.frombuffer(blocks, np.uint8)),
        case("records of 2 words, 1 double word, 3 bytes", Field(8),
             node("records", raw(), raw(), raw(), fields=[[2, 4], [1, 8], [3, 1]]), mixed),
    ]


def cases_view(rng):
    w = weights(rng, 150)
    dead = bits_of(w) & np.uint32(0xFFFFFFFE)  # a dead low mantissa bit, as in a PyTorch zip read as bytes
    return [
        case("f32 weights in bytes no parser typed: exponent apart, a dead low bit dropped", Field(8),
             node("view", node("float_fields", node("ans"), node("low_zero_bits", node("ans"), shift=1),
                               grouping="e|sm"), dtype="F32"), np.frombuffer(dead.tobytes(), np.uint8)),
        case("bf16 weights in bytes", Field(8), node("view", node("ans"), dtype="BF16"),
             np.frombuffer(bf16(w).tobytes(), np.uint8)),
        case("f64 values in a U8 tensor", T("U8"), node("view", raw(), dtype="F64"),
             np.frombuffer(w[:12].astype(np.float64).tobytes(), np.uint8)),
        case("empty", Field(8), node("view", node("ans"), dtype="F16"), np.zeros(0, np.uint8)),
    ]


def cases_row_dedup(rng):
    rows = f16(weights(rng, 8 * 16)).reshape(8, 16)
    rows[0] = 0  # a padding row
    order = [0, 1, 2, 3, 0, 4, 5, 3, 6, 7, 1, 0]  # repeats, not in order
    small = rng.integers(-5, 5, (4, 3)).astype(np.int32).view(np.uint32)
    return [
        case("f16 embedding, repeated rows", T("F16"), node("row_dedup", raw(), raw(), row=16),
             rows[order].reshape(-1)),
        case("i32 rows of 3", T("I32"), node("row_dedup", raw(), raw(), row=3),
             small[[2, 0, 2, 1, 3, 0, 0]].reshape(-1)),
        case("empty chunk", T("I32"), node("row_dedup", raw(), raw(), row=3), np.zeros(0, np.uint32)),
    ]


def cases_sparse(rng):
    x = np.zeros(300, np.uint16)
    at = np.concatenate([[0, 299], rng.choice(np.arange(1, 299), 13, replace=False)])
    x[at] = f16(weights(rng, len(at), 0.1))
    ones = np.full(64, 0x3F80, np.uint16)
    ones[[5, 6, 40]] = [0x3F81, 0x3F7F, 0x3F90]
    return [
        case("mostly zero f16, exceptions at both ends", T("F16"), node("sparse", raw(), raw(), raw(), value=0), x),
        case("norm weight of ones with three exceptions", T("BF16"),
             node("sparse", raw(), raw(), raw(), value=0x3F80), ones),
        case("no exceptions", Field(8), node("sparse", raw(), raw(), raw(), value=7), np.full(50, 7, np.uint8)),
    ]


def cases_delta(rng):
    offsets = np.cumsum(rng.integers(0, 300, 101)).astype(np.uint64)
    grid = bf16(np.repeat(weights(rng, 16), 13)[:200].reshape(-1) + weights(rng, 200, 0.001))
    return [
        case("i64 offsets, increasing", T("I64"), node("delta", raw(), stride=1), offsets),
        case("bf16 rows of 16, against the row above; 200 = 12.5 rows", T("BF16"),
             node("delta", raw(), stride=16), grid),
        case("12-bit field, differences wrap modulo 2^12", Field(12), node("delta", raw(), stride=1),
             (bf16(weights(rng, 50)) >> 4)),
    ]


def cases_xor_delta(rng):
    w = weights(rng, 129)
    return [
        case("bf16 weights, previous element", T("BF16"), node("xor_delta", raw(), stride=1), bf16(w)),
        case("f32 rows of 16, 100 elements", T("F32"), node("xor_delta", raw(), stride=16),
             bits_of(np.resize(w[:16], 100) + weights(rng, 100, 0.0005))),
    ]


def cases_zigzag(rng):
    w = weights(rng, 201)
    q = np.clip(np.round(w / np.abs(w).max() * 127), -128, 127).astype(np.int8).view(np.uint8)
    signal = np.round(np.cumsum(rng.standard_normal(64)) * 40).astype(np.int16).view(np.uint16)
    specials = np.array([0, 1, -1, 2, -2, (1 << 63) - 1, -(1 << 63), 1000, -1000], np.int64).view(np.uint64)
    return [
        case("int8 quants", T("I8"), node("zigzag", raw()), q),
        case("i16 slow signal: delta, then zigzag", T("I16"), node("delta", node("zigzag", raw()), stride=1), signal),
        case("i64 extremes", T("I64"), node("zigzag", raw()), specials),
    ]


def cases_transpose(rng):
    return [
        case("bf16, 12 rows of 16", T("BF16"), node("transpose", raw(), cols=16), bf16(weights(rng, 192))),
        case("i32, 7 rows of 3", T("I32"), node("transpose", raw(), cols=3),
             rng.integers(-1000, 1000, 21).astype(np.int32).view(np.uint32)),
    ]


def cases_xor_base(rng):
    base = weights(rng, 200)
    tuned = base + weights(rng, 200, 0.0005)
    return [
        case("bf16 fine-tune against its base", T("BF16"), node("xor_base", raw()), bf16(tuned), bf16(base)),
        case("f32 fine-tune against its base, then byte planes", T("F32"),
             node("xor_base", node("byte_planes", raw(), raw(), raw(), raw())), bits_of(tuned[:64]),
             bits_of(base[:64])),
    ]


def cases_sub_base(rng):
    base = weights(rng, 200)
    tuned = base + weights(rng, 200, 0.0005)
    return [
        case("bf16 fine-tune against its base (differences of either sign)", T("BF16"),
             node("sub_base", raw()), bf16(tuned), bf16(base)),
        case("f32 fine-tune against its base", T("F32"), node("sub_base", raw()), bits_of(tuned[:64]),
             bits_of(base[:64])),
    ]


# Production id -> its cases. A production registered without an entry here
# makes --productions fail (and tests/archive/test_golden_productions.py).
PRODUCTION_CASES = {
    "raw": cases_raw, "zstd": cases_zstd, "lzma": cases_lzma, "ans": cases_ans, "constant": cases_constant, "affine": cases_affine,
    "bit_fields": cases_bit_fields, "float_fields": cases_float_fields, "low_zero_bits": cases_low_zero_bits,
    "pack_bits": cases_pack_bits, "partition": cases_partition, "rank": cases_rank,
    "byte_planes": cases_byte_planes, "records": cases_records, "row_dedup": cases_row_dedup,
    "sparse": cases_sparse, "delta": cases_delta, "xor_delta": cases_xor_delta, "zigzag": cases_zigzag,
    "transpose": cases_transpose, "xor_base": cases_xor_base, "sub_base": cases_sub_base, "view": cases_view,
}


def uses(program: list, ident: str) -> bool:
    return program[0] == ident or (len(program) == 3 and any(uses(c, ident) for c in program[2]))


def fixture_text(fixture: dict) -> str:
    """JSON with one line per field of a case (programs on one line, one stream a line)."""
    def compact(v):
        return json.dumps(v, separators=(", ", ": "))

    def value(k, v, indent):
        if k == "streams" and v:
            return "[\n" + ",\n".join(" " * (indent + 1) + compact(b) for b in v) + "\n" + " " * indent + "]"
        return compact(v)

    head = [f' {json.dumps(k)}: {compact(v)}' for k, v in fixture.items() if k != "cases"]
    cases = ["  {\n" + ",\n".join(f"   {json.dumps(k)}: {value(k, v, 3)}" for k, v in c.items()) + "\n  }"
             for c in fixture["cases"]]
    text = "{\n" + ",\n".join(head + [' "cases": [\n' + ",\n".join(cases) + "\n ]"]) + "\n}\n"
    assert json.loads(text) == fixture
    return text


def write_productions(folder: Path) -> None:
    """Write the fixture of every production that has none; never touch one that exists."""
    missing = sorted(set(REGISTRY) - set(PRODUCTION_CASES))
    unknown = sorted(set(PRODUCTION_CASES) - set(REGISTRY))
    if missing or unknown:
        sys.exit(f"PRODUCTION_CASES lacks {missing} and has unregistered {unknown}: add a cases_<id> function")
    folder.mkdir(parents=True, exist_ok=True)
    for ident in sorted(PRODUCTION_CASES):
        path = folder / f"{ident}.json"
        if path.exists():
            print(f"{path}: kept (goldens are written once)")
            continue
        # A seed per production: the data of one does not depend on which others exist.
        cases = PRODUCTION_CASES[ident](np.random.default_rng(zlib.crc32(ident.encode())))
        assert all(uses(c["program"], ident) for c in cases), ident
        fixture = {"production": ident, "brevis": brevis.__version__, "zstd": list(zstandard.ZSTD_VERSION),
                   **({"lzma": Lzma.fingerprint()} if ident == "lzma" else {}), "cases": cases}
        text = fixture_text(fixture)
        with open(path, "x") as f:  # "x": never overwrite a golden file
            f.write(text)
        print(f"{path}: {len(cases)} cases, {len(text)} bytes")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default="v1", help="golden folder name (default v1)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing golden archive folder")
    ap.add_argument("--productions", action="store_true",
                    help="write the missing production fixtures (<version>/productions/) instead of the archive")
    args = ap.parse_args()
    out = REPO / "tests" / "golden" / args.version
    if args.productions:
        write_productions(out / "productions")
        os.sync()
        return
    # The production fixtures are no part of the archive: they may exist before it and
    # survive --force (nothing rewrites them).
    if out.exists() and any(p.name != "productions" for p in out.iterdir()):
        if not args.force:
            sys.exit(f"{out} exists: goldens are written once (use --force only for an unreleased version)")
        for p in out.iterdir():
            if p.name != "productions":
                if p.is_dir():
                    shutil.rmtree(p)
                else:
                    p.unlink()
    source = out / "source"
    source.mkdir(parents=True)
    number = int(args.version.lstrip("v") or 1)
    build = (functools.partial(build_source_members, version=args.version) if number >= 8
             else build_source_view if number >= 6 else build_source_lzma if number >= 5
             else build_source_wide if number >= 4 else build_source_gathered if number >= 3 else build_source)
    build(source)
    # Small chunks, so that tensors span several; from v4 on 128 KiB, so that a
    # chunk holds a wide block (2**16 values or more).
    summary = brevis.compress([source], out / "archive.brv", threads=1, chunk_bytes=1 << 17 if number >= 4 else 4096)
    files = sorted(p for p in source.rglob("*") if p.is_file())
    lines = [f"{sha256(p)}  {p.relative_to(source).as_posix()}\n" for p in files]
    (out / "SHA256SUMS").write_text("".join(lines))
    (out / "EMPTY_DIRS").write_text("".join(f"{d}\n" for d in EMPTY_DIRS))
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}: {len(files)} files, archive {summary['archive_bytes']} bytes, folder {total} bytes "
          f"({brevis.__version__})")
    os.sync()


if __name__ == "__main__":
    main()
