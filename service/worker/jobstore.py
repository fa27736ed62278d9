"""A worker's durable job store: SQLite in WAL mode, written by one thread in batches.

The owner loop and job threads never wait on the disk: they hand operations to the
writer thread through a bounded queue; the writer commits a whole batch in one
transaction (group commit) and then runs each operation's follow-up (such as
sending 201 once the job is stored). WAL with synchronous=NORMAL does not fsync
per commit, so durability does not cap throughput.
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import payloads
from ..core.logbudget import LogBudget
from ..core.protocol import Frame
from ..core.states import UNFINISHED_STATES, JobState
from ..storage import open_sqlite

if TYPE_CHECKING:
    from .job import Job

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    uuid TEXT PRIMARY KEY,
    client BLOB NOT NULL,
    task TEXT NOT NULL,
    request TEXT NOT NULL,
    state TEXT NOT NULL,
    received_at REAL NOT NULL,
    started_at REAL,
    completed_at REAL,
    status_code TEXT,
    result TEXT
);
CREATE INDEX IF NOT EXISTS jobs_received ON jobs(received_at);
CREATE TABLE IF NOT EXISTS events (
    uuid TEXT NOT NULL,
    seq INTEGER NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (uuid, seq)
);
"""


@dataclass(slots=True)
class StoredJob:
    uuid: str
    client: bytes
    task: str
    state: str
    status_code: str | None
    result: bytes | str | None  # bytes; str in rows written before 0.3


# A row's state is the job's (core/states.py); rows written before it was say 'received' for a queued job.
_UNFINISHED = ", ".join(f"'{s}'" for s in (*UNFINISHED_STATES, "received"))
FINISHED = f"state NOT IN ({_UNFINISHED})"  # records retention may drop

# A write that finds the writer idle waits this long for company before it commits. One job at a
# time, a job's receive and its result came 0.3-0.6 ms apart and cost two commits and two wake-ups
# of this thread (2.9-3.1 context switches and about 200 us of its CPU per job on a sequential
# echo); waiting 2 ms merges them into one row and one commit (1.3-1.7 switches, 140-170 us).
# Nothing waits on it that matters sooner: the 201 that follows a receive's commit is held 10 ms
# anyway, and reads (GET of a stored job) and events do not linger. Nor do results: a job's result
# is reported once its commit is done (runner.complete, write before report), so the linger ends with
# the first write that comes (a result most often) and one that finds the writer idle is committed at
# once. (The linger was once a sleep: every such result waited it out, a sequential p90 of 3.5 ms.)
LINGER = 0.002

Op = Callable[[sqlite3.Connection], None]
After = Callable[[], None]

INSERT_SQL = (
    "INSERT OR IGNORE INTO jobs(uuid, client, task, request, state, received_at)"
    f" VALUES (?,?,?,?,'{JobState.QUEUED.value}',?)"
)
RESULT_SQL = (
    "INSERT INTO jobs(uuid, client, task, request, state, received_at, started_at, completed_at,"
    " status_code, result) VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT(uuid) DO UPDATE SET"
    " state=excluded.state, started_at=excluded.started_at, completed_at=excluded.completed_at,"
    " status_code=excluded.status_code, result=excluded.result"
)


class Rows:
    """Rows for one statement, INSERT_SQL (received jobs) or RESULT_SQL (finished ones, an upsert:
    a result may come before its receive is written). The writer merges a batch's rows of each
    statement into one executemany; called alone, it writes its own."""

    __slots__ = ("rows", "sql")

    def __init__(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self.sql = sql
        self.rows = rows

    def __call__(self, conn: sqlite3.Connection) -> None:
        conn.executemany(self.sql, self.rows)


class JobStore:
    """Single-writer SQLite store. `submit` is thread-safe; `read` runs on the writer thread."""

    def __init__(
        self,
        path: Path,
        *,
        queue_size: int = 10_000,
        batch: int = 512,
        retention_seconds: float = 7 * 86400,
        retention_count: int = 100_000,
        max_events_per_job: int = 1000,
        max_payload_bytes: int = 1024 * 1024,
        linger: float = LINGER,
        failure_payload: Callable[[str, str, str], bytes] | None = None,
    ) -> None:
        self.path = path
        self.batch = batch
        self.linger = linger
        self.retention_seconds = retention_seconds
        self.retention_count = retention_count
        self.max_events_per_job = max_events_per_job
        self.queue_size = queue_size
        # Writing a 10 MB body and result to SQLite took two thirds of a worker's time on a 10 MB
        # echo; a payload that large is delivered and kept among the recent jobs, not stored.
        self.max_payload_bytes = max_payload_bytes
        self.payloads_not_stored = 0  # owner and pool threads: a count only, races cost nothing
        # SimpleQueue (C, no Condition per put); the bound is checked by submit, which waits on
        # _room only when the writer is behind.
        self._q: queue.SimpleQueue[tuple[Op, After | None] | None] = queue.SimpleQueue()
        self._room = threading.Condition(threading.Lock())
        self._waiting = 0
        self._thread: threading.Thread | None = None
        self._inserts_since_prune = 0
        self.commits = 0
        self.errors = 0
        self.error_log = LogBudget(burst=3, per_second=0.2)  # a storm of failing writes must not flood the log
        self.interrupted_on_open = 0
        # uuids of jobs stored before this run (read at open, never changed after), so a POST
        # repeated after a restart is answered from the store instead of running again.
        self.stored_before: frozenset[str] = frozenset()
        # The result an interrupted job reads as (the worker's: {worker: entry}); given when it is made.
        self.failure_payload = failure_payload

    def open(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="zfab-jobstore", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise TimeoutError(f"job store {self.path} did not open within 30 s")

    def close(self, timeout: float = 10.0) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._q.put(None)
            self._thread.join(timeout)

    def depth(self) -> int:
        return self._q.qsize()

    def submit(self, op: Op, after: After | None = None, timeout: float = 1.0) -> None:
        """Queue a write; `after` runs on the writer thread once it is committed. Raises queue.Full
        when the queue stays at its bound for `timeout` seconds."""
        if self._q.qsize() >= self.queue_size:
            deadline = time.monotonic() + timeout
            with self._room:
                self._waiting += 1
                try:
                    while self._q.qsize() >= self.queue_size:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            raise queue.Full
                        self._room.wait(left)
                finally:
                    self._waiting -= 1
        self._q.put((op, after))

    # ---- writer thread ----------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = open_sqlite(self.path, SCHEMA, SCHEMA_VERSION, table="jobs")
        # 100,000 kept jobs are ~40 MB; with SQLite's default 2 MB page cache every insert and prune
        # read the uuid index back from the OS. 16 MB of cache (bounded, per worker) and a WAL
        # checkpointed every 4,000 pages (16 MB; a hot index page is copied back once, not per
        # commit) took the store's CPU per job from about 45 to 30 us in bench runs.
        conn.execute("PRAGMA cache_size=-16384")
        conn.execute("PRAGMA wal_autocheckpoint=4000")
        return conn

    def _run(self, ready: threading.Event) -> None:
        conn = self._connect()
        self._recover(conn)
        self._prune(conn, sweep=True)
        self.stored_before = frozenset(r[0] for r in conn.execute("SELECT uuid FROM jobs"))
        ready.set()
        try:
            while True:
                first = self._q.get()
                if first is None:
                    return
                items = [first]
                stop = False
                # See LINGER: a receive that finds the writer idle waits for company, and no longer than
                # the first write that comes (its job's result, most often, which is reported once
                # committed: a sleep here held every such result for the whole linger).
                linger = self.linger > 0 and isinstance(first[0], Rows) and first[0].sql is INSERT_SQL
                while len(items) < self.batch:
                    try:
                        nxt = self._q.get(timeout=self.linger) if linger else self._q.get_nowait()
                    except queue.Empty:
                        break
                    linger = False
                    if nxt is None:
                        stop = True
                        break
                    items.append(nxt)
                self._commit(conn, items)
                if self._waiting:
                    with self._room:
                        self._room.notify_all()
                if stop:
                    return
        finally:
            conn.close()

    def _commit(self, conn: sqlite3.Connection, items: list[tuple[Op, After | None]]) -> None:
        """One transaction for the batch. Receives and results are merged into one executemany
        each, and a job received and finished within the batch is written once, as its result:
        a pipelined echo job cost an insert, an upsert and a commit of its own before."""
        inserts: list[tuple[Any, ...]] = []
        results: dict[str, tuple[Any, ...]] = {}
        others: list[Op] = []
        for op, _ in items:
            if isinstance(op, Rows) and op.sql is INSERT_SQL:
                inserts.extend(op.rows)
            elif isinstance(op, Rows) and op.sql is RESULT_SQL:
                results.update((r[0], r) for r in op.rows)  # a later row of the same job is the newer
            else:
                others.append(op)
        self._inserts_since_prune += len(inserts)
        if results:
            inserts = [r for r in inserts if r[0] not in results]
        conn.execute("BEGIN")
        steps: list[Op] = [Rows(INSERT_SQL, inserts), Rows(RESULT_SQL, list(results.values())), *others]
        for step in steps:
            if not isinstance(step, Rows) or step.rows:
                self._apply(conn, step)
        conn.execute("COMMIT")
        self.commits += 1
        for _, after in items:
            if after is not None:
                try:
                    after()
                except Exception:
                    self.errors += 1
                    log.exception("job store: a follow-up failed")
        if self._inserts_since_prune >= 1000:
            self._prune(conn)

    def _apply(self, conn: sqlite3.Connection, op: Op) -> None:
        """Run op; if merged rows fail, each row alone, so one bad row costs only itself."""
        try:
            op(conn)
        except Exception:
            if isinstance(op, Rows) and len(op.rows) > 1:
                for row in op.rows:  # both statements may run again over rows already written
                    self._apply(conn, Rows(op.sql, [row]))
                return
            self.errors += 1
            held = self.error_log.take()
            if held is not None:
                more = f", {held} more not logged" if held else ""
                log.exception("job store: an operation failed and was skipped (%d so far%s)", self.errors, more)

    def _recover(self, conn: sqlite3.Connection) -> None:
        """Jobs left unfinished by a previous run end as failed: interrupted."""
        rows = conn.execute(f"SELECT uuid, task FROM jobs WHERE state IN ({_UNFINISHED})").fetchall()
        now = time.time()
        why = payloads.INTERRUPTED
        for uuid, task_name in rows:
            if self.failure_payload is not None:
                result = self.failure_payload(uuid, task_name, why)
            else:
                result = json.dumps({"failed": True, "errors": [why], "juuid": uuid, "task": task_name}).encode()
            conn.execute(
                "UPDATE jobs SET state='interrupted', completed_at=?, status_code='200', result=? WHERE uuid=?",
                (now, result.decode(), uuid),
            )
        self.interrupted_on_open = len(rows)

    def _prune(self, conn: sqlite3.Connection, sweep: bool = False) -> None:
        """Drop finished jobs past the retention age, then the oldest finished ones over the count.

        Runs every 1000 inserts, so it must cost what it deletes, not what the store holds: the
        old form (`ORDER BY received_at DESC LIMIT -1 OFFSET count`, then events `NOT IN` jobs)
        walked all 100,000 rows each time, 57 ms per prune, a quarter of a busy worker's CPU per
        job. Both deletes now walk the received_at index from its old end and stop at what goes,
        and a job's events go with it; `sweep` (on open) also drops events whose job is gone."""
        self._inserts_since_prune = 0
        cutoff = time.time() - self.retention_seconds
        aged = f"SELECT uuid FROM jobs WHERE received_at < ? AND {FINISHED}"
        conn.execute("BEGIN")
        conn.execute(f"DELETE FROM events WHERE uuid IN ({aged})", (cutoff,))
        conn.execute(f"DELETE FROM jobs WHERE uuid IN ({aged})", (cutoff,))
        excess = conn.execute("SELECT count(*) FROM jobs").fetchone()[0] - self.retention_count
        if excess > 0:
            oldest = f"SELECT uuid FROM jobs WHERE {FINISHED} ORDER BY received_at LIMIT ?"
            conn.execute(f"DELETE FROM events WHERE uuid IN ({oldest})", (excess,))
            conn.execute(f"DELETE FROM jobs WHERE uuid IN ({oldest})", (excess,))
        if sweep:
            conn.execute("DELETE FROM events WHERE uuid NOT IN (SELECT uuid FROM jobs)")
        conn.execute("COMMIT")

    # ---- operations (built by callers, run on the writer thread) ----------------

    def insert_op(self, rows: list[tuple[str, bytes, str, bytes, float]]) -> Op:
        """Record received jobs: (uuid, client, task, raw request body, received_at) each; a body
        is one `storable` passed (the worker keeps none that is not)."""
        # Bodies and results go in as bytes (SQLite keeps them as BLOBs): no decoded copy of a
        # large payload is made on the way to disk.
        return Rows(INSERT_SQL, rows)

    def storable(self, payload: Frame) -> bool:
        """True when a payload (a request body, a result) is within the bound the store writes;
        one over it is counted (zfab_worker_payloads_not_stored_total)."""
        if len(payload) <= self.max_payload_bytes:
            return True
        self.payloads_not_stored += 1
        return False

    def result_op(self, job: Job, status_code: str, result: bytes | None = None) -> Op:
        """Store a finished job: its result payload, or `result` in its place (over the payload
        bound, the runner's stand-in that says it was not kept)."""
        # An upsert: the job's result may be written before its receive batch is.
        row = (
            job.uuid,
            job.client,
            job.task,
            job.request,
            job.state.value,
            job.received_at,
            job.started_at,
            job.completed_at,
            status_code,
            job.result_payload if result is None else result,
        )

        return Rows(RESULT_SQL, [row])

    def event_op(self, uuid: str, seq: int, payload: bytes) -> Op:
        text = payload.decode()
        limit = self.max_events_per_job

        def op(conn: sqlite3.Connection) -> None:
            if seq < limit:
                conn.execute("INSERT OR REPLACE INTO events(uuid, seq, payload) VALUES (?,?,?)", (uuid, seq, text))

        return op

    def events_of(self, uuid: str) -> list[dict[str, Any]]:
        """A job's stored events, read on the calling thread through its own connection (WAL allows it)."""
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT payload FROM events WHERE uuid=? ORDER BY seq", (uuid,)).fetchall()
        finally:
            conn.close()
        return [json.loads(r[0]) for r in rows]

    def read(self, uuid: str, reply: Callable[[StoredJob | None], None], timeout: float = 0.0) -> None:
        """Look a job up on the writer thread (after what is queued before it); `reply` gets the answer there."""
        found: list[StoredJob | None] = [None]

        def op(conn: sqlite3.Connection) -> None:
            row = conn.execute(
                "SELECT uuid, client, task, state, status_code, result FROM jobs WHERE uuid=?", (uuid,)
            ).fetchone()
            if row is not None:
                found[0] = StoredJob(*row)

        self.submit(op, lambda: reply(found[0]), timeout=timeout)
