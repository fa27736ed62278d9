"""The lease keeper: a thread of its own that makes the lease's blocking round trips (lease.py) and hands each
answer to the broker's loop through its thread-safe hand-over (`loop.submit` of a call), so the loop never
waits on the engine and keeps deciding on its own monotonic clock (term.py).

Each answer goes with the moment its request was SENT: a renewal counts from then, never from when the
answer came, so a broker whose answers come late believes its lease shorter than the engine does.
A standby reads the lease as often as the holder renews it and, once the lease is about to expire, right
after its expiry: no busy polling, and the take-over comes within a few milliseconds of the expiry.

A broker that started less than a lease duration ago (most often one restarted after a crash) reads an
expiring lease one renewal later than that: the standby that watched the last holder, already warm, takes
over, and a broker that keeps crashing cannot keep taking the lease back from it. It is client-go's rule (a
newcomer counts a lease's time from when it first saw it) on the engines whose clock decides expiry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..core.keepalive import Clock
from .lease import Lease, LeaseState, LeaseUnavailable

log = logging.getLogger(__name__)

EXPIRY_SLACK = 0.01  # s after the expiry a standby reads it again: the engine's clock decides, not ours

Heard = Callable[[LeaseState | None, float], None]  # (the answer, or None: the engine unreachable; sent at)


def next_round(state: LeaseState | None, sent_at: float, renew: float, *, newcomer: bool = False) -> float:
    """When the next round trip goes (on the clock `sent_at` is on); a `newcomer` never reads another
    holder's lease between its expiry and a renewal after it (the module's docstring says why)."""
    if state is None or state.held or not state.holder:
        return sent_at + renew
    expires = max(0.0, state.expires_in)
    at = sent_at + min(renew, expires + EXPIRY_SLACK)
    if newcomer and at >= sent_at + expires:
        at = sent_at + expires + EXPIRY_SLACK + renew
    return at


class LeaseKeeper:
    """Renews (or watches) the lease every `renew` seconds on its own thread; `heard` gets every answer."""

    def __init__(self, lease: Lease, holder: str, *, duration: float, renew: float, heard: Heard, clock: Clock) -> None:
        self.lease, self.holder, self.duration, self.renew = lease, holder, duration, renew
        self.heard, self.clock = heard, clock
        self.rounds = 0  # round trips made (bench: what an idle standby costs the engine)
        self.last_read: float | None = None  # monotonic: the last answer that came
        self.started_at = 0.0  # monotonic: start(); a newcomer until a duration after it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.release_on_stop = False  # set by the term while this broker holds the lease

    def start(self) -> None:
        self.started_at = self.clock()
        self._thread = threading.Thread(target=self._run, name="zfab-lease-keeper", daemon=True)
        self._thread.start()

    def halt(self) -> None:
        """No more round trips (a deposed broker stops asking: it will not serve again)."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(self.duration + 5.0)
        if self.release_on_stop:
            self.lease.release(self.holder)  # best effort: the standby need not wait out the lease
        self.lease.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = self.clock()
            state: LeaseState | None
            try:
                state = self.lease.acquire_or_renew(self.holder, self.duration)
                self.last_read = self.clock()
            except LeaseUnavailable as exc:
                state = None
                log.warning("lease unavailable: %s", exc)
            except Exception:  # a backend's bug: counted as unavailable, the thread goes on
                state = None
                log.exception("lease round trip failed")
            self.rounds += 1
            if self._stop.is_set():
                return
            self.heard(state, sent)
            newcomer = sent - self.started_at < self.duration
            at = next_round(state, sent, self.renew, newcomer=newcomer)
            self._stop.wait(max(0.0, at - self.clock()))
