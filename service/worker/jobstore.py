"""A worker's durable job store: SQLite in WAL mode, written by one thread in batches.

The owner loop and job threads never wait on SQLite. A received or finished job's row is made
durable by one append to the store's journal on the thread that has it (`write`, journal.py), which
then goes on (the 201, the result's report); the writer thread folds journaled rows into SQLite in
one transaction per batch, every FLUSH_EVERY or sooner when they pile up. Other operations (events,
reads) go to the writer through a bounded queue, and a follow-up given with one runs once it is
committed. WAL with synchronous=NORMAL does not fsync per commit, nor does the journal per append,
so durability does not cap throughput.
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import payloads
from ..core.logbudget import LogBudget
from ..core.protocol import Frame
from ..core.states import UNFINISHED_STATES, JobState
from ..storage import open_sqlite
from . import journal as journals
from .journal import Journal

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

# Journaled rows wait for the writer at most this long: nothing waits on their commit (they are
# durable, and a read or any other queued operation wakes the writer, which folds them in first), so
# the wait only sets how many rows one transaction carries. A sequential echo worker used to commit
# each job alone, its receive held up to 2 ms for its result to share one commit: 150 us of the
# store's CPU and three thread wake-ups per job, on the job's path. Now a commit carries 50 ms of jobs.
FLUSH_EVERY = 0.05
# ...or sooner, when this many rows or bytes are waiting (the journal's records, what they hold).
PARK_ROWS = 512
PARK_BYTES = 8 * 1024 * 1024
# A writer so far behind that this much waits makes `write` wait for room (the queue's rule, in bytes).
MAX_PARKED_BYTES = 64 * 1024 * 1024
# Put in the queue for journaled rows: PARKED wakes a writer asleep with none (it then waits at most
# FLUSH_EVERY), FULL tells it rows are past PARK_ROWS or PARK_BYTES (it commits them now).
PARKED: tuple[Op, After | None] = (lambda conn: None, None)
FULL: tuple[Op, After | None] = (lambda conn: None, None)

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

    __slots__ = ("kind", "rows", "sql")

    def __init__(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self.sql = sql
        self.rows = rows
        self.kind = journals.INSERT if sql is INSERT_SQL else journals.RESULT  # its journal record's

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
        flush_every: float = FLUSH_EVERY,
        park_rows: int = PARK_ROWS,
        segment_bytes: int = journals.SEGMENT_BYTES,
        failure_payload: Callable[[str, str, str], bytes] | None = None,
    ) -> None:
        self.path = path
        self.batch = batch
        self.flush_every = flush_every
        self.park_rows = park_rows
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
        self.journal = Journal(path, segment_bytes=segment_bytes)
        # Journaled rows the writer has not folded yet, and their bytes (the journal's lock guards both).
        self._parked: list[tuple[Op, After | None]] = []
        self._parked_bytes = 0
        self._incoming: deque[tuple[Rows, After | None]] = deque()  # to append, whoever holds the lock
        self._full_told = False  # FULL is in the queue for the rows parked
        self._untimed = False  # the writer sleeps until the queue has something: a row parked must wake it
        self.replayed = 0  # rows a journal left by the previous run put into SQLite on open
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
        """Operations queued and journaled rows not folded into SQLite yet."""
        return self._q.qsize() + len(self._parked)

    def parked_bytes(self) -> int:
        return self._parked_bytes

    def submit(self, op: Op, after: After | None = None, timeout: float = 1.0) -> None:
        """Queue an operation; `after` runs on the writer thread once it is committed. Raises queue.Full
        when the store stays at its bound for `timeout` seconds."""
        self._wait_for_room(timeout)
        self._q.put((op, after))

    def write(self, rows: Rows, after: After | None = None, timeout: float = 1.0) -> None:
        """Record received or finished jobs (`insert_op`, `result_op`), durable by an append to the
        journal, then run `after`: here, or on another thread writing at the same moment, which appends
        what both have in one write and runs both follow-ups (no thread waits on another's write). The
        writer folds the rows into SQLite later. With the journal off (an append failed) it is `submit`:
        `after` runs on the writer once committed. Raises queue.Full when the store stays at its bound
        for `timeout` seconds."""
        if self._parked_bytes >= MAX_PARKED_BYTES or len(self._parked) + self._q.qsize() >= self.queue_size:
            self._wait_for_room(timeout)
        self._incoming.append((rows, after))
        self._append_incoming()

    def _append_incoming(self) -> None:
        """Any thread, after it queued rows or let go of the journal's lock: append what is waiting."""
        # Whoever holds the journal's lock writes what came meanwhile; a thread that finds it held
        # leaves its rows to the holder, which looks again once it has let go (so none is left behind).
        # Every job passes here twice (its receive, its result), so it is written lean: about 30 us of
        # CPU an append on a sequential echo's cold path, half of it the Python around the write(2).
        incoming, lock = self._incoming, self.journal.lock
        while incoming and lock.acquire(blocking=False):
            try:
                batch = [incoming.popleft()]
                while incoming:
                    batch.append(incoming.popleft())
                size = self.journal.append([(r.kind, r.rows) for r, _ in batch])
                wake = None
                if size:
                    parked = self._parked  # under the lock: the writer takes the list and leaves a new one
                    for r, _ in batch:
                        parked.append((r, None))  # follow-ups run here, not again at the commit
                    self._parked_bytes += size
                    if not self._full_told and (len(parked) >= self.park_rows or self._parked_bytes >= PARK_BYTES):
                        wake, self._full_told = FULL, True
                    elif self._untimed:
                        wake, self._untimed = PARKED, False  # one is enough: the writer's wait is timed from now
            finally:
                lock.release()
            if not size:
                for item in batch:
                    self._q.put(item)
                continue
            if wake is not None:
                self._q.put(wake)
            self._follow_up(batch)

    def _follow_up(self, items: list[tuple[Op, After | None]] | list[tuple[Rows, After | None]]) -> None:
        """Run each item's follow-up, in order; one that fails is counted and logged, the rest still run."""
        for _, after in items:
            if after is not None:
                try:
                    after()
                except Exception:
                    self.errors += 1
                    log.exception("job store: a follow-up failed")

    def _wait_for_room(self, timeout: float) -> None:
        """Until the store is below its bounds (operations and rows, and rows' bytes); queue.Full at timeout."""

        def full() -> bool:
            return self.depth() >= self.queue_size or self._parked_bytes >= MAX_PARKED_BYTES

        if not full():
            return
        deadline = time.monotonic() + timeout
        with self._room:
            self._waiting += 1
            try:
                while full():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise queue.Full
                    self._room.wait(left)
            finally:
                self._waiting -= 1

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
        self._replay(conn)
        self._recover(conn)
        self._prune(conn, sweep=True)
        self.stored_before = frozenset(r[0] for r in conn.execute("SELECT uuid FROM jobs"))
        ready.set()
        try:
            while True:
                # Asleep until the queue has something, unless rows are parked: then FLUSH_EVERY at most.
                # `_untimed` is set before the look at the rows, and `write` looks at it after it parked
                # one, so a row parked meanwhile is never left with the writer asleep for good.
                self._untimed = True
                timeout = None
                if self._parked:
                    self._untimed = False
                    timeout = self.flush_every
                try:
                    first = self._q.get(timeout=timeout)
                except queue.Empty:
                    first = FULL  # FLUSH_EVERY is over: the rows parked go now
                self._untimed = False
                if first is PARKED:
                    continue  # rows came to a writer asleep with none: it waits for more, FLUSH_EVERY at most
                stop = first is None
                items: list[tuple[Op, After | None]] = []
                if first is not None and first is not FULL:
                    items.append(first)
                while not stop and len(items) < self.batch:
                    try:
                        nxt = self._q.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                    elif nxt is not FULL and nxt is not PARKED:
                        items.append(nxt)
                # Rows not journaled yet go in first (left to this thread while it held the lock), then
                # the rows parked so far, taken after the queue's items: a read queued after a row was
                # written sees it (a batch writes its rows before any other operation).
                self._append_incoming()
                parked, below = self._take_parked()
                self._append_incoming()  # rows left while it held the lock: reported now, committed next round
                if parked or items:
                    self._commit(conn, parked + items, below)
                else:
                    self.journal.release(below)
                if self._waiting:
                    with self._room:
                        self._room.notify_all()
                if stop:
                    parked, below = self._take_parked()  # what came while it committed: nothing is left
                    if parked:
                        self._commit(conn, parked, below)
                    self.journal.close()
                    return
        finally:
            conn.close()

    def _take_parked(self) -> tuple[list[tuple[Op, After | None]], int]:
        """Writer: the rows parked so far, and the journal segments they release once committed."""
        with self.journal.lock:
            parked, self._parked, self._parked_bytes = self._parked, [], 0
            self._full_told = False
            return parked, self.journal.bound()

    def _commit(self, conn: sqlite3.Connection, items: list[tuple[Op, After | None]], below: int = 0) -> None:
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
        self.journal.release(below)  # the segments below it hold rows just committed, or committed before
        self._follow_up(items)
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

    def _replay(self, conn: sqlite3.Connection) -> None:
        """Rows the previous run journaled and did not fold into SQLite, written now: before unfinished
        jobs are marked interrupted, so a job whose result was reported reads as finished."""
        records = list(self.journal.replay())
        if records:
            conn.execute("BEGIN")
            for kind, rows in records:
                self._apply(conn, Rows(INSERT_SQL if kind == journals.INSERT else RESULT_SQL, rows))
            conn.execute("COMMIT")
            self.replayed = sum(len(rows) for _, rows in records)
            log.info("job store %s: %d rows from the journal of the previous run written", self.path, self.replayed)
        self.journal.release(self.journal.segment)

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

    def insert_op(self, rows: list[tuple[str, bytes, str, bytes, float]]) -> Rows:
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

    def result_op(self, job: Job, status_code: str, result: bytes | None = None) -> Rows:
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
