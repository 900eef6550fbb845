"""Helpers for the format parser tests (tests/formats is on sys.path)."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import pytest

import brevis
from brevis.formats import ParseError, Segment

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("BREVIS_CORPUS", "~/.cache/brevis-corpus")).expanduser()
SHARED_TAESD = Path("/work/shared/corpus/taesd")


def corpus_files(pattern: str) -> list[Path]:
    """Files of the downloaded corpus matching a glob (item/name); skip if there are none."""
    if not CORPUS.is_dir():
        pytest.skip(f"no corpus at {CORPUS}")
    files = sorted(p for p in CORPUS.glob(pattern) if p.is_file())
    if not files:
        pytest.skip(f"no corpus files match {pattern}")
    return files


def taesd_files() -> list[Path]:
    """The taesd checkpoints, read in place: the shared corpus, else the copy in the repo."""
    files = sorted(SHARED_TAESD.glob("*.pth")) or sorted((REPO / "examples" / "taesd").glob("*.pth"))
    if not files:
        pytest.skip("no taesd checkpoint")
    return files


def check_tiling(segments: list[Segment], size: int) -> None:
    pos = 0
    for s in segments:
        assert s.offset == pos, f"segment {s.name!r} at {s.offset}, expected {pos}"
        assert s.length >= 0
        if s.dtype is None:
            assert s.shape is None
        else:
            assert s.shape is not None and len(s.shape) <= 64
            n = 1
            for d in s.shape:
                assert isinstance(d, int) and d >= 0
                n *= d
            assert n * s.dtype.itemsize == s.length, s
        pos = s.end
    assert pos == size


def parse_file(module, path: Path) -> list[Segment]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        assert module.detect(f, size, path.name), f"{path.name} not detected as {module.NAME}"
        segments = module.parse(f, size)
    check_tiling(segments, size)
    return segments


def parse_bytes(module, data: bytes, name: str) -> list[Segment]:
    f = io.BytesIO(data)
    assert module.detect(f, len(data), name)
    segments = module.parse(f, len(data))
    check_tiling(segments, len(data))
    return segments


def tensors(segments: list[Segment]) -> list[Segment]:
    return [s for s in segments if s.dtype is not None]


def survives(module, data: bytes, name: str) -> str:
    """Detect and parse hostile bytes: a ParseError or a valid tiling, nothing else."""
    f = io.BytesIO(data)
    if not module.detect(f, len(data), name):
        return "undetected"
    try:
        segments = module.parse(f, len(data))
    except ParseError:
        return "error"
    check_tiling(segments, len(data))
    return "parsed"


def hostile(module, data: bytes, name: str, *, seed: int, cuts: int = 200, flips: int = 300,
            region: tuple[int, int] | None = None) -> dict[str, int]:
    """Truncate at many offsets and flip random bytes (within `region` if given)."""
    rng = random.Random(seed)
    seen: dict[str, int] = {}
    offsets = sorted({rng.randrange(len(data)) for _ in range(cuts)} | set(range(min(64, len(data)))))
    for n in offsets:
        r = survives(module, data[:n], name)
        seen[r] = seen.get(r, 0) + 1
    lo, hi = region or (0, len(data))
    for _ in range(flips):
        b = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 4))):
            i = rng.randrange(lo, hi)
            b[i] = rng.randrange(256) if rng.random() < 0.5 else b[i] ^ (1 << rng.randrange(8))
        r = survives(module, bytes(b), name)
        seen[r] = seen.get(r, 0) + 1
    return seen


def roundtrip(paths: list[Path], tmp_path: Path, expect_format: str) -> dict:
    """Compress, decompress, compare bytes; returns brevis.inspect of the archive."""
    archive = tmp_path / "a.brv"
    brevis.compress(paths, archive)
    info = brevis.inspect(archive)
    assert {f["format"] for f in info["files"]} == {expect_format}
    out = tmp_path / "out"
    brevis.decompress(archive, out)
    for p in paths:
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name
    return info
