"""The API's PostgreSQL schema: versioned migrations, run on start under an advisory lock.

Each entry of MIGRATIONS turns version n-1 into n; `schema_version` holds one row per applied
version. A start takes a transaction-level advisory lock first, so two replicas starting together
never both migrate: the second waits for the first's commit, then finds nothing left to do.
PostgreSQL's DDL is transactional, so a migration that fails leaves the database as it was.
A database at a version newer than this code knows is refused, not touched: an older replica must
not write rows a newer schema reads differently.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

# pg_advisory_xact_lock key: any constant the API's database uses for nothing else ("zfab-mig" in ASCII).
MIGRATION_LOCK = 0x7A6661622D6D6967

# (description, statements). Columns mirror the SQLite job table (api/store/sqlite.py) where they share a meaning.
MIGRATIONS: list[tuple[str, list[str]]] = [
    (
        "jobs, schedules and the job -> schedule mapping",
        [
            """CREATE TABLE jobs (
                uuid text PRIMARY KEY,
                seq bigserial NOT NULL,
                broker text NOT NULL,
                service text NOT NULL,
                task text NOT NULL,
                target text NOT NULL,
                state text NOT NULL,
                workers text NOT NULL,
                fingerprint text NOT NULL,
                timeout double precision NOT NULL,
                submitted_at double precision NOT NULL,
                completed_at double precision,
                job text NOT NULL,
                request text,
                bytes bigint NOT NULL DEFAULT 0,
                updated_at timestamptz NOT NULL DEFAULT now()
            )""",
            # seq: arrival order (listing cursors, pruning the oldest); kept on update like SQLite's rowid.
            "CREATE UNIQUE INDEX jobs_by_seq ON jobs (seq)",
            "CREATE INDEX jobs_by_broker ON jobs (broker, seq)",
            """CREATE TABLE schedules (
                id text PRIMARY KEY,
                name text,
                job text NOT NULL,
                every double precision,
                cron text,
                paused boolean NOT NULL,
                created_at double precision NOT NULL,
                next_run_at double precision,
                last_run_at double precision,
                runs integer NOT NULL,
                failures integer NOT NULL,
                last_error text
            )""",
            """CREATE TABLE schedule_jobs (
                job_uuid text PRIMARY KEY,
                schedule_id text NOT NULL,
                fired_at double precision NOT NULL,
                seq bigserial NOT NULL
            )""",
            "CREATE INDEX schedule_jobs_by_schedule ON schedule_jobs (schedule_id, fired_at)",
            "CREATE INDEX schedule_jobs_by_seq ON schedule_jobs (seq)",
        ],
    ),
    (
        "replicas: job owners, heartbeats, events handed between replicas, commands to a job's owner",
        [
            # The replica whose fabric client holds the job's future: it alone can cancel it or answer its input.
            "ALTER TABLE jobs ADD COLUMN owner text NOT NULL DEFAULT ''",
            "CREATE INDEX jobs_unfinished ON jobs (owner) WHERE state IN ('queued', 'running', 'waiting')",
            """CREATE TABLE api_replicas (
                id text PRIMARY KEY,
                host text NOT NULL,
                pid integer NOT NULL,
                started_at timestamptz NOT NULL DEFAULT now(),
                seen_at timestamptz NOT NULL DEFAULT now()
            )""",
            """CREATE TABLE job_events (
                job_uuid text NOT NULL,
                seq integer NOT NULL,
                event text NOT NULL,
                bytes integer NOT NULL,
                PRIMARY KEY (job_uuid, seq)
            )""",
            """CREATE TABLE job_commands (
                id bigserial PRIMARY KEY,
                replica text NOT NULL,
                sender text NOT NULL,
                job_uuid text NOT NULL,
                op text NOT NULL,
                body text NOT NULL,
                created_at timestamptz NOT NULL DEFAULT now(),
                status integer,
                answer text
            )""",
        ],
    ),
    (
        "the audit log (api/store/audit.py)",
        [
            """CREATE TABLE audit (
                id bigserial PRIMARY KEY,
                at double precision NOT NULL,
                actor text NOT NULL,
                role text NOT NULL,
                action text NOT NULL,
                target text NOT NULL,
                peer text NOT NULL,
                status integer NOT NULL
            )""",
            "CREATE INDEX audit_at ON audit (at)",
        ],
    ),
    (
        "who submitted each job; each broker audit entry once (docs/roles.md)",
        [
            "ALTER TABLE jobs ADD COLUMN submitter text NOT NULL DEFAULT ''",
            # Every replica takes the broker's entries (api/http/brokeraudit.py); their peer names them.
            "CREATE UNIQUE INDEX audit_broker_once ON audit (peer) WHERE peer LIKE 'broker:%'",
        ],
    ),
]
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer zfab: this one must not use it."""


async def migrate(conn: Any, target: int = SCHEMA_VERSION) -> tuple[int, int]:
    """Bring the database to `target` (an open psycopg AsyncConnection, autocommit off). (found, now)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_version (
                version integer PRIMARY KEY,
                description text NOT NULL,
                applied_at timestamptz NOT NULL DEFAULT now()
            )"""
        )
        cur = await conn.execute("SELECT coalesce(max(version), 0) FROM schema_version")
        row = await cur.fetchone()
        found = int(row[0]) if row else 0
        if found > len(MIGRATIONS):
            raise SchemaTooNew(
                f"the API database is at schema v{found}, and this zfab knows up to v{len(MIGRATIONS)}: "
                "upgrade zfab (a newer replica migrated it)"
            )
        for version in range(found + 1, target + 1):
            description, statements = MIGRATIONS[version - 1]
            for sql in statements:
                await conn.execute(sql)
            await conn.execute(
                "INSERT INTO schema_version (version, description) VALUES (%s, %s)", (version, description)
            )
            log.info("api database: migrated to schema v%d (%s)", version, description)
    return found, max(found, target)
