"""Verification: decode everything, check every checksum, and compare with
the source files where given; problems are listed per file and segment
instead of stopping at the first, in the same order on any executor."""

from __future__ import annotations

import os
import time
from concurrent.futures import Executor
from contextlib import closing
from pathlib import Path

from ..archive.reader import ArchiveReader
from ..fs.sources import collect
from ..workers.heap import keep_freed_memory
from .chunks import ChunkDecoder, CheckOnly, CompareWith, Executing, Progress, Sink, executing, run_jobs


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
        from .assembler import link_entry  # the encoder's side: only where sources are compared

        links: list = []
        files, _ = collect([sources] if isinstance(sources, (str, os.PathLike)) else list(sources), links=links)
        originals = {s.name: s.path for s in files + links}  # a link's content read through it
        source_links = {s.name: link_entry(s).target for s in links}
    with ArchiveReader(Path(archive)) as reader:
        index = reader.index
        with executing(index, threads, processes, executor, base) as how:
            problems = _check(ChunkDecoder(reader, base), originals, how, progress)
        if originals is not None:
            for k in index.links:
                if k.path not in source_links:
                    problems.append(_problem(k.path, None, "a link in the archive, not in the source"))
                elif source_links[k.path] != k.target:
                    problems.append(_problem(k.path, None, f"a link to {k.target} in the archive, "
                                                           f"to {source_links[k.path]} in the source"))
            archived = {f.path for f in index.files} | {k.path for k in index.links}
            for name in sorted(set(originals) - archived):
                problems.append(_problem(name, None, "in the source but not in the archive"))
    return {"archive": str(archive), "ok": not problems, "file_count": len(index.files),
            "link_count": len(index.links),
            "original_bytes": index.original_bytes, "source_compared": originals is not None,
            "problems": problems, "seconds": time.perf_counter() - start}


def _problem(file, segment, error) -> dict:
    return {"file": file, "segment": segment, "error": error}


def _sink(entry, originals: dict | None) -> tuple[Sink, list[dict], list[dict]]:
    """Where a file's decoded bytes go, and the problems found before its
    chunks and after them (a source that is missing, unreadable, longer)."""
    if originals is None:
        return CheckOnly(), [], []
    if entry.path not in originals:
        return CheckOnly(), [_problem(entry.path, None, "missing from the source")], []
    path = originals[entry.path]
    try:
        with open(path, "rb") as original:
            longer = os.fstat(original.fileno()).st_size > entry.size
    except OSError as e:
        return CheckOnly(), [_problem(entry.path, None, f"cannot read source: {e.strerror}")], []
    after = [_problem(entry.path, None, "source file is longer than the archived one")] if longer else []
    return CompareWith(str(path)), [], after


def _check(decoder: ChunkDecoder, originals: dict | None, how: Executing, progress: Progress) -> list[dict]:
    files = decoder.reader.index.files
    sinks, before, after = zip(*(_sink(entry, originals) for entry in files)) if files else ((), (), ())
    found: list[list[dict]] = [[] for _ in files]
    with closing(run_jobs(decoder, sinks.__getitem__, how)) as results:
        for job, (done, problems) in results:
            path = files[job.file].path
            found[job.file] += (_problem(path, seg, error) for seg, error in problems)
            if progress:
                progress(done)
    return [p for i in range(len(files)) for p in before[i] + found[i] + after[i]]
