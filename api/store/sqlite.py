"""The API's job table on disk (SQLite, WAL), so GET /jobs/{uuid} still answers after a restart.

Writes never happen on the event loop and never one per request: the table marks jobs dirty
(on submit, as what the API knows of them changes, and when they finish), and the `Persister`
(api/store/persister.py) writes whatever is dirty in one transaction, from a thread; POST /jobs
answers once its job's row is committed. `synchronous=NORMAL` in WAL mode makes a commit survive a
crash of the API (not of the machine) without an fsync per commit.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from zfab.errors import ClosedError
from zfab.storage import open_sqlite

from ..jobs.record import JobRecord, stored_size
from ..models import Job, JobState

log = logging.getLogger(__name__)


SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    uuid TEXT PRIMARY KEY,
    broker TEXT NOT NULL,
    service TEXT NOT NULL,
    task TEXT NOT NULL,
    target TEXT NOT NULL,
    state TEXT NOT NULL,
    workers TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    timeout REAL NOT NULL,
    submitted_at REAL NOT NULL,
    completed_at REAL,
    job TEXT NOT NULL,
    request TEXT,
    submitter TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS jobs_broker ON jobs(broker);
"""
SCHEMA_VERSION = 3
MIGRATIONS = {
    2: "ALTER TABLE jobs ADD COLUMN request TEXT",  # v2: what was asked, to submit it again
    3: "ALTER TABLE jobs ADD COLUMN submitter TEXT NOT NULL DEFAULT ''",  # v3: who submitted it (docs/roles.md)
}
# `target` is the JSON of what the job was sent to ("any", "all", a name, a list); `workers` the
# JSON list of the workers known to run it (recovery asks them); `job` the body GET answers.
# Rows keep their first rowid on update, so rowid order is submission order.
UPSERT = """
INSERT INTO jobs (uuid, broker, service, task, target, state, workers, fingerprint, timeout, submitted_at,
                  completed_at, job, request, submitter)
VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)
ON CONFLICT(uuid) DO UPDATE SET state=excluded.state, workers=excluded.workers, completed_at=excluded.completed_at,
    job=excluded.job
"""
Row = tuple[str, str, str, str, str, str, str, str, float, float, float | None, str, str | None, str]
COLUMNS = "uuid, service, task, target, workers, fingerprint, timeout, job, request"


def row_of(rec: JobRecord, broker: str, *, keep_waiting: bool = False) -> Row:
    """The database row of a job as it stands (called from the persister's thread).

    `keep_waiting`: a job waiting for input stays `waiting`, with its request (PostgreSQL: another
    replica reads it and forwards the answer to this one); otherwise it is stored as running."""
    job = rec.view()
    fut = rec.live
    if fut is not None and fut.done() and not fut.cancelled() and isinstance(fut.exception(), ClosedError):
        # The API stopped, not the job: it stays unfinished, to be recovered after the restart.
        state = JobState.RUNNING if rec.dispatched() else JobState.QUEUED
        job = job.model_copy(
            update={"state": state, "error": None, "reason": None, "results": None, "completed_at": None}
        )
    if job.state is JobState.WAITING and not keep_waiting:  # an input request cannot be answered across a restart
        job = job.model_copy(update={"state": JobState.RUNNING, "input_request": None})
    done = job.completed_at.timestamp() if job.completed_at else None
    return (
        rec.uuid,
        broker,
        rec.service,
        rec.task,
        json.dumps(rec.workers),
        job.state.value,
        json.dumps(rec.dispatched()),
        rec.fingerprint,
        rec.timeout,
        job.submitted_at.timestamp(),
        done,
        job.model_dump_json(),
        rec.request_json.decode() if rec.request_json is not None else None,
        rec.submitter,
    )


def record_of(
    uuid: str,
    service: str,
    task: str,
    target: str,
    workers: str,
    fp: str,
    timeout: float,
    job: str,
    request: str | None,
) -> JobRecord:
    """A job read back from its row: known only from the database until a read recovers it."""
    stored = Job.model_validate_json(job)
    return JobRecord(
        uuid=uuid,
        service=service,
        task=task,
        workers=json.loads(target),
        future=None,
        fingerprint=fp,
        timeout=timeout,
        cancel_requested=stored.cancel_requested,
        stored=stored,
        ran_on=json.loads(workers),
        stored_bytes=stored_size(stored, len(job)),  # counted by the table, which bounds what it holds
        request_json=request.encode() if request else None,  # decoded when read: see JobRecord.request
        priority=stored.priority,
        retries=stored.retries,
        retry_of=stored.retry_of,
        retried_as=stored.retried_as,
        submitter=stored.submitted_by or "",
    )


class JobDB:
    """One SQLite file; every method runs in a thread, never on the event loop."""

    def __init__(self, path: Path, capacity: int) -> None:
        self.path = path
        self.capacity = capacity
        self._lock = threading.Lock()  # a write cut off by shutdown may still run when the last one starts
        # v1; files written before the version was recorded (user_version 0) have the same table.
        self._conn = open_sqlite(
            path,
            SCHEMA,
            SCHEMA_VERSION,
            table="jobs",
            check_same_thread=False,
            also_accept=(0,),
            migrations=MIGRATIONS,
        )

    def load(self, broker: str) -> list[JobRecord]:
        """The newest `capacity` jobs run through `broker`, oldest first (a job id means nothing elsewhere)."""
        with self._lock:
            rows = self._conn.execute(
                f"SELECT {COLUMNS} FROM jobs WHERE broker=? ORDER BY rowid DESC LIMIT ?",
                (broker, self.capacity),
            ).fetchall()
        out = []
        for row in reversed(rows):
            try:
                out.append(record_of(*row))
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                log.warning("api job db: skipping unreadable job %s: %s", row[0], exc)
        return out

    def read(self, uuid: str) -> JobRecord | None:
        """One job by uuid (a job the in-memory table let go of), or None."""
        with self._lock:
            row = self._conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE uuid=?", (uuid,)).fetchone()
        if row is None:
            return None
        try:
            return record_of(*row)
        except ValueError:
            return None

    def write(self, rows: list[Row]) -> None:
        """Upsert the rows and drop the oldest beyond `capacity`, in one transaction."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN")
            try:
                conn.executemany(UPSERT, rows)
                conn.execute(
                    "DELETE FROM jobs WHERE rowid <= (SELECT max(rowid) FROM jobs) - ?",
                    (self.capacity,),
                )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()
