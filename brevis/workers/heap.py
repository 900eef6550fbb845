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

import sys

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
