"""Retries on failure against real processes: the declared backoff schedule kept, every attempt in the
job's record, the arguments in GET /jobs/{uuid} with the declared secrets redacted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fabric import Fabric, fabric, wait_workers
from inprocess import in_process_api as api

from zfab import Backoff

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

DECLARED = "tests.integration.declared_workers"


def gaps(attempts: list[dict[str, Any]], last: dict[str, Any]) -> list[float]:
    """Seconds from each attempt's end on its worker to the next one's start (worker clocks, one host)."""
    ends = [a["completed"] for a in attempts]
    starts = [a["started"] for a in attempts[1:]] + [last["timestamps"]["started"]]
    return [round(s - e, 3) for e, s in zip(ends, starts, strict=True)]


def test_a_task_that_raises_twice_completes_on_its_third_attempt_after_the_declared_backoffs(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        with f.client() as c:
            wait_workers(c, {"w1", "w2"})
            # demo.flaky declares @task(retries=3, retry_on=RuntimeError): 1 s, then 2 s (±10 % jitter)
            fut = c.submit("demo", "flaky", kwargs={"failures": 2}, timeout=30)
            (entry,) = fut.result(30).values()
            assert entry["result"] == {"attempt": 3} and entry["attempt"] == 3 and entry["juuid"] == fut.uuid
            assert fut.state == "completed" and fut.attempt == 3
            first, second = fut.attempts
            assert [a["attempt"] for a in (first, second)] == [1, 2]
            assert first["error"] == "RuntimeError: attempt 1 of 4 fails on purpose"
            assert second["error"] == "RuntimeError: attempt 2 of 4 fails on purpose"
            planned = [Backoff().planned(1), Backoff().planned(2)]
            measured = gaps(fut.attempts, entry)
            print(
                f"backoff: declared {planned} s, measured {measured} s, jittered waits "
                f"{[a['retry_after'] for a in fut.attempts]} s"
            )
            for got, want in zip(measured, planned, strict=True):
                assert 0.8 * want <= got <= 1.2 * want, f"waited {got} s where {want} s was declared"
            # never two attempts at once: each began after the one before had ended
            assert all(g > 0 for g in measured)


def test_rest_retries_keep_every_attempts_error_and_show_the_arguments_redacted(tmp_path: Path) -> None:
    async def go(f: Fabric) -> None:
        async with api(f) as c:
            r = await c.post(
                "/jobs?wait=20",
                json={"service": "demo", "task": "fail", "kwargs": {"message": "nope"}, "retries": 2, "backoff": 0.2},
            )
            job = r.json()
            assert r.status_code == 200 and job["state"] == "failed", job
            assert job["retries"] == 2 and job["attempt"] == 3
            assert [a["attempt"] for a in job["attempts"]] == [1, 2]
            assert all(a["error"] == "RuntimeError: nope" and a["status"] == "error" for a in job["attempts"])
            assert job["attempts"][1]["retry_after"] == pytest.approx(0.4, rel=0.11)
            (entry,) = job["results"].values()
            assert entry["attempt"] == 3 and "retry" not in entry  # the last one: no retry left
            got = (await c.get(f"/jobs/{job['uuid']}")).json()
            assert got["arguments"] == {
                "args": [],
                "kwargs": {"message": "nope"},
                "redacted": [],
                "bytes": len('[[],{"message":"nope"}]'),
                "omitted": None,
            }
            # retries=0 turns the task's own declaration off
            r = await c.post("/jobs?wait=10", json={"service": "demo", "task": "flaky", "retries": 0})
            assert r.json()["state"] == "failed" and r.json()["attempts"] == []
            # a task's declared secret is never shown, by name or by position
            for body in (
                {"service": "secrets", "task": "login", "kwargs": {"user": "ada", "password": "hunter2"}},
                {"service": "secrets", "task": "login", "args": ["ada", "hunter2"]},
            ):
                r = await c.post("/jobs?wait=10", json=body)
                assert r.json()["state"] == "completed", r.json()
                shown = (await c.get(f"/jobs/{r.json()['uuid']}")).json()["arguments"]
                assert shown["redacted"] == ["password"] and "hunter2" not in str(shown)
                assert shown["kwargs"].get("user", "ada") == "ada"
            # arguments past the bound are counted, not shown
            big = {"service": "demo", "task": "echo", "kwargs": {"data": "x" * 70_000}}
            r = await c.post("/jobs?wait=10", json=big)
            shown = (await c.get(f"/jobs/{r.json()['uuid']}")).json()["arguments"]
            assert shown["args"] is None and shown["bytes"] > 70_000 and "over the" in shown["omitted"]

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.start("s1", "worker", "--worker", f"{DECLARED}:Secrets", "--name", "s1")
        with f.client() as c:
            wait_workers(c, {"w1", "s1"})
        asyncio.run(go(f))
