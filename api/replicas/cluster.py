"""The replicas as the job layer sees them: `ReplicaCluster` implements api/jobs/cluster.py's `Cluster`.

A thin face over remote.py (reading, waiting on and forwarding to another replica's job) and
claims.py (Idempotency-Keys and durable answers across replicas), bound to the lifespan's state.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ..errors import database_unavailable
from ..jobs.cluster import Row
from ..jobs.filters import JobFilter
from ..jobs.record import JobRecord
from ..models import Job, JobRequest
from ..state import ApiState
from ..store.postgres import PgJobStore
from . import claims, remote
from .coordination import Replicas


class ReplicaCluster:
    def __init__(self, st: ApiState, replicas: Replicas, store: PgJobStore) -> None:
        self.st = st
        self.replicas = replicas
        self.store = store

    @property
    def ok(self) -> bool:
        return self.replicas.ok

    async def place(self, rec: JobRecord) -> JobRecord:
        return await remote.place(self.st, rec)

    async def read(self, uuid: str) -> JobRecord | None:
        return await remote.read(self.st, uuid)

    async def wait_remote(self, rec: JobRecord, bound: float) -> JobRecord:
        return await remote.wait_remote(self.st, rec, bound)

    async def forward(self, rec: JobRecord, op: str, body: dict[str, Any]) -> Job:
        return await remote.forward(self.st, rec, op, body)

    def events(self, rec: JobRecord, after: int) -> AsyncIterator[tuple[int, dict[str, Any]] | None]:
        return remote.remote_events(self.st, rec, after)

    async def claim_key(self, uuid: str, fp: str, req: JobRequest) -> tuple[JobRecord | None, bool]:
        return await claims.claim_key(self.st, uuid, fp, req)

    async def take_refused(self, rec: JobRecord) -> tuple[JobRecord, bool]:
        return await claims.take_refused(self.st, rec)

    async def release(self, uuid: str) -> None:
        await claims.release(self.st, uuid)

    async def settled(self, rec: JobRecord, *, started: bool = False) -> None:
        await claims.settled(self.st, rec, started=started)

    async def page(self, before: int | None, limit: int, flt: JobFilter) -> tuple[list[Row], int]:
        try:
            return await self.store.page(self.st.settings.broker, before, limit, flt)
        except Exception as exc:
            raise database_unavailable(str(exc)) from None
