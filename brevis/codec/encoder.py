"""Compression: sources -> plan -> streams -> archive; the orchestration.

1. Scan (plan.scan): every source file is cut into segments (formats/);
   only headers are read. plan.discover then reads the long byte spans
   and cuts them: copies of long repeats, changes of statistics, runs of
   quantized blocks. plan.lay_out makes the plan's skeleton: files ->
   segments -> chunk references, in archive order.
2. Learn: the planner learns the production prior on a stratified sample
   of the segments (unless a prior was given).
3. Plan and encode, through two ordered maps: planning (plan.plan_segments:
   sampling a segment and searching its program) runs a few segments ahead
   of encoding, as self-contained jobs (tasks.run_plans, the segments
   cheap to plan in batches: the prior travels as JSON, a family's follower
   gets its leader's program) where chunks
   are encoded by worker processes or an executor, else on a thread pool.
   Encoding a chunk (reading, checksumming, coding: tasks.run_chunk) is a
   self-contained job that runs on worker processes (large inputs with
   threads > 1), on a caller's executor (a Dask cluster), or on the thread
   pool.
4. Assemble: the assembler (assembler.Assembler) takes the results in plan
   order and alone builds the index: it writes and deduplicates streams and
   releases each file after its last chunk. So the archive does not depend
   on the number of threads, processes or workers.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import Callable, Iterator

from .assembler import Assembler
from .base_model import Base
from ..archive.writer import ArchiveWriter
from ..errors import BrevisError, InvalidArgument
from ..workers import Workers, open_workers
from ..workers.processes import broken_pool, ours
from ..workers.shared import Ring, RingBatch, SharedBatch, read_batch, release_batch
from ..workers.tasks import ChunkTask, run_chunks, run_chunks_ring, run_chunks_shared
from ..workers.pool import CHUNK_BYTES, Pool, ordered_pairs, runs
from ..workers.heap import keep_freed_memory
from ..fs.sources import Source, collect
from ..defaults import DEFAULT_EFFORT
from ..synth.planner import Planner
from ..synth.prior import Prior
# compress() calls scan, discover and _learn through this module (tests and benchmarks/phases.py wrap them here).
from .plan import ChunkRef, _learn, discover, gather_small_tensors, lay_out, plan_segments, scan  # noqa: F401


def learn(sources, *, effort: int = DEFAULT_EFFORT, threads: int = 1, chunk_bytes: int = CHUNK_BYTES,
          base: str | os.PathLike | None = None) -> Prior:
    """Learn the production prior of a checkpoint without compressing it
    (against a base, as compress --base learns it)."""
    files, _ = collect(list(sources))
    planner = Planner(effort)
    if not planner.effort.learn_tensors:
        raise InvalidArgument(f"effort {effort} does not learn a prior; use 1 or more")
    base_model = Base.open(base) if base is not None else None
    try:
        with Pool(threads) as pool:
            scanned = list(pool.ordered_map(scan, files))
            discover(scanned, planner.effort.lzma_margin, threads)
            gather_small_tensors(scanned, base_model)
            return _learn(planner, scanned, pool, chunk_bytes, base_model)
    finally:
        if base_model is not None:
            base_model.close()


# Inputs below this many bytes are compressed on one thread: two worker
# processes gained nothing there (measured, benchmarks/results/scaling.md:
# silero 6 MB +4 %, taesd 8 MB -3 %; nudenet 12 MB +18 %, ppocr 28 MB +27 %).
PROCESS_MIN_BYTES = 8 << 20
# Chunks go to another process (or an executor's worker) in batches of
# about this many original bytes, and at most this many chunks: every
# result costs the main process a few GIL hand-offs, which the planning
# threads make slow (measured: 1 MiB jobs ran at a third of the workers'
# speed while one thread searched).
WORKER_BATCH_BYTES = 4 << 20
WORKER_BATCH_CHUNKS = 64
# A slot of the ring batches' streams come back through (shared.Ring): a
# batch's bytes and two chunks' more (a batch ends past its bytes, and its
# streams may outgrow what they code), at most this; a batch whose streams
# do not fit takes a file of its own.
RING_SLOT_MOST = 16 << 20
# With WRITE_BEHIND_THREADS threads or more, inputs of WRITE_BEHIND_BYTES
# or more have their streams written by a thread of their own
# (ArchiveWriter.write_behind): the thread that takes the encoded chunks,
# which many workers keep busy, no longer copies them into the archive.
# Its CPU seconds at -j2 with worker processes, median of 5 fresh runs
# each, taking turns (2026-12-07): nomic 0.171 -> 0.095, gemma3 0.297 ->
# 0.212, astra 0.192 -> 0.145, minilm 0.082 -> 0.062, smollm2 0.139 ->
# 0.110, piper 0.134 -> 0.117; the process's 0.98-1.07 of them. Not below
# 3 threads: with two workers on two cores the workers are the bottleneck
# and a thread more cost 1-3 % of the time (nomic, astra, smollm2, minilm,
# 8 runs each, taking turns: 0.99-1.03 by median). Its ring then has RING_BEHIND
# slots more than batches in flight: a slot is given out again only once
# the streams of its last batch are written, so the writing thread may lag
# that many batches behind.
WRITE_BEHIND_THREADS = 3
WRITE_BEHIND_BYTES = 32 << 20
RING_BEHIND = 2


def compress(sources: list[str | os.PathLike], output: str | os.PathLike, *, threads: int = 1,
             force: bool = False, effort: int = DEFAULT_EFFORT, prior: Prior | str | os.PathLike | None = None,
             base: str | os.PathLike | None = None, chunk_bytes: int = CHUNK_BYTES,
             progress: Callable[[int], None] | None = None, executor: Executor | None = None,
             processes: bool | None = None, window: int | None = None,
             batch_bytes: int = WORKER_BATCH_BYTES, exclude=(), default_excludes: bool = True,
             dereference: bool = False, series: dict | None = None) -> dict:
    """Write an archive of the sources; return a summary (see api.compress).

    Chunks are encoded by `executor` when one is given (anything with
    concurrent.futures' submit, e.g. Dask's Client.get_executor(); it is
    left open), else by `threads` worker processes when threads > 1 and
    `processes` is True, or None and the input is at least
    PROCESS_MIN_BYTES; scanning and planning then run on this thread.
    `processes=False`: everything on a pool of `threads` threads (as
    before worker processes); otherwise, small inputs run on this thread.
    `window`: jobs in flight (default 2 per thread or process); a job for
    another process or an executor is a batch of chunks of about
    `batch_bytes`. `exclude`, `default_excludes`: what to leave out of
    folders (fs.sources.collect); the summary's "skipped" lists it.
    `base`: a path, or a Base already open (left open: a run's next
    checkpoint uses it); `series`: the index's series record, for a member
    of a training run (series.py).
    Symbolic links inside a folder that point at a file or folder of the
    same folder are stored as links; other links to files are followed
    (their content stored), and every one is with `dereference`.
    """
    start, main_cpu = time.perf_counter(), time.thread_time()
    keep_freed_memory()
    skipped: list[dict] = []
    links: list[Source] = []
    files, dirs = collect(sources, exclude=exclude, default_excludes=default_excludes, skipped=skipped,
                          links=None if dereference else links)
    out = Path(output).absolute()
    for s in files:
        if s.path.absolute() == out or (out.exists() and os.path.samefile(s.path, out)):
            raise InvalidArgument(f"the output {output} is also a source")
    if prior is not None and not isinstance(prior, Prior):
        prior = Prior.load(prior)
    planner = Planner(effort, prior)
    scanned: list = []  # closed on the way out, whatever happened
    ring: Ring | None = None
    own_base = base is not None and not isinstance(base, Base)
    base_model = Base.open(base) if own_base else base
    pids: set[int] = set()
    own = Workers(None)
    total = _total_bytes(files)
    if executor is None:  # before any thread of ours starts, so that workers can fork
        own = open_workers(threads, total, PROCESS_MIN_BYTES, processes)
        executor = own.executor
    try:
        # Threads only where asked for (processes=False): measured (scaling.md), planning
        # threads fight over the GIL with the thread taking results, and a thread pool
        # was slower than one thread on 9 of 12 items.
        with ArchiveWriter(out, force) as writer, Pool(threads if processes is False and executor is None
                                                       else 1) as pool:
            if executor is None:  # one chunk a job, as the thread pool has always run them
                chunk_executor, chunk_window, batch = pool.executor, window or 2 * pool.threads, (0, 1)
            else:
                chunk_executor, chunk_window = executor, window or 2 * max(1, threads)
                batch = (batch_bytes, WORKER_BATCH_CHUNKS)
            scanned = list(pool.ordered_map(scan, files))
            # Discovery's measurements go to the workers (they wait for it),
            # else to threads; planning where this pool has one thread lets
            # LZMA's trials of byte spans take the other cores (planner._sizes).
            discover(scanned, planner.effort.lzma_margin, threads, executor)
            if pool.threads == 1:
                planner.trial_threads = threads
            gather_small_tensors(scanned, base_model)
            learn_time = time.perf_counter()
            if prior is None and planner.effort.learn_tensors:
                _learn(planner, scanned, pool, chunk_bytes, base_model, executor)
            learn_time = time.perf_counter() - learn_time
            files_plan = lay_out(scanned, chunk_bytes)
            assembler = Assembler(files_plan, dirs, writer, links)
            # Segments are planned where chunks are encoded (worker processes,
            # an executor): on this process alone, planning was the critical
            # path of items with many small tensors (ppocr: 0.9 s of 1.3 s).
            planned = plan_segments(files_plan, planner, pool, chunk_bytes, base_model, executor,
                                    2 * max(1, threads))
            chunks = (ref for ps in planned for ref in ps.chunks)
            # Workers on this machine: streams come back through shared memory,
            # a ring of slots where /dev/shm holds one (shared.py).
            shared = ours(executor) and executor.shared
            if threads >= WRITE_BEHIND_THREADS and total >= WRITE_BEHIND_BYTES:
                writer.write_behind()
            slot_bytes = min(batch[0] + 2 * chunk_bytes, RING_SLOT_MOST)
            slots = chunk_window + (RING_BEHIND if writer.behind is not None else 0)
            ring = Ring.open(os.getpid(), slots, slot_bytes) if shared else None
            written: dict[int, object] = {}  # a ring slot -> the ticket of its last batch's streams (writer.mark)
            if ring is not None:
                run, tasks_of = functools.partial(run_chunks_ring, owner=os.getpid()), _placed(ring, writer, written)
            elif shared:
                run, tasks_of = functools.partial(run_chunks_shared, owner=os.getpid()), _tasks
            else:
                run, tasks_of = run_chunks, _tasks
            for refs, result in ordered_pairs(chunk_executor, run, _batches(chunks, *batch), chunk_window,
                                              tasks_of, release_batch):
                with read_batch(result, ring) as outputs:
                    for ref, (chunk_output, streams) in zip(refs, outputs):
                        pids.add(chunk_output.pid)
                        assembler.add(ref, chunk_output, streams)
                        if progress:
                            progress(ref.length)
                    ticket = writer.mark()
                    if isinstance(result, SharedBatch):
                        writer.wait(ticket)  # its file's mapping closes with this block
                    elif isinstance(result, RingBatch):
                        written[result.slot] = ticket  # its slot is given out again once they are written
            size = assembler.finish(planner.prior.to_json(), series)
            index = assembler.index
    except Exception as e:
        if broken_pool(e):
            raise BrevisError("a chunk worker process died (killed, or out of memory); archive not written") from None
        raise
    finally:
        own.shutdown()  # queued jobs are dropped; running ones are short
        if ring is not None:
            ring.close()
        for f in scanned:
            f.close()
        if own_base:
            base_model.close()
    seconds = time.perf_counter() - start
    original = index.original_bytes
    return {
        "archive": str(output),
        "file_count": len(index.files),
        "link_count": len(index.links),
        "original_bytes": original,
        "archive_bytes": size,
        "ratio": size / original if original else None,
        "seconds": seconds,
        "learn_seconds": learn_time,
        "throughput_mb_s": original / seconds / 1e6 if seconds else None,
        "effort": planner.effort.level,
        # CPU seconds of the calling thread (scan, discovery, learning,
        # planning where it plans, taking the results, the index) and of the
        # thread writing streams (write_behind; 0 where this one wrote them)
        "main_thread_cpu_s": time.thread_time() - main_cpu,
        "writer_cpu_s": writer.behind_cpu,
        "prior_samples": planner.prior.samples,
        "encode_processes": len(pids),
        "skipped": skipped,
        "base_tensors": index.base["tensors"] if index.base else 0,
    }


def _total_bytes(files: list[Source]) -> int:
    total = 0
    for s in files:
        try:
            total += s.path.stat().st_size
        except OSError:
            pass  # reported by the scan
    return total


def _batches(chunks: Iterator[ChunkRef], max_bytes: int, max_chunks: int) -> Iterator[list[ChunkRef]]:
    """Consecutive chunks, grouped up to max_bytes or max_chunks (at least one a batch)."""
    return runs(chunks, lambda ref: ref.length, max_bytes, max_chunks)


def _tasks(batch: list[ChunkRef]) -> list[ChunkTask]:
    return [ref.task() for ref in batch]


def _placed(ring: Ring, writer: ArchiveWriter, written: dict) -> Callable[[list[ChunkRef]], tuple]:
    """The jobs of run_chunks_ring: batch k (in the order ordered_pairs
    submits them) with slot k of the ring, once the streams of the batch
    that slot held last are written (`written`: a slot -> its ticket)."""
    count = itertools.count()

    def place(batch: list[ChunkRef]) -> tuple:
        where = ring.place(next(count))
        writer.wait(written.pop(where[1], None))
        return _tasks(batch), where

    return place
