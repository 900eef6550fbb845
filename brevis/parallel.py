"""Chunking and the worker pool.

numpy, hashlib and zstandard release the GIL on large buffers, so threads
give real parallelism. `ordered_map` keeps at most `window` jobs in flight
and yields results in input order, so memory stays bounded by
chunk size x window whatever the checkpoint size.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")

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
        if self.executor is None:
            for item in items:
                yield fn(item)
            return
        window = window or 2 * self.threads
        pending: deque[Future] = deque()
        try:
            for item in items:
                pending.append(self.executor.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
