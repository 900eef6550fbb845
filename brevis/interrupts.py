"""Ctrl-C, SIGTERM and SIGHUP held back over the few steps they must not split.

The CLI turns each into KeyboardInterrupt (`install`), raised in the main
thread at whatever line it is running. Where a step and its cleanup must
not be separated (a temporary made and handed to its owner, a thread
started and recorded for its join), the signals are held back around the
step and raised, if one came, once it is whole.

SIGHUP (the terminal closed, its session ended) as SIGTERM: temporaries
removed on the way out, where its default action left them for the next
run's cleanup.

Held back twice over: the main thread's mask blocks the signals, and the
CLI's handler only records one that comes while a hold is on. The mask
alone is not enough: the kernel gives a signal the main thread blocks to
any other thread (a worker, a zstd or BLAS thread), whose C handler flags
it for the main thread, which runs the Python handler at its next line,
held or not.

A KeyboardInterrupt raised while Python runs a finalizer (a __del__, a
weak reference's callback: importlib drops its module locks so) is
printed and dropped, and the run goes on as if no signal had come (stop
71's CI: a run Ctrl-C'd 50 ms after its start exited 0; here such a run
wrote its archive). The CLI's hook for such exceptions raises it again a
millisecond later, from an alarm, outside the finalizer.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

INTERRUPTS = frozenset({signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])})
# What a hold blocks: those, and the alarm that raises again one a finalizer dropped.
_AGAIN = getattr(signal, "SIGALRM", None)
HELD = INTERRUPTS | ({_AGAIN} if _AGAIN is not None else set())

_holds = 0  # holds now on in the main thread (they nest)
_pending: list[int] = []  # signals that came meanwhile, for the last release


def _fresh_in_child() -> None:
    # A process forked inside a hold (the pool's forked workers are) holds
    # nothing: its main thread is the one that forked, and never releases.
    global _holds
    _holds = 0
    _pending.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_in_child)


def on_signal(signum: int, frame) -> None:
    """The CLI's handler of SIGINT, SIGTERM and SIGHUP (and of the alarm that
    repeats a dropped one): KeyboardInterrupt, or while a hold is on, a
    record for its release."""
    if _holds:
        _pending.append(signum)
        return
    _pending.clear()
    raise KeyboardInterrupt


def _raise_dropped(unraisable) -> None:
    """sys.unraisablehook of the CLI: a KeyboardInterrupt a finalizer
    dropped comes again from an alarm, in the code the run goes on with;
    anything else is printed as Python prints it."""
    if issubclass(unraisable.exc_type, KeyboardInterrupt) and _AGAIN is not None:
        signal.setitimer(signal.ITIMER_REAL, 0.001)  # not raise_signal: that would raise it here, dropped again
        return
    sys.__unraisablehook__(unraisable)


def forget_unhandled() -> None:
    """Before exiting 130 for a caught KeyboardInterrupt: CPython records one
    that ended code run from a string (exec, eval: namedtuple and dataclass
    definitions, which the imports run) as unhandled, caught later or not,
    and `python -m brevis` then dies by SIGINT in place of its exit code
    (main.c, Py_RunMain). Running a string clears the record."""
    exec("")


def install() -> None:
    """Make SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread,
    held back by `hold`, never dropped by a finalizer. For the command only:
    a program using the API keeps its own handling. A signal the parent
    ignores stays ignored (a shell's background job ignores Ctrl-C,
    nohup SIGHUP)."""
    for sig in HELD:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, on_signal)
    sys.unraisablehook = _raise_dropped


def uninstall() -> None:
    """The command's end: a dropped interrupt is no longer raised again.
    An alarm armed in the interpreter's shutdown could come once Python has
    put SIGALRM's default action back, and end the process by it."""
    if _AGAIN is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
    sys.unraisablehook = sys.__unraisablehook__


def hold() -> set[signal.Signals] | None:
    """Hold the INTERRUPTS back in the main thread (the only one Python's
    handlers run in); the previous mask for `release`, or None elsewhere."""
    global _holds
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        return None
    _holds += 1  # first: from here on_signal records, wherever the signal lands
    try:
        return signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    except BaseException:  # raised by a handler other than on_signal
        _holds -= 1
        raise


def release(held: set[signal.Signals] | None) -> None:
    """Undo `hold`: a signal that came meanwhile is raised here (by the
    last release, where holds nest)."""
    global _holds
    if held is None:
        return
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a signal the mask kept back is handled here
    finally:
        _holds -= 1
    if not _holds and _pending:
        _pending.clear()
        raise KeyboardInterrupt


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
