"""Finding the files to archive and naming them inside the archive.

One folder: its contents, named relative to it (decompressing gives the
folder's contents back). Several sources, or files: each named by its base
name, folders keeping their name as the first path component. Symbolic
links to files are followed (a Hugging Face cache folder is made of them);
links to folders are not, so a walk cannot loop: one that leads outside
the tree is skipped, and reported. Empty folders are kept.

Skipped while walking a folder, each reported in `skipped` with its reason:
paths matching an exclusion pattern, the default exclusions (version
control folders, Finder's .DS_Store) unless turned off, links to folders
outside the tree. A source named explicitly is never excluded.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgument, IOFailure


@dataclass(frozen=True)
class Source:
    name: str  # POSIX path inside the archive
    path: Path  # where it is on disk
    link: str | None = None  # a link kept as a link (collect's `links`): the archive name it points at


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


def check_identity(st: os.stat_result, identity: tuple[int, int, int, int], path) -> None:
    """IOFailure unless the file of `st` is the one of `identity` (inode,
    size, mtime, ctime, as a scan found them), unchanged. Not the device:
    a worker on another host may see another device number for the same
    shared file system."""
    if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != tuple(identity):
        if st.st_ino == identity[0] and st.st_size < identity[1]:
            raise IOFailure(f"{path} shrank while being read")
        raise IOFailure(f"{path} changed while being read; archive not written")


def read_at(path: str | os.PathLike, offset: int, length: int, what: str,
            identity: tuple[int, int, int, int] | None = None) -> bytes:
    """read_exactly from a file named by path (a worker's job names its
    bytes so); InvalidArgument if it cannot be opened. With `identity`
    (ScannedFile.identity), IOFailure where the file opened is not that one
    any more (replaced, or written since the scan)."""
    return read_pieces(path, [(offset, 0, length)], what, identity)


def read_pieces(path: str | os.PathLike, parts, what: str,
                identity: tuple[int, int, int, int] | None = None) -> bytes:
    """read_at of several (offset, _, length) parts of one file, joined (one open)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise InvalidArgument(f"cannot read {what}: {e.strerror}") from None
    try:
        if identity is not None:
            check_identity(os.fstat(fd), identity, what)
        return b"".join(read_exactly(fd, what, at, n) for at, _, n in parts)
    finally:
        os.close(fd)


# Skipped in every walk unless default_excludes=False: version control
# folders and Finder's folder settings, never part of a checkpoint (a
# Hugging Face clone's .git/ holds a second copy of every LFS file).
DEFAULT_EXCLUDES = (".git/", ".hg/", ".svn/", ".DS_Store")


def excluded_by(name: str, is_dir: bool, patterns) -> str | None:
    """The first pattern that excludes an archive name: a pattern without
    '/' matches the last component (any depth, as tar and rsync do), one
    with '/' the whole name; a trailing '/' matches folders only."""
    last = name.rsplit("/", 1)[-1]
    for pattern in patterns:
        p = pattern.rstrip("/")
        if not p or (pattern.endswith("/") and not is_dir):
            continue
        if fnmatch.fnmatchcase(name if "/" in p else last, p.lstrip("/")):
            return pattern
    return None


def _in_tree(path: Path, root: Path, prefix: str) -> str | None:
    """The archive name of what a link met walking `root` points at, where
    that lies inside `root` (not `root` itself); else None."""
    real_root = root.resolve()
    target = path.resolve()
    if target == real_root or not target.is_relative_to(real_root):
        return None
    rel = target.relative_to(real_root).as_posix()
    return f"{prefix}/{rel}" if prefix else rel


def _tree(top: str, rel: str = ""):
    """os.walk(top) without following links to folders, top down: (folder,
    its path below the walk's top, its subfolders, its other entries), the
    entries as os.DirEntry, whose kinds come with the listing (a Path's
    is_dir() and is_file() cost a stat call each: onnx's test data, 5,805
    files in 2,876 folders, walked in 0.36 s that way, 0.13 this one,
    medians of six). The caller may remove subfolders from the list it is
    given: they are not walked."""
    try:
        with os.scandir(top) as listing:
            entries = list(listing)
    except OSError as e:
        _raise(e)
    dirs, others = [], []
    for entry in entries:
        (dirs if _is_dir(entry) else others).append(entry)
    yield top, rel, dirs, others
    for entry in dirs:
        if not entry.is_symlink():
            yield from _tree(entry.path, f"{rel}/{entry.name}" if rel else entry.name)


def _is_dir(entry: os.DirEntry) -> bool:
    """Whether an entry is a folder or a link to one (False where it cannot be told, as os.walk has it)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


_NO_SUCH = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)  # pathlib's: "not there", not an error


def _entry_is(test) -> bool:
    """An os.DirEntry's is_file or is_dir as a Path's answers it: False for a
    broken link or one that loops, any other error raised."""
    try:
        return test()
    except OSError as e:
        if e.errno in _NO_SUCH:
            return False
        raise


def _walk(root: Path, prefix: str, exclude=(), default_excludes: bool = True,
          skipped: list | None = None, links: bool = False) -> tuple[list[Source], list[str]]:
    files, dirs = [], []

    def skip(path: Path, kind: str, reason: str) -> None:
        if skipped is not None:
            skipped.append({"path": str(path), "kind": kind, "reason": reason})

    def exclusion(name: str, is_dir: bool) -> bool:
        pattern = excluded_by(name, is_dir, exclude)
        kind = "excluded"
        if pattern is None and default_excludes:
            pattern, kind = excluded_by(name, is_dir, DEFAULT_EXCLUDES), "default"
        if pattern is None:
            return False
        skip(Path(here, name.rsplit("/", 1)[-1]), kind,
             f"matches the exclusion {pattern!r}" if kind == "excluded" else f"excluded by default ({pattern})")
        return True

    for here, rel_name, subdirs, others in _tree(os.fspath(root)):
        base = "/".join(p for p in (prefix, rel_name) if p)

        def named(name: str) -> str:
            return f"{base}/{name}" if base else name

        subdirs.sort(key=lambda e: e.name)
        subdirs[:] = [d for d in subdirs if d.is_symlink() or not exclusion(named(d.name), True)]
        entries = sorted(others + [d for d in subdirs if d.is_symlink()], key=lambda e: e.name)
        subdirs[:] = [d for d in subdirs if not d.is_symlink()]
        kept = 0
        for entry in entries:
            name = entry.name
            path = Path(entry.path)
            if exclusion(named(name), _entry_is(entry.is_dir)):
                continue
            inside = _in_tree(path, root, prefix) if links and entry.is_symlink() and path.exists() else None
            if inside is not None:  # kept as a link (collect's `links`)
                files.append(Source(named(name), path, link=inside))
                kept += 1
            elif _entry_is(entry.is_file):
                files.append(Source(named(name), path))
                kept += 1
            elif entry.is_symlink() and _entry_is(entry.is_dir):
                target = path.resolve()
                if target == root.resolve() or target.is_relative_to(root.resolve()):
                    raise InvalidArgument(f"{path} is a link to a folder inside the source ({target}); "
                                          "links to folders are not followed: remove the link")
                # Not followed (a walk must not leave the tree, nor loop), and no reason to stop the run.
                skip(path, "link", f"a link to a folder outside the source ({target}), not followed: "
                                   "give that folder as a source of its own to archive it")
            else:
                raise InvalidArgument(f"{path} {_not_regular(path)}; only regular files are archived")
        if not kept and not subdirs and base:
            dirs.append(base)
    return files, dirs


def _keep_links(files: list[Source], dirs: list[str], links: list, skipped: list | None) -> list[Source]:
    """The files without the links that point at an archived file or folder
    (appended to `links`); a link to a file that is not archived (excluded)
    is followed, one to such a folder skipped."""
    archived = {s.name for s in files if s.link is None}
    folders = set(dirs)
    for n in [s.name for s in files] + dirs:
        parts = n.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
    out = []
    for s in files:
        if s.link is None:
            out.append(s)
        elif s.link in archived or s.link in folders:  # never a link: resolved to the end
            links.append(s)
        elif s.path.is_file():
            out.append(Source(s.name, s.path))  # its target is not archived: its content is
        elif skipped is not None:
            skipped.append({"path": str(s.path), "kind": "link",
                            "reason": f"a link to a folder that is not archived ({s.link}), not followed"})
        else:
            raise InvalidArgument(f"{s.path} is a link to a folder that is not archived ({s.link})")
    return out


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


def collect(paths: list[str | os.PathLike] | str | os.PathLike, *, exclude=(), default_excludes: bool = True,
            skipped: list | None = None, links: list | None = None) -> tuple[list[Source], list[str]]:
    """The files and empty folders to archive, in archive order.

    `exclude`: glob patterns of archive names to leave out (excluded_by);
    `default_excludes`: also leave out DEFAULT_EXCLUDES. What a walk
    leaves out is appended to `skipped` as {"path", "kind", "reason"}
    (kind: excluded, default, link).

    `links`: a list to which the symbolic links met walking a folder that
    point inside it (at a file or folder that is archived) are appended, as
    Sources whose `link` is the archive name they point at; they are then
    not among the files. Without it (None) every link to a file is
    followed (tar's --dereference), as is a link to a file that is not
    archived (excluded) with it."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise InvalidArgument("nothing to compress")
    walk = {"exclude": tuple(exclude), "default_excludes": default_excludes, "skipped": skipped,
            "links": links is not None}
    roots = [Path(p) for p in paths]
    for r in roots:
        if not r.exists():
            if r.is_symlink():
                raise InvalidArgument(f"{r} {_not_regular(r)}")
            raise InvalidArgument(f"{r}: no such file or folder")
    files: list[Source] = []
    dirs: list[str] = []
    if len(roots) == 1 and roots[0].is_dir():
        files, dirs = _walk(roots[0], "", **walk)
    else:
        for r in roots:
            name = r.resolve().name if r.name in ("", ".", "..") else r.name
            if r.is_dir():
                f, d = _walk(r, name, **walk)
                files += f
                dirs += d or ([] if f else [name])
            elif r.is_file():
                files.append(Source(name, r))
            else:
                raise InvalidArgument(f"{r} {_not_regular(r)}; only regular files and folders are archived")
    if links is not None:
        files = _keep_links(files, dirs, links, skipped)
    names = [s.name for s in files] + [s.name for s in links or ()] + dirs
    seen = set()
    for n in names:
        if n in seen:
            raise InvalidArgument(f"two sources would both be stored as {n!r}")
        seen.add(n)
    return files, dirs
