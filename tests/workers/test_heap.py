"""Memory for decoded files (workers/heap.py)."""

from __future__ import annotations

import errno
import sys
import threading
import time

import numpy as np
import pytest

from brevis.workers import heap


def test_populate_faults_buffers_in_and_stops():
    bufs = [np.empty(n, np.uint8) for n in (3 << 20, 100, 9 << 20, 0)]
    p = heap.populate(bufs)
    p.checked()
    p.stop()
    p.stop()  # twice: nothing more
    for k, b in enumerate(bufs):  # still plain writable memory, zeros or not
        b[:] = k
        assert np.all(b == k)
    heap.populate([]).checked()
    heap.populate([]).stop()
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
    heap.populate([buf]).stop()
    assert buf[123] == 9 and int(buf.sum()) == 7 * len(buf) + 2
    if sys.platform.startswith("linux"):
        assert heap._advise_ready()
        if not native:  # (the extension populates through _layout.prefault: its tests below)
            at = buf.ctypes.data - buf.ctypes.data % heap.PAGE
            assert heap._madvise(at, heap.PAGE) in (0, -1, errno.EINVAL)  # ctypes: -1 on failure; EINVAL: a kernel before 5.14


def _prefault_or_skip():
    if heap._layout is None or not sys.platform.startswith("linux"):
        pytest.skip("extension not built, or not Linux")
    probe = np.zeros(1 << 16, np.uint8)
    if heap._layout.prefault([probe], np.zeros(1, np.uint8), 10**12, 10**6)[0] == 0:
        pytest.skip("the kernel does not populate (before Linux 5.14)")
    return heap._layout.prefault


def test_prefault_faults_every_buffer_in_and_keeps_bytes():
    prefault = _prefault_or_skip()
    bufs = [np.full(n, k + 1, np.uint8) for k, n in enumerate((5 << 20, 3000, 7 << 20))]
    done, switched = prefault(bufs, np.zeros(1, np.uint8), 10**12, 10**6)
    assert not switched
    assert done >= sum(len(b) for b in bufs)  # from each buffer's first page
    for k, b in enumerate(bufs):
        assert np.all(b == k + 1)


def test_prefault_turns_huge_pages_off_after_two_slow_spans():
    """slow_ns 0: every whole span is slow, so the second ends the call with
    huge pages off for the rest; the memory is still the buffers'."""
    prefault = _prefault_or_skip()
    bufs = [np.full(9 << 20, 5, np.uint8), np.full(6 << 20, 6, np.uint8)]
    done, switched = prefault(bufs, np.zeros(1, np.uint8), 0, 10**6)
    assert switched
    assert 0 < done <= 3 * (2 << 20)  # an unaligned head, then two whole spans
    for k, b in enumerate(bufs):
        assert np.all(b == 5 + k)
        b[:] = 9
        assert np.all(b == 9)


def test_prefault_stops_and_refuses_nonsense():
    prefault = _prefault_or_skip()
    buf = np.zeros(4 << 20, np.uint8)
    assert prefault([buf], np.full(1, 2, np.uint8), 10**12, 10**6) == (0, False)
    with pytest.raises(ValueError):
        prefault([buf], np.zeros(0, np.uint8), 10**12, 10**6)
    with pytest.raises(ValueError):
        prefault([buf], np.zeros(1, np.uint8), 10**12, 0)
    with pytest.raises((TypeError, BufferError)):
        prefault([bytes(10)], np.zeros(1, np.uint8), 10**12, 10**6)  # not writable
    with pytest.raises(TypeError):
        prefault(3, np.zeros(1, np.uint8), 10**12, 10**6)


def test_prefault_samples_from_the_end_once_written():
    """Phase 1 (the buffers being written): a whole span every every_ns,
    from the last buffer's end back to the front, then the call ends; with
    slow_ns 0 the second sample turns huge pages off."""
    prefault = _prefault_or_skip()
    span = 2 << 20
    bufs = [np.full(5 << 20, 1, np.uint8), np.full(9 << 20, 2, np.uint8)]
    first = bufs[0].ctypes.data - bufs[0].ctypes.data % heap.PAGE  # phase 0's front, where it stopped at once
    lows = [first] + [b.ctypes.data for b in bufs[1:]]
    whole = sum((b.ctypes.data + len(b)) // span - -(-low // span) for b, low in zip(bufs, lows))
    assert prefault(bufs, np.ones(1, np.uint8), 10**12, 1000) == (whole * span, False)
    assert prefault(bufs, np.ones(1, np.uint8), 0, 1000) == (2 * span, True)
    for k, b in enumerate(bufs):
        assert np.all(b == k + 1)


def test_stop_wakes_the_sampling_thread(monkeypatch):
    """Between samples the thread sleeps SAMPLE_NS; stop() wakes it at once
    (an eventfd), closes what it opened, and leaves no thread behind."""
    _prefault_or_skip()
    if not hasattr(heap.os, "eventfd"):
        pytest.skip("no eventfd here")
    monkeypatch.setattr(heap, "SAMPLE_NS", 10**11)  # 100 s
    buf = np.zeros(16 << 20, np.uint8)
    p = heap.populate([buf])
    p.checked()
    time.sleep(0.05)
    start = time.monotonic()
    p.stop()
    assert time.monotonic() - start < 5
    assert p._wake == -1
    p.stop()  # again: nothing more
    assert not [t for t in threading.enumerate() if t.name == "brevis-populate"]


def test_populating_without_a_descriptor_left(monkeypatch):
    """No eventfd to be had (EMFILE): populating goes on without one, and
    stop waits out the sleep under way instead of failing the unpack."""
    _prefault_or_skip()
    if not hasattr(heap.os, "eventfd"):
        pytest.skip("no eventfd here")

    def refuse(*a):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(heap.os, "eventfd", refuse)
    monkeypatch.setattr(heap, "SAMPLE_NS", 1_000_000)
    buf = np.full(8 << 20, 3, np.uint8)
    p = heap.populate([buf])
    assert p._wake == -1
    p.checked()
    p.stop()
    assert np.all(buf == 3)
