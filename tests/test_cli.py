"""The `brevis` command, run as `python -m brevis` on a real small checkpoint.

Errors are one line on stderr (never a traceback) with one exit code per
kind: 2 invalid argument, 3 corrupt archive, 4 truncated, 5 newer version,
6 checksum mismatch, 7 output exists, 8 i/o error.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from brevis.archive import writer as writer_module
from brevis.archive.format import HEADER, HEADER_SIZE, VERSION
from brevis.archive.reader import ArchiveReader
from brevis.cli import main
from helpers import REPO, largest_stream, small_checkpoint, tree

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


def _imported_after(runs: list[list[str]], names: str, must_succeed: bool = True) -> str:
    """The modules (those m for which the expression `names` holds) that
    cli.main imported running each of `runs` in a fresh interpreter,
    space-separated."""
    exited = "assert not e.code, (args, e.code)" if must_succeed else "pass"
    code = ("import sys\nfrom brevis import cli\n"
            f"for args in {runs!r}:\n"
            f"    try:\n        cli.main(args)\n    except SystemExit as e:\n        {exited}\n"
            f"print(' '.join(sorted(m for m in sys.modules if {names})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()[-1]


def test_help_and_usage_errors_import_no_codec():
    # Issue 14: the imports a command does not need are not paid. --help,
    # --version and a usage error import neither numpy nor the codec.
    runs = [["--help"], ["--version"], ["compress", "--help"], ["compress"]]
    assert _imported_after(runs, "m.split('.')[0] in ('numpy', 'zstandard', 'blake3') or "
                                 "m.startswith(('brevis.api', 'brevis.codec', 'brevis.dsl', 'brevis.synth'))",
                           must_succeed=False) == ""


def test_reading_commands_import_no_search(archive, tmp_path):
    # Issue 14: decompress, verify, ls and inspect read archives; the
    # search, its planner and the format parsers are the compressor's
    # (about 20 ms of a 170 ms decompress of the shipped checkpoint), and
    # multiprocessing is for archives that worker processes decode.
    runs = [["decompress", str(archive), "-o", str(tmp_path / "out"), "-q"], ["verify", str(archive), "-q"],
            ["ls", str(archive)], ["inspect", str(archive)]]
    assert _imported_after(runs, "m.startswith(('brevis.synth', 'brevis.formats', 'brevis.codec.encoder', "
                                 "'brevis.codec.plan', 'brevis.codec.assembler', 'brevis.workers.executor', "
                                 "'multiprocessing', 'concurrent.futures.process'))") == ""
    assert (tmp_path / "out").exists()


@pytest.mark.parametrize("first,given,expected", [("", None, "1"), ("import numpy\n", None, None),
                                                   ("", "4", "4")])
def test_the_command_keeps_blas_to_one_thread(first, given, expected):
    """The `brevis` command (not a library caller who imported numpy first,
    nor one who chose) starts numpy's OpenBLAS with one thread: Brevis does
    no linear algebra, and its idle threads spin for 0.1 s of CPU."""
    code = (first + "import os, sys\nsys.argv = ['/usr/bin/brevis']\nfrom brevis import cli\n"
            "print(os.environ.get('OPENBLAS_NUM_THREADS'))")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(expected)]


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
    assert summary["file_count"] == 2
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
    assert report["ok"] is True and report["problems"] == [] and report["file_count"] == 3


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
    off, length, _ = largest_stream(archive, name)
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
    newer.write_bytes(HEADER.pack(magic, VERSION + 1, flags, reserved) + data[HEADER_SIZE:])  # the newest read is VERSION
    r = brevis("verify", newer)
    assert r.returncode == 5
    assert "upgrade" in one_error_line(r)


def test_missing_archive(tmp_path):
    r = brevis("verify", tmp_path / "nope.brv")
    assert r.returncode == 2
    one_error_line(r)


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


@pytest.mark.parametrize("behind", [False, True], ids=["main-thread", "write-behind"])
def test_compress_disk_full_leaves_nothing(ckpt, tmp_path, monkeypatch, capsys, behind):
    """Writes that fail (ENOSPC): by the main thread, or by the thread that
    writes streams behind it (encoder.WRITE_BEHIND_*), one line, exit 8."""
    if behind:
        from brevis.codec import encoder

        monkeypatch.setattr(encoder, "WRITE_BEHIND_THREADS", 1)
        monkeypatch.setattr(encoder, "WRITE_BEHIND_BYTES", 0)
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


# ------------------------------------------------------------ issue 15: behave like the tools people know
def test_usage_error_is_one_line(tmp_path):
    r = brevis("compress", tmp_path, "--no-such-option")
    assert r.returncode == 2
    line = one_error_line(r)
    assert "--no-such-option" in line and "brevis compress --help" in line
    r = brevis("compress", tmp_path / "a", tmp_path / "b")  # several sources and no -o
    assert r.returncode == 2 and "-o" in one_error_line(r)


def small_tree(folder: Path) -> Path:
    small_checkpoint(folder)
    return folder


def run_in(cwd: Path, *args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """brevis in `cwd` with bytes in and out (for streams)."""
    return subprocess.run([sys.executable, "-m", "brevis", *map(str, args)], capture_output=True, input=stdin,
                          cwd=cwd, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_single_file_round_trip_like_zstd(tmp_path):
    """Item 2: compress X writes X.brv; X.brv holding only X decompresses to the file X."""
    pth = tmp_path / "model.pth"
    shutil.copyfile(find_pth(), pth)
    data = pth.read_bytes()
    r = brevis("compress", "model.pth", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "model.pth.brv").is_file()
    pth.unlink()
    r = brevis("decompress", "model.pth.brv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("model.pth: 1 file, ")  # the file, and "1 file"
    assert pth.read_bytes() == data
    r = brevis("decompress", "model.pth.brv", cwd=tmp_path)  # the file is there
    assert r.returncode == 7 and "(use --force to overwrite)" in one_error_line(r)
    r = brevis("decompress", "model.pth.brv", "-f", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = brevis("decompress", "model.pth.brv", "-o", "renamed.pth", "-q", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "renamed.pth").read_bytes() == data
    # A folder: ckpt/ -> ckpt.brv, and back to a folder.
    small_tree(tmp_path / "ckpt")
    r = brevis("compress", "ckpt/", "-q", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "ckpt.brv").is_file(), r.stderr
    r = brevis("decompress", "ckpt.brv", "-o", "copy", "-q", cwd=tmp_path)
    assert r.returncode == 0 and tree(tmp_path / "copy") == tree(tmp_path / "ckpt")


def test_streams(tmp_path):
    """Item 5: '-' is standard input; -c and -o - write to standard output; refused where impossible."""
    pth = tmp_path / "model.pth"
    shutil.copyfile(find_pth(), pth)
    data = pth.read_bytes()
    small_tree(tmp_path / "ckpt")
    r = run_in(tmp_path, "compress", "-", "-o", "piped.brv", "-q", stdin=data)
    assert r.returncode == 0, r.stderr
    with ArchiveReader(tmp_path / "piped.brv") as reader:
        assert [f.path for f in reader.index.files] == ["piped"]  # named after the archive
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # the spooled input is gone
    r = run_in(tmp_path, "decompress", "piped.brv", "-c")
    assert r.returncode == 0 and r.stdout == data, r.stderr
    r = run_in(tmp_path, "decompress", "piped.brv", "-o", "-")
    assert r.returncode == 0 and r.stdout == data
    r = run_in(tmp_path, "compress", "model.pth", "-c")  # an archive to standard output
    assert r.returncode == 0, r.stderr
    assert b"1 file" in r.stderr  # the summary goes to stderr: stdout holds the archive
    (tmp_path / "streamed.brv").write_bytes(r.stdout)
    assert brevis("verify", tmp_path / "streamed.brv", "-q").returncode == 0
    r = run_in(tmp_path, "decompress", "-", "-c", stdin=r.stdout)  # an archive from standard input
    assert r.returncode == 0 and r.stdout == data
    r = run_in(tmp_path, "compress", "ckpt", "-o", "ckpt.brv", "-q")
    assert r.returncode == 0
    r = run_in(tmp_path, "cat", "ckpt.brv", "config.json")
    assert r.returncode == 0 and r.stdout == (tmp_path / "ckpt" / "config.json").read_bytes()
    r = run_in(tmp_path, "decompress", "ckpt.brv", "-c", "config.json", "model.safetensors")
    assert r.stdout == b"".join((tmp_path / "ckpt" / n).read_bytes() for n in ("config.json", "model.safetensors"))
    r = run_in(tmp_path, "cat", "ckpt.brv", "*.json")  # globs
    assert r.returncode == 0 and r.stdout == (tmp_path / "ckpt" / "config.json").read_bytes()
    for args in (("decompress", "ckpt.brv", "-o", "-"), ("cat", "ckpt.brv")):  # several files, none named
        r = run_in(tmp_path, *args)
        assert r.returncode == 2 and r.stdout == b""
        err = r.stderr.decode()
        assert err.count("\n") == 1 and "brevis cat ckpt.brv PATH" in err, err
    r = run_in(tmp_path, "cat", "ckpt.brv", "nope.txt")
    assert r.returncode == 2 and b"nope.txt" in r.stderr
    r = run_in(tmp_path, "compress", "-", "model.pth", "-o", "x.brv", stdin=b"")
    assert r.returncode == 2 and b"standard input" in r.stderr
    assert not (tmp_path / "-").exists()


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_show_total_percentage_and_eta(archive, tmp_path, monkeypatch, capsys):
    """Item 6: on a terminal, decompress and verify show the total, a percentage and an ETA."""
    total = None
    with ArchiveReader(archive) as reader:
        total = reader.index.original_bytes
    for argv in (["decompress", archive, "-o", tmp_path / "out", "-j", "1"], ["verify", archive, "-j", "1"]):
        fake = FakeTerminal()
        monkeypatch.setattr(sys, "stderr", fake)
        code, _, _ = run_main(argv, capsys)
        monkeypatch.undo()
        assert code == 0
        text = fake.getvalue()
        assert "100%" in text and "0%" in text, text
        assert f"{total / 1024 / 1024:.2f}M" in text, text  # the total, in MiB
        assert "<00:00" in text  # the time left
    fake = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", fake)
    code, _, _ = run_main(["verify", archive, "-q"], capsys)  # -q: no bar
    monkeypatch.undo()
    assert code == 0 and fake.getvalue() == ""


def test_progress_clock_starts_at_the_first_chunk():
    """Item 6: time spent before the first chunk (learning the prior) gives no absurd ETA."""
    import time

    from brevis.cli import Progress

    fake = FakeTerminal()
    p = Progress(100 << 20, False, "compress", file=fake)
    time.sleep(0.5)  # scanning, learning
    p(1 << 20)
    elapsed = p.bar.format_dict["elapsed"]
    p.close()
    assert elapsed < 0.3, elapsed  # else the ETA would be 99 x 0.5 s for no reason
    assert "1%" in fake.getvalue() or "100%" not in fake.getvalue()
    off = Progress(10, False, "x", file=io.StringIO())  # not a terminal: no bar
    off(5)
    assert off.bar is None


def test_compress_many_progress_moves_with_chunks(tmp_path):
    """Item 6: compress-many's bar gets the bytes each task has written, before the task ends."""
    import time

    from brevis import fleet

    c = fleet.Checkpoint("a", tmp_path / "a", tmp_path / "a.brv", 10_000)
    got: list[int] = []
    tracker = fleet.ProgressFiles(tmp_path, got.append)
    try:
        path = tracker.path_for(c)
        writer = fleet.ProgressWriter(path)  # what the task, on a worker, writes
        writer.last = -1e9
        writer(4000)
        deadline_at = time.monotonic() + 5
        while sum(got) < 4000 and time.monotonic() < deadline_at:
            time.sleep(0.05)
        assert got == [4000]  # before the checkpoint finished
        writer(100_000)  # never more than the checkpoint's size
        writer.close()
        tracker.finished(c)
        assert sum(got) == 10_000
    finally:
        tracker.close()
    assert os.listdir(tmp_path) == []  # the progress file is gone


def test_compress_many_cli_progress_and_summary(ckpt, tmp_path, monkeypatch, capsys):
    fake = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", fake)
    code, out, _ = run_main(["compress-many", ckpt, "-o", tmp_path / "archives", "--engine", "processes",
                             "-w", "1"], capsys)
    monkeypatch.undo()
    assert code == 0, fake.getvalue()
    assert "100%" in fake.getvalue() and "1 worker (" in out, (out, fake.getvalue())


def test_exclude_and_skipped_summary(tmp_path):
    """Item 9: --exclude (repeatable), .git/ and .DS_Store skipped by default, each skip said on stderr."""
    src = small_tree(tmp_path / "ckpt")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref")
    (src / ".DS_Store").write_bytes(b"x")
    (src / "run.log").write_text("log")
    (src / "ckpt-1").mkdir()
    (src / "ckpt-1" / "optimizer.pt").write_bytes(b"o")
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", src / "link")  # a link to a folder outside: skipped, not fatal
    r = brevis("compress", src, "-o", tmp_path / "a.brv", "--exclude", "*.log", "--exclude", "ckpt-*/")
    assert r.returncode == 0, r.stderr
    err = r.stderr
    assert f"brevis: skipped {src / '.git'}: excluded by default (.git/)" in err
    assert f"brevis: skipped {src / '.DS_Store'}: excluded by default" in err
    assert f"brevis: skipped {src / 'run.log'}: matches the exclusion '*.log'" in err
    assert f"brevis: skipped {src / 'ckpt-1'}: matches the exclusion 'ckpt-*/'" in err
    assert f"brevis: skipped {src / 'link'}: a link to a folder outside the source" in err
    assert "--no-default-excludes" in err
    assert r.stdout.startswith(f"{tmp_path / 'a.brv'}: 2 files, ")
    r = brevis("compress", src, "-o", tmp_path / "b.brv", "--no-default-excludes", "--json")
    assert r.returncode == 0
    s = json.loads(r.stdout)
    assert s["file_count"] == 6 and [k["kind"] for k in s["skipped"]] == ["link"]


def test_extract_globs_and_default_output(ckpt, archive, tmp_path):
    """Item 9: extract takes globs, and -o is optional."""
    local = tmp_path / "ckpt.brv"
    shutil.copyfile(archive, local)
    r = brevis("extract", local, "model.safetensors::layer.*", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["output"] == str(tmp_path / "ckpt.part.safetensors")
    assert s["tensors"] == ["layer.weight", "layer.bias"] and s["tensor_count"] == 2
    r = brevis("extract", local, "no.such.*", "-o", tmp_path / "x.safetensors")
    assert r.returncode == 2 and "no.such.*" in one_error_line(r)


def test_threads_help_per_command():
    """Item 10: -j says what each command runs in parallel."""
    helps = {}
    for command in (["compress"], ["decompress"], ["verify"], ["extract"], ["cat"], ["prior", "learn"]):
        r = brevis(*command, "--help")
        assert r.returncode == 0
        helps[" ".join(command)] = " ".join(r.stdout.split())
    assert "Encoding" in helps["compress"] and "Encoding" not in helps["decompress"]
    assert "Decoding" in helps["decompress"] and "Decoding" in helps["verify"]
    assert "Decoding threads" in helps["extract"] and "learning searches" in helps["prior learn"]


def test_debug_after_the_command_quiet_and_json_errors(archive, tmp_path):
    """Item 10: --debug anywhere; -q on inspect and ls; --json errors are JSON."""
    r = brevis("verify", archive, "--debug", "-q")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    r = brevis("verify", tmp_path / "nope.brv", "--debug")
    assert r.returncode == 2
    for command in ("inspect", "ls"):
        r = brevis(command, archive, "-q")
        assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    for args, code, kind in ((["verify", tmp_path / "nope.brv", "--json"], 2, "invalid argument"),
                             (["compress", tmp_path / "nope", "-o", tmp_path / "x.brv", "--json"], 2,
                              "invalid argument"),
                             (["decompress", archive, "--json", "--bogus"], 2, "invalid argument")):
        r = brevis(*args)
        assert r.returncode == code
        one_error_line(r)
        e = json.loads(r.stdout)["error"]
        assert e["kind"] == kind and e["exit_code"] == code and isinstance(e["message"], str) and e["message"]


def test_missing_output_folder_is_exit_2_everywhere(ckpt, archive, tmp_path):
    """Item 10: one rule for an output in a folder that does not exist."""
    missing = tmp_path / "no" / "such"
    for args in (["compress", ckpt / "config.json", "-o", missing / "x.brv"],
                 ["decompress", archive, "-o", missing / "out"],
                 ["extract", archive, "model.safetensors::layer.bias", "-o", missing / "x.safetensors"]):
        r = brevis(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "does not exist" in one_error_line(r)


def test_wording_and_base_in_inspect(tmp_path):
    """Item 10: plurals, verify's wording, inspect says an archive needs its base."""
    base = small_tree(tmp_path / "base")
    ft = tmp_path / "ft"
    shutil.copytree(base, ft)
    r = brevis("compress", ft / "config.json", "-o", tmp_path / "one.brv")
    assert r.returncode == 0 and ": 1 file, " in r.stdout
    r = brevis("verify", tmp_path / "one.brv", "--source", ft / "config.json")
    assert r.stdout.strip() == f"{tmp_path / 'one.brv'}: OK, 1 file match the source" or \
        r.stdout.strip() == f"{tmp_path / 'one.brv'}: OK, 1 file matches the source"
    r = brevis("verify", tmp_path / "one.brv")
    assert r.stdout.strip() == f"{tmp_path / 'one.brv'}: OK, 1 file, every checksum matches"
    r = brevis("compress", ft, "--base", base, "-o", tmp_path / "ft.brv", "-q")
    assert r.returncode == 0, r.stderr
    r = brevis("inspect", tmp_path / "ft.brv", "--json")
    info = json.loads(r.stdout)
    if info["base_required"]:  # the search chose to use the base
        r = brevis("inspect", tmp_path / "ft.brv")
        assert "made against a base model" in r.stdout
        r = brevis("verify", tmp_path / "ft.brv")
        assert r.returncode == 2 and one_error_line(r).endswith(": pass it with --base")
    r = brevis("inspect", tmp_path / "one.brv")
    assert "base model" not in r.stdout


def test_install_lines_work_from_a_clone():
    """Item 4: the distribution has a free name; every pip line in the README installs this clone."""
    import re
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == "brevis-ckpt"  # "brevis" on the package index is someone else's
    assert project["scripts"]["brevis"] == "brevis.cli:main"
    extras = set(project["optional-dependencies"])
    readme = (REPO / "README.md").read_text()
    lines = re.findall(r"pip install ([^\n#`]+)", readme)
    assert lines
    for line in lines:
        for target in line.split():
            if target.startswith("-"):
                continue
            target = target.strip("'\"")
            if target in ("torch", "distributed", "ml_dtypes"):  # third-party packages, by their own names
                continue
            m = re.fullmatch(r"\.(?:\[([a-z,]+)\])?", target)
            assert m, f"README installs {target!r}, not this clone"
            assert set((m.group(1) or "").split(",")) - {""} <= extras, target
    from brevis.cli import DIST
    assert DIST == project["name"]


# The documented JSON fields (README, "JSON output"), and their types.
NUM = (int, float)
JSON_FIELDS = {
    "compress": {"archive": str, "file_count": int, "original_bytes": int, "archive_bytes": int, "ratio": float,
                 "seconds": NUM, "learn_seconds": NUM, "throughput_mb_s": NUM, "effort": int,
                 "prior_samples": int, "encode_processes": int, "skipped": list, "main_thread_cpu_s": NUM,
                 "writer_cpu_s": NUM},
    "decompress": {"archive": str, "output": str, "file_count": int, "original_bytes": int, "seconds": NUM,
                   "main_thread_cpu_s": NUM},
    "verify": {"archive": str, "ok": bool, "file_count": int, "original_bytes": int, "source_compared": bool,
               "problems": list, "seconds": NUM},
    "inspect": {"archive": str, "archive_bytes": int, "original_bytes": int, "file_count": int, "tensor_count": int,
                "base_required": bool, "created_by": str, "dirs": list, "files": list},
    "ls": {"archive": str, "archive_bytes": int, "original_bytes": int, "file_count": int, "tensor_count": int,
           "files": list},
    "extract": {"archive": str, "output": str, "tensors": list, "tensor_count": int, "original_bytes": int,
                "output_bytes": int, "seconds": NUM},
    "cat": {"archive": str, "files": list, "file_count": int, "original_bytes": int, "seconds": NUM},
}


def check_fields(summary: dict, command: str) -> None:
    for key, kind in JSON_FIELDS[command].items():
        assert key in summary, (command, key)
        assert isinstance(summary[key], kind) and not (kind is int and isinstance(summary[key], bool)), \
            (command, key, summary[key])


def test_json_fields_of_every_command(ckpt, tmp_path):
    """Item 1 and 10: every documented field of every command's --json, its type and its value."""
    sizes = {n: (ckpt / n).stat().st_size for n in os.listdir(ckpt)}
    total = sum(sizes.values())
    a = tmp_path / "a.brv"
    r = brevis("compress", ckpt, "-o", a, "--json", "-j", "1")
    s = json.loads(r.stdout)
    check_fields(s, "compress")
    assert s["archive"] == str(a)  # a path, not the repr of an internal object (item 1)
    assert s["file_count"] == 3 and s["original_bytes"] == total and s["archive_bytes"] == a.stat().st_size
    assert s["ratio"] == pytest.approx(s["archive_bytes"] / total) and s["effort"] == 2 and s["skipped"] == []
    assert s["seconds"] >= s["learn_seconds"] >= 0 and s["encode_processes"] >= 1
    assert s["main_thread_cpu_s"] > 0 and s["writer_cpu_s"] == 0  # (one thread: it writes the streams itself)

    out = tmp_path / "out"
    d = json.loads(brevis("decompress", a, "-o", out, "--json").stdout)
    check_fields(d, "decompress")
    assert d == {**d, "archive": str(a), "output": str(out), "file_count": 3, "original_bytes": total}

    for sources, compared in (([], False), (["--source", ckpt], True)):
        v = json.loads(brevis("verify", a, "--json", *sources).stdout)
        check_fields(v, "verify")
        assert v["ok"] is True and v["problems"] == [] and v["source_compared"] is compared
        assert v["file_count"] == 3 and v["original_bytes"] == total and v["archive"] == str(a)

    i = json.loads(brevis("inspect", a, "--json").stdout)
    check_fields(i, "inspect")
    assert i["archive_bytes"] == a.stat().st_size and i["original_bytes"] == total and i["file_count"] == 3
    assert i["base_required"] is False and i["created_by"].startswith("brevis") and i["dirs"] == []
    files = {f["path"]: f for f in i["files"]}
    assert {p: f["original_bytes"] for p, f in files.items()} == sizes
    for f in i["files"]:
        assert set(f) == {"path", "format", "original_bytes", "stored_bytes", "segments"}
        assert sum(seg["original_bytes"] for seg in f["segments"]) == f["original_bytes"]
        assert sum(seg["stored_bytes"] for seg in f["segments"]) == f["stored_bytes"]
        for seg in f["segments"]:
            assert {"name", "dtype", "shape", "original_bytes", "stored_bytes", "chunks", "programs",
                    "search"} <= set(seg)
    tensors = sum(len(seg.get("members", [None])) for f in i["files"] for seg in f["segments"] if seg["dtype"] != "bytes")
    assert i["tensor_count"] == tensors

    ls = json.loads(brevis("ls", a, "--json").stdout)
    check_fields(ls, "ls")
    assert ls["file_count"] == 3 and ls["tensor_count"] == tensors == sum(len(f["tensors"]) for f in ls["files"])
    assert ls["original_bytes"] == total and ls["archive_bytes"] == a.stat().st_size
    for f in ls["files"]:
        assert f["original_bytes"] == sizes[f["path"]] and f["stored_bytes"] == files[f["path"]]["stored_bytes"]
        for t in f["tensors"]:
            assert set(t) == {"key", "name", "dtype", "shape", "original_bytes", "stored_bytes"}
    bias = next(t for f in ls["files"] for t in f["tensors"] if t["name"] == "layer.bias")
    assert bias["original_bytes"] == 64 * 4 and bias["dtype"] == "F32" and bias["shape"] == [64]

    x = tmp_path / "x.safetensors"
    e = json.loads(brevis("extract", a, bias["key"], "-o", x, "--json").stdout)
    check_fields(e, "extract")
    assert e["tensors"] == ["layer.bias"] and e["tensor_count"] == 1 and e["original_bytes"] == 256
    assert e["output_bytes"] == x.stat().st_size and e["output"] == str(x)

    r = subprocess.run([sys.executable, "-m", "brevis", "cat", str(a), "config.json", "--json"], capture_output=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.stdout == (ckpt / "config.json").read_bytes()  # the data on stdout, the summary on stderr
    c = json.loads(r.stderr)
    check_fields(c, "cat")
    assert c["files"] == ["config.json"] and c["file_count"] == 1 and c["original_bytes"] == sizes["config.json"]

    m = json.loads(brevis("compress-many", ckpt, "-o", tmp_path / "fleet", "--engine", "processes", "-w", "1",
                          "--json").stdout)
    (report,) = m["checkpoints"]
    assert report["name"] == "ckpt" and report["status"] == "compressed" and report["verified"] is True
    assert report["original_bytes"] == total and report["archive"] == str(tmp_path / "fleet" / "ckpt.brv")
    assert m["compressed"] == 1 and m["failed"] == 0 and m["ok"] is True


def test_readme_usage_runs(tmp_path):
    """Every command of the README's Usage section, as written, in order."""
    import re

    readme = (REPO / "README.md").read_text()
    usage = readme.split("## Usage", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"\n\n((?:    .*\n)+)", usage):
        for line in block.splitlines():
            command = line[4:].split("  #", 1)[0].strip()
            if command and not command.startswith("pip "):
                commands.append(command)
    assert len(commands) >= 15 and any(c.startswith("brevis cat") for c in commands)
    small_tree(tmp_path / "ckpt")
    small_checkpoint(tmp_path / "next-ckpt", seed=3)
    shutil.copyfile(find_pth(), tmp_path / "model.pth")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "brevis").write_text(f"#!/bin/sh\nexec {sys.executable} -m brevis \"$@\"\n")
    (bin_dir / "brevis").chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    work = tmp_path / "work"
    work.mkdir()
    for name in ("ckpt", "next-ckpt", "model.pth"):
        os.replace(tmp_path / name, work / name)
    for command in commands:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=work, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, (command, r.stderr)
    assert (work / "ckpt.brv").is_file() and (work / "next-ckpt.brv").is_file()
    assert (work / "piped.pth").read_bytes() == (work / "model.pth").read_bytes()
    assert tree(work / "ckpt-copy") == tree(work / "ckpt")
