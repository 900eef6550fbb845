"""Interrupted runs: SIGINT, SIGTERM and SIGKILL at several points of `brevis
compress` and `brevis decompress`, run as subprocesses on a real checkpoint
(taesd) and a generated 25 MB safetensors file.

What must hold:
- the sources are unchanged (SHA-256 before and after);
- SIGINT, SIGTERM and SIGHUP: exit 130 within 5 s, one line on stderr,
  nothing at the output path and no temporary left;
- SIGKILL: the output path never appears; a hidden `.NAME.XXXXXXXX.partial`
  file (or staging folder) may remain, and the next run for the same output
  removes it (it is older than that run and no live process holds its lock);
- whenever the output path exists, it is complete (the rename is the commit
  point): a run the signal came too late for must have produced a correct
  archive or tree.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import brevis
from brevis.fs.atomic import remove_stale
from robust_util import ENV, PTH
from helpers import f16_layers, tree

FAST = [("INT", 0.05), ("INT", 0.4), ("TERM", 0.25), ("HUP", 0.25), ("KILL", 0.25)]
SLOW = [(s, d) for s in ("INT", "TERM", "KILL") for d in (0.0, 0.1, 0.2, 0.35, 0.5)]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    if not PTH.is_file():
        pytest.skip(f"{PTH} not found")
    src = tmp_path_factory.mktemp("interrupt") / "src"
    src.mkdir()
    shutil.copyfile(PTH, src / PTH.name)
    f16_layers(src / "gen.safetensors", 6)
    (src / "config.json").write_text('{"layers": 6}\n')
    return src


@pytest.fixture(scope="module")
def archive(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("interrupt-archive") / "ckpt.brv"
    brevis.compress([source], out, threads=2)
    return out


def start(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "brevis", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)


def temporaries(folder: Path, name: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".partial"))


def signal_midway(p: subprocess.Popen, folder: Path, name: str, sig: str, delay: float, out: Path):
    """Wait for the run's temporary to appear, wait `delay`, send the signal.
    Watch the output path all along. Returns (exit code, stderr, seconds from
    signal to exit, whether the output path was seen before the exit)."""
    deadline = time.monotonic() + 120
    while not temporaries(folder, name) and p.poll() is None:
        assert time.monotonic() < deadline, "the run never started writing"
        time.sleep(0.002)
    time.sleep(delay)
    seen_early = os.path.lexists(out)
    sent = time.monotonic()
    p.send_signal(getattr(signal, f"SIG{sig}"))
    while p.poll() is None:
        assert time.monotonic() - sent < 30, "no exit within 30 s of the signal"
        time.sleep(0.002)
    elapsed = time.monotonic() - sent
    _, err = p.communicate()
    return p.returncode, err, elapsed, seen_early


def check_compress_interrupted(source: Path, tmp_path: Path, sig: str, delay: float) -> None:
    before = tree(source)
    out = tmp_path / "ckpt.brv"
    p = start("compress", source, "-o", out, "-j", "2", "-q")
    rc, err, elapsed, seen_early = signal_midway(p, tmp_path, out.name, sig, delay, out)
    assert tree(source) == before, "a source changed"
    if rc == 0 or seen_early or (sig != "KILL" and os.path.lexists(out)):
        # Renamed into place (the commit point) before the signal took effect:
        # complete, whether the signal then met the run's end or interpreter shutdown.
        assert brevis.verify(out, [source], threads=2)["ok"]
        # 130, or killed by the signal itself when it came during interpreter shutdown
        assert rc in (0, 130, -getattr(signal, f"SIG{sig}")), rc
        assert temporaries(tmp_path, out.name) == []
        return
    if sig == "KILL":
        assert rc == -signal.SIGKILL
        if os.path.lexists(out):  # killed after the rename: the archive is whole
            assert brevis.verify(out, [source], threads=2)["ok"]
            return
        left = temporaries(tmp_path, out.name)
        assert len(left) <= 1, left
        # The next run removes the dead run's temporary and writes a good archive.
        r = subprocess.run([sys.executable, "-m", "brevis", "compress", source, "-o", out, "-q", "-j", "2"],
                           capture_output=True, text=True, env=ENV, timeout=300)
        assert r.returncode == 0, r.stderr
        assert temporaries(tmp_path, out.name) == []
        assert brevis.verify(out, [source], threads=2)["ok"]
        return
    assert rc == 130, (rc, err)
    assert err.strip() == "brevis: interrupted", err  # click writes a newline first (after ^C)
    assert elapsed < 5, f"{elapsed:.1f} s from SIG{sig} to exit"
    assert temporaries(tmp_path, out.name) == []
    # Interrupted after the rename (the commit point): complete, or not there at all.
    assert not os.path.lexists(out) or brevis.verify(out, [source], threads=2)["ok"]


@pytest.mark.parametrize("sig,delay", FAST)
def test_compress_interrupted(source, tmp_path, sig, delay):
    check_compress_interrupted(source, tmp_path, sig, delay)


@pytest.mark.slow
@pytest.mark.parametrize("sig,delay", SLOW)
def test_compress_interrupted_at_many_points(source, tmp_path, sig, delay):
    check_compress_interrupted(source, tmp_path, sig, delay)


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_signal_during_startup(source, tmp_path, sig):
    """A signal while Python is still importing Brevis: nothing is written,
    whatever the exit code (see test_ctrl_c_while_importing for the code)."""
    out = tmp_path / "early.brv"
    p = start("compress", source, "-o", out, "-q")
    # Well inside the imports: the run's temporary appears about 0.14 s
    # after the start here (2026-12-04), 0.04 s after the 0.1 this waited.
    time.sleep(0.05)
    p.send_signal(getattr(signal, f"SIG{sig}"))
    p.communicate(timeout=30)
    assert p.returncode != 0
    assert os.listdir(tmp_path) == []


HOOK = """
import os, runpy, signal, sys
class Hook:  # Ctrl-C at a fixed point of the imports
    def find_spec(self, name, path=None, target=None):
        if name == "brevis.dsl.coders":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Hook())
sys.argv = ["brevis", *sys.argv[1:]]
runpy.run_module("brevis", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_while_importing(source, tmp_path):
    r = subprocess.run([sys.executable, "-c", HOOK, "compress", str(source), "-o", str(tmp_path / "x.brv")],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert os.listdir(tmp_path) == []  # holds today
    assert "Traceback" not in r.stderr
    assert r.returncode == 130, r.returncode


DROPPED = """
import os, signal, sys
class Dropping:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs here, inside the finalizer
class Hook:  # Ctrl-C in a finalizer the imports run (importlib's module locks have one)
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            Dropping()
        return None
sys.meta_path.insert(0, Hook())
"""


def test_ctrl_c_while_importing_under_python_m(source, tmp_path):
    # `python -m brevis`, as the tests and many scripts run it, guarded as
    # the script is. A KeyboardInterrupt raised in a finalizer is dropped:
    # stop 71's CI saw a run Ctrl-C'd during its imports go on and write
    # its archive, exit 0. The hook comes in by sitecustomize, so that -m
    # itself runs the module.
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(DROPPED)
    out = tmp_path / "out"
    out.mkdir()
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(hooks), ENV["PYTHONPATH"]])}
    r = subprocess.run([sys.executable, "-m", "brevis", "compress", str(source), "-o", str(out / "x.brv")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert os.listdir(out) == []
    assert r.stderr == "brevis: interrupted\n", r.stderr
    assert r.returncode == 130, r.returncode


def check_decompress_interrupted(source: Path, archive: Path, tmp_path: Path, sig: str, delay: float) -> None:
    out = tmp_path / "restored"
    p = start("decompress", archive, "-o", out, "-j", "1", "-q")
    rc, err, elapsed, seen_early = signal_midway(p, tmp_path, out.name, sig, delay, out)
    if rc == 0 or os.path.lexists(out):  # the rename happened: the tree is whole
        assert tree(out) == tree(source)
        return
    assert not seen_early  # (it would still be there)
    if sig == "KILL":
        assert rc == -signal.SIGKILL
        left = temporaries(tmp_path, out.name)
        assert len(left) <= 1, left
        r = subprocess.run([sys.executable, "-m", "brevis", "decompress", archive, "-o", out, "-q"],
                           capture_output=True, text=True, env=ENV, timeout=300)
        assert r.returncode == 0, r.stderr
        assert temporaries(tmp_path, out.name) == []
        assert tree(out) == tree(source)
        return
    assert rc == 130, (rc, err)
    assert err.strip() == "brevis: interrupted", err  # click writes a newline first (after ^C)
    assert elapsed < 5
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("sig,delay", [("INT", 0.0), ("TERM", 0.02), ("HUP", 0.02), ("KILL", 0.0)])
def test_decompress_interrupted(source, archive, tmp_path, sig, delay):
    check_decompress_interrupted(source, archive, tmp_path, sig, delay)


@pytest.mark.slow
@pytest.mark.parametrize("sig,delay", [(s, d) for s in ("INT", "TERM", "KILL") for d in (0.0, 0.03, 0.08, 0.15)])
def test_decompress_interrupted_at_many_points(source, archive, tmp_path, sig, delay):
    check_decompress_interrupted(source, archive, tmp_path, sig, delay)


# ------------------------------------------------------------ stale temporaries
def old(path: Path, seconds: float = 3600) -> Path:
    t = time.time() - seconds
    os.utime(path, (t, t), follow_symlinks=False)
    return path


def test_compress_removes_only_its_own_stale_temporaries(tmp_path):
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 1000)
    stale = tmp_path / ".x.brv.a1b2c3d4.partial"
    stale.write_bytes(b"left by a killed run")
    old(stale)
    keep = {
        ".y.brv.a1b2c3d4.partial": "another output's",
        ".x.brv.partial": "not the pattern",
        ".x.brv.A1B2C3D4.partial": "not mkstemp's alphabet",
        "x.brv.a1b2c3d4.partial": "not hidden",
        ".x.brv.a1b2c3d4.partial.bak": "not the suffix",
        ".x.brv.zzzzzzzz.partial": "newer than the run",
        ".x.brv.llllllll.partial": "held by a live run",
    }
    for name in keep:
        (tmp_path / name).write_bytes(b"keep")
        if name != ".x.brv.zzzzzzzz.partial":
            old(tmp_path / name)
    future = time.time() + 3600
    os.utime(tmp_path / ".x.brv.zzzzzzzz.partial", (future, future))
    os.symlink(tmp_path / "f.bin", tmp_path / ".x.brv.s1s1s1s1.partial")  # a link: never followed or removed
    old(tmp_path / ".x.brv.s1s1s1s1.partial")
    held = os.open(tmp_path / ".x.brv.llllllll.partial", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        brevis.compress([src], tmp_path / "x.brv")
    finally:
        os.close(held)
    names = set(os.listdir(tmp_path))
    assert stale.name not in names
    assert set(keep) <= names
    assert ".x.brv.s1s1s1s1.partial" in names and (tmp_path / "f.bin").read_bytes() == b"x" * 1000
    assert brevis.verify(tmp_path / "x.brv", [src])["ok"]


def test_decompress_removes_a_stale_staging_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    brevis.compress([src], tmp_path / "a.brv")
    stage = tmp_path / ".out.q9q9q9q9.partial"
    (stage / "sub").mkdir(parents=True)
    (stage / "sub" / "half.bin").write_bytes(b"half")
    old(stage)
    live = tmp_path / ".out.w8w8w8w8.partial"
    live.mkdir()
    old(live)
    held = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        brevis.decompress(tmp_path / "a.brv", tmp_path / "out")
    finally:
        os.close(held)
    assert sorted(os.listdir(tmp_path)) == [".out.w8w8w8w8.partial", "a.brv", "out", "src"]
    assert tree(tmp_path / "out") == tree(src)


def test_a_live_writers_temporary_is_never_removed(tmp_path):
    """Two runs for one output: the second never removes the first's temporary."""
    from brevis.archive.writer import ArchiveWriter
    from brevis.archive.index import Index

    # force: without it, the first would refuse to replace what the second put in place (issue 16)
    with ArchiveWriter(tmp_path / "x.brv", force=True) as first:
        old(first.tmp)
        assert remove_stale(tmp_path, "x.brv", time.time_ns()) == []
        with ArchiveWriter(tmp_path / "x.brv", force=True) as second:
            assert first.tmp.exists() and second.tmp.exists()
            second.finish(Index([], [], "second"))
        first.finish(Index([], [], "first"))
    assert brevis.inspect(tmp_path / "x.brv")["created_by"] == "first"
    assert os.listdir(tmp_path) == ["x.brv"]
