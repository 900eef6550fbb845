"""The worker processes themselves (a ProcessPoolExecutor that starts them
all at once, and what runs in each as it starts). Loaded only where
processes start (processes.open_workers): multiprocessing comes with it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from .. import interrupts
from .heap import keep_freed_memory
from .processes import WATCH_THREAD, process_context


# ------------------------------------------------------------ in the workers
def worker_init(parent: int, ignore_interrupts: bool = True) -> None:
    """Initializer of worker processes (children of `parent`): Ctrl-C is
    the main process's to handle (unless ignore_interrupts is False), and a
    worker never outlives it."""
    if ignore_interrupts:  # (a closed terminal's SIGHUP comes to the whole group too)
        for sig in interrupts.INTERRUPTS - {signal.SIGTERM}:
            signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a forked worker inherits the CLI's handler
    signal.pthread_sigmask(signal.SIG_UNBLOCK, interrupts.HELD)  # and the mask of the fork (WorkerProcesses)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # when the thread that started it ends (WorkerProcesses)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died while this one was starting
        os._exit(1)
    keep_freed_memory()
    threading.Thread(target=_watch, args=(parent,), daemon=True, name=WATCH_THREAD).start()


def _watch(parent: int) -> None:
    """Exit once the parent is gone (reparented: dead, even if not yet reaped)."""
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(1)


def warm_up() -> int:
    """A no-op job: starts a worker before the first job needs it."""
    return os.getpid()


# ------------------------------------------------------------ the pool
class WorkerProcesses(ProcessPoolExecutor):
    """Worker processes, all started at once.

    Forked workers start here, in a few milliseconds. Spawned ones (about
    0.7 s for two, measured) start from a thread of their own, so that the
    start overlaps the caller's work (a scan, the learning), and so that a
    KeyboardInterrupt, which only the main thread receives, cannot land in
    the middle of a process start (a half-started worker would be orphaned
    and print a traceback). That thread lives until shutdown: a worker's
    death signal (PR_SET_PDEATHSIG) is tied to the thread that started it.
    `shared`: whether chunk results can come back through /dev/shm files
    (shared.py)."""

    def __init__(self, workers: int, ignore_interrupts: bool = True):
        from . import shared

        context = process_context()
        shared.remove_stale_batches()
        self.shared = os.path.isdir(shared.SHM_DIR)
        super().__init__(workers, mp_context=context, initializer=worker_init,
                         initargs=(os.getpid(), ignore_interrupts))
        self.closing = threading.Event()
        self.starter: threading.Thread | None = None
        if context.get_start_method() == "fork":
            # Forks every worker now, before any thread of ours exists, and
            # starts the pool's own thread, which shutdown joins: neither
            # may be cut short by an interrupt.
            with interrupts.held():
                self.submit(warm_up)
        else:
            self.starter = threading.Thread(target=self._start, args=(workers,), name="brevis-start-workers",
                                            daemon=True)
            interrupts.start_thread(self.starter)

    def _start(self, workers: int) -> None:
        try:
            for _ in range(workers):  # each no-op job starts one more process
                self.submit(warm_up)
        except RuntimeError:  # shut down before the start finished
            pass
        self.closing.wait()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        try:
            super().shutdown(wait=wait, cancel_futures=cancel_futures)
        finally:
            self.closing.set()
            if self.starter is not None:
                self.starter.join()


