"""Paused service queues against real processes: 1,000 jobs admitted and queued, none dispatched until
the queue resumes, then all of them; the pause kept across a broker restart; REST, CLI and metrics."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fabric import ROOT, Fabric, fabric, wait_for, wait_workers
from inprocess import in_process_api as api

from zfab import Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

JOBS = 1000


def demo(c: Client) -> dict[str, Any]:
    row: dict[str, Any] = next(s for s in c.mmi("show_services") if s["service"] == "demo")
    return row


def zfab(f: Fabric, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zfab.cli", *args], env=f.env, cwd=ROOT, capture_output=True, text=True, timeout=30
    )


def test_a_paused_service_queues_1000_jobs_and_dispatches_none_until_resumed_then_all(tmp_path: Path) -> None:
    async def go(f: Fabric, c: Client) -> None:
        async with api(f) as http:
            # Given a paused queue (REST)
            r = await http.post("/mmi/services/demo/pause")
            assert r.status_code == 200 and r.json()["paused"] is True, r.text
            assert (await http.post("/mmi/services/nosuch/pause")).status_code == 404
            before = demo(c)["jobs_dispatched"]
            # When 1,000 jobs are submitted
            futs = [c.submit("demo", "echo", kwargs={"data": i}, timeout=60) for i in range(JOBS)]
            wait_for(lambda: demo(c)["queue_depth"] == JOBS, 30, what="1,000 jobs in the broker's queue")
            # Then all are admitted (queued) and none is dispatched, for as long as we look
            assert all(fut.admission.result(10) == "queued" for fut in futs[:10])
            seen_until = time.monotonic() + 1.0
            while time.monotonic() < seen_until:
                row = demo(c)
                assert row["jobs_dispatched"] == before and row["paused"] is True and row["jobs_in_flight"] == 0
                assert not any(fut.done() for fut in futs)
                await asyncio.sleep(0.1)
            metrics = (await http.get("/metrics")).text
            assert 'zfab_service_paused{service="demo"} 1.0' in metrics
            # When it resumes, then every one of them runs
            r = await http.post("/mmi/services/demo/resume")
            assert r.status_code == 200 and r.json() == {
                "service": "demo",
                "paused": False,
                "changed": True,
                "queue_depth": JOBS,
            }
            results = [fut.result(60) for fut in futs]
            assert sorted(next(iter(res.values()))["result"] for res in results) == list(range(JOBS))
            row = demo(c)
            assert row["jobs_dispatched"] == before + JOBS and row["queue_depth"] == 0 and row["paused"] is False

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        with f.client() as c:
            wait_workers(c, {"w1", "w2"})
            asyncio.run(go(f, c))


def test_a_paused_queue_stays_paused_across_a_broker_restart(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
            r = zfab(f, "pause", "demo")
            assert r.returncode == 0 and "demo: paused" in r.stdout, r
            assert "already" in zfab(f, "pause", "demo").stdout
            assert zfab(f, "pause", "nosuch").returncode == 1
        f.kill("broker")
        f.broker("broker")  # the same data directory: it reads the pause before any worker is back
        with f.client() as c:
            wait_for(lambda: c.mmi("show_broker")["paused_services"] == ["demo"], 20, what="the new broker up")
            wait_workers(c, {"w1"})
            fut = c.submit("demo", "echo", kwargs={"data": "after"}, timeout=60)
            wait_for(lambda: demo(c)["queue_depth"] == 1, 10, what="the job queued")
            assert demo(c)["paused"] is True and not fut.done()
            r = zfab(f, "resume", "demo")
            assert r.returncode == 0 and "demo: running; 1 jobs queued" in r.stdout, r
            assert next(iter(fut.result(20).values()))["result"] == "after"
