"""ordered_pairs with the calling thread helping: results in order, jobs
taken back from the queue and run by the caller, outcomes at their turn."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from brevis.workers.pool import Pool, ordered_pairs


def test_the_caller_runs_queued_jobs_while_the_oldest_runs():
    """Job 0 waits for job 1 on the pool's only worker: only the caller,
    running job 1 itself, lets it finish."""
    released = threading.Event()
    ran_by: dict[int, int] = {}

    def job(i: int) -> int:
        ran_by[i] = threading.get_ident()
        if i == 0:
            assert released.wait(10), "job 1 never ran"
        if i == 1:
            released.set()
        return i * i

    with ThreadPoolExecutor(1) as executor:
        got = list(ordered_pairs(executor, job, range(6), window=4, helps=True))
    assert got == [(i, i * i) for i in range(6)]
    assert ran_by[1] == threading.get_ident() != ran_by[0]


def test_a_failure_in_a_job_the_caller_ran_comes_at_its_turn():
    gate = threading.Event()

    def job(i: int) -> int:
        if i == 0:
            gate.wait(10)
        if i == 2:
            gate.set()
            raise ValueError("job 2")
        return i

    seen = []
    with ThreadPoolExecutor(1) as executor, pytest.raises(ValueError, match="job 2"):
        for item, result in ordered_pairs(executor, job, range(5), window=4, helps=True):
            seen.append(result)
    assert seen == [0, 1]


def test_ctrl_c_in_a_job_the_caller_runs_is_not_kept_for_later():
    gate = threading.Event()

    def job(i: int) -> int:
        if i == 0:
            gate.wait(10)
        if i == 1:
            gate.set()
            raise KeyboardInterrupt
        return i

    with ThreadPoolExecutor(1) as executor, pytest.raises(KeyboardInterrupt):
        list(ordered_pairs(executor, job, range(4), window=4, helps=True))


def test_a_pool_the_caller_helps_has_a_thread_fewer():
    with Pool(3, caller_helps=True) as pool:
        assert pool.threads == 3 and pool.executor._max_workers == 2
    with Pool(1, caller_helps=True) as pool:
        assert pool.executor is None
