"""The worker's durable job store: one writer thread, SQLite in tmp_path, no sleeps — events with deadlines."""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import wait_for

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


def test_an_idle_writer_waits_for_the_result_that_follows_a_receive(path: Path) -> None:
    # One job at a time: its receive finds the writer idle, and its result comes a moment later.
    # The writer lingers (0.5 s here, so a slow machine cannot split them) and commits both in one
    # transaction: one row written, not an insert and an upsert.
    store = open_store(path, linger=0.5)
    try:
        commits = store.commits
        acked = threading.Event()
        reported: list[int] = []  # the commits made when the result's follow-up ran
        store.submit(store.insert_op([insert_row("solo")]), acked.set)
        wait_for(lambda: store.depth() == 0, WAIT, interval=0.001, what="the writer taking the receive")
        time.sleep(0.01)  # not a wait: the scenario's gap, the result comes after the writer's take
        store.submit(store.result_op(finished_job("solo", result=3), "200"), lambda: reported.append(store.commits))
        job, _ = read_now(store, "solo")
        assert job is not None and job.state == "completed" and acked.is_set()
        assert reported == [commits + 1]
    finally:
        store.close()


def test_a_result_that_follows_a_receive_is_reported_without_waiting_out_the_linger(path: Path) -> None:
    # Given a writer that would linger 60 s for company after a receive (it slept them out once, and every
    # job's result, reported once committed, waited with it: the sequential p50 1.36-1.57 ms, p90 3.5 ms)
    store = open_store(path, linger=60.0)
    try:
        reported = threading.Event()
        store.submit(store.insert_op([insert_row("solo")]))
        wait_for(lambda: store.depth() == 0, WAIT, interval=0.001, what="the writer taking the receive")
        # When the result comes, then it is committed and reported within 10 s: the linger ends with the
        # first write that comes (an order against the linger, not a time window)
        store.submit(store.result_op(finished_job("solo", result=3), "200"), reported.set)
        assert reported.wait(10)
        job, _ = read_now(store, "solo")
        assert job is not None and job.state == "completed"
    finally:
        store.close()


def test_a_read_that_finds_the_writer_idle_does_not_linger(tmp_path: Path) -> None:
    # Given a writer that would linger 60 s for company after a write
    store = open_store(tmp_path / "idle.db", linger=60.0)
    try:
        # When a read finds it idle, then GET answers within read_now's 10 s deadline: no linger (an
        # order against the linger, not a time window)
        job, _ = read_now(store, "nobody")
        assert job is None
    finally:
        store.close()


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
