"""The scheduler's figures in the API's /metrics (api/schedules/scheduler.py counts what they count)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from zfab import DEAD_ENDS

from ..store.schedules import ScheduleRecord

DELAY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300, 3600)
# How a fired job's end counts against its schedule (zfab_schedule_failures_total{reason}: a closed set).
FAILED_ENDS = tuple(s.value for s in DEAD_ENDS)
FAILURE_REASONS = ("refused", *FAILED_ENDS)


class ScheduleMetrics(Collector):
    """zfab_schedules{state}, zfab_schedule_firings_total{outcome}, zfab_schedule_delay_seconds."""

    def __init__(self, held: Callable[[], Iterable[ScheduleRecord]], registry: CollectorRegistry) -> None:
        self.held = held  # the scheduler's schedules, as they are at each scrape
        self.registry = registry
        self.firings = Counter(
            "zfab_schedule_firings",
            "Schedule firings by outcome (submitted: its job was submitted; refused: the fabric refused it)",
            ["outcome"],
            registry=registry,
        )
        self.delay = Histogram(
            "zfab_schedule_delay_seconds",
            "How late a firing was submitted after its due time",
            buckets=DELAY_BUCKETS,
            registry=registry,
        )
        self.failures = Counter(
            "zfab_schedule_failures",
            "Schedule firings that failed, by reason (refused: the fabric refused the job; failed, expired, "
            "lost: how the job it submitted ended)",
            ["reason"],
            registry=registry,
        )
        for outcome in ("submitted", "refused"):
            self.firings.labels(outcome)
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        g = GaugeMetricFamily("zfab_schedules", "Periodic schedules the API holds, by state", labels=["state"])
        held = list(self.held())
        paused = sum(1 for s in held if s.paused)
        g.add_metric(["active"], len(held) - paused)
        g.add_metric(["paused"], paused)
        yield g

    def close(self) -> None:
        for c in (self, self.firings, self.failures, self.delay):
            self.registry.unregister(c)
