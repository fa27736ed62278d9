"""What GET /jobs filters on, in one place: the local job table tests each record against it, and
the shared (PostgreSQL) store turns it into its WHERE clause."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, LiteralString

from ..models import Job, JobState

if TYPE_CHECKING:
    from .record import JobRecord


def aware(when: datetime) -> datetime:
    """A time without a zone is read as UTC."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class JobFilter:
    states: frozenset[JobState] | None = None
    service: str | None = None
    task: str | None = None
    worker: str | None = None  # jobs a worker of this name ran
    since: datetime | None = None  # submitted at or after
    until: datetime | None = None  # submitted before
    schedule: str | None = None  # jobs this schedule fired
    dead: bool | None = None  # dead letters only (True), or none of them (False)

    def matches(self, view: Job, rec: JobRecord) -> bool:
        """Every field but `schedule`, which the caller resolves through the scheduler or the store."""
        if self.states is not None and view.state not in self.states:
            return False
        if self.service is not None and view.service != self.service:
            return False
        if self.task is not None and view.task != self.task:
            return False
        if self.worker is not None and self.worker not in rec.dispatched():
            return False
        if self.since is not None and view.submitted_at < aware(self.since):
            return False
        if self.dead is not None and view.dead != self.dead:
            return False
        return self.until is None or view.submitted_at < aware(self.until)

    def sql(self, params: dict[str, Any]) -> list[LiteralString]:
        """Conditions on `jobs j` (and `schedule_jobs s`), their values added to `params`."""
        fields: list[tuple[LiteralString, str, Any]] = [
            ("j.state = ANY(%(states)s)", "states", [s.value for s in self.states] if self.states else None),
            ("j.service = %(service)s", "service", self.service),
            ("j.task = %(task)s", "task", self.task),
            ("j.workers::jsonb ? %(worker)s", "worker", self.worker),
            ("j.submitted_at >= %(since)s", "since", aware(self.since).timestamp() if self.since else None),
            ("j.submitted_at < %(until)s", "until", aware(self.until).timestamp() if self.until else None),
            ("s.schedule_id = %(schedule)s", "schedule", self.schedule),
            ("coalesce((j.job::jsonb->>'dead')::boolean, false) = %(dead)s", "dead", self.dead),
        ]
        where: list[LiteralString] = []
        for cond, key, value in fields:
            if value is not None:
                where.append(cond)
                params[key] = value
        return where
