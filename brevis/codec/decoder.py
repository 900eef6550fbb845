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

import numpy as np

from ..archive.reader import MEMORY, ArchiveReader
from ..fs.atomic import io_failure, make_temp, remove_stale
from ..errors import FormatError, InvalidArgument, IOFailure, OutputExists
from ..fs.atomic import move_new
from ..fs.staging import check_inside, finish_stage, make_dirs, move_into_place, remove_tree, stage_parent
from ..workers.heap import NotPopulating, keep_freed_memory, populate
from .chunks import ChunkDecoder, Executing, IntoMemory, Progress, WriteInPlace, executing, on_threads, run_jobs



def default_output(archive: Path) -> Path:
    return archive.with_suffix("") if archive.suffix == ".brv" else archive.with_name(archive.name + ".out")


def single_file(index) -> str | None:
    """The name of the one file of an archive that holds one file and nothing
    else (a file given to compress alone), else None."""
    if len(index.files) == 1 and not index.dirs and not index.links and "/" not in index.files[0].path:
        return index.files[0].path
    return None


def output_path(archive: Path, output, index) -> tuple[Path, bool]:
    """Where decompress writes, and whether that is one file.

    An archive of one file named after it (FILE.brv holding only FILE, as
    `compress FILE` writes it) gives that file back, as zstd does: `output`
    names the file (unless it is an existing folder or ends with a
    separator: the file goes inside), by default FILE beside the archive.
    Any other archive is a folder (a folder of one file stays one):
    `output`, by default the archive's path without .brv."""
    name = single_file(index)
    if name is None or archive.name != name + ".brv":
        return (Path(output) if output is not None else default_output(archive)), False
    if output is None:
        return archive.with_name(name), True
    out = Path(output)
    if str(output).endswith(("/", os.sep)) or out.is_dir():
        return out, False
    return out, True


def decompress(archive, output=None, *, threads: int = 1, force: bool = False,
               progress: Progress = None, base=None, executor: Executor | None = None,
               processes: bool | None = None, modes: bool = True, mtimes: bool = True, only=None) -> dict:
    """Rebuild the archived files under `output`; return a summary.

    Files get back their permission bits (less the umask) and modification
    times where the archive records them (`modes`, `mtimes`: False leaves
    the defaults, as a new file gets them); links are recreated as links.
    `only`: glob patterns (select); just the files and links they match,
    and what those links point at.

    With PROCESS_MIN_THREADS threads or more, an archive of at least
    PROCESS_MIN_BYTES (or, with threads > 1, any with processes=True) is
    decoded by worker processes that write the
    chunks in place; `executor` may give such processes (the caller shuts
    them down). An archive coded against a base decodes on threads."""
    start, main_cpu = time.perf_counter(), time.thread_time()
    keep_freed_memory()
    archive = Path(archive)
    with ArchiveReader(archive) as reader, executing(reader.index, threads, processes, executor, base) as how:
        summary = _decompress(reader, output, how, force, progress, base, start, modes, mtimes, only)
    summary["main_thread_cpu_s"] = time.thread_time() - main_cpu  # (the calling thread's: its share of the work)
    return summary


def unpack(archive, *, threads: int = 1, base=None, progress: Progress = None) -> dict[str, memoryview]:
    """Every archived file decoded into memory and checked: {archived path:
    its bytes}. `archive`: a path, or the archive's bytes already in memory
    (bytes, bytearray, memoryview, mmap), read in place. Threads only (the
    buffers are this process's); links and folders are not in the result.
    An archive in memory coded against a base needs `base`."""
    keep_freed_memory()
    # Bytes first: os.PathLike's check costs an ABC's first lookup (26 us a process).
    data = archive if isinstance(archive, (bytes, bytearray, memoryview)) or not isinstance(
        archive, (str, os.PathLike)) else None
    early = _EarlyBuffers()
    try:
        with ArchiveReader(MEMORY if data is not None else Path(archive), data, early) as reader:
            how = on_threads(reader.index, threads)
            decoder = ChunkDecoder(reader, base)
            files = reader.index.files
            sinks = [IntoMemory(b) for b in early.take([f.size for f in files])]
            with closing(run_jobs(decoder, sinks.__getitem__, how, repeats=True)) as results:
                for _, (done, _) in results:
                    if progress:
                        progress(done)
            return {f.path: memoryview(s.data) for f, s in zip(files, sinks)}
    finally:
        early.stop()


# unpack's output is made before the index's checks, and faulted in on a
# thread of its own while they run, where the output is at least
# EARLY_BYTES and at most EARLY_MOST. The thread costs its start; up to
# 065c329 it also held the memory map's lock while it faulted pages in
# (MADV_POPULATE_WRITE), and a huge page slow to come stalled the main
# thread's next mmap, reading the index (benchmarks/map_lock.py): on the
# AMD EPYC, fresh processes taking turns, median ms of the index / of the
# unpack, ppocr (15 each) 10.85 / 43.85 -> 7.16 / 38.98, pocketnet (10)
# 6.09 / 21.32 -> 3.68 / 16.97 (its longest index 21.87 -> 4.95); where
# huge pages came fast, 24 each, 0.95-1.02 of the mean. The early buffers
# themselves, measured, one-shot unpack at 2
# threads, 50 runs each, interleaved: ppocr (28 MB, index 65 KB) mean
# 32.61 -> 31.45 ms, p90 35.64 -> 33.01. It once waited for an index text
# of 32 KB too; on the AMD EPYC (whose kernel sometimes zeroes pages far
# slower) that left out items whose output is large and index small, which
# gain: 30 runs each, interleaved, resemblyzer (17 MB, index 17 KB) mean
# 23.54 -> 19.40 ms, median 20.06 -> 18.33; nudenet (12 MB) 14.72 ->
# 12.35, 12.02 -> 11.73; deepfilternet (8.6 MB) 9.18 -> 9.01, 9.12 -> 8.95.
# Since the thread tells when huge pages come slowly, both while the index
# is checked and, by a sample every few milliseconds, while the files
# decode, and turns them off for the rest (heap.populate), from 4 MiB of
# output rather than 8, in the files' order rather than the largest
# first (2026-12-05, the Intel Xeon, benchmarks/ab.py against b4851b2, 12
# fresh processes each, taking turns, mean / median ms): nomic 151.1 /
# 124.0 -> 122.8 / 118.1, gemma3 207.8 / 207.9 -> 198.3 / 192.9, piper
# 43.0 / 42.9 -> 40.3 / 40.2, pocketnet 14.0 / 13.9 -> 12.7 / 12.6, taesd
# (7.9 MB) 9.6 / 9.7 -> 9.2 / 9.2, silero (5.8 MB) 6.1 / 6.0 -> 5.7 / 5.6;
# the other eight items 0.978-1.017 of the mean (best of 12: 0.943-1.013).
# In a stretch when the host gave huge pages slowly (ten runs each, fresh
# processes taking turns, mean / median): nomic 220.9 / 193.1 -> 135.9 /
# 115.7, astra 176.2 / 104.4 -> 111.0 / 103.9, easyocr 68.6 / 60.6 ->
# 58.9 / 58.2.
EARLY_BYTES = 4 << 20  # numpy's threshold for huge pages (HUGE_PAGE_ARRAY)
EARLY_MOST = 1 << 30
EARLY_FILES = 1 << 12


class _EarlyBuffers:
    """unpack's output buffers made from the sizes of the index as parsed,
    before its checks, and faulted in while the index is checked
    (heap.populate), on a core that would be idle, in the files' order,
    then watched while they are written; taken only where the checked
    index has the same sizes (it always does, unless its checks fail: then
    they are dropped)."""

    def __init__(self):
        self.buffers: list | None = None
        self.populating = NotPopulating()

    def __call__(self, obj) -> None:
        files = obj.get("files") if type(obj) is dict else None
        if type(files) is not list or len(files) > EARLY_FILES:
            return  # (an index listing more files than that is left to its checks, however many it claims)
        sizes = [f.get("size") if type(f) is dict else None for f in files]
        if not all(type(n) is int and n >= 0 for n in sizes) or not EARLY_BYTES <= sum(sizes) <= EARLY_MOST:
            return
        try:
            self.buffers = _output_buffers(sizes)
        except MemoryError:  # address space refused: made once checked, if at all
            return
        self.populating = populate(self.buffers)

    def take(self, sizes: list[int]) -> list:
        """The buffers for the checked index's files."""
        if self.buffers is not None and [len(b) for b in self.buffers] == sizes:
            self.populating.checked()
            return self.buffers
        self.populating.stop()
        return _output_buffers(sizes)

    def stop(self) -> None:
        self.populating.stop()


# numpy advises the memory of arrays of 4 MiB or more for huge pages; a
# smaller file's buffer gets the base pages, a fault each 4 KiB.
HUGE_PAGE_ARRAY = 4 << 20
SHARED_MOST = 64 << 20  # the most small files' bytes one buffer holds (one file's view keeps it all)


def _output_buffers(sizes: list[int]) -> list[np.ndarray]:
    """A buffer a file, for unpack: files under HUGE_PAGE_ARRAY share one
    (consecutive views of it), which numpy advises for huge pages, where
    they add up to HUGE_PAGE_ARRAY to SHARED_MOST; the others have their
    own. Measured on the Intel Xeon, 2026-12-05, one-shot unpack at 2
    threads in fresh processes, interleaved, median / mean ms: silero (5.8
    MB, three files of about 2 MB) 11.73 / 11.49 -> 10.50 / 10.55 (20 each;
    another 20: 10.43 / 10.51 -> 9.66 / 9.79), taesd (7.9 MB) 16.84 /
    16.74 -> 16.00 / 15.92 (16), deepfilternet (8.6 MB) 9.16 / 9.36 ->
    8.60 / 9.17 (16). On the AMD EPYC (eb9dafa) silero's median gained too,
    8.28 -> 7.34 ms, its mean not (8.32 / 8.32 over 120 runs), its p90 lost
    (8.51 -> 12.13): that host's huge pages are now and then slow to come.
    (Files of 4 MiB or more given base pages instead, a mapping of their own
    with MADV_NOHUGEPAGE, on the AMD EPYC, eight fresh processes each,
    best / median / mean ms: easyocr 55 / 99 / 135 -> 68 / 70 / 72, piper
    43 / 97 / 94 -> 49 / 52 / 52, astra 112 / 126 / 192 -> 145 / 152 /
    152; kept as numpy makes them: base pages were a fifth slower at the
    best, the run in which the host had them ready. An anonymous mapping
    advised for huge pages, aligned to them, for the shared buffer: silero
    10.34 -> 12.32 ms mean, taesd 14.37 -> 16.20, on the Intel Xeon.)"""
    small = sum(n for n in sizes if n < HUGE_PAGE_ARRAY)
    if not HUGE_PAGE_ARRAY <= small <= SHARED_MOST:
        return [np.empty(n, np.uint8) for n in sizes]
    shared, at, out = np.empty(small, np.uint8), 0, []
    for n in sizes:
        if n < HUGE_PAGE_ARRAY:
            out.append(shared[at:at + n])
            at += n
        else:
            out.append(np.empty(n, np.uint8))
    return out


def _decompress(reader: ArchiveReader, output, how: Executing, force: bool, progress: Progress, base,
                start: float, modes: bool = True, mtimes: bool = True, only=None) -> dict:
    archive = reader.path
    index = reader.index
    decoder = ChunkDecoder(reader, base)
    out, one_file = output_path(archive, output, index)
    positions = range(len(index.files))
    if only is not None:
        index, positions = select(index, only)
    if one_file:
        if not force and os.path.lexists(out):
            raise OutputExists(f"{out} exists", option="force")
    else:
        if out.exists() and not out.is_dir():
            raise OutputExists(f"{out} exists and is not a folder")
        if not force:
            clashes = [f.path for f in [*index.files, *index.links] if os.path.lexists(out / f.path)]
            if clashes:
                raise OutputExists(f"{out / clashes[0]} exists", option="force")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise InvalidArgument(f"cannot write {out}: folder {parent} does not exist")
    if out.is_dir() and not one_file:
        # Refuse links that lead outside before spending any time decoding.
        check_inside(out, index)
    where = parent if one_file else stage_parent(out, parent)
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
        sinks = {i: WriteInPlace(str(stage / f.path), str(out / f.path)) for i, f in zip(positions, files)}
        with closing(run_jobs(decoder, sinks.__getitem__, how, files=None if only is None else sinks,
                              repeats=True)) as results:
            for _, (done, _) in results:
                if progress:
                    progress(done)
        for d in index.dirs:
            try:
                make_dirs(stage / d)
            except OSError as e:
                raise io_failure(e, f"cannot write {out / d}") from None
        try:
            finish_stage(stage, index, modes, mtimes)
        except OSError as e:
            raise io_failure(e, f"cannot write {out}") from None
        if one_file:
            _move_file(stage / index.files[0].path, out, force)
        else:
            move_into_place(stage, out, index, force)
    finally:
        if stage is not None:
            remove_tree(stage)
        if lock is not None:
            os.close(lock)
    seconds = time.perf_counter() - start
    return {"archive": str(archive), "output": str(out), "file_count": len(index.files),
            "link_count": len(index.links),
            "original_bytes": index.original_bytes, "seconds": seconds}


def _move_file(staged: Path, out: Path, force: bool) -> None:
    """The one decoded file to `out` (replacing a link there, never writing through it)."""
    if not force and os.path.lexists(out):
        raise OutputExists(f"{out} exists", option="force")
    try:
        if force:
            os.replace(staged, out)
        else:
            move_new(staged, out)  # fails where another process made it meanwhile
    except OSError as e:
        raise io_failure(e, f"cannot write {out}") from None


def select(index, patterns) -> tuple[object, list[int]]:
    """The part of an index that glob patterns choose, and the positions of
    its files in the whole index. A pattern without '/' matches a name's
    last component at any depth (`*.safetensors`, `config.json`), one with
    '/' the whole name (`*` crosses '/'); patterns may also be given
    comma-separated. A chosen link brings the file or folder it points at."""
    import dataclasses
    import fnmatch
    import posixpath

    from ..archive.schema import link_target

    patterns = [p for x in ([patterns] if isinstance(patterns, str) else patterns) for p in str(x).split(",") if p]

    def chosen(path: str) -> bool:
        return any(fnmatch.fnmatchcase(path if "/" in p else posixpath.basename(path), p.strip("/"))
                   for p in patterns)

    links = [k for k in index.links if chosen(k.path)]
    wanted = {link_target(k.path, k.target) for k in links}
    positions = [i for i, f in enumerate(index.files)
                 if chosen(f.path) or f.path in wanted or any(f.path.startswith(w + "/") for w in wanted)]
    if not positions and not links:
        raise InvalidArgument(f"no archived file matches {', '.join(map(repr, patterns))}")
    return dataclasses.replace(index, files=[index.files[i] for i in positions], dirs=[], links=links), positions


def _create_files(stage: Path, out: Path, index) -> None:
    """Every file staged at its full size, to be filled in place by the jobs."""
    for entry in index.files:
        target = stage / entry.path
        try:
            make_dirs(target.parent)
            # Exclusive: two archived names that are one file on this file system
            # (case-insensitive, or normalizing names) must not share its bytes.
            with open(target, "xb") as f:
                f.truncate(entry.size)
        except FileExistsError:
            raise FormatError(f"{entry.path!r} and another archived name are one file on this file system "
                              "(names differing only in case?); nothing written") from None
        except OSError as e:
            raise io_failure(e, f"cannot write {out / entry.path}") from None
