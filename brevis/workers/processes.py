"""Worker processes: whether they pay, how they start, how they end.

Everything that starts worker processes calls `open_workers` (compress,
decompress and verify, the CLI ahead of its progress bar, compress-many's
local process pool), which decides processes or none and returns a
`Workers` context manager that shuts them down. The rules, in one place:

- Processes pay only with two or more of them (`min_workers`), where the
  input is large enough (`total_bytes >= min_bytes`, or `processes=True`),
  never with `processes=False`, and only where they can start at all
  (`can_start_processes`).
- They start by fork where that is safe (Linux, no other thread yet),
  else by spawn, from a thread of their own (`WorkerProcesses`, in
  executor.py: multiprocessing is imported only where processes start,
  about 10 ms that a decompress of a small archive need not pay).
- Workers ignore SIGINT (the main process alone reacts to Ctrl-C and
  shuts the pool down) unless asked otherwise, and never outlive the
  process that started them (a death signal on Linux, and a watch thread).
"""

from __future__ import annotations

import re
import sys
import threading

from .pool import live_threads

WATCH_THREAD = "brevis-parent-watch"


def _foreign_threads() -> int:
    """Threads of this process other than the main one and a worker's own
    watch thread (which only sleeps: forking beside it is safe), those of
    the thread pools (pool.Threads, which threading does not list) included."""
    main = threading.main_thread()
    return sum(1 for t in threading.enumerate() if t is not main and t.name != WATCH_THREAD) + live_threads()


def process_context():
    """fork where it is safe (Linux, and this process has no other thread
    yet): a worker then starts in milliseconds with everything already
    imported, and nothing of the main module is run again. Else spawn: a
    fresh interpreter per worker (about 0.5 s of CPU each to import numpy
    and Brevis, measured). forkserver was measured too: its server outlived
    a SIGKILLed main process by over 30 s here."""
    import multiprocessing

    if sys.platform.startswith("linux") and threading.current_thread() is threading.main_thread() \
            and _foreign_threads() == 0:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


# A main script's guard, compiled where it is looked for (only where workers
# must be spawned): compiled at import, 0.12 ms of every command.
_GUARD = r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:"""


def can_start_processes() -> bool:
    """Whether worker processes can start here: not from a daemonic process
    (a Dask worker, a multiprocessing.Pool worker), and, where they must be
    spawned (see process_context), not where a worker would rerun the main
    script's code: spawn imports the main module in every worker, which is
    safe for `python -m`, the `brevis` command, an interactive session, or
    a script whose work is under `if __name__ == "__main__":`, and for
    nothing else."""
    import multiprocessing

    if multiprocessing.current_process().daemon:
        return False
    if process_context().get_start_method() == "fork":
        return True
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    if path is None:
        return True
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return re.search(_GUARD, f.read(), re.M) is not None
    except OSError:
        return False


class Workers:
    """What open_workers gives: worker processes (`executor`), or None where
    they would not pay. Entered, it gives the executor (or None); left, it
    shuts the processes down, dropping queued jobs (Ctrl-C, errors: the
    jobs running are short)."""

    def __init__(self, executor: "WorkerProcesses | None"):
        self.executor = executor

    def __enter__(self) -> "WorkerProcesses | None":
        return self.executor

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self, wait: bool = True) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=wait, cancel_futures=True)


def wants_processes(threads: int, total_bytes: int = 0, min_bytes: int = 0, processes: bool | None = None,
                    min_workers: int = 2) -> bool:
    """open_workers' decision, without starting anything."""
    if threads < min_workers or processes is False or not (processes or total_bytes >= min_bytes):
        return False
    return can_start_processes()


def open_workers(threads: int, total_bytes: int = 0, min_bytes: int = 0, processes: bool | None = None, *,
                 min_workers: int = 2, ignore_interrupts: bool = True) -> Workers:
    """`threads` worker processes for work on total_bytes, or none.

    None where fewer than `min_workers` are asked for (one process does not
    beat the caller's own thread; 1 for a pool that must exist, as
    compress-many's), where processes=False, where they cannot start here
    (can_start_processes), or where processes is None and total_bytes is
    below `min_bytes` (starting them would cost more than they save).
    Call it before starting any thread of the caller's, so that they can
    start by fork. The caller shuts them down (`with open_workers(...) as
    executor:`); `ignore_interrupts=False` leaves SIGINT to the workers."""
    if not wants_processes(threads, total_bytes, min_bytes, processes, min_workers):
        return Workers(None)
    from .executor import WorkerProcesses

    return Workers(WorkerProcesses(threads, ignore_interrupts))


def ours(executor) -> bool:
    """Whether `executor` is a WorkerProcesses (none exists before
    executor.py is loaded, which this does not load)."""
    module = sys.modules.get(f"{__package__}.executor")
    return module is not None and isinstance(executor, module.WorkerProcesses)


def broken_pool(error: BaseException) -> bool:
    """Whether `error` is concurrent.futures' BrokenProcessPool (none is
    raised before its module is loaded, which this does not load)."""
    module = sys.modules.get("concurrent.futures.process")
    return module is not None and isinstance(error, module.BrokenProcessPool)


def __getattr__(name: str):
    if name == "WorkerProcesses":  # where it lives since executor.py
        from .executor import WorkerProcesses

        return WorkerProcesses
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

