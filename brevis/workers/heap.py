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

MMAP_THRESHOLD = 32 << 20  # the most glibc accepts; a chunk decodes to at most 64 MiB
TRIM_THRESHOLD = 128 << 20
_malloc_tuned = False


def keep_freed_memory() -> None:
    """Tell glibc's malloc to keep freed buffers (once per process; no-op elsewhere)."""
    global _malloc_tuned
    if _malloc_tuned or not sys.platform.startswith("linux"):
        return
    _malloc_tuned = True
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        pass


PAGE = mmap.PAGESIZE
HUGE_PAGE = 2 << 20  # x86-64's and arm64's (4 KiB pages) transparent huge page
MADV_HUGEPAGE = 14  # Linux's
MADV_POPULATE_WRITE = 23  # Linux's, from 5.14: fault pages in, writable, as a write would
POPULATE_STEP = 8 << 20  # bytes a call populates before looking whether to stop
NUMPY_ADVISES = 4 << 20  # numpy advises its arrays of this many bytes or more for huge pages
_madvise = None  # libc's madvise, once looked up (False: none)


def output_buffers(sizes: list[int]) -> list[np.ndarray]:
    """One writable uint8 array per size, for decoded files held in memory.

    np.empty's, but on Linux the files under NUMPY_ADVISES (numpy advises
    larger arrays for transparent huge pages itself), where they add up to
    a huge page or more, share one buffer, from a huge page's boundary on,
    advised for huge pages: writing them takes a page fault per 2 MiB, not
    per 4 KiB. Measured on this project's machine, a fresh process writing
    5.8 MB into three arrays: 907 faults, 1.75 ms -> 4 faults, 0.76 ms;
    unpacking silero (three files of 1.2-2.3 MB), median of 15: 6.96 ->
    6.15 ms. One file of 17 MB (resemblyzer) gained nothing over numpy's
    advice (16.64 -> 17.05 ms, median of 21), so large files keep it. The
    shared buffer is malloc's, as np.empty's are: a process decoding again
    reuses it once freed (keep_freed_memory); it is freed once every array
    from it is gone. Without huge pages, pages are faulted as before."""
    small = [k for k, n in enumerate(sizes) if n < NUMPY_ADVISES]
    total = sum(sizes[k] for k in small)
    if total < HUGE_PAGE or not _advise_ready():
        return [np.empty(n, np.uint8) for n in sizes]
    out = [None if n < NUMPY_ADVISES else np.empty(n, np.uint8) for n in sizes]
    length = -(-total // HUGE_PAGE) * HUGE_PAGE
    whole = np.empty(length + HUGE_PAGE, np.uint8)  # untouched, it costs address space only
    start = -whole.ctypes.data % HUGE_PAGE
    _madvise(whole.ctypes.data + start, length, MADV_HUGEPAGE)  # a refusal (no huge pages) changes nothing
    at = start
    for k in small:
        out[k] = whole[at:at + sizes[k]]
        at += sizes[k]
    return out


def _advise_ready() -> bool:
    global _madvise
    if _madvise is None:
        _madvise = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                f = ctypes.CDLL(None).madvise
                f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
                _madvise = f
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
                if _madvise(at, n, MADV_POPULATE_WRITE):
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
