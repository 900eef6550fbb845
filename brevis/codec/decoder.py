"""Decompression: archive -> chunks -> files.

Files are rebuilt in a staging folder beside the output and moved into
place only when every file decoded and matched its checksums, so a failure
leaves no partial output (fs/staging.py). The staging folder
(`.NAME.XXXXXXXX.partial`) is locked while in use; one left by a killed
run is removed by the next run for the same output (see archive/writer.py).
Every staged file is created at its full size and decode jobs write their
chunks in place (chunks.py), on threads or in worker processes alike.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import Executor
from contextlib import closing
from pathlib import Path

from ..archive.reader import ArchiveReader
from ..fs.atomic import io_failure, make_temp, remove_stale
from ..errors import InvalidArgument, IOFailure, OutputExists
from ..fs.staging import check_inside, move_into_place, stage_parent
from ..workers.heap import keep_freed_memory
from .chunks import ChunkDecoder, Executing, Progress, WriteInPlace, executing, run_jobs



def default_output(archive: Path) -> Path:
    return archive.with_suffix("") if archive.suffix == ".brv" else archive.with_name(archive.name + ".out")


def decompress(archive, output=None, *, threads: int = 1, force: bool = False,
               progress: Progress = None, base=None, executor: Executor | None = None,
               processes: bool | None = None) -> dict:
    """Rebuild the archived files under `output`; return a summary.

    With threads > 1, an archive of at least PROCESS_MIN_BYTES (or any,
    with processes=True) is decoded by worker processes that write the
    chunks in place; `executor` may give such processes (the caller shuts
    them down). An archive coded against a base decodes on threads."""
    start = time.perf_counter()
    keep_freed_memory()
    archive = Path(archive)
    with ArchiveReader(archive) as reader, executing(reader.index, threads, processes, executor) as how:
        return _decompress(reader, output, how, force, progress, base, start)


def _decompress(reader: ArchiveReader, output, how: Executing, force: bool, progress: Progress, base,
                start: float) -> dict:
    archive = reader.path
    index = reader.index
    decoder = ChunkDecoder(reader, base)
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
        check_inside(out, index)
    where = stage_parent(out, parent)
    try:
        free = shutil.disk_usage(where).free
    except OSError as e:
        raise io_failure(e, f"cannot write {out}") from None
    if index.original_bytes > free:
        raise IOFailure(f"{out}: needs {index.original_bytes} bytes, {free} free on disk")
    started = time.time_ns()
    stage = lock = None
    try:
        try:
            stage, lock = make_temp(where, out.name, folder=True)
        except OSError as e:
            raise io_failure(e, f"cannot write {out}") from None
        remove_stale(where, out.name, started)
        _create_files(stage, out, index)
        files = index.files
        sinks = [WriteInPlace(str(stage / f.path), str(out / f.path)) for f in files]
        with closing(run_jobs(decoder, sinks.__getitem__, how)) as results:
            for _, (done, _) in results:
                if progress:
                    progress(done)
        for d in index.dirs:
            try:
                (stage / d).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise io_failure(e, f"cannot write {out / d}") from None
        move_into_place(stage, out, index, force)
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        if lock is not None:
            os.close(lock)
    seconds = time.perf_counter() - start
    return {"archive": str(archive), "output": str(out), "files": len(index.files),
            "bytes": index.original_bytes, "seconds": seconds}


def _create_files(stage: Path, out: Path, index) -> None:
    """Every file staged at its full size, to be filled in place by the jobs."""
    for entry in index.files:
        target = stage / entry.path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as f:
                f.truncate(entry.size)
        except OSError as e:
            raise io_failure(e, f"cannot write {out / entry.path}") from None
