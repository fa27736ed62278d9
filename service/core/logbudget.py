"""How often one kind of log line may be written: a burst, then a steady rate, and a count of the rest.

A storm of the same failure (a task raising on every job, a peer sending bad frames) must not
flood the log or cost the process its time, yet the first lines, and a steady trickle after them,
are what an operator needs. A line held back is counted, and the next line let through says how
many were (`held`), so nothing is silently lost. Pure: the clock is injected, and a lock makes one
budget safe to share between threads (a worker's pool threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LogBudget:
    """At most `burst` lines at once, refilled at `per_second`; `take()` says whether to log this one."""

    def __init__(
        self, *, burst: int = 10, per_second: float = 0.2, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if burst < 1 or per_second <= 0:
            raise ValueError("a log budget needs burst >= 1 and per_second > 0")
        self.burst = burst
        self.per_second = per_second
        self.clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._held = 0
        self.held_total = 0  # lines held back since the start
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """None: hold this line back (counted). Otherwise log it, and the number returned is how many
        lines were held back since the last one logged (to say so in this one)."""
        with self._lock:
            now = self.clock()
            self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._at) * self.per_second)
            self._at = now
            if self._tokens < 1.0:
                self._held += 1
                self.held_total += 1
                return None
            self._tokens -= 1.0
            held, self._held = self._held, 0
            return held


def clip(text: str, limit: int) -> str:
    """`text` cut to about `limit` characters by taking out its middle: a traceback's first line and
    its last lines (the exception and where it was raised) stay."""
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = limit - head
    return f"{text[:head]}\n  ... {len(text) - limit} characters left out ...\n{text[-tail:]}"
