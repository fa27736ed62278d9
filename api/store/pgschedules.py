"""Schedules on PostgreSQL: the shared-database side of api/store/schedules.py (ZFAB_API_DB=postgresql://...).

A firing is claimed with SELECT ... FOR UPDATE SKIP LOCKED on the due row, so of all the replicas
whose scheduler woke for it exactly one fires it; the schedules' NOTIFY channel tells the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, LiteralString

import psycopg

from .postgres import PgDatabase, notify_payloads
from .schedules import LAST_JOBS, ScheduleRecord
from .schedules import record_of as schedule_of_row

log = logging.getLogger(__name__)

SCHEDULE_COLUMNS: LiteralString = (
    "id, name, job, every, cron, paused, created_at, next_run_at, last_run_at, runs, failures, last_error"
)
SCHEDULES_CHANNEL = "zfab_schedules"
UPSERT_SCHEDULE: LiteralString = (
    "INSERT INTO schedules (" + SCHEDULE_COLUMNS + ") VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (id) DO UPDATE SET name = excluded.name, job = excluded.job, every = excluded.every, "
    "cron = excluded.cron, paused = excluded.paused, next_run_at = excluded.next_run_at"
)


def schedule_row(rec: ScheduleRecord) -> tuple[Any, ...]:
    row = list(rec.row())
    row[5] = bool(row[5])  # SQLite stores paused as 0/1; PostgreSQL has a boolean
    return tuple(row)


class PgSchedules:
    """Schedules in the shared database. A firing is claimed with SELECT ... FOR UPDATE SKIP LOCKED on
    the due row, so of all the replicas whose loop woke for it exactly one fires it (see claim)."""

    shared = True

    def __init__(self, db: PgDatabase, mapping_capacity: int) -> None:
        self.db = db
        self.mapping_capacity = mapping_capacity

    async def load(self) -> list[ScheduleRecord]:
        rows = await self.db.fetch("SELECT " + SCHEDULE_COLUMNS + " FROM schedules ORDER BY created_at, id")
        recs = [r for row in rows if (r := self._record(row)) is not None]
        if recs:
            await self._last_jobs(recs)
        return recs

    async def read(self, ids: Sequence[str]) -> list[ScheduleRecord]:
        rows = await self.db.fetch("SELECT " + SCHEDULE_COLUMNS + " FROM schedules WHERE id = ANY(%s)", (list(ids),))
        recs = [r for row in rows if (r := self._record(row)) is not None]
        if recs:
            await self._last_jobs(recs)
        return recs

    @staticmethod
    def _record(row: Sequence[Any]) -> ScheduleRecord | None:
        try:
            return schedule_of_row(tuple(row))
        except (ValueError, TypeError) as exc:
            log.warning("api schedules: skipping unreadable schedule %s: %s", row[0], exc)
            return None

    async def _last_jobs(self, recs: Sequence[ScheduleRecord]) -> None:
        rows = await self.db.fetch(
            """SELECT schedule_id, job_uuid FROM (
                   SELECT schedule_id, job_uuid, fired_at, seq,
                          row_number() OVER (PARTITION BY schedule_id ORDER BY fired_at DESC, seq DESC) AS n
                   FROM schedule_jobs WHERE schedule_id = ANY(%s)) t
               WHERE n <= %s ORDER BY fired_at, seq""",
            ([r.id for r in recs], LAST_JOBS),
        )
        by_id = {r.id: r for r in recs}
        for sid, job in rows:
            if sid in by_id:
                by_id[sid].last_jobs.append(str(job))

    async def save(self, rows: Sequence[tuple[Any, ...]], fired: Sequence[tuple[str, str, float]] = ()) -> None:
        """Create or change schedules (what the routes do: the firing columns are the firing's, see claim)."""
        fixed = [(*r[:5], bool(r[5]), *r[6:]) for r in rows]
        async with self.db.connection() as conn, conn.transaction():
            cur = conn.cursor()
            if fixed:
                await cur.executemany(UPSERT_SCHEDULE, fixed)
            if fired:
                await self._record_fired(cur, fired)
            for payload in notify_payloads([str(r[0]) for r in rows]):
                await cur.execute("SELECT pg_notify(%s, %s)", (SCHEDULES_CHANNEL, payload))

    async def _record_fired(
        self, cur: psycopg.AsyncCursor[tuple[Any, ...]], fired: Sequence[tuple[str, str, float]]
    ) -> None:
        await cur.executemany(
            "INSERT INTO schedule_jobs (job_uuid, schedule_id, fired_at) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            list(fired),
        )
        await cur.execute(
            "DELETE FROM schedule_jobs WHERE seq <= "
            "(SELECT seq FROM schedule_jobs ORDER BY seq DESC OFFSET %s LIMIT 1)",
            (self.mapping_capacity,),
        )

    async def delete(self, schedule_id: str) -> None:
        async with self.db.connection() as conn, conn.transaction():
            await conn.execute("DELETE FROM schedules WHERE id = %s", (schedule_id,))
            await conn.execute("SELECT pg_notify(%s, %s)", (SCHEDULES_CHANNEL, schedule_id))

    async def mapping(self) -> list[tuple[str, str]]:
        rows = await self.db.fetch("SELECT job_uuid, schedule_id FROM schedule_jobs ORDER BY seq")
        return [(str(u), str(s)) for u, s in rows]

    async def fire_claimed(
        self, ids: Sequence[str], now: float, advance: Callable[[list[ScheduleRecord]], None]
    ) -> tuple[list[ScheduleRecord], list[str]]:
        """One transaction: lock those of `ids` still due at `now` (SKIP LOCKED: a row another replica is
        firing is passed over), let `advance(recs)` move their next_run_at on, write that, commit.
        (claimed records, ids not claimed). The firing itself happens after the commit (see scheduler.py):
        at most once per slot, even if this replica dies right after."""
        async with self.db.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT " + SCHEDULE_COLUMNS + " FROM schedules WHERE id = ANY(%s) AND NOT paused "
                "AND next_run_at IS NOT NULL AND next_run_at <= %s FOR UPDATE SKIP LOCKED",
                (list(ids), now),
            )
            recs = [r for row in await cur.fetchall() if (r := self._record(row)) is not None]
            if recs:
                await self._last_jobs(recs)
                advance(recs)
                await conn.cursor().executemany(
                    "UPDATE schedules SET next_run_at = %s, last_run_at = %s WHERE id = %s",
                    [(r.next_run_at, r.last_run_at, r.id) for r in recs],
                )
                for payload in notify_payloads([r.id for r in recs]):
                    await conn.execute("SELECT pg_notify(%s, %s)", (SCHEDULES_CHANNEL, payload))
        got = {r.id for r in recs}
        return recs, [i for i in ids if i not in got]

    async def record_firings(
        self, outcomes: Sequence[tuple[str, bool, str | None]], fired: Sequence[tuple[str, str, float]]
    ) -> None:
        """After the firings: (schedule id, submitted?, error) each, and the job -> schedule rows."""
        async with self.db.connection() as conn, conn.transaction():
            cur = conn.cursor()
            await cur.executemany(
                "UPDATE schedules SET runs = runs + %s, failures = failures + %s, last_error = %s WHERE id = %s",
                [(int(ok), int(not ok), error, sid) for sid, ok, error in outcomes],
            )
            if fired:
                await self._record_fired(cur, fired)
            for payload in notify_payloads([sid for sid, _, _ in outcomes]):
                await cur.execute("SELECT pg_notify(%s, %s)", (SCHEDULES_CHANNEL, payload))

    async def close(self) -> None:
        pass
