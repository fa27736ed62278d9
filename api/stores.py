"""Opens what ZFAB_API_DB names: the job store, the schedules' store and, on PostgreSQL, the replicas.

The one module that knows every backend: api/http/app.py's lifespan calls `open_stores` and hands
the parts to `ApiState`. PostgreSQL's modules (and psycopg) are imported only when the URL names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .settings import ApiSettings
from .store.audit import AuditStore, PgAudit, SqliteAudit
from .store.base import JobStore, ScheduleBackend, SqliteJobStore, is_postgres_url

if TYPE_CHECKING:
    from .replicas.coordination import Replicas
    from .store.postgres import PgDatabase


@dataclass(slots=True)
class Stores:
    """What ZFAB_API_DB opened: the job store, the scheduler's store (None: the scheduler opens its own
    SQLite file or memory table, as before), and the replicas' coordination (PostgreSQL only)."""

    jobs: JobStore | None = None
    schedules: ScheduleBackend | None = None
    replicas: Replicas | None = None
    database: PgDatabase | None = None
    audit: AuditStore | None = None  # the audit log's table (api/store/audit.py)

    async def close(self) -> None:
        if self.audit is not None:
            await self.audit.close()
        if self.jobs is not None:
            await self.jobs.close()
        if self.database is not None:
            await self.database.close()


async def open_stores(s: ApiSettings) -> Stores:
    """The stores ZFAB_API_DB names (see the module's doc). PostgreSQL: connected and migrated."""
    if not s.api_db:
        return Stores()
    audit_age = s.api_audit_days * 86400
    if not is_postgres_url(s.api_db):
        return Stores(
            jobs=await SqliteJobStore.open(Path(s.api_db), s.job_history),
            audit=SqliteAudit(Path(s.api_db), s.api_audit_count, audit_age),
        )
    # Imported here: psycopg is not needed (nor loaded) by an API on SQLite.
    from .replicas.coordination import Replicas, new_replica_id
    from .store.pgschedules import PgSchedules
    from .store.postgres import PgDatabase, PgJobStore

    replica = new_replica_id()
    db = await PgDatabase.open(s.api_db, f"zfab-api {replica}")
    jobs = PgJobStore(db, s.job_history, s.api_db_bytes, replica)
    return Stores(
        jobs=jobs,
        schedules=PgSchedules(db, s.job_history),
        replicas=Replicas(db, jobs, s.broker, s.api_replica_timeout, replica),
        database=db,
        audit=PgAudit(db, s.api_audit_count, audit_age),
    )
