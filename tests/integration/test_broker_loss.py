"""Losing the broker (issue 13's last part): the broker is killed with jobs queued, in flight and
finished, a new one takes its endpoint (as a Kubernetes restart would), and every job admitted
with 202 is accounted for, run once."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import httpx
import pytest
from fabric import fabric, free_port, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FINAL = {"completed", "failed", "cancelled", "expired", "lost"}


def task_runs(port: int, task: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("zfab_task_jobs_total{") and f'task="{task}"' in line
    )


def test_a_new_broker_on_the_endpoint_loses_no_admitted_job(tmp_path: Path) -> None:
    with fabric(tmp_path, interval=0.3, multiplier=10) as f:
        f.broker("b1")
        mport = free_port()
        f.worker("w1", "demo", "--metrics-port", str(mport), env={"ZFAB_POOL_SIZE": "1", "ZFAB_WORKER_PREFETCH": "0"})
        port = free_port()
        f.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(base + "/readyz", timeout=2).status_code == 200, 30, what="api ready")
        with httpx.Client(base_url=base, timeout=30) as h:
            wait_for(lambda: h.get("/mmi/workers").json()[0]["alive"], 20, what="w1 registered")
            # Given jobs finished, one running, and more waiting in the broker's queue
            done = [h.post("/jobs?wait=10", json={"service": "demo", "task": "echo", "kwargs": {"data": i}}).json()
                    for i in range(3)]  # fmt: skip
            assert {j["state"] for j in done} == {"completed"}
            sleep = {"service": "demo", "task": "sleep", "kwargs": {"seconds": 1.5}, "timeout": 60}
            running = h.post("/jobs", json=sleep).json()
            wait_for(lambda: h.get(f"/jobs/{running['uuid']}").json()["state"] == "running", 10, what="running")
            queued = [h.post("/jobs", json=sleep).json() for _ in range(3)]
            assert {j["state"] for j in queued} == {"queued"}
            # When the broker dies and a new one takes its endpoint
            f.kill("b1")
            t_kill = time.monotonic()
            f.broker("b2")
            wait_for(lambda: httpx.get(base + "/readyz", timeout=2).status_code == 200, 30, what="api ready again")
            # Then every job ends, and each sleep job ran once
            jobs = [running, *queued]
            ends = {}
            first = None
            for j in jobs:
                body = h.get(f"/jobs/{j['uuid']}?wait=30").json()
                ends[j["uuid"]] = body["state"]
                if first is None and body["state"] == "completed":
                    first = time.monotonic() - t_kill
            assert set(ends.values()) == {"completed"}, ends
            for j in done:
                assert h.get(f"/jobs/{j['uuid']}").json()["state"] == "completed"
            wait_for(lambda: task_runs(mport, "sleep") >= 4, 10, what="the worker's count")
            assert task_runs(mport, "sleep") == 4  # none ran twice
            assert first is not None and first < 15
            print(f"broker lost: first job completed {first:.2f} s after the kill; jobs {ends}")
