"""Chunking, the thread pool and the chunk worker processes.

Planning (sampling and searching, mostly Python) runs on a thread pool;
encoding chunks runs in worker processes (`chunk_processes`) where the
input is large enough to pay for starting them, since the operators hold
the GIL too much for threads to scale. `ordered_map` keeps at most
`window` jobs in flight on any concurrent.futures-like executor (a thread
pool, a process pool, Dask's `Client.get_executor()`) and yields results
in input order, so memory stays bounded by chunk size x window whatever
the checkpoint size.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import sys
import threading
from collections import deque
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")
A = TypeVar("A")

CHUNK_BYTES = 1 << 20


def default_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def chunk_counts(elements: int, itemsize: int, chunk_bytes: int = CHUNK_BYTES, row: int = 1) -> list[int]:
    """Element counts of the chunks a segment is cut into: whole rows of
    `row` elements when a row fits, so row-wise operators see whole rows."""
    per = max(1, chunk_bytes // itemsize)
    if 1 < row <= per:
        per = per // row * row
    full, rest = divmod(elements, per)
    return [per] * full + ([rest] if rest else [])


class Pool:
    """A thread pool, or inline execution for one thread (simpler to debug)."""

    def __init__(self, threads: int):
        self.threads = max(1, threads)
        self.executor = ThreadPoolExecutor(self.threads) if self.threads > 1 else None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        if self.executor:
            # Drop queued work at once (Ctrl-C, errors); running jobs are short.
            self.executor.shutdown(wait=True, cancel_futures=True)

    def ordered_map(self, fn: Callable[[T], R], items: Iterable[T], window: int | None = None) -> Iterator[R]:
        return ordered_map(self.executor, fn, items, window or 2 * self.threads)


def runs(items: Iterable[T], size: Callable[[T], int], max_bytes: int, max_items: int = 0) -> Iterator[list[T]]:
    """Consecutive items grouped until a group holds max_bytes (by `size`)
    or max_items (0: no limit); every group has at least one item."""
    group: list[T] = []
    total = 0
    for item in items:
        group.append(item)
        total += size(item)
        if total >= max_bytes or len(group) == max_items:
            yield group
            group, total = [], 0
    if group:
        yield group


def ordered_map(executor: Executor | None, fn: Callable[[T], R], items: Iterable[T], window: int) -> Iterator[R]:
    """fn over items on the executor (inline if None), at most `window` in
    flight, results in input order. Leaving early cancels what is queued."""
    for _, result in ordered_pairs(executor, fn, items, window):
        yield result


def ordered_pairs(executor: Executor | None, fn: Callable[[A], R], items: Iterable[T], window: int,
                  arg: Callable[[T], A] | None = None,
                  discard: Callable[[R], None] | None = None) -> Iterator[tuple[T, R]]:
    """(item, fn(arg(item))) in input order; only arg(item) goes to the
    executor (to another process, it is pickled), the item stays here.
    Leaving early, `discard` gets the result of every job that still
    completes (to free what a result holds)."""
    arg = arg or (lambda item: item)
    if executor is None:
        for item in items:
            yield item, fn(arg(item))
        return
    pending: deque[tuple[T, Future]] = deque()
    try:
        for item in items:
            pending.append((item, executor.submit(fn, arg(item))))
            if len(pending) >= window:
                item, f = pending[0]
                result = f.result()
                pending.popleft()  # only now: interrupted while waiting, it is still discarded
                yield item, result
        while pending:
            item, f = pending[0]
            result = f.result()
            pending.popleft()
            yield item, result
    finally:
        for _, f in pending:
            if not f.cancel() and discard is not None:
                f.add_done_callback(lambda f: None if f.cancelled() or f.exception() else discard(f.result()))


def process_context():
    """fork where it is safe (Linux, and this process has no other thread
    yet): a worker then starts in milliseconds with everything already
    imported, and nothing of the main module is run again. Else spawn: a
    fresh interpreter per worker (about 0.5 s of CPU each to import numpy
    and Brevis, measured). forkserver was measured too: its server outlived
    a SIGKILLed main process by over 30 s here."""
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.M)


def can_start_processes() -> bool:
    """Whether worker processes can start here: not from a daemonic process
    (a Dask worker, a multiprocessing.Pool worker), and, where they must be
    spawned (see process_context), not where a worker would rerun the main
    script's code: spawn imports the main module in every worker, which is
    safe for `python -m`, the `brevis` command, an interactive session, or
    a script whose work is under `if __name__ == "__main__":`, and for
    nothing else."""
    if multiprocessing.current_process().daemon:
        return False
    if process_context().get_start_method() == "fork":
        return True
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    if path is None:
        return True
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return _GUARD.search(f.read()) is not None
    except OSError:
        return False


class ChunkProcesses(ProcessPoolExecutor):
    """Worker processes for chunk jobs, all started at once.

    Forked workers start here, in a few milliseconds. Spawned ones (about
    0.7 s for two, measured) start from a thread of their own, so that the
    start overlaps the scan and the learning, and so that a
    KeyboardInterrupt, which only the main thread receives, cannot land in
    the middle of a process start (a half-started worker would be orphaned
    and print a traceback). That thread lives until shutdown: a worker's
    death signal (PR_SET_PDEATHSIG) is tied to the thread that started it."""

    def __init__(self, workers: int):
        from . import tasks as jobs

        context = process_context()
        jobs.remove_stale_batches()
        self.shared = os.path.isdir(jobs.SHM_DIR)  # streams come back through /dev/shm files
        super().__init__(workers, mp_context=context, initializer=jobs.worker_init, initargs=(os.getpid(),))
        self.closing = threading.Event()
        self.starter: threading.Thread | None = None
        if context.get_start_method() == "fork":
            self.submit(jobs.warm_up)  # forks every worker now, before any thread of ours exists
        else:
            self.starter = threading.Thread(target=self._start, args=(workers,), name="brevis-start-workers",
                                            daemon=True)
            self.starter.start()

    def _start(self, workers: int) -> None:
        from . import tasks as jobs

        try:
            for _ in range(workers):  # each no-op job starts one more process
                self.submit(jobs.warm_up)
        except RuntimeError:  # shut down before the start finished
            pass
        self.closing.wait()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        try:
            super().shutdown(wait=wait, cancel_futures=cancel_futures)
        finally:
            self.closing.set()
            if self.starter is not None:
                self.starter.join()


def chunk_processes(workers: int) -> ChunkProcesses:
    return ChunkProcesses(workers)
