"""The scheduler's decisions without a fabric: what fires when, what waits for a silent broker, what pause,
resume, re-time and delete do, and what a restart brings back (an in-memory or temporary store, a fake clock)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from zfab import JobFuture
from zfab.api.jobs.record import JobRecord
from zfab.api.schedules.scheduler import Scheduler, next_wake, plan
from zfab.api.store.schedules import ScheduleRecord, ScheduleStore

JOB = {"service": "demo", "task": "echo"}


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rec(sid: str, next_run_at: float | None, every: float = 10.0) -> ScheduleRecord:
    return ScheduleRecord(id=sid, job=JOB, every=every, cron=None, next_run_at=next_run_at)


def run(fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(fn())


def test_due_schedules_fire_and_the_others_set_the_wake_up() -> None:
    a, b, c = rec("a", 100.0), rec("b", 105.0), rec("c", None)
    due, recheck = plan([a, b, c], 101.0, 0.0, None)
    assert due == [a] and recheck is None
    assert next_wake([a, b, c], 101.0, None) == 105.0
    assert next_wake([c], 101.0, None) is None  # nothing ever due: sleep the longest


def test_a_silent_broker_holds_a_due_firing_for_one_hold_time() -> None:
    a = rec("a", 100.0)
    # Within the hold time (15 s) of its due time: held, looked at again one step (2.5 s) later
    due, recheck = plan([a], 110.0, 0.0, (15.0, 2.5))
    assert due == [] and recheck == 112.5
    assert next_wake([a], 110.0, recheck) == 112.5
    # Past it: fires (and will be counted refused)
    assert plan([a], 116.0, 0.0, (15.0, 2.5)) == ([a], None)


def test_after_a_restart_the_hold_counts_from_the_start_not_from_the_old_due_time() -> None:
    # Due an hour before the scheduler started: still given a hold time for the broker to answer
    a = rec("a", 1000.0 - 3600)
    assert plan([a], 1001.0, 1000.0, (15.0, 2.5)) == ([], 1003.5)
    assert plan([a], 1001.0, 1000.0, None) == ([a], None)  # the broker answers: fires at once


def test_a_firing_refused_by_the_fabric_is_counted_and_the_schedule_moves_on() -> None:
    async def scenario() -> None:
        clock = Clock()
        s = Scheduler(lambda: None, ScheduleStore(None, 100), capacity=10, clock=clock)  # no API state: refused
        r = await s.add(JOB, 10.0, None, "t", False)
        assert r.next_run_at == clock.now + 10
        clock.now += 10
        assert s.fire(r, clock.now) is None
        assert r.failures == 1 and r.runs == 0 and r.last_error and r.next_run_at == clock.now + 10
        s.store.close()

    run(scenario)


def test_pause_resume_retime_and_delete() -> None:
    async def scenario() -> None:
        clock = Clock()
        s = Scheduler(lambda: None, ScheduleStore(None, 100), capacity=2, clock=clock)
        r = await s.add(JOB, 10.0, None, None, False)
        await s.update(r, {"paused": True})
        assert r.paused and r.next_run_at is None
        clock.now += 100
        await s.update(r, {"paused": False})  # from now: the paused slots are not caught up
        assert not r.paused and r.next_run_at == clock.now + 10
        await s.update(r, {"cron": "0 * * * *", "every": None})
        assert r.every is None and r.next_run_at is not None and r.next_run_at % 3600 == 0
        await s.add(JOB, 5.0, None, None, True)
        assert s.full()
        await s.delete(r)
        assert r.id not in s.schedules and not s.full()
        s.store.close()

    run(scenario)


def test_a_restart_brings_back_schedules_runs_and_the_job_mapping(tmp_path: Path) -> None:
    db = tmp_path / "api.sqlite"

    async def first_life() -> str:
        s = Scheduler(lambda: None, ScheduleStore(db, 100), capacity=10, clock=Clock())
        r = await s.add(JOB, 10.0, None, "kept", False)
        r.runs = 2
        r.last_jobs.extend(["j1", "j2"])
        for job in ("j1", "j2"):
            s.made.put(job, r.id)
        await s._save([r], [("j1", r.id, 1.0), ("j2", r.id, 2.0)])
        await s.stop()
        return r.id

    sid = asyncio.run(first_life())

    async def second_life() -> None:
        s = Scheduler(lambda: None, ScheduleStore(db, 100), capacity=10, clock=Clock(2_000_000.0))
        await s.start()
        r = s.schedules[sid]
        assert r.name == "kept" and r.runs == 2 and list(r.last_jobs) == ["j1", "j2"]
        assert s.schedule_of("j2") == sid and s.jobs_of(sid) == ["j2", "j1"]
        # It was due long ago: due now, once
        assert plan(s.schedules.values(), 2_000_000.0, 0.0, None) == ([r], None)
        await s.stop()

    asyncio.run(second_life())


def test_a_schedule_is_found_by_its_name_and_a_name_has_one_owner() -> None:
    async def scenario() -> None:
        s = Scheduler(lambda: None, ScheduleStore(None, 100), capacity=10, clock=Clock())
        r = await s.add(JOB, 10.0, None, "nightly", False)
        assert await s.fetch("nightly") is r and await s.fetch(r.id) is r
        assert await s.fetch("daily") is None
        assert s.name_taken("nightly") and not s.name_taken("nightly", by=r.id) and not s.name_taken(None)
        other = await s.add(JOB, 10.0, None, None, False)
        assert s.name_taken("nightly", by=other.id)
        await s.update(r, {"name": "weekly"})
        assert await s.fetch("weekly") is r and not s.name_taken("nightly")
        s.store.close()

    run(scenario)


def test_a_fired_jobs_failure_is_counted_on_its_schedule_and_a_completed_one_clears_the_error() -> None:
    async def scenario() -> None:
        registry = CollectorRegistry()
        s = Scheduler(lambda: None, ScheduleStore(None, 100), capacity=10, clock=Clock(), registry=registry)
        r = await s.add(JOB, 10.0, None, None, False)

        def fired(uuid: str, entry: dict[str, Any]) -> None:
            fut = JobFuture(uuid, 0, 100)
            s._follow(r.id, JobRecord(uuid, "demo", "echo", "any", fut, ""))
            fut.set_result({"w1": entry})

        fired("j1", {"failed": True, "status": "error", "messages": ["RuntimeError: boom"], "errors": []})
        await wait_until(lambda: r.failures == 1)
        assert r.last_error is not None and r.last_error.startswith("job j1 failed")
        assert registry.get_sample_value("zfab_schedule_failures_total", {"reason": "failed"}) == 1
        fired("j2", {"failed": False, "status": "completed", "result": 1})
        await wait_until(lambda: r.last_error is None)
        assert r.failures == 1
        await s.stop()

    run(scenario)


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)
