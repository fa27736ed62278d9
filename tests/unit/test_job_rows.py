"""Which jobs the API's store gets a row of (api/jobs/table.py JobRecord.writable): a POST's job the broker
refused at once never does, even when the write its end asked for is still queued when POST drops it."""

from __future__ import annotations

from zfab import JobFuture
from zfab.api.jobs.record import JobRecord
from zfab.errors import BadRequestError, JobExpiredError


def record(fut: JobFuture, *, posted: bool = True) -> JobRecord:
    rec = JobRecord(fut.uuid, "demo", "nosuch", "any", fut, "")
    rec.row_once_taken = posted
    return rec


def ended(fut: JobFuture, error: Exception, *, refused: bool) -> JobFuture:
    if refused:
        fut.refused(error)
    else:
        fut.admitted("dispatched")
    fut.set_exception(error)
    return fut


def test_a_posted_job_the_broker_refused_at_once_gets_no_row() -> None:
    rec = record(ended(JobFuture("a" * 32), BadRequestError("task 'nosuch' is not a task"), refused=True))
    assert not rec.writable


def test_a_posted_job_that_was_taken_and_then_failed_gets_its_row() -> None:
    rec = record(ended(JobFuture("b" * 32), JobExpiredError("expired"), refused=False))
    assert rec.writable


def test_a_job_not_posted_by_a_caller_gets_its_row_even_when_refused() -> None:
    # (a schedule's or a recovery's: nobody was answered the refusal, so the row is what tells it)
    rec = record(ended(JobFuture("c" * 32), BadRequestError("no such task"), refused=True), posted=False)
    assert rec.writable


def test_a_posted_job_still_waiting_for_the_broker_may_be_written() -> None:
    assert record(JobFuture("d" * 32)).writable
