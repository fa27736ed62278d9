"""The API's rules for jobs across restarts (issue 39), without a fabric: when a job counts as refused
(an Idempotency-Key retry may submit it again), and when a recovered attempt was cut short."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from zfab import JobFuture
from zfab.api.jobs import recovery
from zfab.api.jobs.record import JobRecord
from zfab.api.jobs.recovery import cut_short
from zfab.api.models import Job, JobState
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


def test_a_job_whose_worker_is_missing_after_a_restart_waits_a_hold_time_before_the_live_workers_are_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a broker restart the API may recover a running job before its worker re-registered: the live
    workers, which never had it, would say "not known" and the job would end lost while it runs. Its own
    worker is waited for a hold time; then, still missing, it counts as gone and the live ones are asked."""
    now = [100.0]
    live: list[str] = ["w1"]
    asked: list[list[str]] = []

    async def service_workers(st: Any, service: str) -> list[str]:
        return list(live)

    def ask(st: Any, rec: JobRecord, workers: list[str], **_: Any) -> None:
        asked.append(workers)

    monkeypatch.setattr(recovery, "_clock", lambda: now[0])
    monkeypatch.setattr(recovery, "_service_workers", service_workers)
    monkeypatch.setattr(recovery, "_ask", ask)
    st = SimpleNamespace(client=SimpleNamespace(keepalive=SimpleNamespace(hold_time=15.0)))
    stored = Job(
        uuid="j",
        service="demo",
        task="echo",
        workers="any",
        state=JobState.RUNNING,
        results=None,
        submitted_at=datetime.now(UTC),
        timings={},
    )
    rec = JobRecord("j", "demo", "echo", "any", None, "fp", stored=stored, ran_on=["w2"], timeout=600)

    asyncio.run(recovery.ensure_live(st, rec))  # type: ignore[arg-type]
    assert asked == []  # w2 is not back yet: nobody asked
    now[0] += 14.0
    asyncio.run(recovery.ensure_live(st, rec))  # type: ignore[arg-type]
    assert asked == []
    live.append("w2")  # back: asked, not the others
    asyncio.run(recovery.ensure_live(st, rec))  # type: ignore[arg-type]
    assert asked == [["w2"]]
    now[0] += 600.0  # a second broker restart much later: w2 missing again is waited for afresh
    live.remove("w2")
    asyncio.run(recovery.ensure_live(st, rec))  # type: ignore[arg-type]
    assert asked == [["w2"]]
    live.append("w2")

    asked.clear()
    gone = JobRecord("k", "demo", "echo", "any", None, "fp", stored=stored, ran_on=["w3"], timeout=600)
    asyncio.run(recovery.ensure_live(st, gone))  # type: ignore[arg-type]
    now[0] += 15.0  # a hold time later w3 is still missing: gone, and the live workers are asked
    asyncio.run(recovery.ensure_live(st, gone))  # type: ignore[arg-type]
    assert asked == [["w1", "w2"]]
