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

from .atomic import io_failure
from ..errors import InvalidArgument, OutputExists


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


def check_inside(out: Path, index) -> None:
    """Refuse an archive whose files or folders would land outside `out`
    through a link already in it, or under something that is not a folder.
    Checked before anything is created in `out`."""
    root = out.resolve()
    checked: set[str] = set()
    wanted = [(f.path, f.path.split("/")[:-1]) for f in index.files] + [(d, d.split("/")) for d in index.dirs]
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
        for entry in index.files:
            target = out / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_dir() and not target.is_symlink():
                raise OutputExists(f"{target} is a folder")
            if not force and os.path.lexists(target):
                raise OutputExists(f"{target} exists (use --force to overwrite)")
            os.replace(stage / entry.path, target)  # replaces a link itself, never writes through it
        for d in index.dirs:
            (out / d).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise io_failure(e, f"cannot write {out}") from None
