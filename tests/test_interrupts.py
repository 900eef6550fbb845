"""Ctrl-C and SIGTERM held back where they must not split a step (interrupts.py)."""

import signal
import threading

import pytest

from brevis import interrupts

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="no signal masks")


def test_an_interrupt_during_a_start_comes_once_the_thread_is_joinable(monkeypatch):
    # The signal arrives while Thread.start waits for the new thread: the
    # moment that once left a thread join() refused (CI, SIGTERM to compress -j 2).
    started = threading._start_new_thread

    def start_then_interrupt(*args):
        ident = started(*args)
        signal.raise_signal(signal.SIGINT)
        return ident

    monkeypatch.setattr(threading, "_start_new_thread", start_then_interrupt)
    ran = threading.Event()
    thread = threading.Thread(target=ran.set)
    with pytest.raises(KeyboardInterrupt):
        interrupts.start_thread(thread)
    thread.join(10)
    assert ran.is_set() and not thread.is_alive()
    assert not interrupts.INTERRUPTS & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_the_thread_runs_with_the_callers_mask():
    # Held while starting, not in the thread: processes it starts would inherit blocked signals.
    masks = []
    thread = threading.Thread(target=lambda: masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
    interrupts.start_thread(thread)
    thread.join()
    assert not interrupts.INTERRUPTS & masks[0]


def test_hold_and_release():
    held = interrupts.hold()
    try:
        assert interrupts.INTERRUPTS <= signal.pthread_sigmask(signal.SIG_BLOCK, [])
        signal.raise_signal(signal.SIGINT)  # pending, not raised
    finally:
        with pytest.raises(KeyboardInterrupt):
            interrupts.release(held)
    assert not interrupts.INTERRUPTS & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_only_the_main_thread_holds():
    # Python's handlers run in the main thread only: another's mask is left alone.
    got = []
    thread = threading.Thread(target=lambda: got.append(interrupts.hold()))
    thread.start()
    thread.join()
    assert got == [None]
    interrupts.release(None)
