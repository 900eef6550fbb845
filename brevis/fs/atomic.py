"""Atomic outputs: temporaries beside the output, moved into place once complete.

Temporaries are named `.NAME.XXXXXXXX.partial` and locked (flock) by the
run that writes them. A run killed outright (SIGKILL, power loss) cannot
remove its own; the next run for the same output removes those that are
older than itself and that no live process holds locked (the lock dies
with its process). The archive writer, decompression's staging folder and
extraction all make their outputs this way.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

from .. import interrupts
from ..errors import IOFailure


def io_failure(e: OSError, what: str) -> IOFailure:
    reason = "disk full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return IOFailure(f"{what}: {reason}")


TEMP_SUFFIX = ".partial"
_TEMP_SUFFIX_BYTES = TEMP_SUFFIX.encode()
# ".NAME." + 8 random characters + ".partial" must fit in a 255-byte file name.
_TEMP_NAME_BYTES = 255 - 1 - 1 - 8 - len(TEMP_SUFFIX)


def temp_prefix(name: str) -> str:
    """".NAME." for the temporaries of NAME, cut to keep the whole name short enough."""
    return "." + os.fsdecode(os.fsencode(name)[:_TEMP_NAME_BYTES]) + "."


def lock_temp(fd: int, path: Path) -> bool:
    """Lock a temporary just created; False if a cleaner removed it first (make another).

    Where the filesystem has no flock, the temporary stays unlocked, and
    remove_stale leaves it alone for the same reason.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        return True
    try:
        return os.lstat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def make_temp(parent: Path, name: str, folder: bool = False) -> tuple[Path, int]:
    """A locked temporary file (or folder) for NAME in parent: (path, fd holding the lock).

    Ctrl-C, SIGTERM and SIGHUP are held back while it is made (in the main thread),
    so an interruption cannot fall between its creation and the caller's
    cleanup: it is raised here, after the temporary is removed again, or
    once the caller holds it.
    """
    prefix = temp_prefix(name)
    held = interrupts.hold()
    path = fd = None
    try:
        while True:
            if folder:
                path = Path(tempfile.mkdtemp(prefix=prefix, suffix=TEMP_SUFFIX, dir=parent))
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
                except FileNotFoundError:
                    # Another run's remove_stale took it before it was open and
                    # locked (it looked older than that run's start): make another.
                    path = None
                    continue
            else:
                fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=TEMP_SUFFIX, dir=parent)
                path = Path(tmp)
            if lock_temp(fd, path):
                break
            os.close(fd)
            path = fd = None
        interrupts.release(held)  # a pending Ctrl-C is raised here
        held = None
        return path, fd
    except BaseException:
        if fd is not None:
            os.close(fd)
        if path is not None:
            shutil.rmtree(path, ignore_errors=True) if folder else path.unlink(missing_ok=True)
        raise
    finally:
        interrupts.release(held)


# The characters of mkstemp's 8 random ones (tempfile._RandomNameSequence).
_TEMP_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_")


def is_temp_name(entry: bytes, prefix: bytes) -> bool:
    """Whether `entry` is PREFIX + 8 of mkstemp's characters + TEMP_SUFFIX:
    a temporary of ours. (With a regular expression compiled per call,
    remove_stale took 190-240 us in a fresh process; 64-88 without.)"""
    suffix = _TEMP_SUFFIX_BYTES
    return (len(entry) == len(prefix) + 8 + len(suffix) and entry.startswith(prefix) and entry.endswith(suffix)
            and all(c in _TEMP_CHARS for c in entry[len(prefix):len(prefix) + 8]))


def remove_stale(parent: Path, name: str, before_ns: int) -> list[Path]:
    """Remove the temporaries of earlier runs for NAME in parent: entries named
    like ours, last changed before `before_ns`, that no live process holds
    locked. Best effort: anything unclear is left alone."""
    prefix = os.fsencode(temp_prefix(name))
    removed = []
    try:
        entries = os.listdir(os.fsencode(parent))
    except OSError:
        return removed
    for entry in entries:
        if not is_temp_name(entry, prefix):
            continue
        path = os.path.join(os.fsencode(parent), entry)
        try:
            st = os.lstat(path)
            folder = stat.S_ISDIR(st.st_mode)
            if st.st_mtime_ns >= before_ns or not (folder or stat.S_ISREG(st.st_mode)):
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if folder else 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its run is alive
            if os.lstat(path).st_ino != st.st_ino:
                continue
            if folder:
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(Path(os.fsdecode(path)))
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def publish(fd: int, tmp: Path, path: Path, replace: bool = True) -> None:
    """Move a complete temporary file into place: the usual permissions
    (mkstemp made it private), then an atomic rename over `path`, or with
    replace=False, put in place only where nothing is at `path` at that very
    moment (move_new: of two runs writing one new output, the second fails
    instead of replacing the first's). Done while the temporary is still
    open, so its lock keeps other runs' cleanup off it until it is in place.
    OSError for the caller to report; OutputExists where `path` exists."""
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    if replace:
        os.replace(tmp, path)
    else:
        move_new(tmp, path)


# Where a file system has no hard links, link() fails with one of these.
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK, errno.EXDEV,
             getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)}
RENAME_NOREPLACE = 1


def move_new(src: Path, dst: Path) -> None:
    """Rename `src` to `dst` where nothing is at `dst`, atomically: a hard
    link then the old name removed (link() never replaces), or where the
    file system has no hard links, renameat2(RENAME_NOREPLACE) (Linux).
    OutputExists where `dst` exists (a link included); IOFailure where the
    file system offers neither; other OSErrors for the caller."""
    from ..errors import OutputExists

    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        raise OutputExists(f"{dst} exists (created meanwhile by another process)", option="force") from None
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
        _rename_noreplace(src, dst)
        return
    os.unlink(src)


def _rename_noreplace(src: Path, dst: Path) -> None:
    import ctypes

    from ..errors import OutputExists

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        AT_FDCWD = -100
        if renameat2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise OutputExists(f"{dst} exists (created meanwhile by another process)", option="force")
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(dst))
    raise IOFailure(f"cannot create {dst} without risking to replace a file made meanwhile: the file system "
                    "has neither hard links nor an exclusive rename (overwriting, with force, works)")
