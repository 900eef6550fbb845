"""Keeping freed buffers in the process's heap while chunks are coded.

glibc's malloc hands buffers above its (adaptive) mmap threshold back to
the kernel when they are freed, and trims the top of its heap once more
than twice that threshold is free, so the megabyte-sized temporaries of
every chunk were faulted in afresh: 9,700 page faults in decompressing
deepfilternet3 (8.6 MB), at about 5 us each on this project's machine,
and the numpy operators of one 1 MiB BF16 chunk of astra took 0.9 to 3.3
ms depending on the heap's state, 0.9 ms with freed memory kept.
Keeping freed memory for reuse removes most of those faults; peak memory
is the same, the process returns that memory later or at exit.
"""

from __future__ import annotations

import mmap
import sys
import threading
from typing import Callable

import numpy as np

try:
    from ..native import _layout
except ImportError:  # not built: ctypes
    _layout = None

MMAP_THRESHOLD = 32 << 20  # the most glibc accepts; a chunk decodes to at most 64 MiB
TRIM_THRESHOLD = 128 << 20
_malloc_tuned = False


def keep_freed_memory() -> None:
    """Tell glibc's malloc to keep freed buffers (once per process; no-op elsewhere)."""
    global _malloc_tuned
    if _malloc_tuned or not sys.platform.startswith("linux"):
        return
    _malloc_tuned = True
    if _layout is not None:  # 1 us; through ctypes 50 us (dlopen, a lookup)
        _layout.keep_freed(MMAP_THRESHOLD, TRIM_THRESHOLD)
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        pass


PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = 23  # Linux's, from 5.14: fault pages in, writable, as a write would
POPULATE_STEP = 8 << 20  # bytes a call populates before looking whether to stop
_madvise = None  # madvise(at, n, MADV_POPULATE_WRITE) once looked up (False: none)


def _advise_ready() -> bool:
    global _madvise
    if _madvise is None:
        _madvise = False
        if _layout is not None and sys.platform.startswith("linux"):
            _madvise = _layout.populate
        elif sys.platform.startswith("linux"):
            try:
                import ctypes

                f = ctypes.CDLL(None).madvise
                f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
                _madvise = lambda at, n: f(at, n, MADV_POPULATE_WRITE)  # noqa: E731
            except (OSError, AttributeError):
                pass
    return _madvise is not False


def populate(buffers: list[np.ndarray]) -> Callable[[], None]:
    """Fault the buffers' pages in on a thread of their own (madvise
    MADV_POPULATE_WRITE, the largest buffer first, POPULATE_STEP at a time,
    each step without the GIL) until done or told to stop: the returned
    function stops it and waits for the step under way. The kernel zeroes
    each page it gives a process, about 0.35 ms a MB on this project's
    machine; done while the calling thread checks an archive's index, it
    is not done later by the threads that decode. A step's end waits for
    the GIL, which the checks hold: about one step runs before they end.
    Nothing where the kernel does not populate (before Linux 5.14, other
    systems): the pages are faulted by their first write, as before."""
    if not buffers or not _advise_ready():
        return _nothing
    stop = threading.Event()

    def run() -> None:
        for b in sorted(buffers, key=len, reverse=True):
            at, end = b.ctypes.data, b.ctypes.data + len(b)
            at -= at % PAGE
            while at < end and not stop.is_set():
                n = min(POPULATE_STEP, end - at)
                if _madvise(at, n):
                    return  # not supported (or no memory: the writes will fault)
                at += n

    worker = threading.Thread(target=run, name="brevis-populate", daemon=True)
    worker.start()

    def halt() -> None:
        stop.set()
        worker.join()

    return halt


def _nothing() -> None:
    pass
