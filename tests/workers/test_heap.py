"""Buffers for decoded files (workers/heap.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from brevis.workers import heap


@pytest.mark.parametrize("sizes", [[], [0], [100, 200], [1000, 5 << 20, 3 << 20, 0, 100], [3 << 20] * 3,
                                   [(2 << 20) - 1, 1]])
def test_output_buffers_are_separate_writable_arrays_of_each_size(sizes):
    bufs = heap.output_buffers(sizes)
    assert [len(b) for b in bufs] == sizes
    for k, b in enumerate(bufs):
        assert b.dtype == np.uint8 and b.flags.writeable and b.flags.c_contiguous
        b[:] = k + 1
    for k, b in enumerate(bufs):  # none overlaps another
        assert np.all(b == k + 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages are advised on Linux only")
def test_small_files_share_a_buffer_from_a_huge_page_boundary():
    sizes = [3 << 20, 1 << 20, 5 << 20]  # two under numpy's own advice, 4 MiB together
    bufs = heap.output_buffers(sizes)
    assert heap._advise_ready()
    shared = bufs[0].base
    assert shared is not None and bufs[1].base is shared and bufs[2].base is not shared
    assert bufs[0].ctypes.data % heap.HUGE_PAGE == 0
    assert bufs[1].ctypes.data == bufs[0].ctypes.data + sizes[0]


def test_populate_faults_buffers_in_and_stops():
    bufs = heap.output_buffers([3 << 20, 100, 9 << 20])
    stop = heap.populate(bufs)
    stop()
    stop()  # twice: nothing more
    for k, b in enumerate(bufs):  # still plain writable memory, zeros or not
        b[:] = k
        assert np.all(b == k)
    assert heap.populate([])() is None
    assert not [t for t in __import__("threading").enumerate() if t.name == "brevis-populate"]
