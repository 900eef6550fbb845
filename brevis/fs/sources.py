"""Finding the files to archive and naming them inside the archive.

One folder: its contents, named relative to it (decompressing gives the
folder's contents back). Several sources, or files: each named by its base
name, folders keeping their name as the first path component. Symbolic
links to files are followed (a Hugging Face cache folder is made of them);
links to folders are not, so a walk cannot loop. Empty folders are kept.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgument, IOFailure


@dataclass(frozen=True)
class Source:
    name: str  # POSIX path inside the archive
    path: Path  # where it is on disk


def read_up_to(fd: int, offset: int, length: int) -> bytes:
    """Up to `length` bytes of an open file at `offset`: fewer only at the
    end of the file. OSError as the system raises it. The one pread loop:
    one call in the usual case, and no copy then."""
    first = os.pread(fd, length, offset)
    if len(first) == length or not first:
        return first
    data = bytearray(first)
    while len(data) < length:
        more = os.pread(fd, length - len(data), offset + len(data))
        if not more:
            break
        data += more
    return bytes(data)


def read_exactly(fd: int, path, offset: int, length: int) -> bytes:
    """`length` bytes of an open source file at `offset`; IOFailure if the
    disk refuses or the file has shrunk since it was measured."""
    try:
        data = read_up_to(fd, offset, length)
    except OSError as e:
        raise IOFailure(f"cannot read {path}: {e.strerror}") from None
    if len(data) < length:
        raise IOFailure(f"{path} shrank while being read")
    return data


def read_at(path: str | os.PathLike, offset: int, length: int, what: str) -> bytes:
    """read_exactly from a file named by path (a worker's job names its
    bytes so); InvalidArgument if it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise InvalidArgument(f"cannot read {what}: {e.strerror}") from None
    try:
        return read_exactly(fd, what, offset, length)
    finally:
        os.close(fd)


def _walk(root: Path, prefix: str) -> tuple[list[Source], list[str]]:
    files, dirs = [], []
    for here, subdirs, names in os.walk(root, followlinks=False, onerror=_raise):
        subdirs.sort()
        rel = os.path.relpath(here, root)
        rel_name = "" if rel == "." else rel.replace(os.sep, "/")
        base = "/".join(p for p in (prefix, rel_name) if p)
        entries = sorted(names) + [d for d in subdirs if os.path.islink(os.path.join(here, d))]
        kept = 0
        for name in sorted(entries):
            path = Path(here, name)
            if path.is_file():
                files.append(Source(f"{base}/{name}" if base else name, path))
                kept += 1
            elif path.is_symlink() and path.is_dir():
                target = path.resolve()
                if target == root.resolve() or target.is_relative_to(root.resolve()):
                    raise InvalidArgument(f"{path} is a link to a folder inside the source ({target}); "
                                          "links to folders are not followed: remove the link")
                raise InvalidArgument(f"{path} is a link to a folder; links to folders are not "
                                      f"followed: pass {target} as a source of its own")
            else:
                raise InvalidArgument(f"{path} {_not_regular(path)}; only regular files are archived")
        if not kept and not subdirs and base:
            dirs.append(base)
    return files, dirs


def _not_regular(path: Path) -> str:
    """What a path that is neither a regular file nor a folder is, in words."""
    try:
        st = os.stat(path)
    except OSError as e:
        if os.path.islink(path):
            if e.errno == errno.ELOOP:
                return "is a link that loops"
            return f"is a broken link (to {os.readlink(path)})"
        return f"cannot be read ({e.strerror})"
    mode = st.st_mode
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
    return f"is {kind}"


def _raise(e: OSError):
    raise InvalidArgument(f"cannot read {e.filename}: {e.strerror}")


def collect(paths: list[str | os.PathLike]) -> tuple[list[Source], list[str]]:
    """The files and empty folders to archive, in archive order."""
    if not paths:
        raise InvalidArgument("nothing to compress")
    roots = [Path(p) for p in paths]
    for r in roots:
        if not r.exists():
            if r.is_symlink():
                raise InvalidArgument(f"{r} {_not_regular(r)}")
            raise InvalidArgument(f"{r}: no such file or folder")
    files: list[Source] = []
    dirs: list[str] = []
    if len(roots) == 1 and roots[0].is_dir():
        files, dirs = _walk(roots[0], "")
    else:
        for r in roots:
            name = r.resolve().name if r.name in ("", ".", "..") else r.name
            if r.is_dir():
                f, d = _walk(r, name)
                files += f
                dirs += d or ([] if f else [name])
            elif r.is_file():
                files.append(Source(name, r))
            else:
                raise InvalidArgument(f"{r} {_not_regular(r)}; only regular files and folders are archived")
    names = [s.name for s in files] + dirs
    seen = set()
    for n in names:
        if n in seen:
            raise InvalidArgument(f"two sources would both be stored as {n!r}")
        seen.add(n)
    return files, dirs
