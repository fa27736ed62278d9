"""What the job layer asks of the other API replicas: the interface, not the replicas themselves.

With PostgreSQL several API replicas share one job table; a job one of them submitted is *remote*
to the others, who read its row, wait on its owner's notifications and forward commands to it.
The job layer (api/jobs/operations.py) and the routes reach all that through this protocol only;
api/replicas/cluster.py implements it, so imports run from replicas to jobs and never back.
Without a shared database `ApiState.cluster` is None and every job is local.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from ..models import Job, JobRequest
from .filters import JobFilter
from .record import JobRecord

Row = tuple[int, JobRecord, str | None]  # (arrival sequence, the job, the schedule that fired it)


class Cluster(Protocol):
    @property
    def ok(self) -> bool:
        """The shared database answers: a job submitted now can be recorded for the others."""

    async def place(self, rec: JobRecord) -> JobRecord:
        """A job read from the database: ours (held again), remote (its owner lives), or adopted."""

    async def read(self, uuid: str) -> JobRecord | None:
        """The job's row as the database holds it now (ProblemError 503 when it does not answer)."""

    async def wait_remote(self, rec: JobRecord, bound: float) -> JobRecord:
        """Wait up to `bound` s for another replica's job to finish; the record as it then stands."""

    async def forward(self, rec: JobRecord, op: str, body: dict[str, Any]) -> Job:
        """Run `op` (cancel, input) on the replica that owns the job; its answer or its problem."""

    def events(self, rec: JobRecord, after: int) -> AsyncIterator[tuple[int, dict[str, Any]] | None]:
        """Another replica's job's events after `after` as its owner writes them (None: a ping is due)."""

    async def claim_key(self, uuid: str, fp: str, req: JobRequest) -> tuple[JobRecord | None, bool]:
        """Claim an Idempotency-Key's job row: (None, True) when this replica won it, else the job."""

    async def take_refused(self, rec: JobRecord) -> tuple[JobRecord, bool]:
        """Take over a refused job's key for a retry: (the job, whether this request starts it again)."""

    async def release(self, uuid: str) -> None:
        """Give back a claimed key whose job never started."""

    async def settled(self, rec: JobRecord, *, started: bool = False) -> None:
        """Wait (bounded) until the job's row is committed, so any replica asked next answers the same."""

    async def page(self, before: int | None, limit: int, flt: JobFilter) -> tuple[list[Row], int]:
        """GET /jobs across every replica: newest first by arrival, and how many jobs there are."""
