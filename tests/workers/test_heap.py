"""Memory for decoded files (workers/heap.py)."""

from __future__ import annotations

import errno
import sys
import threading

import numpy as np
import pytest

from brevis.workers import heap


def test_populate_faults_buffers_in_and_stops():
    bufs = [np.empty(n, np.uint8) for n in (3 << 20, 100, 9 << 20, 0)]
    stop = heap.populate(bufs)
    stop()
    stop()  # twice: nothing more
    for k, b in enumerate(bufs):  # still plain writable memory, zeros or not
        b[:] = k
        assert np.all(b == k)
    assert heap.populate([])() is None
    assert not [t for t in threading.enumerate() if t.name == "brevis-populate"]


@pytest.mark.parametrize("native", [True, False], ids=["extension", "ctypes"])
def test_both_ways_to_the_c_library(monkeypatch, native):
    """keep_freed_memory and populate through the extension's calls or,
    unbuilt, ctypes: both take effect the same way (a page populated reads
    as written before; malloc's thresholds set once)."""
    if native and heap._layout is None:
        pytest.skip("extension not built")
    if not native:
        monkeypatch.setattr(heap, "_layout", None)
    monkeypatch.setattr(heap, "_madvise", None)
    monkeypatch.setattr(heap, "_malloc_tuned", False)
    heap.keep_freed_memory()
    assert heap._malloc_tuned
    buf = np.full(5 << 20, 7, np.uint8)
    buf[123] = 9
    heap.populate([buf])()
    assert buf[123] == 9 and int(buf.sum()) == 7 * len(buf) + 2
    if sys.platform.startswith("linux"):
        assert heap._advise_ready()
        at = buf.ctypes.data - buf.ctypes.data % heap.PAGE
        assert heap._madvise(at, heap.PAGE) in (0, -1, errno.EINVAL)  # ctypes: -1 on failure; EINVAL: a kernel before 5.14


def test_populate_refuses_nonsense():
    if heap._layout is None:
        pytest.skip("extension not built")
    with pytest.raises(ValueError):
        heap._layout.populate(0, -1)
    assert heap._layout.populate(0, heap.PAGE) != 0  # page 0 is never mapped: an errno, no crash
