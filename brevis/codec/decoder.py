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
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator

import numpy as np

from ..archive.index import DIGEST_BYTES, FileEntry
from ..archive.reader import ArchiveReader
from ..archive.writer import io_failure, make_temp, remove_stale
from ..errors import BrevisError, ChecksumError, FormatError, InvalidArgument, IOFailure, OutputExists
from ..workers.pool import Pool, can_start_processes, chunk_processes, ordered_pairs, runs
from ..workers.heap import keep_freed_memory
from ..fs.sources import collect

Progress = Callable[[int], None] | None


class ChunkDecoder:
    """Decodes chunks, giving those coded against a base their base tensor.

    Opening checks that the base is the one the archive was made with: every
    base tensor it used must be present, of the same dtype and shape, with
    the recorded SHA-256.
    """

    def __init__(self, reader: ArchiveReader, base=None):
        self.reader = reader
        self.base = None
        self.tensors: dict[int, object] = {}
        index = reader.index
        if index.base is None:
            return
        if base is None:
            raise InvalidArgument(f"{reader.path} was made against a base model: pass it with --base")
        from .base_model import Base

        self.base = Base.open(base)
        reader.on_close.append(self.close)  # the base's files live as long as the reader
        try:
            for f in index.files:
                for seg in f.segments:
                    if seg.base:
                        self.tensors[id(seg)] = self._resolve(f.path, seg)
        except BaseException:
            self.base.close()
            raise

    def _resolve(self, path: str, seg):
        ref = seg.base
        t = self.base.exact(ref["file"], ref["name"]) or self.base.match(ref["file"], ref["name"], seg.dtype, seg.shape)
        if t is None or t.dtype != seg.dtype or tuple(t.shape) != tuple(seg.shape):
            raise InvalidArgument(f"the base has no tensor {ref['name']!r} of {seg.dtype.name}{list(seg.shape)} "
                                  f"(needed by {path}); is it the right base?")
        if t.digest()[:DIGEST_BYTES].hex() != ref["sha256"]:
            raise ChecksumError(f"base tensor {ref['name']!r} differs from the one {path} was coded against: wrong base")
        return t

    def decode(self, seg, chunk, start: int):
        reference = None
        if seg.programs[chunk.program].uses_reference:
            t = self.tensors[id(seg)]
            ref = t.read(start, chunk.n * seg.itemsize)
            reference = np.frombuffer(ref, dtype=seg.value_type.container)
        return self.reader.decode_chunk(seg, chunk, reference)

    def work(self, entry: FileEntry) -> list[tuple]:
        """(segment, chunk, byte offset in the segment) for every chunk of a file."""
        return [w for seg in entry.segments for w in self.work_segment(seg)]

    @staticmethod
    def work_segment(seg) -> list[tuple]:
        out, start = [], 0
        for chunk in seg.chunks:
            out.append((seg, chunk, start))
            start += chunk.n * seg.itemsize
        return out

    def close(self) -> None:
        if self.base is not None:
            self.base.close()


# A job for the thread pool decodes whole chunks of one file, in order, until
# it holds at least this many original bytes: most chunks of a checkpoint are
# small tensors, and a job of one of them costs more in thread switches than
# it decodes.
BATCH_BYTES = 1 << 20


def batches(work: Iterable[tuple]) -> Iterator[list[tuple]]:
    """Runs of consecutive (segment, chunk, start) of about BATCH_BYTES."""
    return runs(work, lambda w: w[1].n * w[0].itemsize, BATCH_BYTES)


def file_chunks(decoder: ChunkDecoder, entry: FileEntry, pool: Pool) -> Iterator[memoryview]:
    """The decoded bytes of one file, chunk by chunk, in order."""
    for decoded in pool.ordered_map(lambda ws: [decoder.decode(*w) for w in ws], batches(decoder.work(entry))):
        for data in decoded:
            yield memoryview(data)


# Archives of fewer original bytes are decoded on the thread pool: starting
# worker processes costs more than it saves (the same bound as compress).
PROCESS_MIN_BYTES = 32 << 20
# A job for a worker process decodes about this many original bytes of one
# file (whole chunks, in order) and writes them in place itself, so no
# decoded byte travels between processes.
TASK_BYTES = 4 << 20


@dataclass(frozen=True)
class DecodeTask:
    archive: str
    digest: bytes  # of the archive's index: a worker refuses an archive replaced meanwhile
    file: int  # index of the file entry
    chunks: tuple[tuple[int, int], ...]  # (segment, chunk) pairs, consecutive in the file
    offset: int  # where the first chunk's bytes go in the file
    target: str | None  # the staged file, created at its full size, to write; None: only check
    shown: str  # the output path, for messages
    source: str | None = None  # the original file, to compare with (verify)


_readers: dict[str, ArchiveReader] = {}  # per worker process


def _worker_reader(path: str, digest: bytes) -> ArchiveReader:
    reader = _readers.get(path)
    if reader is None:
        keep_freed_memory()
        reader = _readers[path] = ArchiveReader(Path(path))
    if reader.footer.digest != digest:
        raise FormatError(f"{path} changed while being decoded")
    return reader


def _pwrite_all(fd: int, data, offset: int, shown: str) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.pwrite(fd, view, offset)
        except OSError as e:
            raise io_failure(e, f"cannot write {shown}") from None
        view, offset = view[written:], offset + written


def run_decode(task: DecodeTask) -> int:
    """Decode a run of chunks of one file and write them in place (in a
    worker process); return the bytes written."""
    reader = _worker_reader(task.archive, task.digest)
    entry = reader.index.files[task.file]
    try:
        fd = os.open(task.target, os.O_WRONLY)
    except OSError as e:
        raise io_failure(e, f"cannot write {task.shown}") from None
    offset = task.offset
    try:
        for s, c in task.chunks:
            seg = entry.segments[s]
            data = reader.decode_chunk(seg, seg.chunks[c])
            _pwrite_all(fd, data, offset, task.shown)
            offset += len(data)
    finally:
        os.close(fd)
    return offset - task.offset


def run_check(task: DecodeTask) -> tuple[int, list[tuple[str | None, str]]]:
    """Decode a run of chunks and check them (and compare them with the
    source, if the task names one), in a worker process; return the bytes
    checked and the (segment name, problem) pairs found, in order."""
    reader = _worker_reader(task.archive, task.digest)
    entry = reader.index.files[task.file]
    problems: list[tuple[str | None, str]] = []
    fd = -1
    if task.source is not None:
        try:
            fd = os.open(task.source, os.O_RDONLY)
        except OSError as e:
            return 0, [(None, f"cannot read source: {e.strerror}")]
    offset = task.offset
    try:
        for s, c in task.chunks:
            seg = entry.segments[s]
            chunk = seg.chunks[c]
            length = chunk.n * seg.itemsize
            try:
                data = reader.decode_chunk(seg, chunk)
            except BrevisError as e:
                problems.append((seg.name, str(e)))
            else:
                if fd >= 0 and _read_up_to(fd, offset, length) != data.tobytes():
                    problems.append((seg.name, "decoded bytes differ from the source"))
            offset += length
    finally:
        if fd >= 0:
            os.close(fd)
    return offset - task.offset, problems


def _read_up_to(fd: int, offset: int, length: int) -> bytes:
    """Up to length bytes at offset (fewer only at the end of the file)."""
    out = b""
    while len(out) < length:
        more = os.pread(fd, length - len(out), offset + len(out))
        if not more:
            break
        out += more
    return out


def decode_tasks(archive: Path, reader: ArchiveReader, stage: Path | None, out: Path,
                 sources: dict[int, str] | None = None) -> Iterator[DecodeTask]:
    """Jobs of about TASK_BYTES covering every chunk of every file; each
    writes into `stage` (None: checks only), compares with sources[file]
    where given."""
    sources = sources or {}
    for i, entry in enumerate(reader.index.files):
        target = str(stage / entry.path) if stage is not None else None
        make = lambda run, start: DecodeTask(str(archive), reader.footer.digest, i, tuple(run), start,  # noqa: E731
                                             target, str(out / entry.path), sources.get(i))
        run: list[tuple[int, int]] = []
        start = offset = 0
        for s, seg in enumerate(entry.segments):
            for c, chunk in enumerate(seg.chunks):
                run.append((s, c))
                offset += chunk.n * seg.itemsize
                if offset - start >= TASK_BYTES:
                    yield make(run, start)
                    run, start = [], offset
        if run:
            yield make(run, start)


def _in_order(executor: Executor, fn, tasks: Iterator[DecodeTask], window: int) -> Iterator[tuple[DecodeTask, object]]:
    """(task, fn(task)) on the executor, at most `window` in flight, in order."""
    try:
        yield from ordered_pairs(executor, fn, tasks, window)
    except BrokenProcessPool:
        raise BrevisError("a decoding worker process died (killed, or out of memory)") from None


def open_decode_processes(threads: int, total_bytes: int, base=None, processes: bool | None = None):
    """Worker processes to decode an archive of total_bytes, or None where
    they would not pay. Archives coded against a base decode on threads:
    every worker would have to open and check the base again."""
    if threads > 1 and base is None and processes is not False and can_start_processes():
        if processes or total_bytes >= PROCESS_MIN_BYTES:
            return chunk_processes(threads)
    return None


# Below PROCESS_MIN_BYTES a thread pool pays only where chunks are large:
# numpy and zstd then work without the GIL, while on many small chunks the
# threads queue for it. Measured, 2 threads against one, MB/s: voicefilter
# (276 KB a chunk) 599 vs 411, minilm-int8 (78 KB) 358 vs 218, resemblyzer
# (251 KB) 247 vs 221, deepfilternet3 (67 KB) 133 vs 125; but ppocr (35 KB)
# 171 vs 197, pocketnet (22 KB) 102 vs 123, taesd (17 KB) 122 vs 149.
POOL_CHUNK_BYTES = 64 << 10


def _threads_for(threads: int, index, processes: bool | None) -> int:
    """Threads for an archive decoded without worker processes: below
    PROCESS_MIN_BYTES, one unless its chunks average POOL_CHUNK_BYTES or
    more, or processes=False asks for the pool."""
    total = index.original_bytes
    if processes is not None or total >= PROCESS_MIN_BYTES:
        return threads
    chunks = sum(len(s.chunks) for f in index.files for s in f.segments)
    return threads if chunks and total >= POOL_CHUNK_BYTES * chunks else 1


def processes_for(archive, threads: int, base=None):
    """Worker processes to decode or verify this archive (see
    open_decode_processes), opened ahead of any thread of the caller's (a
    progress bar) so that they can start by fork; None if they would not
    pay or the archive cannot be read (the call that follows says why)."""
    try:
        with ArchiveReader(Path(archive)) as reader:
            total = reader.index.original_bytes
    except BrevisError:
        return None
    return open_decode_processes(threads, total, base)


def _decode_in_processes(executor: Executor, archive: Path, reader: ArchiveReader, stage: Path, out: Path,
                         window: int, progress: Progress) -> None:
    for entry in reader.index.files:  # every file at its full size, then filled in place
        target = stage / entry.path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as f:
                f.truncate(entry.size)
        except OSError as e:
            raise io_failure(e, f"cannot write {out / entry.path}") from None
    for _, done in _in_order(executor, run_decode, decode_tasks(archive, reader, stage, out), window):
        if progress:
            progress(done)


def default_output(archive: Path) -> Path:
    return archive.with_suffix("") if archive.suffix == ".brv" else archive.with_name(archive.name + ".out")


def decompress(archive, output=None, *, threads: int = 1, force: bool = False,
               progress: Progress = None, base=None, executor: Executor | None = None,
               processes: bool | None = None) -> dict:
    """Rebuild the archived files under `output`; return a summary.

    With threads > 1, an archive of at least PROCESS_MIN_BYTES (or any,
    with processes=True) is decoded by worker processes that write the
    chunks in place; `executor` may give such processes (the caller shuts
    them down)."""
    start = time.perf_counter()
    keep_freed_memory()
    archive = Path(archive)
    with ArchiveReader(archive) as reader:
        own = None
        if executor is None:
            own = executor = open_decode_processes(threads, reader.index.original_bytes, base, processes)
            threads = _threads_for(threads, reader.index, processes)
        try:
            return _decompress(reader, output, threads, force, progress, base, executor, start)
        finally:
            if own is not None:
                own.shutdown(wait=True, cancel_futures=True)


def _decompress(reader: ArchiveReader, output, threads: int, force: bool, progress: Progress, base,
                executor: Executor | None, start: float) -> dict:
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
        _check_inside(out, index)
    where = _stage_parent(out, parent)
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
        if executor is not None and decoder.base is None:
            _decode_in_processes(executor, archive.absolute(), reader, stage, out, 2 * max(1, threads), progress)
        else:
            _decode_in_threads(decoder, stage, out, threads, progress)
        for d in index.dirs:
            try:
                (stage / d).mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise io_failure(e, f"cannot write {out / d}") from None
        _move_into_place(stage, out, index, force)
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        if lock is not None:
            os.close(lock)
    seconds = time.perf_counter() - start
    return {"archive": str(archive), "output": str(out), "files": len(index.files),
            "bytes": index.original_bytes, "seconds": seconds}


def _decode_in_threads(decoder: ChunkDecoder, stage: Path, out: Path, threads: int, progress: Progress) -> None:
    with Pool(threads) as pool:
        for entry in decoder.reader.index.files:
            target = stage / entry.path
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as f:
                    for data in file_chunks(decoder, entry, pool):
                        f.write(data)
                        if progress:
                            progress(len(data))
            except OSError as e:
                raise io_failure(e, f"cannot write {out / entry.path}") from None


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


def verify(archive, sources=None, *, threads: int = 1, progress: Progress = None, base=None,
           executor: Executor | None = None, processes: bool | None = None) -> dict:
    """Decode everything and check it; with `sources`, compare to the originals too.

    `sources` are named as for compress (the same paths give the same names).
    Returns a report whose "ok" is True only when everything matched;
    problems are listed per file and segment instead of stopping at the first.
    Worker processes check the chunks where decompress would use them.
    """
    start = time.perf_counter()
    keep_freed_memory()
    originals = None
    if sources:
        files, _ = collect([sources] if isinstance(sources, (str, os.PathLike)) else list(sources))
        originals = {s.name: s.path for s in files}
    with ArchiveReader(Path(archive)) as reader:
        own = None
        if executor is None:
            own = executor = open_decode_processes(threads, reader.index.original_bytes, base, processes)
            threads = _threads_for(threads, reader.index, processes)
        try:
            decoder = ChunkDecoder(reader, base)
            if executor is not None and decoder.base is None:
                problems = _verify_in_processes(executor, reader, originals, 2 * max(1, threads), progress)
            else:
                problems = _verify_in_threads(decoder, originals, threads, progress)
        finally:
            if own is not None:
                own.shutdown(wait=True, cancel_futures=True)
        index = reader.index
        if originals is not None:
            for name in sorted(set(originals) - {f.path for f in index.files}):
                problems.append(_problem(name, None, "in the source but not in the archive"))
    return {"archive": str(archive), "ok": not problems, "files": len(index.files),
            "bytes": index.original_bytes, "problems": problems,
            "seconds": time.perf_counter() - start}


def _problem(file, segment, error) -> dict:
    return {"file": file, "segment": segment, "error": error}


def _open_source(entry: FileEntry, originals: dict | None) -> tuple[BinaryIO | None, list[dict]]:
    """The source file to compare an archived file with (open), or None,
    and the problems found before reading it."""
    if originals is None:
        return None, []
    if entry.path not in originals:
        return None, [_problem(entry.path, None, "missing from the source")]
    try:
        return open(originals[entry.path], "rb"), []
    except OSError as e:
        return None, [_problem(entry.path, None, f"cannot read source: {e.strerror}")]


def _verify_in_threads(decoder: ChunkDecoder, originals: dict | None, threads: int, progress: Progress) -> list[dict]:
    problems: list[dict] = []
    with Pool(threads) as pool:
        for entry in decoder.reader.index.files:
            original, found = _open_source(entry, originals)
            problems += found
            for seg, error in _check_file(decoder, entry, pool, original, progress):
                problems.append(_problem(entry.path, seg.name, error))
            if original is not None:
                if original.read(1):
                    problems.append(_problem(entry.path, None, "source file is longer than the archived one"))
                original.close()
    return problems


def _verify_in_processes(executor: Executor, reader: ArchiveReader, originals: dict | None, window: int,
                         progress: Progress) -> list[dict]:
    """The same problems, in the same order, as _verify_in_threads."""
    files = reader.index.files
    before: dict[int, list[dict]] = {}  # per file: problems found before its chunks
    after: dict[int, list[dict]] = {}  # ... and after them
    sources: dict[int, str] = {}
    for i, entry in enumerate(files):
        original, before[i] = _open_source(entry, originals)
        if original is None:
            continue
        with original:
            sources[i] = original.name  # workers read it by path
            if os.fstat(original.fileno()).st_size > entry.size:
                after[i] = [_problem(entry.path, None, "source file is longer than the archived one")]
    found: dict[int, list[dict]] = {}
    tasks = decode_tasks(reader.path.absolute(), reader, None, Path(""), sources)
    for task, (done, chunk_problems) in _in_order(executor, run_check, tasks, window):
        path = files[task.file].path
        found.setdefault(task.file, []).extend(_problem(path, seg, error) for seg, error in chunk_problems)
        if progress:
            progress(done)
    return [p for i in range(len(files)) for p in before.get(i, []) + found.get(i, []) + after.get(i, [])]


def _check_file(decoder: ChunkDecoder, entry: FileEntry, pool: Pool, original, progress: Progress):
    """Yield (segment, error) for every problem found in one file."""

    def decode(w):
        try:
            return w, decoder.decode(*w), None
        except BrevisError as e:
            return w, None, str(e)

    decoded = pool.ordered_map(lambda ws: [decode(w) for w in ws], batches(decoder.work(entry)))
    for (seg, chunk, _), data, error in (r for rs in decoded for r in rs):
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
