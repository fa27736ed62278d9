"""Per task: jobs by outcome, run time, and the wait from the broker's admission to the start."""

from __future__ import annotations

from typing import Any

from ..core import protocol as nfp
from ..core.histogram import Histogram
from ..core.payloads import Outcome

# Seconds: task run times and waits from admission to start (tasks run from milliseconds to hours).
TASK_BUCKETS = (0.001, 0.005, 0.025, 0.1, 0.25, 1, 2.5, 10, 30, 60, 300, 1800)
OUTCOMES = ("completed", "failed", "cancelled", "expired", "rejected")


class TaskStats:
    """One task's figures. Made for every declared task up front, so each series exists from the start with 0."""

    def __init__(self) -> None:
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.run = Histogram(TASK_BUCKETS)
        self.wait = Histogram(TASK_BUCKETS)


def outcome_label(code: bytes, entry: dict[str, Any]) -> str:
    """The task metrics' outcome label of a result entry: a closed set."""
    if code == nfp.ST_BAD_REQUEST:
        return "rejected"
    status = entry.get("status")
    if status == Outcome.CANCELLED:
        return "cancelled"
    if status == Outcome.TIMEOUT:
        return "expired"
    return "failed" if entry.get("failed") else "completed"
