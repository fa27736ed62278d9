"""The broker as a job queue, with real processes: faults and bad input (issue 9)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fabric import fabric, free_port, wait_for, wait_workers

from zfab.errors import BusyError, JobExpiredError, WorkerLostError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SINGLE = {"ZFAB_POOL_SIZE": "1", "ZFAB_WORKER_PREFETCH": "0"}


def test_jobs_queued_behind_a_killed_worker_go_to_another_and_the_running_one_is_lost(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1", env=SINGLE)
        with f.client() as c:
            wait_workers(c, {"w1"})
            running = c.submit("demo", "sleep", kwargs={"seconds": 30}, timeout=60)
            wait_for(lambda: running.state == "running", 5, what="the long job running")
            waiting = [c.submit("demo", "echo", kwargs={"data": i}, timeout=60) for i in range(5)]
            wait_for(lambda: all(fut.admission.done() for fut in waiting), 5, what="the echoes admitted")
            assert {fut.admission.result() for fut in waiting} == {"queued"}  # w1 has no credit left
            f.worker("w2", env=SINGLE)
            f.kill("w1")
            with pytest.raises(WorkerLostError, match="w1"):
                running.result(f.hold_time + 5)
            assert running.state == "lost" and running.reason
            assert [next(iter(fut.result(20).values()))["result"] for fut in waiting] == list(range(5))
            assert {fut.dispatched[0] for fut in waiting if fut.dispatched} == {"w2"}


def test_jobs_queued_when_the_broker_dies_run_after_it_returns(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=10) as f:
        f.broker("b1")
        f.worker("w1", env=SINGLE)
        with f.client() as c:
            wait_workers(c, {"w1"})
            # Longer than the client's 1 s queued notice: all ten are still queued at the kill
            blocker = c.submit("demo", "sleep", kwargs={"seconds": 3}, timeout=60)
            queued = [c.submit("demo", "echo", kwargs={"data": i}, timeout=60) for i in range(10)]
            wait_for(lambda: all(fut.admission.done() for fut in queued), 5, what="queued at the broker")
            f.kill("b1")
            f.broker("b2")
            # The new broker never saw them: the client submits them again (same uuid, as known)
            got = [next(iter(fut.result(30).values()))["result"] for fut in queued]
            assert got == list(range(10))
            assert blocker.result(30)  # dispatched before the kill: recovered from its worker
            assert c.counts["reestablished"] >= 10, str(c.counts)


def test_a_flood_into_a_full_queue_is_refused_busy_and_the_queue_does_not_grow(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.env["ZFAB_SERVICE_QUEUE_SIZE"] = "20"
        f.broker()
        f.worker("w1", env=SINGLE)
        with f.client() as c:
            wait_workers(c, {"w1"})
            c.submit("demo", "sleep", kwargs={"seconds": 5}, timeout=60)
            futs = [c.submit("demo", "echo", kwargs={"data": i}, timeout=60) for i in range(200)]
            wait_for(lambda: all(fut.admission.done() for fut in futs), 10, what="every job answered")
            busy = [fut for fut in futs if fut.admission.exception() is not None]
            assert len(busy) == 200 - 20
            assert all(isinstance(fut.admission.exception(), BusyError) for fut in busy)
            assert all(fut.admission.exception().retry_after for fut in busy)  # type: ignore[union-attr]
            (svc,) = [s for s in c.mmi("show_services") if s["service"] == "demo"]
            assert svc["queue_depth"] == 20 and svc["queue_capacity"] == 20


def test_a_queued_job_past_its_deadline_expires_and_never_runs(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1", env=SINGLE)
        with f.client() as c:
            wait_workers(c, {"w1"})
            c.submit("demo", "sleep", kwargs={"seconds": 3}, timeout=60)
            late = c.submit("demo", "echo", kwargs={"data": "late"}, timeout=1)
            t = time.monotonic()
            with pytest.raises(JobExpiredError, match="queue"):
                late.result(5)
            assert late.state == "expired" and time.monotonic() - t < 2.5
            wait_for(lambda: c.mmi("show_broker")["counts"].get("expired_in_queue", 0) == 1, 5, what="counted")


def test_bad_priority_and_delay_are_refused_by_the_api_with_the_field_named(tmp_path: Path) -> None:
    import httpx

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        port = free_port()
        f.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(base + "/readyz", timeout=2).status_code == 200, 20, what="api ready")
        job = {"service": "demo", "task": "echo"}
        with httpx.Client(base_url=base, timeout=10) as h:
            bads = [({"priority": -1}, "priority"), ({"priority": 10}, "priority"), ({"delay": -5}, "delay")]
            bads += [({"delay": 1e12}, "delay"), ({"retries": 99}, "retries")]
            for bad, field in bads:
                r = h.post("/jobs", json={**job, **bad})
                assert r.status_code == 422 and field in r.json()["detail"], r.text
            r = h.post("/jobs", json={"service": "demo", "task": "add", "kwargs": {"a": "x", "b": 1}})
            assert r.status_code == 422 and "a:" in r.json()["detail"]
            r = h.post("/jobs?wait=10", json={"service": "demo", "task": "add", "kwargs": {"a": "1.5", "b": 1}})
            assert r.status_code == 200 and r.json()["state"] == "completed"  # lax as the worker: "1.5" is a number
