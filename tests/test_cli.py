"""The `brevis` command, run as `python -m brevis` on a real small checkpoint.

Errors are one line on stderr (never a traceback) with one exit code per
kind: 2 invalid argument, 3 corrupt archive, 4 truncated, 5 newer version,
6 checksum mismatch, 7 output exists, 8 i/o error.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from brevis.archive import writer as writer_module
from brevis.archive.format import HEADER, HEADER_SIZE
from brevis.archive.reader import ArchiveReader
from brevis.cli import main
from helpers import REPO, small_checkpoint, tree

PTH_NAME = "taef2_decoder.pth"
PTH_CANDIDATES = [
    REPO / "examples" / "taesd" / PTH_NAME,  # committed with the project
    REPO.parent / "shared" / "corpus" / "taesd" / PTH_NAME,
    Path("/work/shared/corpus/taesd") / PTH_NAME,
]


def find_pth() -> Path:
    for p in PTH_CANDIDATES:
        if p.is_file():
            return p
    pytest.skip(f"{PTH_NAME} not found")


def brevis(*args: str | os.PathLike, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "brevis", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("brevis: "), lines[0]
    return lines[0]


def no_partials(folder: Path) -> None:
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".") or "partial" in p.name]
    assert not leftovers, leftovers


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    """A real PyTorch F16 checkpoint (taesd, MIT), a small safetensors file and a config.json."""
    folder = tmp_path_factory.mktemp("cli") / "ckpt"
    small_checkpoint(folder)
    shutil.copyfile(find_pth(), folder / PTH_NAME)
    return folder


@pytest.fixture(scope="module")
def archive(ckpt) -> Path:
    out = ckpt.parent / "ckpt.brv"
    r = brevis("compress", ckpt, "-o", out, "-q", "-j", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    return out


def test_version_and_help():
    r = brevis("--version")
    assert r.returncode == 0 and "brevis" in r.stdout
    r = brevis("--help")
    assert r.returncode == 0
    for command in ("compress", "decompress", "verify", "inspect"):
        assert command in r.stdout


def test_compress_decompress_roundtrip(ckpt, archive, tmp_path):
    out = tmp_path / "restored"
    r = brevis("decompress", archive, "-o", out, "-j", "2")
    assert r.returncode == 0, r.stderr
    assert tree(out) == tree(ckpt)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", PTH_NAME]


def test_decompress_default_output_is_the_archive_name(ckpt, archive, tmp_path):
    local = tmp_path / "model.brv"
    shutil.copyfile(archive, local)
    r = brevis("decompress", "model.brv", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert tree(tmp_path / "model") == tree(ckpt)


def test_compress_json(ckpt, tmp_path):
    out = tmp_path / "x.brv"
    r = brevis("compress", ckpt / "model.safetensors", ckpt / "config.json", "-o", out, "--json", "-j", "1")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["files"] == 2
    assert summary["archive_bytes"] == out.stat().st_size
    assert summary["original_bytes"] == sum((ckpt / n).stat().st_size for n in ("model.safetensors", "config.json"))
    assert 0 < summary["ratio"] < 1


def test_verify(archive):
    r = brevis("verify", archive)
    assert r.returncode == 0, r.stderr
    assert "OK" in r.stdout
    r = brevis("verify", archive, "--json")
    assert r.returncode == 0
    report = json.loads(r.stdout)
    assert report["ok"] is True and report["problems"] == [] and report["files"] == 3


def test_verify_source(ckpt, archive, tmp_path):
    r = brevis("verify", archive, "--source", ckpt)
    assert r.returncode == 0, r.stderr + r.stdout
    # A source that differs: a checksum failure, named.
    changed = tmp_path / "ckpt"
    shutil.copytree(ckpt, changed)
    with open(changed / "config.json", "a") as f:
        f.write(" ")
    r = brevis("verify", archive, "--source", changed)
    assert r.returncode == 6
    assert "config.json" in r.stderr


def corrupt_stream(archive: Path, name: str, out: Path) -> None:
    """Copy the archive with one byte flipped in the middle of a stream of file `name`."""
    with ArchiveReader(archive) as reader:
        entry = next(f for f in reader.index.files if f.path == name)
        off, length, _ = max((s for seg in entry.segments for c in seg.chunks for s in c.streams),
                          key=lambda s: s[1])
    data = bytearray(archive.read_bytes())
    data[off + length // 2] ^= 0x01
    out.write_bytes(data)


def test_verify_detects_a_corrupt_stream(archive, tmp_path):
    bad = tmp_path / "bad.brv"
    corrupt_stream(archive, PTH_NAME, bad)
    r = brevis("verify", bad)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert PTH_NAME in lines[0]
    assert "FAILED" in r.stdout


def test_decompress_of_a_corrupt_archive_leaves_no_output(archive, tmp_path):
    bad = tmp_path / "bad.brv"
    corrupt_stream(archive, PTH_NAME, bad)
    out = tmp_path / "out"
    r = brevis("decompress", bad, "-o", out)
    assert r.returncode == 6
    line = one_error_line(r)
    assert "checksum" in line
    assert not out.exists()
    no_partials(tmp_path)


def test_inspect(archive):
    r = brevis("inspect", archive)
    assert r.returncode == 0, r.stderr
    assert PTH_NAME in r.stdout and "model.safetensors" in r.stdout
    assert "layer.weight" in r.stdout


def test_inspect_json(archive):
    r = brevis("inspect", archive, "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["archive_bytes"] == archive.stat().st_size
    files = {f["path"]: f for f in info["files"]}
    assert set(files) == {"config.json", "model.safetensors", PTH_NAME}
    assert files["model.safetensors"]["format"] == "safetensors"
    segments = [s for f in info["files"] for s in f["segments"]]
    assert any(s["dtype"] == "BF16" and s["shape"] == [64, 32] for s in segments)
    for s in segments:
        if s["chunks"]:
            assert s["programs"], s
        for p in s["programs"]:
            assert isinstance(p["program"], str) and p["program"]
            assert p["program"].count("[") == p["program"].count("]")


# ------------------------------------------------------------ exit codes
def test_missing_source(tmp_path):
    r = brevis("compress", tmp_path / "nope", "-o", tmp_path / "x.brv")
    assert r.returncode == 2
    assert "nope" in one_error_line(r)
    assert not (tmp_path / "x.brv").exists()


def test_output_exists(ckpt, archive, tmp_path):
    out = tmp_path / "x.brv"
    out.write_bytes(b"keep me")
    r = brevis("compress", ckpt / "config.json", "-o", out)
    assert r.returncode == 7
    one_error_line(r)
    assert out.read_bytes() == b"keep me"
    r = brevis("compress", ckpt / "config.json", "-o", out, "-f", "-q")
    assert r.returncode == 0, r.stderr
    assert brevis("verify", out).returncode == 0
    no_partials(tmp_path)


def test_decompress_over_existing_files(ckpt, archive, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("mine")
    r = brevis("decompress", archive, "-o", out)
    assert r.returncode == 7
    assert "config.json" in one_error_line(r)
    assert (out / "config.json").read_text() == "mine"
    assert os.listdir(out) == ["config.json"]
    r = brevis("decompress", archive, "-o", out, "-f", "-q")
    assert r.returncode == 0, r.stderr
    assert tree(out) == tree(ckpt)


@pytest.mark.parametrize("command", ["verify", "decompress", "inspect"])
def test_truncated_archive(archive, tmp_path, command):
    cut = tmp_path / "cut.brv"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    r = brevis(command, cut)
    assert r.returncode == 4
    assert "truncated" in one_error_line(r)
    assert not (tmp_path / "cut").exists()


@pytest.mark.parametrize("command", ["verify", "decompress", "inspect"])
def test_not_an_archive(ckpt, tmp_path, command):
    r = brevis(command, ckpt / "config.json")
    assert r.returncode == 3
    assert "not a Brevis archive" in one_error_line(r)


def test_newer_version(archive, tmp_path):
    data = archive.read_bytes()
    magic, version, flags, reserved = HEADER.unpack(data[:HEADER_SIZE])
    newer = tmp_path / "newer.brv"
    newer.write_bytes(HEADER.pack(magic, version + 1, flags, reserved) + data[HEADER_SIZE:])
    r = brevis("verify", newer)
    assert r.returncode == 5
    assert "upgrade" in one_error_line(r)


def test_missing_archive(tmp_path):
    r = brevis("verify", tmp_path / "nope.brv")
    assert r.returncode == 2
    one_error_line(r)


def test_usage_error(tmp_path):
    r = brevis("compress", tmp_path)  # no -o
    assert r.returncode == 2
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------ failures leave nothing behind
def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run the CLI in this process (so a test can make things fail midway)."""
    try:
        main([str(a) for a in argv])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_compress_failing_midway_leaves_nothing(ckpt, tmp_path, monkeypatch, capsys):
    """A source that vanishes while being archived: no archive, no temporary file."""
    src = tmp_path / "src"
    shutil.copytree(ckpt, src)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    original = writer_module.ArchiveWriter.write_stream

    def vanish(self, data, crc):
        for p in list(src.iterdir()):
            p.unlink()
        return original(self, data, crc)

    monkeypatch.setattr(writer_module.ArchiveWriter, "write_stream", vanish)
    code, _, err = run_main(["compress", src, "-o", out_dir / "x.brv", "-j", "1", "-q"], capsys)
    assert code == 8, err  # i/o error: "... disappeared while being read"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert os.listdir(out_dir) == []


def test_compress_disk_full_leaves_nothing(ckpt, tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    original = writer_module.ArchiveWriter.write_stream
    calls = [0]

    class Full:
        """A file whose writes fail with ENOSPC after the header."""

        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    def full(self, data, crc):
        calls[0] += 1
        if not isinstance(self.file, Full):
            self.file = Full(self.file)
        return original(self, data, crc)

    monkeypatch.setattr(writer_module.ArchiveWriter, "write_stream", full)
    code, _, err = run_main(["compress", ckpt, "-o", out_dir / "x.brv", "-j", "2", "-q"], capsys)
    assert calls[0] >= 1
    assert code == 8, err
    assert "disk full" in err and len(err.strip().splitlines()) == 1
    assert os.listdir(out_dir) == []


def test_compress_of_an_unreadable_source_leaves_nothing(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 100)
    os.symlink(tmp_path / "missing", src / "broken")  # a broken link: refused before writing
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, _, err = run_main(["compress", src, "-o", out_dir / "x.brv", "-q"], capsys)
    assert code == 2, err
    assert "broken" in err
    assert os.listdir(out_dir) == []


def test_decompress_failing_midway_leaves_no_output(ckpt, archive, tmp_path, monkeypatch, capsys):
    """A later file fails to decode: nothing of the earlier ones is left."""
    bad = tmp_path / "bad.brv"
    corrupt_stream(archive, PTH_NAME, bad)  # the last file in archive order
    out = tmp_path / "restored"
    code, _, err = run_main(["decompress", bad, "-o", out, "-j", "1", "-q"], capsys)
    assert code == 6, err
    assert not out.exists()
    no_partials(tmp_path)
