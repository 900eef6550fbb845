"""Disk full, for real: a 2 MB tmpfs (mounted as root; skipped where mounting
is not permitted). Compress and decompress fail with one line, exit 8, and
leave nothing on the full filesystem.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import brevis
from robust_util import PTH, run_measured
from helpers import tree, write_safetensors


@pytest.fixture
def small_fs(tmp_path):
    """Mount a tmpfs (2 MiB, 40 inodes) on tmp_path/full; unmount afterwards."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,nr_inodes=40", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("diskfull")
    big = root / "big"
    big.mkdir()
    rng = np.random.default_rng(1)
    write_safetensors(big / "w.safetensors", {
        "w": ("F16", (1024, 2048), (rng.standard_normal(1 << 21) * 0.02).astype(np.float16).tobytes())})
    if PTH.is_file():
        (big / PTH.name).write_bytes(PTH.read_bytes())
    brevis.compress([big], root / "big.brv", threads=2)
    # Files whose sizes add up to less than 2 MiB, but not their 4 KiB pages.
    blocks = root / "blocks"
    blocks.mkdir()
    for i in range(31):
        (blocks / f"f{i:02d}.bin").write_bytes(rng.integers(0, 256, 65_537, dtype=np.uint8).tobytes())
    brevis.compress([blocks], root / "blocks.brv", threads=2)
    # More folders than the filesystem has inodes.
    many = root / "many"
    for i in range(60):
        (many / f"d{i:02d}").mkdir(parents=True)
        (many / f"d{i:02d}" / "x").write_bytes(bytes([i]))
    brevis.compress([many], root / "many.brv", threads=1)
    return {"big": big, "big.brv": root / "big.brv", "blocks.brv": root / "blocks.brv",
            "blocks": blocks, "many.brv": root / "many.brv"}


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_compress_to_a_full_disk(data, small_fs):
    rc, out, err, _ = run_measured(["compress", data["big"], "-o", small_fs / "x.brv", "-q"])
    assert rc == 8, err
    assert "disk full" in one_line(err)
    assert os.listdir(small_fs) == []


def test_decompress_larger_than_the_free_space(data, small_fs):
    """Refused before writing anything: the index says how much is needed."""
    rc, out, err, _ = run_measured(["decompress", data["big.brv"], "-o", small_fs / "out", "-q"])
    assert rc == 8, err
    assert "free on disk" in one_line(err)
    assert os.listdir(small_fs) == []


def test_decompress_that_runs_out_of_blocks(data, small_fs):
    """The free-space check passes (2.03 MB < 2 MiB) but pages run out midway."""
    assert brevis.inspect(data["blocks.brv"])["original_bytes"] < 2 << 20
    rc, out, err, _ = run_measured(["decompress", data["blocks.brv"], "-o", small_fs / "out", "-q"])
    assert rc == 8, err
    assert "disk full" in one_line(err)
    assert os.listdir(small_fs) == []


def test_decompress_that_runs_out_of_inodes(data, small_fs):
    rc, out, err, _ = run_measured(["decompress", data["many.brv"], "-o", small_fs / "out", "-q"])
    assert rc == 8, err
    assert "disk full" in one_line(err)
    assert os.listdir(small_fs) == []


def test_decompress_into_the_mount_point_itself(data, small_fs, tmp_path):
    """An output folder on another filesystem than its parent: staged inside it."""
    (small_fs / "keep.txt").write_text("mine")
    rc, out, err, _ = run_measured(["decompress", data["blocks.brv"], "-o", small_fs, "-q"])
    assert rc == 8 and "disk full" in one_line(err)  # fits by size, not by pages
    assert os.listdir(small_fs) == ["keep.txt"]
    few = tmp_path / "few"
    few.mkdir()
    (few / "a.bin").write_bytes(b"a" * 5000)
    brevis.compress([few], tmp_path / "few.brv")
    rc, out, err, _ = run_measured(["decompress", tmp_path / "few.brv", "-o", small_fs, "-q"])
    assert rc == 0, err
    assert sorted(os.listdir(small_fs)) == ["a.bin", "keep.txt"]
    assert (small_fs / "a.bin").read_bytes() == b"a" * 5000


def test_the_archive_on_a_full_disk_still_reads(data, small_fs, tmp_path):
    few = tmp_path / "few"
    few.mkdir()
    (few / "a.bin").write_bytes(bytes(range(256)) * 20)
    archive = small_fs / "few.brv"
    brevis.compress([few], archive)
    filler = small_fs / "filler"
    with open(filler, "wb", buffering=0) as f:  # fill the rest of the disk
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    assert brevis.verify(archive, [few])["ok"]
    rc, out, err, _ = run_measured(["decompress", archive, "-o", tmp_path / "out", "-q"])
    assert rc == 0, err
    assert tree(tmp_path / "out") == tree(few)


def test_background_flushes_keep_the_archive_and_report_their_errors(data, tmp_path, monkeypatch):
    """The writer flushes to disk in a background thread as it goes; the
    archive is the same, and a flush that failed fails the run (Linux may
    report the next fsync clean after a failed one)."""
    from brevis.archive import writer
    from brevis.errors import IOFailure

    brevis.compress([data["big"]], tmp_path / "once.brv", threads=1)
    monkeypatch.setattr(writer, "SYNC_BYTES", 1 << 16)
    brevis.compress([data["big"]], tmp_path / "flushed.brv", threads=1)
    assert (tmp_path / "flushed.brv").read_bytes() == (tmp_path / "once.brv").read_bytes()
    assert brevis.verify(tmp_path / "flushed.brv", [data["big"]])["ok"]

    def failing(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(writer, "_datasync", failing)
    with pytest.raises(IOFailure, match="Input/output error"):
        brevis.compress([data["big"]], tmp_path / "failed.brv", threads=1)
    assert sorted(os.listdir(tmp_path)) == ["flushed.brv", "once.brv"]
