"""The API's store on PostgreSQL: one database shared by every API replica (ZFAB_API_DB=postgresql://...).

psycopg 3's asyncio API over a small connection pool: no call blocks the event loop and no thread
is held per request. The job table has the SQLite table's columns (api/store/sqlite.py) plus `owner` (the
replica whose fabric client holds the job's future), `bytes` (what the row and its events weigh,
for the byte bound) and `seq` (arrival order). A write is one transaction per batch: the jobs'
rows, their new events, and one NOTIFY on `zfab_jobs` naming them, which PostgreSQL delivers at
commit, so a replica woken by it reads what woke it.

Bounds, as in SQLite and then some: at most ZFAB_JOB_HISTORY rows and ZFAB_API_DB_BYTES bytes (the
oldest go first, with their events), at most EVENTS_PER_JOB events and EVENT_BYTES_PER_JOB bytes of
them per job (the oldest go first, as in the client's own buffer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg_pool import AsyncConnectionPool

from ..jobs.filters import JobFilter
from ..jobs.record import JobRecord
from .base import StoreError, redacted
from .schema import migrate
from .sqlite import record_of, row_of

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
POOL_SIZE = 8  # connections per replica: writes are batched, reads are single-row lookups
EVENTS_PER_JOB = 1000  # as the client's buffer (ZFAB_MAX_EVENTS_PER_JOB's default)
EVENT_BYTES_PER_JOB = 1024 * 1024
PRUNE_EVERY = 2.0  # seconds between prunes (after writes only): one scan of the table's seq index
ORPHAN_EVENTS_EVERY = 60.0
NOTIFY_BYTES = 7900  # PostgreSQL's NOTIFY payload limit is 8000 bytes
JOBS_CHANNEL = "zfab_jobs"
PRUNE_LOCK = 0x7A6661622D707275  # "zfab-pru": one replica prunes at a time; the others skip

COLUMNS: LiteralString = "uuid, service, task, target, workers, fingerprint, timeout, job, request, owner"
INSERT_JOB: LiteralString = """
INSERT INTO jobs (uuid, broker, service, task, target, state, workers, fingerprint, timeout, submitted_at,
                  completed_at, job, request, owner, bytes, submitter)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""
CLAIM: LiteralString = INSERT_JOB + "ON CONFLICT (uuid) DO NOTHING RETURNING uuid"
JOB_FIELDS: LiteralString = (
    "uuid, broker, service, task, target, state, workers, fingerprint, timeout, submitted_at, completed_at, job, "
    "request, owner, bytes, submitter"
)
# A batch of rows and events as arrays, upserted in one statement whose last step notifies their uuids.
WRITE: LiteralString = (
    "WITH r AS (SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], "
    "%s::text[], %s::text[], %s::float8[], %s::float8[], %s::float8[], %s::text[], %s::text[], %s::text[], "
    "%s::int8[], %s::text[]) AS t(" + JOB_FIELDS + ")), "
    "up AS (INSERT INTO jobs (" + JOB_FIELDS + ") SELECT " + JOB_FIELDS + " FROM r "
    "ON CONFLICT (uuid) DO UPDATE SET state = excluded.state, workers = excluded.workers, "
    "completed_at = excluded.completed_at, job = excluded.job, owner = excluded.owner, bytes = excluded.bytes, "
    "updated_at = now() RETURNING uuid), "
    "ev AS (INSERT INTO job_events (job_uuid, seq, event, bytes) "
    "SELECT * FROM unnest(%s::text[], %s::int4[], %s::text[], %s::int4[]) ON CONFLICT DO NOTHING) "
    "SELECT pg_notify(%s, string_agg(uuid, ',')) FROM up"
)
INLINE_ROWS = 16  # batches up to this many rows are made on the event loop
WRITE_BATCH = 200  # rows per statement: their uuids fit one NOTIFY payload (8000 bytes)


def notify_payloads(ids: Sequence[str]) -> list[str]:
    """Comma-joined ids, each payload under NOTIFY's size limit."""
    out: list[str] = []
    cur: list[str] = []
    size = 0
    for i in ids:
        if cur and size + len(i) + 1 > NOTIFY_BYTES:
            out.append(",".join(cur))
            cur, size = [], 0
        cur.append(i)
        size += len(i) + 1
    if cur:
        out.append(",".join(cur))
    return out


@dataclass(slots=True)
class Written:
    """What one record's write puts in the database (made in a thread, applied after the commit)."""

    rec: JobRecord
    row: tuple[Any, ...]
    events: list[tuple[str, int, str, int]]
    total: int  # events the job had when the row was made (its next event's seq - 1)
    event_bytes: int  # bytes of its events in the database after this write (before any trim)


def written(rec: JobRecord, broker: str, owner: str) -> Written:
    """The row and the events not written yet of a job (any thread: reads the future under its lock)."""
    base = row_of(rec, broker, keep_waiting=True)
    fut = rec.live if rec.stored is None else None  # a recovered job's events are read back from its workers
    events: list[tuple[str, int, str, int]] = []
    total = rec.events_written
    ebytes = rec.event_bytes
    if fut is not None:
        with fut.changed:  # add_event appends and counts drops under it: a consistent (events, dropped) pair
            buffered = list(fut.events)
            dropped = fut.events_dropped
        total = dropped + len(buffered)
        first = max(rec.events_written + 1, dropped + 1)  # events dropped from the buffer before a write: gone
        for seq in range(first, total + 1):
            text = json.dumps(buffered[seq - dropped - 1], separators=(",", ":"), default=str)
            events.append((rec.uuid, seq, text, len(text)))
            ebytes += len(text)
    job, request = base[11], base[12]
    size = len(job) + len(request or "") + ebytes
    return Written(rec, (*base[:13], owner, size, base[13]), events, total, ebytes)  # submitter last


class PgDatabase:
    """The pool every part of the API's PostgreSQL store shares; migrated when opened."""

    def __init__(self, url: str, pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]]) -> None:
        self.url = url
        self.label = redacted(url)
        self.pool = pool
        self.ok = True  # the last statement reached the database (read by /readyz through replicas.py)

    @classmethod
    async def open(cls, url: str, application: str, timeout: float = 30.0) -> PgDatabase:
        """Connect and migrate; waits up to `timeout` s for the database (it may start after us)."""
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "application_name": application[:63],
            "connect_timeout": int(CONNECT_TIMEOUT),
            # A database host that vanishes without closing the connection is noticed within about 20 s.
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 2,
        }
        deadline = time.monotonic() + timeout
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(url, **{**kwargs, "autocommit": False}) as conn:
                    found, now = await migrate(conn)
                break
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise StoreError(f"cannot reach the API database {redacted(url)}: {exc}") from exc
                log.warning("api database %s not reachable yet: %s", redacted(url), str(exc).strip())
                await asyncio.sleep(1.0)
        if found != now:
            log.info("api database %s: schema v%d -> v%d", redacted(url), found, now)
        pool: AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] = AsyncConnectionPool(
            url, min_size=1, max_size=POOL_SIZE, kwargs=kwargs, open=False, timeout=CONNECT_TIMEOUT, name="zfab-api"
        )
        await pool.open(wait=True, timeout=timeout)
        return cls(url, pool)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[tuple[Any, ...]]]:
        """A pooled connection; psycopg's errors (and a pool timeout) come out as StoreError."""
        try:
            async with self.pool.connection() as conn:
                yield conn
            self.ok = True
        except (psycopg.Error, OSError) as exc:
            self.ok = False
            raise StoreError(str(exc).strip() or type(exc).__name__) from exc
        except Exception as exc:  # psycopg_pool.PoolTimeout is not a psycopg.Error
            if type(exc).__name__ not in ("PoolTimeout", "TooManyRequests", "PoolClosed"):
                raise
            self.ok = False
            raise StoreError(str(exc).strip() or type(exc).__name__) from exc

    async def fetch(self, sql: LiteralString, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        async with self.connection() as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchall() if cur.description else []

    async def close(self) -> None:
        await self.pool.close()


class PgJobStore:
    """The shared job table, its events, and their bounds."""

    shared = True

    def __init__(self, db: PgDatabase, capacity: int, max_bytes: int, owner: str) -> None:
        self.db = db
        self.label = db.label
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.owner = owner  # this replica's id: the owner of every job it writes
        self._pruned_at = 0.0
        self._orphans_at = time.monotonic()
        self.pruned = 0

    async def load(self, broker: str) -> list[JobRecord]:
        # Nothing is held in memory at start: finished jobs are read when asked for, and unfinished
        # ones of replicas that are gone are adopted by replicas.py (so by one replica only).
        return []

    async def read(self, uuid: str) -> JobRecord | None:
        rows = await self.db.fetch("SELECT " + COLUMNS + " FROM jobs WHERE uuid = %s", (uuid,))
        return self.record(rows[0]) if rows else None

    @staticmethod
    def record(row: Sequence[Any]) -> JobRecord | None:
        try:
            rec = record_of(*row[:9])
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            log.warning("api database: unreadable job %s: %s", row[0], exc)
            return None
        rec.owner = str(row[9])
        return rec

    async def write(self, records: Sequence[JobRecord], broker: str) -> None:
        # Rows of a small batch are made on the loop: a thread hop costs more than a few model dumps.
        make = [written(r, broker, self.owner) for r in records] if len(records) <= INLINE_ROWS else None
        rows = (
            make
            if make is not None
            else await asyncio.to_thread(lambda: [written(r, broker, self.owner) for r in records])
        )
        for start in range(0, len(rows), WRITE_BATCH):
            await self._write(rows[start : start + WRITE_BATCH])
        if time.monotonic() - self._pruned_at >= PRUNE_EVERY:
            self._pruned_at = time.monotonic()
            await self.prune()

    async def _write(self, rows: list[Written]) -> None:
        """One statement, so one round trip and one implicit transaction: the rows, their new events,
        and the NOTIFY naming them (delivered at commit). Trimming a job's events, when due, follows."""
        # Lists, not tuples: psycopg sends a list as an array (a tuple would be a record).
        columns = [list(c) for c in zip(*(w.row for w in rows), strict=True)]
        events = [e for w in rows for e in w.events]
        ev_columns: list[list[Any]] = [list(c) for c in zip(*events, strict=True)] if events else [[], [], [], []]
        async with self.db.connection() as conn:
            await conn.execute(WRITE, (*columns, *ev_columns, JOBS_CHANNEL))
            for w in rows:
                if w.events and w.total > EVENTS_PER_JOB:
                    await conn.execute(
                        "DELETE FROM job_events WHERE job_uuid = %s AND seq <= %s",
                        (w.rec.uuid, w.total - EVENTS_PER_JOB),
                    )
                if w.events and w.event_bytes > EVENT_BYTES_PER_JOB:
                    w.event_bytes = await self._trim_event_bytes(conn.cursor(), w.rec.uuid)
        for w in rows:
            w.rec.events_written = max(w.rec.events_written, w.total)
            w.rec.event_bytes = w.event_bytes
            w.rec.owner = self.owner

    @staticmethod
    async def _trim_event_bytes(cur: psycopg.AsyncCursor[tuple[Any, ...]], uuid: str) -> int:
        """Drop a job's oldest events until the rest fit EVENT_BYTES_PER_JOB; the bytes left."""
        await cur.execute(
            """DELETE FROM job_events WHERE job_uuid = %(u)s AND seq <= (
                   SELECT seq FROM (SELECT seq, sum(bytes) OVER (ORDER BY seq DESC) AS total
                                    FROM job_events WHERE job_uuid = %(u)s) t
                   WHERE total > %(max)s ORDER BY seq DESC LIMIT 1)""",
            {"u": uuid, "max": EVENT_BYTES_PER_JOB},
        )
        await cur.execute("SELECT coalesce(sum(bytes), 0) FROM job_events WHERE job_uuid = %s", (uuid,))
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def prune(self) -> int:
        """Drop the oldest jobs beyond the count and byte bounds, and their events (one replica at a time)."""
        async with self.db.connection() as conn, conn.transaction():
            cur = await conn.execute("SELECT pg_try_advisory_xact_lock(%s)", (PRUNE_LOCK,))
            got = await cur.fetchone()
            if not got or not got[0]:
                return 0
            gone: list[str] = []
            cur = await conn.execute(
                """DELETE FROM jobs WHERE seq <= (SELECT seq FROM jobs ORDER BY seq DESC OFFSET %s LIMIT 1)
                   RETURNING uuid""",
                (self.capacity,),
            )
            gone += [str(r[0]) for r in await cur.fetchall()]
            cur = await conn.execute(
                """DELETE FROM jobs WHERE seq <= (
                       SELECT seq FROM (SELECT seq, sum(bytes) OVER (ORDER BY seq DESC) AS total FROM jobs) t
                       WHERE total > %s ORDER BY seq DESC LIMIT 1)
                   RETURNING uuid""",
                (self.max_bytes,),
            )
            gone += [str(r[0]) for r in await cur.fetchall()]
            if gone:
                await conn.execute("DELETE FROM job_events WHERE job_uuid = ANY(%s)", (gone,))
            if time.monotonic() - self._orphans_at >= ORPHAN_EVENTS_EVERY:
                # Events written for a job in the same moment it was pruned (by another replica's prune).
                self._orphans_at = time.monotonic()
                await conn.execute(
                    "DELETE FROM job_events e WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.uuid = e.job_uuid)"
                )
        self.pruned += len(gone)
        return len(gone)

    async def events(self, uuid: str, after: int, limit: int = EVENTS_PER_JOB) -> list[tuple[int, dict[str, Any]]]:
        """A job's events with seq > after, in order: (seq, event)."""
        rows = await self.db.fetch(
            "SELECT seq, event FROM job_events WHERE job_uuid = %s AND seq > %s ORDER BY seq LIMIT %s",
            (uuid, after, limit),
        )
        out: list[tuple[int, dict[str, Any]]] = []
        for seq, text in rows:
            try:
                event = json.loads(text)
            except ValueError:
                continue
            if isinstance(event, dict):
                out.append((int(seq), event))
        return out

    async def claim(self, rec: JobRecord, broker: str) -> bool:
        """Insert a job's row unless one exists (an Idempotency-Key's job): True when this replica got it."""
        w = await asyncio.to_thread(written, rec, broker, self.owner)
        rows = await self.db.fetch(CLAIM, w.row)
        return bool(rows)

    async def release(self, uuid: str) -> None:
        """Forget a claimed row whose job could not be submitted (a retry of the key may try again)."""
        await self.db.fetch("DELETE FROM jobs WHERE uuid = %s AND owner = %s", (uuid, self.owner))

    async def take(self, uuid: str, previous: str) -> bool:
        """Become the owner of a job (refused, or its owner is gone) unless another replica did first."""
        rows = await self.db.fetch(
            "UPDATE jobs SET owner = %s, updated_at = now() WHERE uuid = %s AND owner = %s RETURNING uuid",
            (self.owner, uuid, previous),
        )
        return bool(rows)

    async def page(
        self, broker: str, before: int | None, limit: int, flt: JobFilter
    ) -> tuple[list[tuple[int, JobRecord, str | None]], int]:
        """Newest first: (seq, record, schedule id) for up to `limit` jobs matching, and the table's size."""
        where: list[LiteralString] = ["j.broker = %(broker)s"]
        params: dict[str, Any] = {"broker": broker, "limit": limit}
        if before is not None:
            where.append("j.seq < %(before)s")
            params["before"] = before
        where += flt.sql(params)
        cond: LiteralString = " AND ".join(where)
        sql: LiteralString = (
            "SELECT j.seq, j.uuid, j.service, j.task, j.target, j.workers, j.fingerprint, j.timeout, j.job, "
            "j.request, j.owner, s.schedule_id FROM jobs j LEFT JOIN schedule_jobs s ON s.job_uuid = j.uuid "
            "WHERE " + cond + " ORDER BY j.seq DESC LIMIT %(limit)s"
        )
        rows = await self.db.fetch(sql, params)
        total = await self.db.fetch("SELECT count(*) FROM jobs WHERE broker = %s", (broker,))
        out: list[tuple[int, JobRecord, str | None]] = []
        for row in rows:
            rec = self.record(row[1:11])
            if rec is not None:
                out.append((int(row[0]), rec, row[11]))
        return out, int(total[0][0]) if total else 0

    async def close(self) -> None:
        pass  # the pool is the PgDatabase's, closed by its owner
