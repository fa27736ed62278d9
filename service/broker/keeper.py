"""The lease keeper: a thread of its own that makes the lease's blocking round trips (lease.py) and hands each
answer to the broker's loop through its thread-safe hand-over (`loop.submit` of a call), so the loop never
waits on the engine and keeps deciding on its own monotonic clock (term.py).

Each answer goes with the moment its request was SENT: a renewal counts from then, never from when the
answer came, so a broker whose answers come late believes its lease shorter than the engine does.
A standby reads the lease as often as the holder renews it and, once the lease is about to expire, right
after its expiry: no busy polling, and the take-over comes within a few milliseconds of the expiry.

A broker whose first read of the lease came after the holder's last renewal (most often one restarted after a
crash, its own predecessor the holder) reads the expiring lease one renewal later than that: a standby that
was reading the lease while the holder lived, already warm, takes over, and a broker that keeps crashing
cannot keep taking the lease back from it. It is client-go's rule (an observer counts a lease's time from when
it saw the record change) on the engines whose clock decides the expiry. Neither process age nor the term's
age is the test: a standby started a moment before the holder died must win, and so must one whose holder
died a moment after taking the lease.
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


def watched(first_read: float, state: LeaseState | None, sent_at: float, duration: float) -> bool:
    """Was this broker reading the lease while its holder lived: did its first read (at `first_read`) come no
    later than the holder's last renewal, the expiry less the duration (on the clock of `sent_at`)?"""
    if state is None or state.held or not state.holder:
        return True
    return first_read <= sent_at + max(0.0, state.expires_in) - duration


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
        self._first_read: float | None = None  # monotonic: sent, the first answer of the engine
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.release_on_stop = False  # set by the term while this broker holds the lease

    def start(self) -> None:
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
            if self._first_read is None and state is not None:
                self._first_read = sent
            newcomer = self._first_read is None or not watched(self._first_read, state, sent, self.duration)
            at = next_round(state, sent, self.renew, newcomer=newcomer)
            self._stop.wait(max(0.0, at - self.clock()))
