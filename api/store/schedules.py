"""Periodic schedules on disk: their own tables in the API's SQLite file (ZFAB_API_DB), so a restart keeps them.

The file's `user_version` belongs to the job table (api/store/sqlite.py), so the schedules keep their schema
version in a row of their own (`zfab_components`); tables from another version are renamed aside, not
misread. Every method runs in a thread, never on the event loop; the scheduler serializes the writes.
`path=None` keeps them in memory only (an app built in-process, or ZFAB_API_DB empty).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

COMPONENT = "schedules"
VERSION = 1
LAST_JOBS = 10  # job uuids each schedule shows (GET /schedules/{id}); the mapping keeps more

COMPONENTS = "CREATE TABLE IF NOT EXISTS zfab_components (name TEXT PRIMARY KEY, version INTEGER NOT NULL)"
SCHEMA = """
CREATE TABLE IF NOT EXISTS schedules (
    id TEXT PRIMARY KEY,
    name TEXT,
    job TEXT NOT NULL,
    every REAL,
    cron TEXT,
    paused INTEGER NOT NULL,
    created_at REAL NOT NULL,
    next_run_at REAL,
    last_run_at REAL,
    runs INTEGER NOT NULL,
    failures INTEGER NOT NULL,
    last_error TEXT
);
CREATE TABLE IF NOT EXISTS schedule_jobs (
    job_uuid TEXT PRIMARY KEY,
    schedule_id TEXT NOT NULL,
    fired_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS schedule_jobs_by_schedule ON schedule_jobs(schedule_id, fired_at);
"""
TABLES = ("schedules", "schedule_jobs")
COLUMNS = "id, name, job, every, cron, paused, created_at, next_run_at, last_run_at, runs, failures, last_error"
UPSERT = f"INSERT OR REPLACE INTO schedules ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"


@dataclass(slots=True, eq=False)
class ScheduleRecord:
    """One schedule as the scheduler holds it. Times are epoch seconds (cron is wall-clock, UTC)."""

    id: str
    job: dict[str, Any]  # a JobRequest as JSON: what each firing submits
    every: float | None
    cron: str | None
    name: str | None = None
    paused: bool = False
    created_at: float = field(default_factory=time.time)
    next_run_at: float | None = None  # None while paused
    last_run_at: float | None = None
    runs: int = 0  # firings whose job was submitted
    failures: int = 0  # firings the fabric refused (no broker, no workers, busy...)
    last_error: str | None = None
    last_jobs: deque[str] = field(default_factory=lambda: deque(maxlen=LAST_JOBS))

    def row(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.name,
            json.dumps(self.job),
            self.every,
            self.cron,
            int(self.paused),
            self.created_at,
            self.next_run_at,
            self.last_run_at,
            self.runs,
            self.failures,
            self.last_error,
        )


def record_of(row: tuple[Any, ...]) -> ScheduleRecord:
    sid, name, job, every, cron, paused, created, nxt, last, runs, failures, error = row
    return ScheduleRecord(
        id=sid,
        name=name,
        job=json.loads(job),
        every=every,
        cron=cron,
        paused=bool(paused),
        created_at=created,
        next_run_at=nxt,
        last_run_at=last,
        runs=runs,
        failures=failures,
        last_error=error,
    )


class ScheduleStore:
    """The schedules table and the job → schedule mapping (at most `mapping_capacity` rows)."""

    def __init__(self, path: Path | None, mapping_capacity: int) -> None:
        self.path = path
        self.mapping_capacity = mapping_capacity
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        conn = sqlite3.connect(str(path) if path else ":memory:", isolation_level=None, check_same_thread=False)
        # The job table's writer uses the same file from another connection: wait for it, do not fail.
        conn.execute("PRAGMA busy_timeout=5000")
        if path is not None:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(COMPONENTS)
        found = conn.execute("SELECT version FROM zfab_components WHERE name=?", (COMPONENT,)).fetchone()
        if found is not None and found[0] != VERSION:
            stamp = int(time.time())
            for table in TABLES:
                conn.execute(f"ALTER TABLE {table} RENAME TO {table}_v{found[0]}_{stamp}")
            conn.execute("DROP INDEX IF EXISTS schedule_jobs_by_schedule")
            log.warning("%s: schedules at schema v%s, not v%d; kept aside with suffix _v%s_%d", path, *found, VERSION)
        conn.executescript(SCHEMA)
        conn.execute("INSERT OR REPLACE INTO zfab_components (name, version) VALUES (?, ?)", (COMPONENT, VERSION))
        self._conn = conn

    def load(self) -> list[ScheduleRecord]:
        """Every schedule, oldest first, each with its last job uuids."""
        with self._lock:
            rows = self._conn.execute(f"SELECT {COLUMNS} FROM schedules ORDER BY created_at, id").fetchall()
            out = []
            for row in rows:
                try:
                    rec = record_of(row)
                except (ValueError, TypeError) as exc:
                    log.warning("api schedules: skipping unreadable schedule %s: %s", row[0], exc)
                    continue
                jobs = self._conn.execute(
                    "SELECT job_uuid FROM schedule_jobs WHERE schedule_id=? ORDER BY fired_at DESC, rowid DESC LIMIT ?",
                    (rec.id, LAST_JOBS),
                ).fetchall()
                rec.last_jobs.extend(u for (u,) in reversed(jobs))
                out.append(rec)
        return out

    def save(self, rows: Sequence[tuple[Any, ...]], fired: Sequence[tuple[str, str, float]] = ()) -> None:
        """Upsert schedule rows and record fired jobs (job uuid, schedule id, time), in one transaction."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN")
            try:
                conn.executemany(UPSERT, rows)
                if fired:
                    conn.executemany("INSERT OR REPLACE INTO schedule_jobs VALUES (?,?,?)", fired)
                    conn.execute(
                        "DELETE FROM schedule_jobs WHERE rowid <= (SELECT max(rowid) FROM schedule_jobs) - ?",
                        (self.mapping_capacity,),
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def delete(self, schedule_id: str) -> None:
        """Forget the schedule; the mapping of the jobs it made stays (they are still jobs)."""
        with self._lock:
            self._conn.execute("DELETE FROM schedules WHERE id=?", (schedule_id,))

    def mapping(self) -> list[tuple[str, str]]:
        """(job uuid, schedule id) of every job a schedule made that the mapping still holds, oldest first."""
        with self._lock:
            rows = self._conn.execute("SELECT job_uuid, schedule_id FROM schedule_jobs ORDER BY rowid").fetchall()
        return [(str(u), str(s)) for u, s in rows]

    def close(self) -> None:
        with self._lock:
            self._conn.close()
