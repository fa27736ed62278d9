"""Rate and concurrency limits against real processes: declared on a task or set at run time, enforced
by the broker across three workers; jobs over a limit wait, none fails."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fabric import ROOT, Fabric, fabric, wait_workers
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


def test_a_5_per_second_limit_over_3_workers_runs_50_jobs_in_10_s(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        start_limited(f)
        with f.client() as c:
            wait_workers(c, WORKERS)
            t0 = time.monotonic()
            futs = [c.submit("limited", "paced", kwargs={"n": i}, timeout=60) for i in range(50)]
            results = [fut.result(60) for fut in futs]
            took = time.monotonic() - t0
            starts = sorted(s for s, _, _ in spans(results))
            gaps = [b - a for a, b in itertools.pairwise(starts)]
            print(
                f"5/s over 3 workers: 50 jobs in {took:.2f} s; starts {starts[-1] - starts[0]:.2f} s apart, "
                f"gaps {min(gaps):.3f}-{max(gaps):.3f} s"
            )
            assert 9.0 <= took <= 11.0, took
            # evenly spaced, no burst: a start late under load is followed by one on schedule, never two at once
            assert min(gaps) >= 0.05 and 0.18 <= statistics.median(gaps) <= 0.22, gaps
            assert len({w for _, _, w in spans(results)}) >= 2  # the limit is the broker's, across workers
            assert all(not next(iter(r.values()))["failed"] for r in results)


def test_a_concurrency_limit_of_2_over_3_workers_never_shows_3_running(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        start_limited(f)
        with f.client() as c, f.client("watch") as watch:
            wait_workers(c, WORKERS)
            futs = [c.submit("limited", "slow", kwargs={"seconds": 0.4}, timeout=60) for _ in range(8)]
            seen: list[int] = []
            deadline = time.monotonic() + 60
            while not all(fut.done() for fut in futs):
                assert time.monotonic() < deadline, f"8 jobs of 0.4 s not done in 60 s; in flight seen: {seen}"
                running = sum(w["jobs_in_flight"] for w in watch.mmi("show_workers", service="limited"))
                seen.append(running)
                assert running <= 2, seen
                time.sleep(0.05)  # the sampling interval of the watch, not a wait for a condition
            results = [fut.result(0) for fut in futs]
            intervals = spans(results)
            print(
                f"concurrency 2 over 3 workers: at most {max(seen)} in flight over {len(seen)} looks, "
                f"{most_at_once(intervals)} running at once by the results"
            )
            assert most_at_once(intervals) == 2 and max(seen) == 2
            (row,) = [r for r in watch.mmi("show_limits") if r["task"] == "slow"]
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
            jobs = [
                (await http.post("/jobs", json={"service": "demo", "task": "sleep", "args": [0.3]})).json()
                for _ in range(3)
            ]
            for _ in range(100):
                limits = (await http.get("/mmi/limits")).json()
                if any(row["task"] == "sleep" and row["held"] == 2 for row in limits):
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError(f"two jobs held by the limit: {limits}")
            assert 'zfab_task_limit_waiting{service="demo",task="sleep"} 2.0' in (await http.get("/metrics")).text
            done = [(await http.get(f"/jobs/{j['uuid']}?wait=10")).json() for j in jobs]
            assert all(j["state"] == "completed" for j in done), done
            assert most_at_once(spans([j["results"] for j in done])) == 1
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
