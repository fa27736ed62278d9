"""A fixed-bucket histogram kept as plain counts, for state exported through MMI or a collector
(the prometheus_client Histogram lives in one registry; these travel as numbers)."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, the last one is +Inf
    total: float = 0.0
    count: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        with self._lock:  # observed from pool threads too
            self.counts[i] += 1
            self.total += value
            self.count += 1

    def snapshot(self) -> dict[str, object]:
        """Cumulative buckets as Prometheus wants them: {"buckets": [[le, n], ...], "sum", "count"}."""
        with self._lock:
            counts, total, count = list(self.counts), self.total, self.count
        out, running = [], 0
        for le, n in zip([*self.bounds, float("inf")], counts, strict=True):
            running += n
            out.append(["+Inf" if le == float("inf") else le, running])
        return {"buckets": out, "sum": total, "count": count}
