"""ordered_pairs with the calling thread helping: results in order, jobs
taken back from the queue and run by the caller, outcomes at their turn."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from brevis.workers.pool import Pool, ordered_pairs


def waiting_on(k: int, act):
    """A job function: job 0 waits until job k has run, job k returns
    act(k) (or raises), the others return their number. On a pool of one
    worker busy with job 0, only the calling thread can run job k."""
    ran = threading.Event()

    def job(i: int):
        if i == 0:
            assert ran.wait(10), f"job {k} never ran"
        if i == k:
            ran.set()
            return act(i)
        return i

    return job


def run_all(job, count: int) -> list:
    with ThreadPoolExecutor(1) as executor:
        return [result for _, result in ordered_pairs(executor, job, range(count), window=4, helps=True)]


def test_the_caller_runs_queued_jobs_while_the_oldest_runs():
    caller = threading.get_ident()
    assert run_all(waiting_on(1, lambda i: threading.get_ident() == caller), 6) == [0, True, 2, 3, 4, 5]


def test_a_failure_in_a_job_the_caller_ran_comes_at_its_turn():
    seen = []

    def fail(i):
        raise ValueError(f"job {i}")

    with pytest.raises(ValueError, match="job 2"):
        with ThreadPoolExecutor(1) as executor:
            for _, result in ordered_pairs(executor, waiting_on(2, fail), range(5), window=4, helps=True):
                seen.append(result)
    assert seen == [0, 1]


def test_ctrl_c_in_a_job_the_caller_runs_is_not_kept_for_later():
    def interrupt(i):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_all(waiting_on(1, interrupt), 4)


def test_a_pool_the_caller_helps_has_a_thread_fewer():
    with Pool(3, caller_helps=True) as pool:
        assert pool.threads == 3 and pool.executor._max_workers == 2
    with Pool(1, caller_helps=True) as pool:
        assert pool.executor is None
