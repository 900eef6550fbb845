"""Chunking, the thread pool, and ordered maps over any executor.

Planning (sampling and searching, mostly Python) runs on a thread pool;
encoding and decoding chunks run in worker processes (processes.py,
`open_workers`) where the input is large enough to pay for starting them,
since the operators hold the GIL too much for threads to scale. `ordered_map` keeps at most
`window` jobs in flight on any concurrent.futures-like executor (a thread
pool, a process pool, Dask's `Client.get_executor()`) and yields results
in input order, so memory stays bounded by chunk size x window whatever
the checkpoint size.
"""

from __future__ import annotations

import _thread
from collections import deque
from concurrent.futures import Executor, Future
from queue import Empty, SimpleQueue
from typing import Callable, Iterable, Iterator, TypeVar

# Where they were before processes.py: the encoder imports them from here.

T = TypeVar("T")
R = TypeVar("R")
A = TypeVar("A")

CHUNK_BYTES = 1 << 20


def chunk_counts(elements: int, itemsize: int, chunk_bytes: int = CHUNK_BYTES, row: int = 1) -> list[int]:
    """Element counts of the chunks a segment is cut into: whole rows of
    `row` elements when a row fits, so row-wise operators see whole rows."""
    per = max(1, chunk_bytes // itemsize)
    if 1 < row <= per:
        per = per // row * row
    full, rest = divmod(elements, per)
    return [per] * full + ([rest] if rest else [])


class Threads(Executor):
    """`workers` threads running the calls submitted, in order of
    submission, as concurrent.futures' ThreadPoolExecutor does (a queued
    call's Future.cancel() stops it; shutdown(wait=True) returns once every
    thread has exited), except that starting a thread does not wait for it
    to run: threading.Thread.start does, and the first thread of a process
    took 0.5-0.65 ms to come up on this project's 2-core VMs (measured),
    about 7 % of decoding a 6 MB checkpoint. Here the caller goes on (making
    jobs, running one) while its threads come up."""

    # Threads of every pool alive in the process: threading.enumerate()
    # does not list them, and worker processes start by fork only where no
    # other thread runs (processes.process_context asks live_threads()).
    _live = 0
    _live_lock = _thread.allocate_lock()

    def __init__(self, workers: int):
        self.workers = workers
        self._queue: SimpleQueue = SimpleQueue()
        self._exited: list = []  # per thread, a lock it holds until it exits
        self._closed = False
        try:
            for _ in range(workers):
                exited = _thread.allocate_lock()
                exited.acquire()
                _count(1)
                try:
                    _thread.start_new_thread(self._work, (exited,))
                except BaseException:
                    _count(-1)
                    raise
                self._exited.append(exited)
        except BaseException:
            self.shutdown()
            raise

    def _work(self, exited) -> None:
        try:
            while (item := self._queue.get()) is not None:
                future, fn, args, kwargs = item
                item = None  # hold nothing of a finished call while waiting for the next
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args, **kwargs))
                    except BaseException as e:  # as ThreadPoolExecutor: kept for whoever waits on it
                        future.set_exception(e)
                future = fn = args = kwargs = None
        finally:
            _count(-1)
            exited.release()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        if self._closed:
            raise RuntimeError("cannot submit to a pool that was shut down")
        future: Future = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if not self._closed:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in self._exited:
                self._queue.put(None)  # one end mark per thread, after the calls still queued
        if wait:
            for exited in self._exited:
                with exited:
                    pass


def _count(change: int) -> None:
    with Threads._live_lock:
        Threads._live += change


def live_threads() -> int:
    """How many threads of Threads pools are alive in this process."""
    return Threads._live


class Pool:
    """A thread pool, or inline execution for one thread (simpler to debug).
    `caller_helps`: the calling thread runs jobs too (ordered_pairs'
    `helps`), so the pool has one thread fewer."""

    def __init__(self, threads: int, caller_helps: bool = False):
        self.threads = max(1, threads)
        workers = self.threads - 1 if caller_helps else self.threads
        self.executor = Threads(workers) if self.threads > 1 else None

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
                  discard: Callable[[R], None] | None = None, helps: bool = False) -> Iterator[tuple[T, R]]:
    """(item, fn(arg(item))) in input order; only arg(item) goes to the
    executor (to another process, it is pickled), the item stays here.
    Leaving early, `discard` gets the result of every job that still
    completes (to free what a result holds). `helps` (a thread pool): while
    the oldest job is not done, the calling thread runs queued jobs itself
    (_oldest) instead of only waiting."""
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
                item, f = _oldest(pending, fn, arg) if helps else pending[0]
                result = f.result()
                pending.popleft()  # only now: interrupted while waiting, it is still discarded
                yield item, result
        while pending:
            item, f = _oldest(pending, fn, arg) if helps else pending[0]
            result = f.result()
            pending.popleft()
            yield item, result
    finally:
        for _, f in pending:
            if not f.cancel() and discard is not None:
                f.add_done_callback(lambda f: None if f.cancelled() or f.exception() else discard(f.result()))


def _oldest(pending: deque, fn: Callable, arg: Callable) -> tuple:
    """The oldest pending (item, future), returned once it is done or no
    job is left queued. Until then the queued job nearest the front is
    taken back from the executor (Future.cancel succeeds only on a job no
    worker has started) and run here, its outcome kept in a finished
    future in its place."""
    while not pending[0][1].done():
        for k, (item, f) in enumerate(pending):
            if f.cancel():
                done: Future = Future()
                try:
                    done.set_result(fn(arg(item)))
                except Exception as e:  # kept for its turn, as a worker's would be (Ctrl-C is not)
                    done.set_exception(e)
                pending[k] = (item, done)
                break
        else:
            break  # every job is running: wait for the oldest
    return pending[0]
