"""Load: many tiny tensors, many small files, one large tensor, and several
processes reading one archive at once.

Timings are printed (pytest -s) and checked only loosely: the point is
linear growth, not speed on a given machine. Per-item time at 10x the
items must stay under 4x the smaller run's (quadratic work would give 10x).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import brevis
from robust_util import ENV, run_measured
from helpers import sha256_file, tree

SIZES = {"F32": 4, "F16": 2, "I32": 4, "U8": 1, "BF16": 2, "I64": 8}


def many_tensors(path: Path, count: int, seed: int = 0) -> None:
    """A safetensors file of `count` tensors of 4 to 64 bytes, header written by hand."""
    rng = np.random.default_rng(seed)
    names = list(SIZES)
    header, offset = {}, 0
    for i, k in enumerate(rng.integers(1, 17, count)):
        dtype = names[i % len(names)]
        nbytes = max(SIZES[dtype], int(k) * 4 // SIZES[dtype] * SIZES[dtype])
        header[f"blocks.{i // 16}.p{i % 16}"] = {"dtype": dtype, "shape": [nbytes // SIZES[dtype]],
                                                  "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.write(rng.integers(0, 256, offset, dtype=np.uint8).tobytes())


def timed_roundtrip(src: Path, tmp: Path, threads: int = 2) -> dict:
    archive = tmp / "a.brv"
    out = tmp / "out"
    t = {}
    start = time.perf_counter()
    brevis.compress([src], archive, threads=threads)
    t["compress"] = time.perf_counter() - start
    start = time.perf_counter()
    assert brevis.verify(archive, [src], threads=threads)["ok"]
    t["verify"] = time.perf_counter() - start
    start = time.perf_counter()
    brevis.decompress(archive, out, threads=threads)
    t["decompress"] = time.perf_counter() - start
    return t


def tensor_run(tmp_path: Path, count: int) -> dict:
    folder = tmp_path / f"t{count}"
    folder.mkdir()
    src = folder / "src"
    src.mkdir()
    many_tensors(src / "many.safetensors", count)
    t = timed_roundtrip(src, folder)
    assert sha256_file(folder / "out" / "many.safetensors") == sha256_file(src / "many.safetensors")
    assert brevis.inspect(folder / "a.brv")["tensor_count"] == count
    print(f"{count} tensors: " + ", ".join(f"{k} {v:.1f} s" for k, v in t.items()))
    return t


def check_linear(small: dict, large: dict, factor: int) -> None:
    for step in small:
        per_small = small[step]
        per_large = large[step] / factor
        assert per_large < 4 * per_small + 0.05, (
            f"{step}: {large[step]:.1f} s for {factor}x the items vs {small[step]:.1f} s: not linear")


def test_10k_tiny_tensors_scale_linearly(tmp_path):
    small = tensor_run(tmp_path, 1_000)
    large = tensor_run(tmp_path, 10_000)
    check_linear(small, large, 10)
    assert sum(large.values()) < 120


@pytest.mark.slow
def test_100k_tiny_tensors(tmp_path):
    small = tensor_run(tmp_path, 10_000)
    large = tensor_run(tmp_path, 100_000)
    check_linear(small, large, 10)


def file_run(tmp_path: Path, count: int) -> dict:
    folder = tmp_path / f"f{count}"
    src = folder / "src"
    rng = np.random.default_rng(count)
    for i in range(count):
        d = src / f"d{i // 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.bin").write_bytes(rng.integers(0, 256, int(rng.integers(0, 200)), dtype=np.uint8).tobytes())
    t = timed_roundtrip(src, folder)
    assert tree(folder / "out") == tree(src)
    print(f"{count} files: " + ", ".join(f"{k} {v:.1f} s" for k, v in t.items()))
    return t


def test_1k_small_files(tmp_path):
    t = file_run(tmp_path, 1_000)
    assert sum(t.values()) < 60


@pytest.mark.slow
def test_10k_small_files_scale_linearly(tmp_path):
    small = file_run(tmp_path, 1_000)
    large = file_run(tmp_path, 10_000)
    check_linear(small, large, 10)


@pytest.mark.slow
def test_one_large_tensor_memory_is_bounded(tmp_path):
    """1.5 GiB BF16 tensor: peak RSS of compress and decompress stays near
    chunk size x window (1 MiB chunks), not the tensor size."""
    src = tmp_path / "src"
    src.mkdir()
    n = 3 * (1 << 28)  # 768 Mi elements, 1.5 GiB
    rng = np.random.default_rng(0)
    path = src / "big.safetensors"
    header = json.dumps({"w": {"dtype": "BF16", "shape": [n // 4096, 4096], "data_offsets": [0, 2 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        block = 1 << 24
        for _ in range(n // block):
            x = (rng.standard_normal(block, dtype=np.float32) * 0.02).view(np.uint32) >> 16
            f.write(x.astype(np.uint16).tobytes())
    figures = {}
    for step, args in (("compress", ["compress", src, "-o", tmp_path / "big.brv", "-q"]),
                       ("verify", ["verify", tmp_path / "big.brv", "-q"]),
                       ("decompress", ["decompress", tmp_path / "big.brv", "-o", tmp_path / "out", "-q"])):
        start = time.perf_counter()
        rc, out, err, rss = run_measured(args, timeout=3600)
        figures[step] = (time.perf_counter() - start, rss)
        assert rc == 0, err
    path.unlink()  # room on disk; compare by checksum
    assert brevis.verify(tmp_path / "big.brv")["ok"]
    print("1.5 GiB tensor: " + ", ".join(f"{k} {s:.0f} s, peak RSS {r / 1024:.0f} MiB" for k, (s, r) in figures.items()))
    threads = len(os.sched_getaffinity(0))
    for step, (_, rss) in figures.items():
        assert rss < 100_000 + threads * 2 * 16_000, f"{step}: {rss} KiB"


# ------------------------------------------------------------ concurrency
@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("concurrent")
    src = root / "src"
    src.mkdir()
    rng = np.random.default_rng(3)
    many_tensors(src / "many.safetensors", 500)
    (src / "blob.bin").write_bytes(rng.integers(0, 16, 3 << 20, dtype=np.uint8).tobytes())
    (src / "sub").mkdir()
    (src / "sub" / "w.bin").write_bytes((rng.standard_normal(1 << 19) * 0.1).astype(np.float16).tobytes())
    brevis.compress([src], root / "shared.brv", threads=2)
    return src, root / "shared.brv"


def test_concurrent_readers(shared, tmp_path):
    """Four decompressions (two into one folder, with --force) and three
    verifications of one archive at the same time: all correct."""
    src, archive = shared
    jobs = [["verify", archive, "--source", src, "-q"] for _ in range(3)]
    jobs += [["decompress", archive, "-o", tmp_path / f"out{i}", "-q", "-j", "1"] for i in range(2)]
    jobs += [["decompress", archive, "-o", tmp_path / "same", "-q", "-f", "-j", "1"] for _ in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "brevis", *map(str, j)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=ENV) for j in jobs]
    codes = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        codes.append((p.returncode, err.decode()))
    assert [c for c, _ in codes] == [0] * len(jobs), codes
    expected = tree(src)
    for name in ("out0", "out1", "same"):
        assert tree(tmp_path / name) == expected
    assert sorted(os.listdir(tmp_path)) == ["out0", "out1", "same"]


def test_concurrent_decompress_into_one_folder_without_force(shared, tmp_path):
    """Without --force, racing runs into one folder: each either succeeds or
    says 'output exists' (exit 7); the folder ends up exact."""
    src, archive = shared
    procs = [subprocess.Popen([sys.executable, "-m", "brevis", "decompress", str(archive), "-o",
                               str(tmp_path / "out"), "-q", "-j", "1"], stderr=subprocess.PIPE, env=ENV)
             for _ in range(3)]
    codes = [(p.wait(timeout=300), p.stderr.read().decode()) for p in procs]
    assert all(c in (0, 7) for c, _ in codes), codes
    assert any(c == 0 for c, _ in codes)
    assert tree(tmp_path / "out") == tree(src)
    assert os.listdir(tmp_path) == ["out"]
