"""Staging a decompressed tree and moving it into place, safely.

Files are rebuilt in a staging folder beside the output (or inside an
output folder on another filesystem than its parent) and moved into place
only when everything decoded, so a failure leaves no partial output. No
file is ever written through a link that leads outside the output.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .atomic import io_failure, move_new
from ..errors import InvalidArgument, OutputExists


def make_dirs(path: Path) -> None:
    """mkdir -p, without recursion (Path.mkdir and os.makedirs recurse once
    per component: an archived path of 1,500 components, still under
    PATH_MAX, would raise RecursionError)."""
    missing = []
    here = Path(path)
    while not os.path.isdir(here):
        missing.append(here)
        if here.parent == here:
            break
        here = here.parent
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not os.path.isdir(d):
                raise


def remove_tree(path: Path) -> None:
    """shutil.rmtree(path, ignore_errors=True), without recursion (rmtree
    recurses once per level before Python 3.12); best effort, links are
    removed, never followed."""
    stack = [os.fsencode(path)]
    expanded: set[bytes] = set()  # folders whose subfolders were pushed once: not again
    while stack:
        top = stack[-1]
        try:
            entries = list(os.scandir(top))
        except NotADirectoryError:
            entries = None
        except OSError:
            stack.pop()
            continue
        if entries is None:
            stack.pop()
            try:
                os.unlink(top)
            except OSError:
                pass
            continue
        deeper = [e.path for e in entries if e.is_dir(follow_symlinks=False)]
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                try:
                    os.unlink(e.path)
                except OSError:
                    pass
        if deeper and top not in expanded:
            expanded.add(top)
            stack.extend(deeper)
            continue
        stack.pop()
        try:
            os.rmdir(top)
        except OSError:
            pass


def stage_parent(out: Path, parent: Path) -> Path:
    """Where to stage: beside the output, or inside an existing output folder
    that is on another filesystem than its parent (a mount point, a link to
    another disk), so every file can be renamed into place."""
    try:
        if out.is_dir() and os.stat(out).st_dev != os.stat(parent).st_dev:
            return out
    except OSError:
        pass
    return parent


def umask() -> int:
    """The process's umask, read without changing it where Linux tells it
    (/proc), else by setting and restoring it."""
    try:
        # As bytes: a text file of an encoding not yet used imports its
        # codec, 0.3 ms of a decompress in a fresh process.
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def finish_stage(stage: Path, index, modes: bool = True, mtimes: bool = True) -> None:
    """The staged tree completed, before it moves into place: its links
    made (after every file was written: no file is written under or through
    one), the files' modes (permission bits less the umask, as tar gives an
    ordinary user) and modification times restored where the archive
    records them, the links' own times too, and the staging folder itself,
    made private by mkdtemp, given the mode a new folder gets (0777 less the
    umask; the owner's bits always). Folders' own modes and times are not
    kept."""
    mask = umask()
    for link in index.links:
        where = stage / link.path
        make_dirs(where.parent)
        os.symlink(link.target, where)
    for entry in index.files:
        where = stage / entry.path
        if modes and entry.mode is not None:
            os.chmod(where, entry.mode & 0o777 & ~mask)
        if mtimes and entry.mtime is not None:
            os.utime(where, ns=(entry.mtime, entry.mtime))
    if mtimes and os.utime in os.supports_follow_symlinks:
        for link in index.links:
            if link.mtime is not None:
                os.utime(stage / link.path, ns=(link.mtime, link.mtime), follow_symlinks=False)
    os.chmod(stage, (0o777 & ~mask) | 0o700)  # the owner keeps access, to finish (or clean up) the move


def check_inside(out: Path, index) -> None:
    """Refuse an archive whose files or folders would land outside `out`
    through a link already in it, or under something that is not a folder.
    Checked before anything is created in `out`."""
    root = out.resolve()
    checked: set[str] = set()
    wanted = [(f.path, f.path.split("/")[:-1]) for f in [*index.files, *index.links]] + \
        [(d, d.split("/")) for d in index.dirs]
    for path, folders in wanted:
        here = out
        for i, part in enumerate(folders):
            here = here / part
            key = "/".join(folders[: i + 1])
            if key in checked:
                continue
            checked.add(key)
            if here.is_symlink():
                if not here.resolve().is_relative_to(root):
                    raise InvalidArgument(f"{out / path} would be written outside {out} (through the link {here})")
            elif os.path.lexists(here) and not here.is_dir():
                raise OutputExists(f"{here} exists and is not a folder (needed for {out / path})")
            elif not os.path.lexists(here):
                break  # created by us below: nothing under it can be a link


def move_into_place(stage: Path, out: Path, index, force: bool) -> None:
    """The staged tree to `out`: one rename where `out` does not exist, else
    file by file (never writing through a link, see check_inside)."""
    try:
        if not os.path.lexists(out):
            try:
                os.rename(stage, out)
                return
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                # Another process created the folder meanwhile: merge as below.
        check_inside(out, index)
        for entry in [*index.files, *index.links]:  # links last: nothing is written under one
            target = out / entry.path
            make_dirs(target.parent)
            if target.is_dir() and not target.is_symlink():
                raise OutputExists(f"{target} is a folder")
            if not force and os.path.lexists(target):
                raise OutputExists(f"{target} exists", option="force")
            if force:
                os.replace(stage / entry.path, target)  # replaces a link itself, never writes through it
            else:
                move_new(stage / entry.path, target)  # fails where another process made it meanwhile
        for d in index.dirs:
            make_dirs(out / d)
    except OSError as e:
        raise io_failure(e, f"cannot write {out}") from None
