"""Decompression and verification: archive -> chunks -> files.

Files are rebuilt in a staging folder beside the output and moved into
place only when every file decoded and matched its checksums, so a failure
leaves no partial output. The staging folder (`.NAME.XXXXXXXX.partial`) is
locked while in use; one left by a killed run is removed by the next run
for the same output (see archive/writer.py).
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

from .archive.index import FileEntry
from .archive.reader import ArchiveReader
from .archive.writer import io_failure, make_temp, remove_stale
from .errors import BrevisError, InvalidArgument, IOFailure, OutputExists
from .parallel import Pool
from .sources import collect

Progress = Callable[[int], None] | None


def file_chunks(reader: ArchiveReader, entry: FileEntry, pool: Pool) -> Iterator[memoryview]:
    """The decoded bytes of one file, chunk by chunk, in order."""
    work = [(seg, chunk) for seg in entry.segments for chunk in seg.chunks]
    for data in pool.ordered_map(lambda sc: reader.decode_chunk(*sc), work):
        yield memoryview(data)


def default_output(archive: Path) -> Path:
    return archive.with_suffix("") if archive.suffix == ".brv" else archive.with_name(archive.name + ".out")


def decompress(archive, output=None, *, threads: int = 1, force: bool = False,
               progress: Progress = None) -> dict:
    start = time.perf_counter()
    archive = Path(archive)
    with ArchiveReader(archive) as reader:
        index = reader.index
        out = Path(output) if output is not None else default_output(archive)
        if out.exists() and not out.is_dir():
            raise OutputExists(f"{out} exists and is not a folder")
        if not force:
            clashes = [f.path for f in index.files if os.path.lexists(out / f.path)]
            if clashes:
                raise OutputExists(f"{out / clashes[0]} exists (use --force to overwrite)")
        parent = out.absolute().parent
        if not parent.is_dir():
            raise InvalidArgument(f"cannot write {out}: folder {parent} does not exist")
        if out.is_dir():
            # Refuse links that lead outside before spending any time decoding.
            _check_inside(out, index)
        where = _stage_parent(out, parent)
        try:
            free = shutil.disk_usage(where).free
        except OSError as e:
            raise io_failure(e, f"cannot write {out}") from None
        if index.original_bytes > free:
            raise IOFailure(f"{out}: needs {index.original_bytes} bytes, {free} free on disk")
        started = time.time_ns()
        try:
            stage, lock = make_temp(where, out.name, folder=True)
        except OSError as e:
            raise io_failure(e, f"cannot write {out}") from None
        try:
            remove_stale(where, out.name, started)
            with Pool(threads) as pool:
                for entry in index.files:
                    target = stage / entry.path
                    try:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        with open(target, "wb") as f:
                            for data in file_chunks(reader, entry, pool):
                                f.write(data)
                                if progress:
                                    progress(len(data))
                    except OSError as e:
                        raise io_failure(e, f"cannot write {out / entry.path}") from None
            for d in index.dirs:
                try:
                    (stage / d).mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise io_failure(e, f"cannot write {out / d}") from None
            _move_into_place(stage, out, index, force)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
            os.close(lock)
    seconds = time.perf_counter() - start
    return {"archive": str(archive), "output": str(out), "files": len(index.files),
            "bytes": index.original_bytes, "seconds": seconds}


def _stage_parent(out: Path, parent: Path) -> Path:
    """Where to stage: beside the output, or inside an existing output folder
    that is on another filesystem than its parent (a mount point, a link to
    another disk), so every file can be renamed into place."""
    try:
        if out.is_dir() and os.stat(out).st_dev != os.stat(parent).st_dev:
            return out
    except OSError:
        pass
    return parent


def _check_inside(out: Path, index) -> None:
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


def _move_into_place(stage: Path, out: Path, index, force: bool) -> None:
    try:
        if not os.path.lexists(out):
            try:
                os.rename(stage, out)
                return
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                # Another process created the folder meanwhile: merge as below.
        _check_inside(out, index)
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


def verify(archive, sources=None, *, threads: int = 1, progress: Progress = None) -> dict:
    """Decode everything and check it; with `sources`, compare to the originals too.

    `sources` are named as for compress (the same paths give the same names).
    Returns a report whose "ok" is True only when everything matched;
    problems are listed per file and segment instead of stopping at the first.
    """
    start = time.perf_counter()
    problems: list[dict] = []

    def problem(file, segment, error):
        problems.append({"file": file, "segment": segment, "error": error})

    originals = None
    if sources:
        files, _ = collect([sources] if isinstance(sources, (str, os.PathLike)) else list(sources))
        originals = {s.name: s.path for s in files}
    with ArchiveReader(Path(archive)) as reader:
        index = reader.index
        with Pool(threads) as pool:
            for entry in index.files:
                original = None
                if originals is not None:
                    if entry.path not in originals:
                        problem(entry.path, None, "missing from the source")
                    else:
                        try:
                            original = open(originals[entry.path], "rb")
                        except OSError as e:
                            problem(entry.path, None, f"cannot read source: {e.strerror}")
                for seg, error in _check_file(reader, entry, pool, original, progress):
                    problem(entry.path, seg.name, error)
                if original is not None:
                    if original.read(1):
                        problem(entry.path, None, "source file is longer than the archived one")
                    original.close()
        if originals is not None:
            for name in sorted(set(originals) - {f.path for f in index.files}):
                problem(name, None, "in the source but not in the archive")
    return {"archive": str(archive), "ok": not problems, "files": len(index.files),
            "bytes": index.original_bytes, "problems": problems,
            "seconds": time.perf_counter() - start}


def _check_file(reader, entry: FileEntry, pool: Pool, original, progress: Progress):
    """Yield (segment, error) for every problem found in one file."""
    work = [(seg, chunk) for seg in entry.segments for chunk in seg.chunks]

    def decode(sc):
        try:
            return sc, reader.decode_chunk(*sc), None
        except BrevisError as e:
            return sc, None, str(e)

    for (seg, chunk), data, error in pool.ordered_map(decode, work):
        length = chunk.n * seg.itemsize
        if error:
            yield seg, error
            if original is not None:
                original.seek(length, os.SEEK_CUR)
        elif original is not None:
            if original.read(length) != data.tobytes():
                yield seg, "decoded bytes differ from the source"
        if progress:
            progress(length)
