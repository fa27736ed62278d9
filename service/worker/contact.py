"""The worker's contact with its broker: may a job start now, and what to do when the broker has
been silent past its hold time.

The owner loop drives it (its timer, the end of each receive batch); pool threads and the event
loop ask it before they start a job, because after a SIGSTOP or a partition the broker may have
given that job up (told its client "lost", perhaps retried it elsewhere).
"""

from __future__ import annotations

import enum
import threading
import time

from ..core.keepalive import KeepAlive
from .job import Job

PROBE_SECONDS = 0.5  # at most this long (and one keepalive interval) for the broker's answer before a reconnect


class Silence(enum.Enum):
    """What the owner does about a broker silent past the hold time (BrokerContact.silent)."""

    PROBE = "probe"  # send one keepalive and listen
    LISTEN = "listen"  # the probe's answer is still awaited
    RECONNECT = "reconnect"  # no answer: a new connection


class BrokerContact:
    """Set while the worker is in touch with its broker; the keepalive state says when it is not."""

    def __init__(self, keepalive: KeepAlive) -> None:
        self.keepalive = keepalive
        self._touch = threading.Event()
        self._touch.set()
        self.given_up = False  # owner: the broker said it purged us; unstarted jobs are dropped
        self.cut_off = False  # owner: the broker forgot us after a silence past its hold time; the same
        self._probe_until: float | None = None  # owner: the probe's answer awaited until then

    def connected(self) -> None:
        """Owner, on each (re)connect: the keepalive state starts afresh."""
        self.keepalive.reset()
        self._probe_until = None

    def is_set(self) -> bool:
        """In touch, as last seen by the owner or a thread about to start a job."""
        return self._touch.is_set()

    def in_touch_now(self) -> bool:
        """The event loop's check before an `async` job starts (it must not block)."""
        if self.keepalive.expired():
            self._touch.clear()
        return self._touch.is_set()

    def wait_to_start(self, job: Job) -> bool:
        """Pool thread, before it starts a job: wait while the broker has been silent past the hold
        time (its clock jumped after a SIGSTOP, or a partition), bounded by the job's deadline.
        False when the job was dropped meanwhile (the owner claims it)."""
        if not self.in_touch_now():
            deadline = job.deadline
            self._touch.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not job.started

    def heard_again(self) -> None:
        """Owner, after a receive batch: a broker heard within its hold time lets jobs start again."""
        if not self._touch.is_set() and not self.keepalive.expired():
            self._touch.set()
            self._probe_until = None  # a probe, if any, was answered

    def silent(self, now: float) -> tuple[Silence, float]:
        """Owner timer, once the keepalive has expired: what to do now and when to look again.

        The worker does not reconnect at once. The broker's last words may not be read yet: after
        a SIGSTOP our clock is past the hold time at once, while the DISCONNECT (purged) it sent
        meanwhile is still on its way in. Reconnecting would close the socket on it, and the jobs
        it gave up would run here as well. So it asks once (PROBE) and listens for a moment."""
        ka = self.keepalive
        self._touch.clear()
        if self._probe_until is None:
            self._probe_until = now + min(ka.interval, PROBE_SECONDS)
            return Silence.PROBE, self._probe_until
        if now < self._probe_until:
            return Silence.LISTEN, self._probe_until
        self._probe_until = None
        return Silence.RECONNECT, now + ka.interval
