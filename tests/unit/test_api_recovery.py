"""The API's rules for jobs across restarts (issue 39), without a fabric: when a job counts as refused
(an Idempotency-Key retry may submit it again), and when a recovered attempt was cut short."""

from __future__ import annotations

from zfab import JobFuture
from zfab.api.jobs.record import JobRecord
from zfab.api.jobs.recovery import cut_short
from zfab.core import payloads
from zfab.errors import BusyError, JobNotFoundError


def record(fut: JobFuture) -> JobRecord:
    return JobRecord(fut.uuid, "demo", "echo", "any", fut, "fp")


def test_a_refused_first_attempt_may_be_submitted_again_but_never_a_refused_later_one() -> None:
    first = JobFuture("a")
    first.set_exception(BusyError("full"))
    assert record(first).refused()
    later = JobFuture("b")
    later.attempt = 2  # attempt 1 ran (its worker was lost); the retry was turned away
    later.set_exception(BusyError("full"))
    assert not record(later).refused()


def test_a_recovered_attempt_was_cut_short_when_nobody_knows_it_or_its_worker_restarted() -> None:
    gone = JobFuture("g")
    gone.set_exception(JobNotFoundError("no worker knows job g"))
    assert cut_short(gone) == "no worker knows job g"
    cut = JobFuture("c")
    cut.set_result({"w1": {"failed": True, "errors": [payloads.INTERRUPTED], "result": None}})
    assert "interrupted" in (cut_short(cut) or "")
    ran = JobFuture("r")
    ran.set_result({"w1": {"failed": True, "errors": ["ValueError: boom"], "result": None}})
    assert cut_short(ran) is None  # the task itself failed: not a restart's doing
