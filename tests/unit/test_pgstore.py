"""The PostgreSQL store's pure pieces (no server): which ZFAB_API_DB values mean PostgreSQL, URLs in logs,
NOTIFY payloads under PostgreSQL's size limit, and which of a job's events a write carries."""

from __future__ import annotations

import time

from zfab.api.jobs.record import JobRecord
from zfab.api.store.base import is_postgres_url, redacted
from zfab.api.store.postgres import NOTIFY_BYTES, notify_payloads, written
from zfab.client.future import JobFuture


def test_postgres_urls_and_paths() -> None:
    assert is_postgres_url("postgresql://u:p@db:5432/zfab") and is_postgres_url("postgres://db/zfab")
    assert (
        not is_postgres_url("/var/lib/zfab/api/jobs.sqlite") and not is_postgres_url("") and not is_postgres_url(None)
    )
    assert redacted("postgresql://zfab:s3cret@db:5432/zfab") == "postgresql://zfab:***@db:5432/zfab"
    assert redacted("postgresql://zfab@db/zfab") == "postgresql://zfab@db/zfab"  # nothing to hide


def test_notify_payloads_stay_under_the_limit_and_lose_nothing() -> None:
    ids = [f"{i:032x}" for i in range(1000)]
    payloads = notify_payloads(ids)
    assert len(payloads) > 1 and all(len(p) <= NOTIFY_BYTES for p in payloads)
    assert [i for p in payloads for i in p.split(",")] == ids
    assert notify_payloads([]) == []


def job(uuid: str, events: int, max_events: int = 1000) -> JobRecord:
    fut = JobFuture(uuid, max_events=max_events)
    fut.timings["submitted"] = time.time()
    for i in range(events):
        fut.add_event({"event_type": "progress", "message": f"step {i + 1}"}, 40)
    return JobRecord(uuid, "demo", "progress", "any", fut, "")


def test_a_write_carries_the_events_not_written_yet_numbered_in_the_job() -> None:
    rec = job("j1", 3)
    w = written(rec, "tcp://b", "replica-1")
    assert [(e[0], e[1]) for e in w.events] == [("j1", 1), ("j1", 2), ("j1", 3)] and w.total == 3
    assert w.row[13] == "replica-1" and w.row[14] >= len(w.row[11]) + sum(e[3] for e in w.events)
    rec.events_written, rec.event_bytes = w.total, w.event_bytes  # what a committed write records
    assert rec.future is not None
    rec.future.add_event({"event_type": "progress", "message": "step 4"}, 40)
    again = written(rec, "tcp://b", "replica-1")
    assert [e[1] for e in again.events] == [4] and again.total == 4


def test_events_the_client_dropped_before_a_write_are_skipped_not_renumbered() -> None:
    rec = job("j2", 5, max_events=2)  # the client's buffer kept the last two of five
    w = written(rec, "tcp://b", "r")
    assert [e[1] for e in w.events] == [4, 5] and w.total == 5
