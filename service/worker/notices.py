"""A job's 201 (started), held a moment and left out when its result goes first.

Under a pipelined load most jobs finish within STARTED_NOTICE_DELAY, and the 201 was two of the
seven messages each job cost (worker to broker, broker to client) for news the 200 brings anyway. A
longer job's client learns it started this much later. Any thread adds a job's notice (the pool
thread that starts it, the store's writer once its row is committed); the owner loop sends the ones
due from its timer.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from ..errors import BackpressureError, ClosedError
from ..transport.base import Transport
from .job import Job

STARTED_NOTICE_DELAY = 0.01


class StartedNotices:
    """201s waiting out STARTED_NOTICE_DELAY, in due order. Bounded by the jobs in flight (each job at
    most once)."""

    def __init__(self, *, loop: Transport, clock: Callable[[], float]) -> None:
        self.loop = loop
        self.clock = clock
        self._due: deque[tuple[float, Job]] = deque()
        self._lock = threading.Lock()
        self._armed = False  # the owner knows of the first one (its timer is set for it), or looks anyway
        self._handed: list[Job] = []  # owner only: jobs handed to run since it last looked at its timers

    def add(self, job: Job) -> None:
        """Any thread: the job started; its 201 goes after the delay unless the job is over by then."""
        if job.state.final:
            return  # its result went first: a 201 now would say less than the client knows
        with self._lock:
            self._due.append((self.clock() + STARTED_NOTICE_DELAY, job))
            wake = not self._armed
            self._armed = True
        if wake:
            # The owner may be asleep until its next keepalive: a queued call makes it look at its timers.
            try:
                self.loop.submit(_nothing, timeout=0)
            except (BackpressureError, ClosedError):
                pass  # the owner is busy (it looks at its timers between batches) or stopping

    def handed(self, jobs: list[Job]) -> None:
        """Owner, before it hands `jobs` to run: its next look at its timers decides whether it looks again
        one delay on (a 201 is due one delay after its job starts at the soonest), so the thread that starts
        one of them need not wake it. A sequential echo's owner was woken mid-job, once a job, only to arm
        that timer, and took the GIL from the job's thread while at it."""
        self._handed = jobs
        with self._lock:
            self._armed = True

    def due(self, now: float) -> tuple[list[Job], float | None]:
        """Owner: the jobs whose 201 is due (those that ended meanwhile get none), and when the next one is due."""
        jobs: list[Job] = []
        with self._lock:
            q = self._due
            # Jobs that ended leave from the front whether due or not: the next deadline is that of a job
            # still running. Sequential short jobs each left a notice due one delay after its start, so the
            # owner woke once a job, in the middle of the next one, only to drop it (32 µs of a 0.6 ms p50).
            while q and (q[0][0] <= now or q[0][1].state.final):
                job = q.popleft()[1]
                if not job.state.final:
                    jobs.append(job)
            nxt = q[0][0] if q else None
            if self._handed:
                # Jobs handed since the last look and not started yet: a look one delay on finds those
                # started by then. One that starts after that look wakes the owner (`add`).
                if nxt is None and any(j.ack and not j.started for j in self._handed):
                    nxt = now + STARTED_NOTICE_DELAY
                self._handed = []
            self._armed = nxt is not None
        return jobs, nxt

    def waiting(self) -> int:
        return len(self._due)


def _nothing() -> None:
    pass
