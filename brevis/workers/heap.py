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
import os
import sys
import threading

import numpy as np

from ..interrupts import start_thread

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
_madvise = None  # without the extension: madvise(at, n, MADV_POPULATE_WRITE) once looked up (False: none)


def populate_write():
    """madvise(at, n, MADV_POPULATE_WRITE) through ctypes, as a call of
    (at, n) returning 0 or -1; None where the C library has no madvise."""
    try:
        import ctypes

        f = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return lambda at, n: f(at, n, MADV_POPULATE_WRITE)


def _advise_ready() -> bool:
    """Whether populate can run here: on Linux, through the extension
    (_layout.prefault, which ends at the kernel's first refusal) or else
    through ctypes' madvise."""
    if not sys.platform.startswith("linux"):
        return False
    if _layout is not None:
        return True
    global _madvise
    if _madvise is None:
        _madvise = populate_write() or False
    return _madvise is not False


# A huge page's span (2 MiB) whose faults cost the populating thread more
# CPU time than this, twice in a row: huge pages off for all of the
# buffers not faulted yet (_layout.prefault). On this project's virtual
# machines a span costs 0.22 ms where the host has backed the memory and
# about 4.8 ms where it has not (the guest's first touch of it), the same
# bytes in base pages 0.45 ms; the slow stretches come and go within a
# run. While the buffers are written, one span is sampled every SAMPLE_NS:
# 0.22 ms of a core in 5 ms where huge pages come fast.
SLOW_SPAN_NS = 1_000_000
SAMPLE_NS = 5_000_000


class Populating:
    """A thread faulting buffers in (populate): `checked()` once their
    writes begin (the thread then only samples how fast huge pages come,
    or, without the extension, stops), `stop()` once they are done or
    dropped (it waits for the step under way); each may be called again."""

    def __init__(self, buffers: list[np.ndarray]):
        self._phase = np.zeros(1, np.uint8)  # 0 ahead of the writes, 1 sampling (prefault; else stopping), 2 stop
        # Written to by stop(): prefault's sleep between samples ends at once.
        # Without one (no eventfd here, or no descriptor left), stop waits out
        # the sleep under way (SAMPLE_NS at most).
        self._wake = -1
        if hasattr(os, "eventfd") and _layout is not None:
            try:
                self._wake = os.eventfd(0, os.EFD_CLOEXEC)
            except OSError:
                pass
        self._thread = threading.Thread(target=self._run, args=(buffers,), name="brevis-populate", daemon=True)
        try:
            start_thread(self._thread)
        except BaseException:  # interrupted: the thread runs, and its caller will not stop it
            self.stop()
            raise

    def _run(self, buffers: list[np.ndarray]) -> None:
        if _layout is not None:
            _layout.prefault(buffers, self._phase, SLOW_SPAN_NS, SAMPLE_NS, self._wake)
            return
        for b in buffers:
            at, end = b.ctypes.data, b.ctypes.data + len(b)
            at -= at % PAGE
            while at < end and not self._phase[0]:
                n = min(POPULATE_STEP, end - at)
                if _madvise(at, n):
                    return  # not supported (or no memory: the writes will fault)
                at += n

    def checked(self) -> None:
        if self._phase[0] == 0:
            self._phase[0] = 1

    def stop(self) -> None:
        self._phase[0] = 2
        if self._wake >= 0:
            os.eventfd_write(self._wake, 1)
        self._thread.join()
        if self._wake >= 0:
            os.close(self._wake)
            self._wake = -1


class NotPopulating:
    """populate's answer where there is nothing to do."""

    def checked(self) -> None:
        pass

    def stop(self) -> None:
        pass


def populate(buffers: list[np.ndarray]) -> Populating | NotPopulating:
    """Fault the buffers' pages in on a thread of their own (a write that
    changes nothing, or madvise MADV_POPULATE_WRITE: _layout.prefault), in
    their order, each front to back (the order the decoding threads write
    them in), until done or told (Populating). The
    kernel zeroes each page it gives a process, about 0.1 ms a MB in huge
    pages on this project's machine; done while the calling thread checks
    an archive's index, it is not done later by the threads that decode.
    With the extension (_layout.prefault) the run is one call without the
    GIL, a huge page's span at a time, and while the buffers are written it
    samples a span now and then from their end; where huge pages come
    slowly (SLOW_SPAN_NS; numpy asks for them on arrays of 4 MiB or more)
    it turns them off for all that is not faulted yet: the decoding
    threads fault that in base pages. Without the extension, POPULATE_STEP
    at a time until checked, as numpy asked. Where madvise is the way
    (without the extension, or off x86-64), nothing where the kernel does
    not populate (before Linux 5.14, other systems): the pages are faulted
    by their first write."""
    if not buffers or not _advise_ready():
        return NotPopulating()
    return Populating(buffers)
