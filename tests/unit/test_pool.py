"""The worker's job pool: the last idle thread takes the next job, the backlog is bounded, and
stop finishes what was queued."""

from __future__ import annotations

import queue
import threading
from collections import deque

import pytest
from conftest import wait_for

from zfab.worker.pool import JobPool


def test_one_job_at_a_time_runs_on_one_thread_while_the_others_sleep() -> None:
    threads: list[str] = []
    done = threading.Event()

    def run(_: int) -> None:
        threads.append(threading.current_thread().name)
        done.set()

    pool: JobPool[int] = JobPool(run, size=4, capacity=10)
    pool.start()
    try:
        wait_for(lambda: len(pool._idle) == 4, timeout=5)  # every thread is up and idle
        for i in range(20):
            done.clear()
            pool.put(i)
            assert done.wait(5)
            wait_for(lambda: len(pool._idle) == 4, timeout=5)  # back on the idle stack, on top
        assert len(threads) == 20 and len(set(threads)) == 1
    finally:
        pool.stop()


def test_a_burst_spreads_over_all_threads_and_the_backlog_is_bounded() -> None:
    gate = threading.Event()
    seen: set[str] = set()
    finished: list[int] = []

    def run(i: int) -> None:
        seen.add(threading.current_thread().name)
        gate.wait(10)
        finished.append(i)

    pool: JobPool[int] = JobPool(run, size=3, capacity=3)
    pool.start()
    try:
        wait_for(lambda: len(pool._idle) == 3, timeout=5)
        for i in range(3):
            pool.put(i)
        wait_for(lambda: pool.running == 3, timeout=5)  # three at once: each woke a thread
        assert len(seen) == 3
        for i in range(3, 6):
            pool.put(i)
        assert pool.depth() == 3  # these wait for a thread
        with pytest.raises(queue.Full):
            pool.put(6)
        gate.set()
        wait_for(lambda: len(finished) == 6, timeout=5)
        assert sorted(finished) == list(range(6))
        wait_for(lambda: pool.running == 0, timeout=5)
    finally:
        gate.set()
        pool.stop()


def test_stop_runs_the_backlog_then_ends_every_thread() -> None:
    gate = threading.Event()
    finished: list[int] = []

    def run(i: int) -> None:
        gate.wait(10)
        finished.append(i)

    pool: JobPool[int] = JobPool(run, size=2, capacity=10)
    pool.start()
    wait_for(lambda: len(pool._idle) == 2, timeout=5)
    for i in range(6):
        pool.put(i)
    gate.set()
    pool.stop(timeout=10)
    assert sorted(finished) == list(range(6))
    assert not any(t.is_alive() for t in pool._threads)


def test_a_failing_job_does_not_end_its_thread() -> None:
    ran: list[int] = []

    def run(i: int) -> None:
        if i == 0:
            raise RuntimeError("boom")
        ran.append(i)

    pool: JobPool[int] = JobPool(run, size=1, capacity=10)
    pool.start()
    try:
        pool.put(0)
        pool.put(1)
        wait_for(lambda: ran == [1], timeout=5)
        wait_for(lambda: pool.running == 0, timeout=5)
    finally:
        pool.stop()


def test_a_job_put_while_the_last_thread_goes_idle_still_runs() -> None:
    # No lock between put and a thread going idle: a job can be put after the thread found the
    # backlog empty and before it is on the idle stack, so put finds no thread to wake. The
    # thread must see the job, not sleep on it. The backlog below makes that interleaving
    # happen every time: its first empty pop lets a put in before it raises.
    ran: list[int] = []
    pool: JobPool[int] = JobPool(ran.append, size=1, capacity=10)

    class RacingBacklog(deque[int]):
        armed = True

        def popleft(self) -> int:
            try:
                return super().popleft()
            except IndexError:
                if self.armed:
                    self.armed = False
                    pool.put(7)  # no thread on the idle stack yet: nobody is woken
                raise

    pool._backlog = RacingBacklog()
    pool.start()
    try:
        wait_for(lambda: ran == [7], timeout=5, what="the job put in the gap ran")
    finally:
        pool.stop()
