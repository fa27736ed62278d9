"""Passive keepalive state. The owner loop that holds the socket sends the frames.

All times come from a clock (monotonic by default) so tests can drive it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]

DEFAULT_INTERVAL = 2.5
DEFAULT_MULTIPLIER = 6

# An answering peer (a worker) sends its keepalive at once when the other side's comes and its
# own is due within ANSWER_WINDOW of an interval. Its own clock runs ANSWER_DELAY intervals, a
# little slower than the other side's: the other side's next keepalive, one interval on, then
# arrives before ours falls due and is answered, and a peer that started out of phase (its own
# keepalive half an interval or less before the other side's) drifts into the answer window
# within three intervals instead of staying out of it for good.
ANSWER_WINDOW = 0.5
ANSWER_DELAY = 1.2


@dataclass(slots=True)
class KeepAlive:
    """When to send the next keepalive and when the peer's hold time runs out.

    hold-time expiry = last heard from the peer + interval × multiplier.
    """

    interval: float = DEFAULT_INTERVAL
    multiplier: int = DEFAULT_MULTIPLIER
    clock: Clock = time.monotonic
    answering: bool = False  # answers the peer's keepalives (see answers()), its clock ANSWER_DELAY
    started_at: float = field(init=False)
    next_due: float = field(init=False)
    expires_at: float = field(init=False)
    sent: int = field(default=0, init=False)
    received: int = field(default=0, init=False)
    last_sent: float = field(default=-math.inf, init=False)

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ValueError("keepalive interval must be positive")
        if self.multiplier < 1:
            raise ValueError("keepalive multiplier must be at least 1")
        self.reset()

    @property
    def hold_time(self) -> float:
        return self.interval * self.multiplier

    def reset(self) -> None:
        """Start afresh, as after a (re)connect: counters to zero, timers from now."""
        now = self.clock()
        self.started_at = now
        self.next_due = now + self.interval
        self.expires_at = now + self.hold_time
        self.sent = 0
        self.received = 0
        self.last_sent = -math.inf

    def due(self) -> bool:
        return self.clock() >= self.next_due

    def mark_sent(self, now: float | None = None) -> None:
        self.last_sent = self.clock() if now is None else now
        self.sent += 1
        self.next_due = self.last_sent + self.interval * (ANSWER_DELAY if self.answering else 1.0)

    def due_with_wave(self, now: float) -> bool:
        """Due within ANSWER_WINDOW of an interval: a keepalive pass at `now` sends it early, so
        that peers joined at scattered moments fall into one wave (the broker's tend_workers)."""
        return now + self.interval * ANSWER_WINDOW >= self.next_due

    def sent_within_window(self) -> bool:
        """A keepalive went to the peer within ANSWER_WINDOW of an interval: the peer's keepalive
        now answers it, and needs no answer of its own."""
        return self.clock() - self.last_sent < self.interval * ANSWER_WINDOW

    def answers(self) -> bool:
        """The peer's keepalive just came: send ours with it, not on our own clock?

        Answering aligns the two sides: the broker sends its keepalives in waves, its workers
        answer each wave at once, and an idle broker wakes once for the wave's sends and once or
        twice for the answers, not once per worker per interval for sends and again for receipts.
        A keepalive sent up to half an interval early changes nothing the peer can see (its hold
        time is `multiplier` intervals), and a peer sending faster is answered at most once per
        ANSWER_DELAY - ANSWER_WINDOW (0.7) intervals, so two answering peers cannot ping-pong."""
        return self.answering and self.due_with_wave(self.clock())

    def heard(self, keepalive: bool = True) -> None:
        """Any frame from the peer proves it alive; only keepalive frames are counted."""
        self.expires_at = self.clock() + self.hold_time
        if keepalive:
            self.received += 1

    def heard_ago(self) -> float:
        """Seconds since the peer was last heard (since the reset, if it never was)."""
        return self.clock() - (self.expires_at - self.hold_time)

    def expired(self) -> bool:
        return self.clock() >= self.expires_at

    def is_alive(self) -> bool:
        return not self.expired()

    def hold_time_left(self) -> float:
        return max(0.0, self.expires_at - self.clock())

    def alive_for(self) -> float:
        return max(0.0, self.clock() - self.started_at)

    def next_deadline(self) -> float:
        """The earliest moment the owner must act: send a keepalive or check expiry."""
        return min(self.next_due, self.expires_at)
