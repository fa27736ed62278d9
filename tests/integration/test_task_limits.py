"""Rate and concurrency limits against real processes: declared on a task or set at run time, enforced
by the broker across three workers; jobs over a limit wait, none fails."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import until
from fabric import ROOT, Fabric, fabric, wait_for, wait_workers
from inprocess import in_process_api as api

from zfab import Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DECLARED = "tests.integration.declared_workers"
WORKERS = {"l1", "l2", "l3"}


def start_limited(f: Fabric) -> None:
    f.broker()
    for name in sorted(WORKERS):
        f.start(name, "worker", "--worker", f"{DECLARED}:Limited", "--name", name)


def spans(results: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(started, completed, worker) of each job, from its result entry (worker clocks, one host)."""
    out = []
    for res in results:
        (entry,) = res.values()
        ts = entry["timestamps"]
        out.append((ts["started"], ts["completed"], entry["worker"]))
    return out


def most_at_once(intervals: list[tuple[float, float, str]]) -> int:
    edges = sorted([(s, 1) for s, _, _ in intervals] + [(e, -1) for _, e, _ in intervals])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def limit_row(c: Client, task: str) -> dict[str, Any]:
    (row,) = [r for r in c.mmi("show_limits") if r["task"] == task]
    return row


def in_flight(c: Client) -> int:
    return sum(w["jobs_in_flight"] for w in c.mmi("show_workers", service="limited"))


def test_a_rate_limit_is_the_brokers_across_3_workers_and_holds_jobs_without_failing_them(tmp_path: Path) -> None:
    # (How evenly a rate spaces its starts is a fake-clock test: tests/unit/test_broker_limits.py.)
    with fabric(tmp_path) as f:
        start_limited(f)
        with f.client() as c:
            wait_workers(c, WORKERS)
            # Given a task declared at 5/s: 10 jobs at once all run, none fails
            results = [fut.result(30) for fut in [c.submit("limited", "paced", kwargs={"n": i}) for i in range(10)]]
            assert [next(iter(r.values()))["result"] for r in results] == list(range(10))
            assert all(not next(iter(r.values()))["failed"] for r in results)
            # Given its rate then set to one an hour, so that nothing but the next job may start
            row = c.mmi("set_limit", service="limited", task_name="paced", rate_limit="1/h")
            assert (row["rate_limit"], row["source"]) == ("1/h", "set"), row
            # When 6 jobs are submitted to 3 workers with credits to spare
            futs = [c.submit("limited", "paced", kwargs={"n": i}, timeout=60) for i in range(6)]
            # Then at most one runs (the 5/s spacing may still hold it), and the broker holds the rest:
            # none is sent to a worker, none fails
            wait_for(
                lambda: limit_row(c, "paced")["held"] + sum(fut.done() for fut in futs) == 6, 20, what="the rest held"
            )
            assert sum(fut.done() for fut in futs) <= 1 and limit_row(c, "paced")["held"] >= 5
            assert all(not next(iter(fut.result(0).values()))["failed"] for fut in futs if fut.done())
            # And a held job cancelled leaves the queue at once
            for fut in [fut for fut in futs if not fut.done()]:
                c.cancel(fut.uuid)  # (False for one the old 5/s let start meanwhile: it ended on its own)
            wait_for(lambda: all(fut.done() for fut in futs), 20, what="the held jobs cancelled")
            assert limit_row(c, "paced")["held"] == 0 and in_flight(c) == 0


def test_a_concurrency_limit_of_2_over_3_workers_runs_2_and_holds_the_rest(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        start_limited(f)
        with f.client() as c, f.client("watch") as watch:
            wait_workers(c, WORKERS)
            # Given 4 jobs that run until cancelled, of a task limited to 2 at once
            futs = [c.submit("limited", "slow", kwargs={"seconds": 300}, timeout=600) for _ in range(4)]
            # Then 2 run and the broker holds 2, though a third worker has credits to spare; and each job
            # cancelled frees its slot for a held one, never letting a third run
            for left in (4, 3, 2, 1):
                running, held = min(left, 2), max(0, left - 2)
                wait_for(
                    lambda r=running, h=held: (
                        (limit_row(watch, "slow")["running"], limit_row(watch, "slow")["held"]) == (r, h)
                    ),
                    20,
                    what=f"{running} running and {held} held of {left} jobs",
                )
                assert in_flight(watch) == running
                assert c.cancel(next(fut for fut in futs if not fut.done()).uuid)
                wait_for(lambda n=left: sum(not fut.done() for fut in futs) == n - 1, 20, what="the cancel")
            assert all(fut.done() for fut in futs)  # (the task returns when cancelled: its jobs complete)
            wait_for(lambda: limit_row(watch, "slow")["running"] == 0, 20, what="the last slot given back")
            row = limit_row(watch, "slow")
            assert (row["concurrency"], row["source"], row["running"], row["held"]) == (2, "declared", 0, 0)


def test_a_limit_set_at_run_time_over_rest_and_the_cli_holds_jobs_without_failing_them(tmp_path: Path) -> None:
    async def go(f: Fabric, c: Client) -> None:
        async with api(f) as http:
            r = await http.put("/mmi/services/demo/tasks/sleep/limits", json={"concurrency": 1})
            assert r.status_code == 200 and r.json()["concurrency"] == 1 and r.json()["source"] == "set", r.text
            bad = await http.put("/mmi/services/demo/tasks/sleep/limits", json={"rate_limit": "often"})
            assert bad.status_code == 400 and "rate" in bad.json()["detail"]
            assert (
                await http.put("/mmi/services/demo/tasks/nosuch/limits", json={"concurrency": 1})
            ).status_code == 404
            # The first job runs until cancelled, so the two after it are held for as long as it takes to see them
            first = (await http.post("/jobs", json={"service": "demo", "task": "sleep", "args": [300]})).json()
            jobs = [
                (await http.post("/jobs", json={"service": "demo", "task": "sleep", "args": [0.3]})).json()
                for _ in range(2)
            ]

            async def two_held() -> bool:
                limits = (await http.get("/mmi/limits")).json()
                return any(row["task"] == "sleep" and row["held"] == 2 for row in limits)

            await until(two_held, 20, "two jobs held by the limit")
            assert 'zfab_task_limit_waiting{service="demo",task="sleep"} 2.0' in (await http.get("/metrics")).text
            assert (await http.delete(f"/jobs/{first['uuid']}")).status_code in (200, 202)
            done = [(await http.get(f"/jobs/{j['uuid']}?wait=10")).json() for j in jobs]
            assert all(j["state"] == "completed" for j in done), done
            assert most_at_once(spans([j["results"] for j in done])) == 1
            cancelled = (await http.get(f"/jobs/{first['uuid']}?wait=10")).json()
            assert cancelled["state"] == "cancelled", cancelled
            r = await http.delete("/mmi/services/demo/tasks/sleep/limits")
            assert r.status_code == 200 and r.json()["concurrency"] is None

    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        with f.client() as c:
            wait_workers(c, {"w1", "w2"})
            asyncio.run(go(f, c))
            cli = [sys.executable, "-m", "zfab.cli", "limit", "demo", "echo"]
            r = subprocess.run([*cli, "--rate", "5/s"], env=f.env, cwd=ROOT, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0 and r.stdout.strip() == "demo.echo: rate 5/s (set)", r
            r = subprocess.run([*cli, "--clear"], env=f.env, cwd=ROOT, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0 and r.stdout.strip() == "demo.echo: no limit (declared)", r
