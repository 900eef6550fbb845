"""Ctrl-C and SIGTERM held back over the few steps they must not split.

The CLI turns both into KeyboardInterrupt, raised in the main thread at
whatever line it is running. Where a step and its cleanup must not be
separated (a temporary made and handed to its owner, a thread started and
recorded for its join), the signals are blocked around the step and
raised, if one came, once it is whole.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

INTERRUPTS = frozenset({signal.SIGINT, signal.SIGTERM})


def hold() -> set[signal.Signals] | None:
    """Block SIGINT and SIGTERM in the main thread (the only one Python's
    handlers run in); the previous mask for `release`, or None elsewhere."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)


def release(held: set[signal.Signals] | None) -> None:
    """Undo `hold`: a signal that came meanwhile is raised here."""
    if held is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextmanager
def held():
    """hold() for the block's length, release() after it (a signal that
    came meanwhile raised there); gives hold()'s previous mask."""
    previous = hold()
    try:
        yield previous
    finally:
        release(previous)


def start_thread(thread: threading.Thread) -> None:
    """thread.start(), which an interrupt cannot leave half done.

    Thread.start waits for the new thread to report that it runs; an
    interrupt raised in that wait leaves a thread that join() refuses
    ("cannot join thread before it is started"), so the cleanup that joins
    it would fail in turn. Held back, the interrupt is raised here once the
    thread is joinable. The thread itself runs with the caller's mask, not
    the held one: processes it starts must not inherit blocked signals."""
    with held() as previous:
        if previous is not None:
            run = thread.run

            def run_unheld() -> None:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
                run()

            thread.run = run_unheld
        thread.start()
