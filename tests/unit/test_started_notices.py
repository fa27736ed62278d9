"""The worker's held 201s (worker/notices.py): when the thread that starts a job must wake the owner.

A wake-up is a `submit` to the owner loop; the loop here only counts them. The owner looks at its
timers after every receive batch (transport/owner.py), which `due` stands for here.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from zfab.core.states import JobState
from zfab.transport import FakeClock
from zfab.transport.base import Transport
from zfab.worker.job import Job
from zfab.worker.notices import STARTED_NOTICE_DELAY, StartedNotices


class _Owner:
    """The owner loop as the notices see it: what it was handed."""

    def __init__(self) -> None:
        self.wakes = 0

    def submit(self, item: Any, timeout: float | None = None) -> None:
        self.wakes += 1

    def submitted(self) -> int:
        return self.wakes


def _notices(clock: FakeClock) -> tuple[StartedNotices, _Owner]:
    owner = _Owner()
    return StartedNotices(loop=cast(Transport, owner), clock=clock), owner


def _job(uuid: str) -> Job:
    return Job(uuid=uuid, client=b"c1", task="echo", args=[], kwargs={}, timeout=None, push=True, ack=True)


def _start(job: Job, notices: StartedNotices) -> None:
    """What a pool thread does as the job starts (runner._begin)."""
    assert job.claim()
    notices.add(job)


def test_a_job_started_after_its_handing_wakes_no_owner_and_its_201_comes_due() -> None:
    clock = FakeClock()
    notices, loop = _notices(clock)
    # Given a job the owner hands to run, then looks at its timers (as after every batch)
    j = _job("a")
    notices.handed([j])
    _, nxt = notices.due(clock())
    # Then the owner looks again one delay on, whatever starts meanwhile
    assert nxt == pytest.approx(clock() + STARTED_NOTICE_DELAY)
    # When the pool thread starts the job
    clock.advance(0.001)
    _start(j, notices)
    # Then the owner is not woken for it
    assert loop.submitted() == 0
    # and at the promised look the 201 is not due yet, but its own time is set
    clock.advance(STARTED_NOTICE_DELAY - 0.001)
    due, nxt = notices.due(clock())
    assert due == [] and nxt == pytest.approx(clock() + 0.001)
    clock.advance(0.001)
    due, _ = notices.due(clock())
    assert due == [j]


def test_a_job_that_starts_after_the_look_wakes_the_owner() -> None:
    clock = FakeClock()
    notices, loop = _notices(clock)
    j = _job("late")
    notices.handed([j])
    notices.due(clock())
    # The look finds nothing (the job waited behind others) and sets no timer of its own
    clock.advance(STARTED_NOTICE_DELAY)
    assert notices.due(clock()) == ([], None)
    # so the thread that starts it later wakes the owner, which must arm the 201's timer
    _start(j, notices)
    assert loop.submitted() == 1


def test_a_job_over_before_the_owner_looks_leaves_no_timer() -> None:
    clock = FakeClock()
    notices, loop = _notices(clock)
    j = _job("quick")
    notices.handed([j])
    # Started and finished before the owner's look
    _start(j, notices)
    j.state = JobState.COMPLETED
    assert loop.submitted() == 0
    assert notices.due(clock()) == ([], None)
    assert notices.waiting() == 0
