"""Retry schedules: how long a failed attempt waits before the next one. Pure arithmetic.

A schedule is exponential: the wait after attempt n failed is `base × factor^(n-1)`, at most
`cap`, then moved by up to ± `jitter` of itself (so workers that failed together do not come
back together), and never past `cap`. The worker that ran the failed attempt computes the wait
(it knows the task's declaration), and the client sends the next attempt with the broker's
`not_before`, so the broker's queue holds it meanwhile.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .schemacheck import is_number

MAX_RETRIES = 100
"""Retries a task may declare (attempts are retries + 1): a job's record keeps every attempt's error."""
MAX_BACKOFF = 7 * 86_400.0
"""Seconds: no wait between attempts is longer (the broker's longest delay)."""
DEFAULT_BASE = 1.0
DEFAULT_CAP = 300.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """An exponential schedule of waits between attempts: `base` seconds after the first failure,
    `factor` times longer after each next one, at most `cap`, ± `jitter` (a fraction) of each.

    `Backoff()` is 1 s, doubling, 300 s at most, ±10 %. Give one to `@task(backoff=...)` or to
    `Client.submit(backoff=...)`; a number there means `Backoff(base=that number)`.

    Args:
        base: seconds to wait after the first failed attempt (0 to 7 days).
        factor: how much longer each next wait is (1 to 100).
        cap: the longest wait, in seconds (from `base` to 7 days).
        jitter: a fraction (0 to below 1) each wait moves by at random, so that workers that failed
            together do not come back together.

    Raises:
        ValueError: a value out of its range, or not a finite number.

    Example:
        ```python
        from zfab import Backoff

        b = Backoff(base=1, factor=2, cap=60, jitter=0)
        print([b.planned(n) for n in (1, 2, 3, 7, 8)])     # [1, 2, 4, 60, 60]
        ```
    """

    base: float = DEFAULT_BASE
    factor: float = 2.0
    cap: float = DEFAULT_CAP
    jitter: float = 0.1

    def __post_init__(self) -> None:
        for name in ("base", "factor", "cap", "jitter"):
            value = getattr(self, name)
            if not is_number(value) or not math.isfinite(value):
                raise ValueError(f"backoff {name} must be a finite number, not {value!r}")
        if not 0 <= self.base <= MAX_BACKOFF:
            raise ValueError(f"backoff base must be 0..{MAX_BACKOFF:g} seconds, not {self.base}")
        if not 1 <= self.factor <= 100:
            raise ValueError(f"backoff factor must be 1..100, not {self.factor}")
        if not self.base <= self.cap <= MAX_BACKOFF:
            raise ValueError(f"backoff cap must be from base ({self.base}) to {MAX_BACKOFF:g} seconds, not {self.cap}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"backoff jitter must be a fraction from 0 to below 1, not {self.jitter}")

    def planned(self, attempt: int) -> float:
        """The declared wait after attempt `attempt` (1 = the first) failed, before jitter."""
        # At most MAX_RETRIES doublings: 100 ** 100 still fits a float, and any cap is reached long before.
        exponent = min(max(0, attempt - 1), MAX_RETRIES)
        return min(self.cap, self.base * self.factor**exponent)

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The wait after attempt `attempt` failed: the planned one, jittered, within 0..cap."""
        planned = self.planned(attempt)
        moved = planned * (1 + self.jitter * (2 * rand() - 1))
        return round(min(self.cap, max(0.0, moved)), 3)

    def as_dict(self) -> dict[str, float]:
        return {"base": self.base, "factor": self.factor, "cap": self.cap, "jitter": self.jitter}


def read_backoff(value: Any) -> Backoff:
    """A backoff as a POST body or a declaration carries it: seconds (the base), or an object of
    Backoff's fields. Raises ValueError naming what is wrong."""
    if isinstance(value, Backoff):
        return value
    if is_number(value):
        return Backoff(base=float(value), cap=max(float(value), DEFAULT_CAP))
    if isinstance(value, dict):
        unknown = set(value) - {"base", "factor", "cap", "jitter"}
        if unknown:
            raise ValueError(f"backoff has no field {sorted(unknown)[0]!r} (base, factor, cap, jitter)")
        fields = {k: float(v) if is_number(v) else v for k, v in value.items()}
        base = fields.get("base", DEFAULT_BASE)
        if "cap" not in fields and is_number(base):
            fields["cap"] = max(float(base), DEFAULT_CAP)
        return Backoff(**fields)
    raise ValueError(f"backoff must be seconds or an object of base, factor, cap, jitter, not {value!r}")
