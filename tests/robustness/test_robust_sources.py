"""Source edge cases: links, empty things, very long and non-UTF-8 names,
files that change or cannot be read while being archived, FIFOs.

What a user gets: links to files are followed (a Hugging Face cache is made
of them); links to folders are refused, with a message that says whether
the target is already inside the source (remove the link) or not (pass the
target as a source of its own): Brevis stores no links, and following them
could loop or archive files twice. Anything that is not a regular file or a
folder (FIFO, socket, device, broken or looping link) is refused before
anything is read, never opened (a FIFO would block). A file that changes
while it is read fails the run: no archive is written.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import brevis
from brevis.archive.reader import ArchiveReader
from brevis.errors import InvalidArgument, IOFailure
from robust_util import ENV, deadline, on_first_stream
from helpers import tree


def cli(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "brevis", *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=timeout)


def roundtrip(src, tmp_path: Path) -> Path:
    archive = tmp_path / "a.brv"
    brevis.compress([src], archive)
    out = tmp_path / "restored"
    brevis.decompress(archive, out)
    assert brevis.verify(archive, [src])["ok"]
    return out


# ------------------------------------------------------------ links
def test_link_to_a_file_outside_the_tree_is_followed(tmp_path):
    (tmp_path / "elsewhere.bin").write_bytes(b"\x01" * 300)
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(tmp_path / "elsewhere.bin", src / "model.bin")
    os.symlink("model.bin", src / "alias.bin")  # a link to a link
    out = roundtrip(src, tmp_path)
    assert (out / "model.bin").read_bytes() == b"\x01" * 300 and not (out / "model.bin").is_symlink()
    assert (out / "alias.bin").read_bytes() == b"\x01" * 300


def test_link_to_a_folder_inside_the_tree(tmp_path):
    src = tmp_path / "src"
    (src / "real").mkdir(parents=True)
    (src / "real" / "w.bin").write_bytes(b"w")
    os.symlink("real", src / "again")
    # Stored as a link (issue 15, item 3), never walked: no loop, no copy.
    s = brevis.compress([src], tmp_path / "a.brv")
    assert s["file_count"] == 1 and s["link_count"] == 1
    brevis.decompress(tmp_path / "a.brv", tmp_path / "out")
    assert os.readlink(tmp_path / "out" / "again") == "real"
    # With dereference (every link followed) a link to a folder inside cannot be stored: refused.
    with pytest.raises(InvalidArgument, match="inside the source.*remove the link"):
        brevis.compress([src], tmp_path / "b.brv", dereference=True)
    assert not (tmp_path / "b.brv").exists()


def test_link_to_a_folder_outside_the_tree(tmp_path):
    (tmp_path / "other").mkdir()
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(tmp_path / "other", src / "other")
    (src / "w.bin").write_bytes(b"w")
    # Not followed, and no reason to stop the run: skipped, and the summary says why (issue 15, item 9).
    s = brevis.compress([src], tmp_path / "a.brv")
    assert [(k["path"], k["kind"]) for k in s["skipped"]] == [(str(src / "other"), "link")]
    assert "outside the source" in s["skipped"][0]["reason"]
    assert brevis.ls(tmp_path / "a.brv")["file_count"] == 1


def test_link_loop_and_link_to_the_root(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    os.symlink("loop", src / "loop")
    with pytest.raises(InvalidArgument, match="loops"):
        brevis.compress([src], tmp_path / "a.brv")
    os.unlink(src / "loop")
    os.symlink(".", src / "self")
    with pytest.raises(InvalidArgument, match="inside the source"):
        brevis.compress([src], tmp_path / "a.brv")


def test_broken_link_is_a_clear_error(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.bin").write_bytes(b"ok")
    os.symlink("gone.bin", src / "model.bin")
    r = cli("compress", src, "-o", tmp_path / "a.brv")
    assert r.returncode == 2
    assert r.stderr.strip() == f"brevis: invalid argument: {src / 'model.bin'} is a broken link (to gone.bin); only regular files are archived"
    r = cli("compress", src / "model.bin", "-o", tmp_path / "a.brv")
    assert r.returncode == 2 and "broken link" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_a_source_that_is_a_link_to_a_folder_is_walked(tmp_path):
    """Named on the command line, a link to a folder is what the user asked for."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "w.bin").write_bytes(b"w")
    os.symlink(real, tmp_path / "link")
    out = roundtrip(tmp_path / "link", tmp_path)
    assert tree(out) == tree(real)


# ------------------------------------------------------------ empty things
def test_empty_files_and_folders(tmp_path):
    src = tmp_path / "src"
    (src / "a" / "b" / "c").mkdir(parents=True)
    (src / "only-empty-files").mkdir()
    (src / "only-empty-files" / "x").write_bytes(b"")
    (src / "e.safetensors").write_bytes(b"")
    (src / "e.pth").write_bytes(b"")
    out = roundtrip(src, tmp_path)
    assert tree(out) == tree(src)
    assert (out / "a" / "b" / "c").is_dir()


# ------------------------------------------------------------ names
def test_255_byte_names(tmp_path):
    src = tmp_path / "src"
    folder = src / ("d" * 255)
    folder.mkdir(parents=True)
    (folder / ("f" * 255)).write_bytes(b"long")
    (src / ("\u00e9" * 127 + "x")).write_bytes(b"two-byte characters, 255 bytes")
    out = roundtrip(src, tmp_path)
    assert tree(out) == tree(src)


def test_archive_and_output_with_255_byte_names(tmp_path):
    """Temporaries add '.', '.XXXXXXXX.partial' to the name: cut to fit NAME_MAX."""
    (tmp_path / "w.bin").write_bytes(b"w" * 100)
    archive = tmp_path / ("a" * 251 + ".brv")
    r = cli("compress", tmp_path / "w.bin", "-o", archive, "-q")
    assert r.returncode == 0, r.stderr
    r = cli("decompress", archive, "-o", tmp_path / ("o" * 255), "-q")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / ("o" * 255) / "w.bin").read_bytes() == b"w" * 100
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]


def test_extract_to_a_255_byte_name(tmp_path):
    from helpers import small_checkpoint

    src = small_checkpoint(tmp_path / "src")
    brevis.compress([src], tmp_path / "a.brv")
    out = tmp_path / ("e" * 243 + ".safetensors")
    brevis.extract(tmp_path / "a.brv", ["layer.bias"], out)
    assert out.is_file()


def make_deep(root: Path, total: int) -> bytes:
    """A file at a path of `total` bytes (absolute), made with folder fds; its relative path."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY)
    length = len(os.fsencode(root))
    parts = []
    try:
        while length + 1 + 200 + 1 + 100 < total:
            os.mkdir("d" * 200, dir_fd=fd)
            nfd = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
            parts.append("d" * 200)
            length += 201
        name = "f" * min(255, total - length - 1)
        parts.append(name)
        wfd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(wfd, b"deep")
        os.close(wfd)
    finally:
        os.close(fd)
    return "/".join(parts).encode()


def test_paths_near_path_max(tmp_path):
    """A source file whose absolute path is 4090 bytes (PATH_MAX is 4096):
    compress and verify work; decompressing beside it works while the
    output path stays under PATH_MAX, and is a clean I/O error past it."""
    src = tmp_path / "s"
    rel = make_deep(src, 4090)
    archive = tmp_path / "a.brv"
    r = cli("compress", src, "-o", archive, "-q")
    assert r.returncode == 0, r.stderr
    assert cli("verify", archive, "--source", src, "-q").returncode == 0
    with ArchiveReader(archive) as reader:
        assert reader.index.files[0].path.encode() == rel
    # '.o.XXXXXXXX.partial' is longer than 's': the staged path passes PATH_MAX.
    r = cli("decompress", archive, "-o", tmp_path / "o", "-q")
    assert r.returncode == 8, r.stderr
    assert "File name too long" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["a.brv", "s"]
    # From inside the folder, relative paths are short enough.
    deeper = tmp_path / "x"
    rel2 = make_deep(deeper, 3800)
    r = cli("compress", deeper, "-o", tmp_path / "b.brv", "-q")
    assert r.returncode == 0, r.stderr
    r = cli("decompress", tmp_path / "b.brv", "-o", tmp_path / "y", "-q")
    assert r.returncode == 0, r.stderr
    assert os.path.exists(os.path.join(os.fsencode(tmp_path / "y"), rel2))


def test_non_utf8_and_odd_names(tmp_path):
    src = os.path.join(os.fsencode(tmp_path), b"src")
    os.makedirs(os.path.join(src, b"\xff\xfe"))
    names = [b"\xff\xfe/\x80", b"latin1-\xe9", b"tab\there", b"new\nline", b"back\\slash", b"-dash",
             b"\xed\xa0\x80surrogate", b" leading space", b"quote\"'", b"\xf0\x9f\x98\x80emoji"]
    for i, n in enumerate(names):
        with open(os.path.join(src, n), "wb") as f:
            f.write(bytes([i]) * 7)
    out = roundtrip(os.fsdecode(src), tmp_path)
    assert tree(out) == tree(os.fsdecode(src))


# ------------------------------------------------------------ special files
def test_fifo_in_the_tree_is_refused_without_hanging(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a")
    os.mkfifo(src / "pipe")
    with deadline(10, "compress of a tree with a FIFO"):
        with pytest.raises(InvalidArgument, match="FIFO"):
            brevis.compress([src], tmp_path / "a.brv")
    r = cli("compress", src / "pipe", "-o", tmp_path / "b.brv", timeout=30)
    assert r.returncode == 2 and "FIFO" in r.stderr
    with deadline(10, "verify against a FIFO source"):
        (src / "pipe").unlink()
        brevis.compress([src], tmp_path / "a.brv")
        os.mkfifo(src / "pipe")
        with pytest.raises(InvalidArgument, match="FIFO"):
            brevis.verify(tmp_path / "a.brv", [src])
    assert sorted(os.listdir(tmp_path)) == ["a.brv", "src"]


def test_socket_and_device_are_refused(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(src / "sock"))
        with pytest.raises(InvalidArgument, match="socket"):
            brevis.compress([src], tmp_path / "a.brv")
    finally:
        s.close()
    os.unlink(src / "sock")
    os.symlink("/dev/null", src / "null")
    with pytest.raises(InvalidArgument, match="device"):
        brevis.compress([src], tmp_path / "a.brv")


# ------------------------------------------------------------ files that change or cannot be read
@pytest.fixture
def growing(tmp_path, monkeypatch):
    """A source folder and a hook that runs `change` when the first stream is written."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(bytes(range(256)) * 64)
    (src / "b.bin").write_bytes(b"b" * 5000)
    return src, on_first_stream(monkeypatch)


@pytest.mark.parametrize("how", ["append", "same size", "truncate", "replace"])
def test_a_file_that_changes_while_being_read(growing, tmp_path, how):
    src, state = growing
    target = src / "a.bin"

    def change():
        if how == "append":
            with open(target, "ab") as f:
                f.write(b"more")
        elif how == "same size":
            data = bytearray(target.read_bytes())
            data[-1] ^= 1
            os.utime(target, ns=(0, target.stat().st_mtime_ns + 1_000_000))  # a new mtime
            target.write_bytes(data)
        elif how == "truncate":
            os.truncate(target, 10)
        else:  # replaced by another file (a new inode) of the same size
            (src / "new").write_bytes(b"x" * target.stat().st_size)
            os.replace(src / "new", target)

    state["change"] = change
    with pytest.raises(IOFailure, match="changed while being read|shrank while being read"):
        brevis.compress([src], tmp_path / "a.brv", threads=1, chunk_bytes=4096)
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_a_file_that_cannot_be_read(tmp_path):
    """As root, chmod 000 does not stop a read; a write-only sysfs attribute does."""
    if os.geteuid() != 0:
        target = tmp_path / "secret.bin"
        target.write_bytes(b"s")
        target.chmod(0)
    else:
        target = Path("/sys/bus/pci/rescan")
        try:
            open(target, "rb").close()
            pytest.skip("running as root and no unreadable regular file found")
        except PermissionError:
            pass
        except OSError as e:
            pytest.skip(f"running as root and {target} is not usable: {e}")
    r = cli("compress", target, "-o", tmp_path / "a.brv")
    assert r.returncode == 2, r.stderr
    assert "Permission denied" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "a.brv").exists()
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]


def test_a_read_error_midway(growing, tmp_path, monkeypatch):
    """EIO from the disk while reading a chunk: an I/O error, no archive."""
    from brevis.codec import encoder

    src, _ = growing
    real = encoder.os.pread
    calls = [0]

    def failing(fd, n, offset):
        calls[0] += 1
        if calls[0] == 3:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, n, offset)

    monkeypatch.setattr(encoder.os, "pread", failing)
    with pytest.raises(Exception) as info:
        brevis.compress([src], tmp_path / "a.brv", threads=1, chunk_bytes=4096)
    monkeypatch.setattr(encoder.os, "pread", real)
    assert sorted(os.listdir(tmp_path)) == ["src"]
    assert isinstance(info.value, brevis.BrevisError), f"{type(info.value).__name__}: {info.value}"
