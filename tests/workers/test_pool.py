"""The pool's threads (Threads: concurrent.futures semantics, threads
started without waiting), and ordered_pairs with the calling thread
helping: results in order, jobs taken back from the queue and run by the
caller, outcomes at their turn."""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError, ThreadPoolExecutor, wait

import pytest

from brevis.workers.pool import Pool, Threads, ordered_pairs


def waiting_on(k: int, act):
    """A job function: job 0 waits until job k has run, job k returns
    act(k) (or raises), the others return their number. On a pool of one
    worker busy with job 0, only the calling thread can run job k: `items`
    yields the job numbers once a worker has taken job 0 (threads start
    without the caller waiting for them)."""
    ran, started = threading.Event(), threading.Event()

    def job(i: int):
        if i == 0:
            started.set()
            assert ran.wait(10), f"job {k} never ran"
        if i == k:
            ran.set()
            return act(i)
        return i

    def items(count: int):
        yield 0
        assert started.wait(10), "no worker took job 0"
        yield from range(1, count)

    job.items = items
    return job


def run_all(job, count: int) -> list:
    with Threads(1) as executor:
        return [result for _, result in ordered_pairs(executor, job, job.items(count), window=4, helps=True)]


def test_the_caller_runs_queued_jobs_while_the_oldest_runs():
    caller = threading.get_ident()
    assert run_all(waiting_on(1, lambda i: threading.get_ident() == caller), 6) == [0, True, 2, 3, 4, 5]


def test_a_failure_in_a_job_the_caller_ran_comes_at_its_turn():
    seen = []

    def fail(i):
        raise ValueError(f"job {i}")

    job = waiting_on(2, fail)
    with pytest.raises(ValueError, match="job 2"):
        with Threads(1) as executor:
            for _, result in ordered_pairs(executor, job, job.items(5), window=4, helps=True):
                seen.append(result)
    assert seen == [0, 1]


def test_ctrl_c_in_a_job_the_caller_runs_is_not_kept_for_later():
    def interrupt(i):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_all(waiting_on(1, interrupt), 4)


def test_a_pool_the_caller_helps_has_a_thread_fewer():
    with Pool(3, caller_helps=True) as pool:
        assert pool.threads == 3 and pool.executor.workers == 2
    with Pool(1, caller_helps=True) as pool:
        assert pool.executor is None


@pytest.mark.parametrize("make", [Threads, ThreadPoolExecutor], ids=["Threads", "ThreadPoolExecutor"])
def test_threads_run_calls_as_a_thread_pool_executor_does(make):
    """Results, exceptions and keyword arguments come back through the
    futures, from other threads, as many at once as the pool has threads."""
    both = threading.Barrier(2, timeout=10)  # two calls meet only if two threads run them

    def call(i, scale=1):
        if i < 2:
            both.wait()
        if i == 3:
            raise ValueError("call 3")
        return i * scale, threading.get_ident()

    with make(2) as pool:
        futures = [pool.submit(call, i, scale=10) for i in range(5)]
        wait(futures, timeout=10)
    assert [f.result()[0] for f in futures if f is not futures[3]] == [0, 10, 20, 40]
    with pytest.raises(ValueError, match="call 3"):
        futures[3].result()
    assert threading.get_ident() not in {f.result()[1] for f in futures if f is not futures[3]}


def test_threads_shutdown_cancels_queued_calls_and_waits_for_the_running_one():
    started, go, ran = threading.Event(), threading.Event(), []

    def block():
        started.set()
        assert go.wait(10)
        ran.append("block")

    pool = Threads(1)
    running = pool.submit(block)
    queued = [pool.submit(ran.append, i) for i in range(3)]
    assert started.wait(10)
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(ran.append, 9)
    go.set()
    pool.shutdown(wait=True)  # a second shutdown waits as the first would have
    assert running.done() and ran == ["block"]
    with pytest.raises(CancelledError):
        queued[0].result()


def test_threads_exit_after_shutdown_once_the_queued_calls_ran():
    pool = Threads(2)
    futures = [pool.submit(sum, [i, 1]) for i in range(20)]
    pool.shutdown(wait=True)
    assert [f.result() for f in futures] == list(range(1, 21))
    assert all(not lock.locked() for lock in pool._exited)  # every thread left its loop


def test_threads_are_counted_where_worker_processes_choose_fork():
    """threading.enumerate() does not list a Threads pool's threads:
    live_threads() does, so worker processes are not forked beside them."""
    from brevis.workers.pool import live_threads
    from brevis.workers.processes import process_context

    before = live_threads()
    pool = Threads(2)
    try:
        assert live_threads() == before + 2
        assert process_context().get_start_method() == "spawn"
    finally:
        pool.shutdown(wait=True)
    assert live_threads() == before
