#!/usr/bin/env python3
"""Write a golden archive: tests/golden/<version>/{source/, archive.brv, SHA256SUMS, EMPTY_DIRS}.

Run once per archive format version, with the Brevis of that version, and
commit the result. tests/archive/test_golden.py decodes every committed
golden archive with the current code and compares the SHA-256 of every
file; it never regenerates them. This script refuses to overwrite a golden
folder unless --force is given (only ever for a version not yet released).

    python scripts/make_golden.py            # writes tests/golden/v1
    python scripts/make_golden.py --version v2

The source folder is deterministic: a safetensors file with one tensor per
dtype (special float values included), an empty and a scalar tensor and a
few larger tensors that give the search something to find; a config.json;
a file that is not a tensor; an empty file; files in a subfolder; and an
empty folder (git does not keep empty folders: EMPTY_DIRS lists them and
the test checks they come back).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import brevis  # noqa: E402
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


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default="v1", help="golden folder name (default v1)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing golden folder")
    args = ap.parse_args()
    out = REPO / "tests" / "golden" / args.version
    if out.exists():
        if not args.force:
            sys.exit(f"{out} exists: goldens are written once (use --force only for an unreleased version)")
        shutil.rmtree(out)
    source = out / "source"
    source.mkdir(parents=True)
    build_source(source)
    summary = brevis.compress([source], out / "archive.brv", threads=1, chunk_bytes=4096)
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
