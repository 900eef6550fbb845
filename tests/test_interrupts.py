"""Ctrl-C, SIGTERM and SIGHUP held back where they must not split a step,
never dropped, and the command told from a program using the API
(interrupts.py, brevis._is_command)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import brevis
from brevis import interrupts

REPO = Path(__file__).resolve().parent.parent

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


@pytest.fixture
def restored():
    """The handlers and hook interrupts.install() sets, put back after the
    test. (install() itself runs in the test: pytest sets its own
    unraisablehook around each test's call.)"""
    handlers = {s: signal.getsignal(s) for s in interrupts.HELD}
    hook = sys.unraisablehook
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    for s, h in handlers.items():
        signal.signal(s, h)
    sys.unraisablehook = hook


def busy(seconds: float) -> None:
    """Lines for a Python handler to run at."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(100))


def test_a_hold_holds_where_the_signal_lands_on_another_thread(restored):
    # The main thread blocks the signal, so the kernel gives it to another
    # thread, whose C handler flags it; Python runs the handler in the main
    # thread at its next line, held or not. The mask alone let it through.
    interrupts.install()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    held = interrupts.hold()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        busy(0.05)
        finished = True
    finally:
        with pytest.raises(KeyboardInterrupt):
            interrupts.release(held)
        stop.set()
        other.join()
    assert finished


def test_holds_nest(restored):
    interrupts.install()
    outer = interrupts.hold()
    try:
        inner = interrupts.hold()
        signal.raise_signal(signal.SIGTERM)
        interrupts.release(inner)  # still held by the outer one
    finally:
        with pytest.raises(KeyboardInterrupt):
            interrupts.release(outer)
    assert interrupts._holds == 0 and interrupts._pending == []


def test_an_interrupt_a_finalizer_drops_comes_again(restored):
    # Python prints and drops an exception raised in a __del__ (or a weak
    # reference's callback), KeyboardInterrupt included: a run went on and
    # finished. The CLI's hook raises it again, from an alarm.
    class Dropping:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside the finalizer

    interrupts.install()
    with pytest.raises(KeyboardInterrupt):
        Dropping()
        busy(5)


def test_uninstall_disarms_the_alarm(restored):
    # At the command's end: an alarm left for the interpreter's shutdown
    # could come after Python has put SIGALRM's default action (exit) back.
    interrupts.install()
    signal.setitimer(signal.ITIMER_REAL, 10)
    interrupts.uninstall()
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert sys.unraisablehook is sys.__unraisablehook__


def test_install_leaves_an_ignored_signal_ignored(restored):
    # A shell's background job ignores Ctrl-C: the command must not take it back.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    interrupts.install()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is interrupts.on_signal
    assert signal.getsignal(signal.SIGHUP) is interrupts.on_signal  # a closed terminal: cleaned up as SIGTERM


CAUGHT = """import sys
from brevis.interrupts import forget_unhandled
try:
    exec("raise KeyboardInterrupt")  # ends code run from a string, as a namedtuple's definition
except KeyboardInterrupt:
    if sys.argv[1:] == ["forget"]:
        forget_unhandled()
    sys.exit(130)
"""


@pytest.mark.parametrize("forget", [False, True])
def test_a_caught_interrupt_leaves_python_m_its_exit_code(tmp_path, forget):
    (tmp_path / "caught.py").write_text(CAUGHT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    r = subprocess.run([sys.executable, "-m", "caught", *(["forget"] if forget else [])], env=env, timeout=60)
    # Without forget_unhandled CPython kills itself with SIGINT at exit.
    assert r.returncode == (130 if forget else -signal.SIGINT)


@pytest.mark.parametrize("argv0,orig,command", [
    ("/usr/bin/brevis", ["python", "/usr/bin/brevis", "compress"], True),
    ("-m", ["python", "-m", "brevis", "compress"], True),
    ("-m", ["python", "-W", "ignore", "-X", "dev", "-m", "brevis"], True),
    ("-m", ["python", "-Im", "brevis"], True),
    ("-m", ["python", "-mbrevis"], True),
    ("-m", ["python", "-m", "brevis.__main__"], True),
    ("-m", ["python", "-m", "mytool", "-m", "brevis"], False),  # another package that imports brevis
    ("-m", ["python", "-m", "brevis_plugin"], False),
    ("/x/pytest", ["python", "/x/pytest"], False),
])
def test_the_command_is_told_from_a_program_using_the_api(monkeypatch, argv0, orig, command):
    monkeypatch.setattr(sys, "argv", [argv0])
    monkeypatch.setattr(sys, "orig_argv", orig)
    assert brevis._is_command() is command


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_child_forked_inside_a_hold_holds_nothing():
    # The pool's forked workers are made inside a hold; their main thread
    # never releases it, so a record kept there would never be raised.
    held = interrupts.hold()
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if interrupts._holds == 0 and interrupts._pending == [] else 1)
    finally:
        interrupts.release(held)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert interrupts._holds == 0
