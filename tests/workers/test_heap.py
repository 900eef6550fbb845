"""Memory for decoded files (workers/heap.py)."""

from __future__ import annotations

import threading

import numpy as np

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
