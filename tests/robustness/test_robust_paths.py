"""Path safety on decompress: nothing is ever written outside the output folder.

Archives are crafted by rewriting the index JSON and sealing it again with a
valid digest and footer, so only the reader's checks stand in the way.
Links already present in the output folder must not carry a file or a
folder outside it either.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import brevis
from brevis.archive.reader import ArchiveReader
from brevis.errors import FormatError, InvalidArgument, OutputExists
from robust_util import ENV, join, split
from helpers import tree


def snapshot(root: Path) -> dict:
    """Every path under root (links not followed) with its content or kind."""
    out = {}
    for here, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(here, n)
            rel = str(p.relative_to(root))
            out[rel] = ("link", os.readlink(p)) if p.is_symlink() else ("dir",) if p.is_dir() else p.read_bytes()
    return out


@pytest.fixture
def world(tmp_path):
    """tmp/src (a.txt, sub/b.txt, sub/empty/), tmp/x.brv, tmp/outside/ (a decoy), tmp/work/."""
    src = tmp_path / "src"
    (src / "sub" / "empty").mkdir(parents=True)
    (src / "a.txt").write_text("a")
    (src / "sub" / "b.txt").write_text("b")
    brevis.compress([src], tmp_path / "x.brv")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "decoy.txt").write_text("decoy")
    (tmp_path / "work").mkdir()
    return tmp_path


def craft(world: Path, edit) -> Path:
    head, index = split((world / "x.brv").read_bytes())
    edit(index)
    path = world / "crafted.brv"
    path.write_bytes(join(head, index))
    return path


def rename_file(old: str, new: str):
    def edit(index):
        for f in index["files"]:
            if f["path"] == old:
                f["path"] = new
    return edit


UNSAFE = [
    "/etc/brevis-escape", "/tmp/x", "//x",
    "..", "../x", "../../outside/decoy.txt", "a/../../x", "sub/../../x", "sub/..", "./a", "sub/./b",
    "a//b", "a/", "", "a\x00b",
]


@pytest.mark.parametrize("name", UNSAFE)
def test_unsafe_file_names_are_refused(world, name):
    before = snapshot(world)
    path = craft(world, rename_file("a.txt", name))
    with pytest.raises(FormatError, match="path"):
        ArchiveReader(path)
    out = world / "work" / "out"
    with pytest.raises(FormatError):
        brevis.decompress(path, out)
    after = snapshot(world)
    assert {k: v for k, v in after.items() if k != "crafted.brv"} == before


@pytest.mark.parametrize("name", ["/abs", "..", "../up", "sub/../..", "x/./y"])
def test_unsafe_folder_names_are_refused(world, name):
    path = craft(world, lambda index: index["dirs"].append(name))
    with pytest.raises(FormatError):
        ArchiveReader(path)


@pytest.mark.parametrize("name", ["..\\x", "...", "..x", "x..", " ..", ".hidden", "a\\..\\..\\b"])
def test_odd_but_safe_names_stay_inside(world, name):
    """A backslash is an ordinary character on POSIX; '...' is an ordinary name."""
    path = craft(world, rename_file("a.txt", name))
    out = world / "work" / "out"
    brevis.decompress(path, out)
    assert (out / name).read_text() == "a"
    assert sorted(os.listdir(world)) == ["crafted.brv", "outside", "src", "work", "x.brv"]
    assert snapshot(world / "outside") == {"decoy.txt": b"decoy"}


def test_cli_refuses_an_escaping_archive(world):
    path = craft(world, rename_file("a.txt", "../../escape.txt"))
    r = subprocess.run([sys.executable, "-m", "brevis", "decompress", str(path), "-o", str(world / "work" / "out")],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 3, r.stderr
    assert "unsafe path" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert os.listdir(world / "work") == []
    assert not (world.parent / "escape.txt").exists()


# ------------------------------------------------------------ links in the output folder
@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("link", ["sub", "sub/empty"])
def test_link_in_the_output_folder_leading_outside(world, link, force):
    out = world / "work" / "out"
    (out / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(world / "outside", out / link)
    before = snapshot(world / "outside"), snapshot(out)
    with pytest.raises(InvalidArgument, match="outside"):
        brevis.decompress(world / "x.brv", out, force=force)
    assert (snapshot(world / "outside"), snapshot(out)) == before
    assert sorted(os.listdir(world / "work")) == ["out"]


def test_relative_link_leading_outside(world):
    out = world / "work" / "out"
    out.mkdir()
    os.symlink("../../outside", out / "sub")
    with pytest.raises(InvalidArgument):
        brevis.decompress(world / "x.brv", out)
    assert snapshot(world / "outside") == {"decoy.txt": b"decoy"}


def test_link_to_the_output_folders_parent(world):
    out = world / "work" / "out"
    out.mkdir()
    os.symlink("..", out / "sub")
    with pytest.raises(InvalidArgument):
        brevis.decompress(world / "x.brv", out)
    assert os.listdir(world / "work") == ["out"]


def test_cli_exit_code_for_a_link_leading_outside(world):
    out = world / "work" / "out"
    out.mkdir()
    os.symlink(world / "outside", out / "sub")
    r = subprocess.run([sys.executable, "-m", "brevis", "decompress", str(world / "x.brv"), "-o", str(out), "-f"],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "outside" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert snapshot(world / "outside") == {"decoy.txt": b"decoy"}


def test_link_that_stays_inside_is_followed(world):
    out = world / "work" / "out"
    (out / "real").mkdir(parents=True)
    os.symlink("real", out / "sub")
    brevis.decompress(world / "x.brv", out)
    assert (out / "real" / "b.txt").read_text() == "b"
    assert (out / "real" / "empty").is_dir()
    assert (out / "sub").is_symlink()


def test_a_link_as_the_file_itself_is_replaced_not_written_through(world):
    out = world / "work" / "out"
    out.mkdir()
    os.symlink(world / "outside" / "decoy.txt", out / "a.txt")
    with pytest.raises(OutputExists):
        brevis.decompress(world / "x.brv", out)
    brevis.decompress(world / "x.brv", out, force=True)
    assert not (out / "a.txt").is_symlink() and (out / "a.txt").read_text() == "a"
    assert (world / "outside" / "decoy.txt").read_text() == "decoy"


def test_a_file_where_a_folder_is_needed(world):
    out = world / "work" / "out"
    out.mkdir()
    (out / "sub").write_text("a file, not a folder")
    with pytest.raises(OutputExists, match="not a folder"):
        brevis.decompress(world / "x.brv", out, force=True)
    assert (out / "sub").read_text() == "a file, not a folder"
    assert os.listdir(world / "work") == ["out"]


def test_output_folder_that_is_itself_a_link(world):
    """The output named on the command line may be a link: the user chose it."""
    real = world / "work" / "real"
    real.mkdir()
    os.symlink(real, world / "work" / "out")
    brevis.decompress(world / "x.brv", world / "work" / "out")
    assert tree(real) == tree(world / "src")
