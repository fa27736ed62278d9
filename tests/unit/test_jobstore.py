"""The worker's durable job store: one writer thread, SQLite in tmp_path, no sleeps — events with deadlines."""

from __future__ import annotations

import json
import logging
import os
import queue
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from zfab.worker import journal
from zfab.worker.job import Job, JobState
from zfab.worker.jobstore import SCHEMA_VERSION, JobStore, StoredJob

WAIT = 10.0  # seconds; a deadline, never a sleep


def open_store(path: Path, **kw: int | float) -> JobStore:
    store = JobStore(path, **kw)  # type: ignore[arg-type]
    store.open()
    return store


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "jobs" / "store.db"


@pytest.fixture
def store(path: Path) -> Iterator[JobStore]:
    s = open_store(path)
    yield s
    s.close()


def read_now(store: JobStore, uuid: str) -> tuple[StoredJob | None, list[str]]:
    """Read the job on the writer thread (after all queued writes) and its events as stored text."""
    done = threading.Event()
    answer: list[StoredJob | None] = []

    def reply(job: StoredJob | None) -> None:
        answer.append(job)
        done.set()

    store.read(uuid, reply, timeout=WAIT)
    assert done.wait(WAIT), "the job store did not answer a read in time"
    events = [json.dumps(e, separators=(",", ":")) for e in store.events_of(uuid)]
    return answer[0], events


def flush(store: JobStore) -> None:
    """Wait until everything submitted so far is committed."""
    done = threading.Event()
    store.submit(lambda conn: None, done.set, timeout=WAIT)
    assert done.wait(WAIT), "the job store did not commit in time"


def finished_job(uuid: str, *, received_at: float | None = None, result: object = "ok") -> Job:
    now = time.time()
    job = Job(
        uuid=uuid,
        client=b"client-a",
        task="echo",
        args=[],
        kwargs={},
        timeout=None,
        push=True,
        ack=True,
        request=b'{"task":"echo"}',
        received_at=received_at if received_at is not None else now,
    )
    job.started_at, job.completed_at = job.received_at, now
    job.state = JobState.COMPLETED
    job.result_payload = json.dumps({"w1": {"result": result, "failed": False}}).encode()
    return job


def insert_row(uuid: str, received_at: float | None = None) -> tuple[str, bytes, str, bytes, float]:
    return (uuid, b"client-a", "echo", b'{"task":"echo"}', received_at if received_at is not None else time.time())


# ---- writes and reads ----------------------------------------------------------------


def test_received_job_is_stored_without_a_result(store: JobStore) -> None:
    store.submit(store.insert_op([insert_row("job-1")]))

    job, events = read_now(store, "job-1")

    assert job == StoredJob("job-1", b"client-a", "echo", "queued", None, None)
    assert events == []


def test_result_after_insert_completes_the_row(store: JobStore) -> None:
    # Given a received job
    store.submit(store.insert_op([insert_row("job-1")]))

    # When its result is written
    store.submit(store.result_op(finished_job("job-1", result=42), "200"))

    # Then the row carries the state, status and result
    job, _ = read_now(store, "job-1")
    assert job is not None
    assert (job.state, job.status_code) == ("completed", "200")
    assert job.result is not None and json.loads(job.result) == {"w1": {"result": 42, "failed": False}}


def test_result_written_before_its_insert_still_leaves_a_complete_row(store: JobStore) -> None:
    # Given a fast job whose result reaches the store before its receive batch
    store.submit(store.result_op(finished_job("job-1"), "200"))

    # When the late insert arrives
    store.submit(store.insert_op([insert_row("job-1")]))

    # Then the insert does not overwrite the finished row
    job, _ = read_now(store, "job-1")
    assert job is not None
    assert (job.state, job.status_code, job.client, job.task) == ("completed", "200", b"client-a", "echo")
    assert job.result is not None


def test_unknown_job_reads_as_none(store: JobStore) -> None:
    assert read_now(store, "never-stored") == (None, [])


def test_after_callback_runs_once_the_write_is_committed(store: JobStore) -> None:
    seen: list[int] = []
    done = threading.Event()

    def after() -> None:
        # On the writer thread, after COMMIT: another connection already sees the row
        with sqlite3.connect(store.path) as other:
            seen.append(other.execute("SELECT count(*) FROM jobs WHERE uuid='job-1'").fetchone()[0])
        other.close()
        done.set()

    store.submit(store.insert_op([insert_row("job-1")]), after)

    assert done.wait(WAIT)
    assert seen == [1]


def test_a_failing_operation_is_skipped_and_counted_while_others_commit(store: JobStore) -> None:
    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO no_such_table VALUES (1)")

    store.submit(broken)
    store.submit(store.insert_op([insert_row("job-1")]))

    job, _ = read_now(store, "job-1")
    assert job is not None
    assert store.errors == 1


# ---- events --------------------------------------------------------------------------


def test_events_are_read_back_in_sequence_order(store: JobStore) -> None:
    store.submit(store.insert_op([insert_row("job-1")]))
    for seq in (2, 0, 1):
        store.submit(store.event_op("job-1", seq, json.dumps({"seq": seq}).encode()))

    _, events = read_now(store, "job-1")

    assert [json.loads(e)["seq"] for e in events] == [0, 1, 2]


def test_events_beyond_the_per_job_bound_are_dropped(path: Path) -> None:
    store = open_store(path, max_events_per_job=3)
    try:
        store.submit(store.insert_op([insert_row("job-1")]))
        for seq in range(6):
            store.submit(store.event_op("job-1", seq, f'{{"seq":{seq}}}'.encode()))

        _, events = read_now(store, "job-1")
    finally:
        store.close()

    assert events == ['{"seq":0}', '{"seq":1}', '{"seq":2}']


# ---- recovery and retention ----------------------------------------------------------


def test_reopening_marks_unfinished_jobs_interrupted_with_a_failed_result(path: Path) -> None:
    # Given a store closed with two jobs received but never finished, and one finished
    first = open_store(path)
    first.submit(first.insert_op([insert_row("queued-1"), insert_row("queued-2")]))
    first.submit(first.result_op(finished_job("done-1"), "200"))
    flush(first)
    first.close()

    # When the worker starts again on the same store
    second = open_store(path)
    try:
        queued, _ = read_now(second, "queued-1")
        done, _ = read_now(second, "done-1")
    finally:
        second.close()

    # Then the unfinished jobs end as failed, interrupted; the finished one is untouched
    assert second.interrupted_on_open == 2
    assert queued is not None
    assert (queued.state, queued.status_code) == ("interrupted", "200")
    assert queued.result is not None
    entry = json.loads(queued.result)
    assert entry["failed"] is True and entry["juuid"] == "queued-1" and entry["task"] == "echo"
    assert "interrupted" in entry["errors"][0]
    assert done is not None and done.state == "completed"


def test_a_row_an_older_worker_wrote_as_received_is_still_unfinished_on_reopening(path: Path) -> None:
    # Given a store whose queued job an older worker wrote with its own word for it, 'received'
    first = open_store(path)
    first.submit(first.insert_op([insert_row("old-1")]))
    flush(first)
    first.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE jobs SET state='received' WHERE uuid='old-1'")
    # When the worker starts again on it
    second = open_store(path)
    try:
        old, _ = read_now(second, "old-1")
    finally:
        second.close()
    # Then that job ends as interrupted, like one written as queued
    assert second.interrupted_on_open == 1
    assert old is not None and old.state == "interrupted"


def test_reopening_a_clean_store_interrupts_nothing(path: Path) -> None:
    first = open_store(path)
    first.submit(first.result_op(finished_job("done-1"), "200"))
    first.close()

    second = open_store(path)
    try:
        done, _ = read_now(second, "done-1")
    finally:
        second.close()

    assert second.interrupted_on_open == 0
    assert done is not None and done.state == "completed"
    assert not [p.name for p in path.parent.iterdir() if ".v" in p.name]  # nothing moved aside


def test_retention_by_count_prunes_the_oldest_finished_jobs_and_their_events(path: Path) -> None:
    # Given a store that keeps 1,002 records, holding four finished jobs, the oldest with events
    store = open_store(path, retention_count=1002)
    try:
        base = time.time() - 100
        for i in range(4):
            store.submit(store.result_op(finished_job(f"done-{i}", received_at=base + i), "200"))
        store.submit(store.event_op("done-0", 0, b'{"progress":1}'))

        # When enough new jobs arrive to trigger a prune (a prune runs every 1000 inserts)
        store.submit(store.insert_op([insert_row(f"new-{i}") for i in range(1000)]))
        flush(store)

        # Then the two oldest finished jobs went (1,004 records), received jobs are never pruned
        remaining = {u: read_now(store, u)[0] is not None for u in ("done-0", "done-1", "done-2", "done-3")}
        assert remaining == {"done-0": False, "done-1": False, "done-2": True, "done-3": True}
        assert read_now(store, "new-0")[0] is not None
        assert read_now(store, "new-999")[0] is not None
    finally:
        store.close()

    with sqlite3.connect(path) as conn:
        orphans = conn.execute("SELECT count(*) FROM events WHERE uuid='done-0'").fetchone()[0]
    conn.close()
    assert orphans == 0


def test_retention_by_age_prunes_old_finished_jobs_on_open(path: Path) -> None:
    first = open_store(path)
    first.submit(first.result_op(finished_job("old", received_at=time.time() - 7200), "200"))
    first.submit(first.result_op(finished_job("recent"), "200"))
    first.close()

    second = open_store(path, retention_seconds=3600)
    try:
        assert read_now(second, "old")[0] is None
        assert read_now(second, "recent")[0] is not None
    finally:
        second.close()


# ---- schema versions -----------------------------------------------------------------


def test_store_with_another_schema_version_is_moved_aside_not_misread(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a store file written by another zfab version
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE jobs (uuid TEXT PRIMARY KEY, payload TEXT)")
        conn.execute("INSERT INTO jobs VALUES ('old-job', 'old format')")
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()

    # When the store opens
    with caplog.at_level(logging.WARNING, logger="zfab.worker.jobstore"):
        store = open_store(path)
    try:
        found, _ = read_now(store, "old-job")
    finally:
        store.close()

    # Then the old file is kept aside intact and the new store starts empty at the current version
    assert found is None
    aside = [p for p in path.parent.iterdir() if p.name.startswith(f"store.db.v{SCHEMA_VERSION + 1}.")]
    assert len(aside) == 1
    with sqlite3.connect(aside[0]) as old:
        assert old.execute("SELECT payload FROM jobs").fetchall() == [("old format",)]
    old.close()
    with sqlite3.connect(path) as new:
        assert new.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    new.close()
    assert "moved aside" in caplog.text


# ---- backpressure --------------------------------------------------------------------


def test_submit_on_a_full_queue_raises_queue_full(path: Path) -> None:
    # Given a store with room for one queued operation, whose writer is stuck on another
    store = open_store(path, queue_size=1)
    started, release = threading.Event(), threading.Event()

    def stuck(conn: sqlite3.Connection) -> None:
        started.set()
        release.wait(WAIT)

    try:
        store.submit(stuck)
        assert started.wait(WAIT)
        store.submit(lambda conn: None)  # fills the queue

        # When one more operation is submitted
        with pytest.raises(queue.Full):
            store.submit(lambda conn: None, timeout=0.05)
        assert store.depth() == 1
    finally:
        release.set()
        store.close()


# ---- one batch: receives and results merged ------------------------------------------


def hold_writer(store: JobStore) -> threading.Event:
    """Block the writer on an operation until the returned event is set, so what is submitted
    meanwhile is committed as one batch."""
    release, holding = threading.Event(), threading.Event()

    def block(conn: sqlite3.Connection) -> None:
        holding.set()
        release.wait(WAIT)

    store.submit(block)
    assert holding.wait(WAIT)
    return release


def test_a_job_received_and_finished_in_one_batch_is_stored_finished(store: JobStore) -> None:
    release = hold_writer(store)
    acked = threading.Event()
    store.submit(store.insert_op([insert_row("both"), insert_row("only-received")]), acked.set)
    store.submit(store.result_op(finished_job("both", result=7), "200"))
    commits = store.commits
    release.set()

    both, _ = read_now(store, "both")
    received, _ = read_now(store, "only-received")
    assert acked.is_set()  # the receive's follow-up (the 201) still runs
    assert both is not None and both.state == "completed" and both.result is not None
    assert json.loads(both.result)["w1"]["result"] == 7
    assert received is not None and received.state == "queued"
    assert store.commits <= commits + 3  # the held batch, then the merged one, then the reads


# ---- the journal: durable at once, folded into SQLite later ------------------------------


def test_a_write_is_durable_and_followed_up_at_once_and_a_read_sees_it(store: JobStore) -> None:
    # Given a receive and a result written as a job's threads write them
    followed: list[str] = []
    store.write(store.insert_op([insert_row("solo")]), lambda: followed.append("201"))
    store.write(store.result_op(finished_job("solo", result=3), "200"), lambda: followed.append("report"))
    # Then each follow-up ran on this thread before write returned (no wait on the writer)
    assert followed == ["201", "report"]
    # And a read, queued after, finds the job finished: the writer folds journaled rows in before it
    job, _ = read_now(store, "solo")
    assert job is not None and job.state == "completed" and json.loads(job.result or "")["w1"]["result"] == 3


def test_jobs_written_one_at_a_time_are_committed_together(path: Path) -> None:
    # Given a writer that folds rows in every 60 s, and 20 jobs received and finished one after another
    store = open_store(path, flush_every=60.0)
    try:
        before = store.commits
        for i in range(20):
            store.write(store.insert_op([insert_row(f"one-{i}")]))
            store.write(store.result_op(finished_job(f"one-{i}"), "200"))
        # When a read comes, then one commit carries all 20 (a writer woken per job committed each alone)
        job, _ = read_now(store, "one-19")
        assert job is not None and job.state == "completed"
        assert store.commits == before + 1
    finally:
        store.close()


CRASH_AFTER_WRITES = """
import os, sys, threading, time
from pathlib import Path
from zfab.worker.jobstore import JobStore
sys.path[:0] = [{tests!r}, {conftest!r}]
from test_jobstore import finished_job, insert_row
store = JobStore(Path({path!r}))
store.open()
holding = threading.Event()
store.submit(lambda conn: (holding.set(), time.sleep(60)))  # the writer stuck inside a transaction
assert holding.wait(10)
store.write(store.insert_op([insert_row("ran"), insert_row("running")]))
store.write(store.result_op(finished_job("ran", result=5), "200"), lambda: print("reported", flush=True))
os._exit(0)  # a crash: nothing committed, nothing closed
"""


def test_a_result_reported_before_a_crash_reads_as_finished_after_it(path: Path) -> None:
    # Given a worker process that journaled a receive of two jobs and one's result, reported it, and
    # died before its writer committed anything (the writer was stuck in a transaction)
    path.parent.mkdir(parents=True)
    here = Path(__file__).parent
    code = CRASH_AFTER_WRITES.format(tests=str(here), conftest=str(here.parent), path=str(path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "reported", done.stderr
    assert list(path.parent.glob("*.journal.*")), "the journal holds the rows"
    # When the store opens again
    store = open_store(path)
    try:
        # Then the reported job reads as finished with its result, the other as interrupted (it was
        # running), and the journal is gone once its rows are in SQLite
        assert store.replayed == 3
        ran, _ = read_now(store, "ran")
        running, _ = read_now(store, "running")
        assert ran is not None and ran.state == "completed" and json.loads(ran.result or "")["w1"]["result"] == 5
        assert running is not None and running.state == "interrupted"
        assert store.stored_before >= {"ran", "running"}
        assert not list(path.parent.glob("*.journal.*"))
    finally:
        store.close()


def test_a_torn_record_ends_its_segment_and_is_counted(path: Path) -> None:
    # Given a journal whose last record a crash cut short
    path.parent.mkdir(parents=True)
    writer = journal.Journal(path)
    with writer.lock:
        assert writer.append([(journal.INSERT, [insert_row("whole")])]) > 0
        assert writer.append([(journal.INSERT, [insert_row("torn")])]) > 0
    segment = writer.segments()[0][1]
    segment.write_bytes(segment.read_bytes()[:-5])
    # When the store opens, then the whole record is written and the torn one skipped and counted
    store = open_store(path)
    try:
        assert store.replayed == 1 and store.journal.torn == 1
        whole, _ = read_now(store, "whole")
        torn, _ = read_now(store, "torn")
        assert whole is not None and whole.state == "interrupted" and torn is None
    finally:
        store.close()


@pytest.mark.parametrize(
    ("kind", "body"),
    [
        (3, b""),
        (3, b"\x91\x01"),  # an array whose row is not an array
        (3, journal.encode([("u", 1)]) + b"x"),  # bytes after the rows
        (3, journal.encode([("u", 1)])[:-1]),  # cut short
        (1, b""),
        (1, b"\x01\x00\x00\x00"),
        (1, b"\x01\x00\x00\x00\x01\x00\x00\x00Sxxxx"),
    ],
)
def test_a_body_that_does_not_add_up_is_refused(kind: int, body: bytes) -> None:
    with pytest.raises(ValueError):
        journal.decode(kind, body)


def test_rows_of_every_type_come_back_as_written() -> None:
    rows = [("u", b"\x00\xff", "t\u00e9", None, 1.5, 7, memoryview(b"view"))]
    back = journal.decode(3, journal.encode(rows))
    assert back == [("u", b"\x00\xff", "t\u00e9", None, 1.5, 7, b"view")]


def test_a_journal_in_the_older_tagged_format_is_replayed(path: Path) -> None:
    # Given a segment an older zfab wrote (kind 2: a finished job's row, fields tagged), left by a crash
    def tagged(*fields: object) -> bytes:
        out = struct.pack("<II", 1, len(fields))
        for f in fields:
            if f is None:
                out += b"N"
            elif isinstance(f, float):
                out += b"F" + struct.pack("<d", f)
            elif isinstance(f, str):
                out += b"S" + struct.pack("<I", len(f.encode())) + f.encode()
            else:
                assert isinstance(f, bytes)
                out += b"B" + struct.pack("<I", len(f)) + f
        return out

    result = json.dumps({"w1": {"result": 5, "failed": False}}).encode()
    now = time.time()
    body = tagged("old", b"c1", "add", b"{}", "completed", now, now, now, "200", result)
    path.parent.mkdir(parents=True)
    segment = path.parent / f"{path.name}.journal.00000000"
    segment.write_bytes(struct.pack("<BII", 2, len(body), zlib.crc32(body)) + body)
    # When the store opens, then the row is written, and the job reads as finished
    store = open_store(path)
    try:
        assert store.replayed == 1 and store.journal.torn == 0
        old, _ = read_now(store, "old")
        assert old is not None and old.state == "completed" and json.loads(old.result or "")["w1"]["result"] == 5
    finally:
        store.close()


def test_committed_segments_are_deleted_so_the_journal_stays_bounded(path: Path) -> None:
    # Given segments of 1 KiB and 200 jobs written, each with its result
    store = open_store(path, segment_bytes=1024)
    try:
        for i in range(200):
            store.write(store.insert_op([insert_row(f"job-{i}")]))
            store.write(store.result_op(finished_job(f"job-{i}"), "200"))
        # When the writer has folded them in, then every segment but the one written to is gone
        flush(store)
        assert len(store.journal.segments()) <= 1
        assert store.journal.bytes_held <= 1024 + 1024  # one segment, and one record past its size
        job, _ = read_now(store, "job-199")
        assert job is not None and job.state == "completed"
    finally:
        store.close()
    assert not store.journal.segments()  # closed: everything committed, nothing left to replay
    again = open_store(path)
    try:
        assert again.replayed == 0
        job, _ = read_now(again, "job-199")
        assert job is not None and job.state == "completed"
    finally:
        again.close()


def test_rows_waiting_for_the_writer_count_against_the_store_bound(path: Path) -> None:
    # Given a store of 3 places whose writer is stuck
    store = open_store(path, queue_size=3)
    release = hold_writer(store)
    try:
        store.write(store.insert_op([insert_row("a")]))
        store.write(store.insert_op([insert_row("b")]))
        store.write(store.insert_op([insert_row("c")]))
        assert store.depth() >= 3
        # When one more is written, then it is refused as busy, not held without bound
        with pytest.raises(queue.Full):
            store.write(store.insert_op([insert_row("d")]), timeout=0.05)
    finally:
        release.set()
        store.close()


def test_when_the_journal_fails_a_row_is_committed_before_its_follow_up(store: JobStore) -> None:
    # Given a journal whose file went away under it (a full disk looks the same to the store)
    store.write(store.insert_op([insert_row("first")]))
    assert store.journal._fd is not None
    os.close(store.journal._fd)
    # When a result is written, then its follow-up waits for the commit, on the writer
    seen: list[int] = []
    done = threading.Event()

    def reported() -> None:
        seen.append(store.commits)
        done.set()

    store.write(store.result_op(finished_job("second"), "200"), reported)
    assert done.wait(WAIT) and store.journal.broken
    assert seen[0] >= 1
    job, _ = read_now(store, "second")
    assert job is not None and job.state == "completed"
    store.journal._fd = None  # closed above: the store's close must not close it twice


def test_a_bad_row_in_a_merged_batch_costs_only_itself(store: JobStore) -> None:
    release = hold_writer(store)
    bad = ("bad", b"client-a", {"not": "bindable"}, b"{}", time.time())  # SQLite cannot bind a dict
    store.submit(store.insert_op([insert_row("good-1")]))
    store.submit(store.insert_op([bad, insert_row("good-2")]))  # type: ignore[list-item]
    release.set()

    assert read_now(store, "good-1")[0] is not None
    assert read_now(store, "good-2")[0] is not None
    assert read_now(store, "bad")[0] is None
    assert store.errors == 1
