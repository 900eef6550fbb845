"""File modes and modification times, kept as tar keeps them (issue 15,
item 7), and the output folder created as the umask says (issue 16)."""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest

import brevis
from brevis.archive.reader import ArchiveReader

MTIME = 1_577_836_800_123_456_789  # 2020-01-01, with nanoseconds


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture
def ckpt(tmp_path) -> Path:
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    for name, bits in (("secret.bin", 0o640), ("run.sh", 0o755), ("sub/ro.json", 0o444)):
        (src / name).write_bytes(name.encode() * 100)
        os.chmod(src / name, bits)
        os.utime(src / name, ns=(MTIME, MTIME))
    return src


def test_modes_and_mtimes_are_recorded(ckpt, tmp_path):
    brevis.compress([ckpt], tmp_path / "c.brv")
    with ArchiveReader(tmp_path / "c.brv") as r:
        got = {f.path: (f.mode, f.mtime) for f in r.index.files}
    assert got == {"run.sh": (0o755, MTIME), "secret.bin": (0o640, MTIME), "sub/ro.json": (0o444, MTIME)}


def test_modes_and_mtimes_are_restored(ckpt, tmp_path):
    brevis.compress([ckpt], tmp_path / "c.brv")
    out = tmp_path / "out"
    with umask(0o022):
        brevis.decompress(tmp_path / "c.brv", out)
    assert mode(out / "secret.bin") == 0o640  # not 0644
    assert mode(out / "run.sh") == 0o755
    assert mode(out / "sub" / "ro.json") == 0o444
    for name in ("secret.bin", "run.sh", "sub/ro.json"):
        assert os.stat(out / name).st_mtime_ns == MTIME, name  # not now


def test_modes_less_the_umask_as_tar_gives_a_user(ckpt, tmp_path):
    brevis.compress([ckpt], tmp_path / "c.brv")
    with umask(0o077):
        brevis.decompress(tmp_path / "c.brv", tmp_path / "out")
    assert mode(tmp_path / "out" / "run.sh") == 0o700
    assert mode(tmp_path / "out" / "secret.bin") == 0o600


def test_setuid_bits_are_not_restored(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "a").write_bytes(b"x")
    (src / "b").write_bytes(b"y")
    os.chmod(src / "a", 0o4755)
    brevis.compress([src], tmp_path / "c.brv")
    with umask(0o022):
        brevis.decompress(tmp_path / "c.brv", tmp_path / "out")
    assert mode(tmp_path / "out" / "a") == 0o755


def test_no_mode_no_mtime(ckpt, tmp_path):
    brevis.compress([ckpt], tmp_path / "c.brv")
    out = tmp_path / "out"
    with umask(0o022):
        brevis.decompress(tmp_path / "c.brv", out, modes=False, mtimes=False)
    assert mode(out / "secret.bin") == 0o644 and mode(out / "run.sh") == 0o644
    assert abs(os.stat(out / "run.sh").st_mtime_ns - MTIME) > 10 ** 15


def test_single_file_keeps_its_metadata(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"w" * 1000)
    os.chmod(f, 0o600)
    os.utime(f, ns=(MTIME, MTIME))
    brevis.compress([f], tmp_path / "model.bin.brv")
    with umask(0o022):
        brevis.decompress(tmp_path / "model.bin.brv", tmp_path / "copy.bin")
    assert mode(tmp_path / "copy.bin") == 0o600 and os.stat(tmp_path / "copy.bin").st_mtime_ns == MTIME


def test_link_mtimes_are_restored(tmp_path):
    src = tmp_path / "ckpt"
    src.mkdir()
    (src / "w.bin").write_bytes(b"w")
    os.symlink("w.bin", src / "alias")
    os.utime(src / "alias", ns=(MTIME, MTIME), follow_symlinks=False)
    brevis.compress([src], tmp_path / "c.brv")
    brevis.decompress(tmp_path / "c.brv", tmp_path / "out")
    assert os.lstat(tmp_path / "out" / "alias").st_mtime_ns == MTIME
    assert os.stat(tmp_path / "out" / "w.bin").st_mtime_ns != MTIME


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o027])
def test_output_folder_follows_the_umask(ckpt, tmp_path, mask):
    brevis.compress([ckpt], tmp_path / "c.brv")
    with umask(mask):
        brevis.decompress(tmp_path / "c.brv", tmp_path / "out")
    assert mode(tmp_path / "out") == 0o777 & ~mask  # not 0700
    assert mode(tmp_path / "out" / "sub") == 0o777 & ~mask


def test_golden_archive_without_metadata_decodes_with_defaults(tmp_path):
    golden = Path(__file__).resolve().parent / "golden" / "v1" / "archive.brv"
    with ArchiveReader(golden) as r:
        assert all(f.mode is None and f.mtime is None for f in r.index.files)
    with umask(0o022):
        brevis.decompress(golden, tmp_path / "out")
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert files and all(mode(p) == 0o644 for p in files)


def test_cli_no_mode_no_mtime(ckpt, tmp_path):
    from click.testing import CliRunner

    from brevis.cli import cli

    brevis.compress([ckpt], tmp_path / "c.brv")
    with umask(0o022):
        r = CliRunner().invoke(cli, ["decompress", str(tmp_path / "c.brv"), "-o", str(tmp_path / "a")])
        assert r.exit_code == 0, r.output
        r = CliRunner().invoke(cli, ["decompress", str(tmp_path / "c.brv"), "-o", str(tmp_path / "b"),
                                     "--no-mode", "--no-mtime"])
        assert r.exit_code == 0, r.output
    assert mode(tmp_path / "a" / "secret.bin") == 0o640 and os.stat(tmp_path / "a" / "run.sh").st_mtime_ns == MTIME
    assert mode(tmp_path / "b" / "secret.bin") == 0o644 and os.stat(tmp_path / "b" / "run.sh").st_mtime_ns != MTIME
