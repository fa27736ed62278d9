"""Per-hop traces with real processes: every job's final answer says where its time went, and the
hops add up to the end-to-end time its client measured, over TCP and over ipc://."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fabric import Fabric, fabric, wait_workers
from inprocess import in_process_api

from zfab.core.hoptrace import HOPS

pytestmark = pytest.mark.integration

ALL_BUT_API = [h for h in HOPS if h != "api"]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # An ipc:// path must fit in a socket address (107 bytes): pytest's tmp_path may not.
    d = Path(tempfile.mkdtemp(prefix="zfab-ipc-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _over(f: Fabric, transport: str, short_dir: Path) -> None:
    if transport == "ipc":
        f.endpoint = f"ipc://{short_dir}/broker.sock"
        f.env["ZFAB_BROKER"] = f.endpoint


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_hops_add_up_to_the_clients_end_to_end_time(tmp_path: Path, short_dir: Path, transport: str) -> None:
    with fabric(tmp_path) as f:
        _over(f, transport, short_dir)
        f.broker()
        f.worker("w1")
        with f.client() as c:
            wait_workers(c, {"w1"})
            c.run_job("demo", "echo", kwargs={"data": 0}, timeout=10)  # warm: connections, imports
            for seconds in (0.0, 0.05, 0.2):
                t0 = time.monotonic()
                fut = c.submit("demo", "sleep", kwargs={"seconds": seconds}, timeout=10)
                fut.result(10)
                measured = time.monotonic() - t0
                trace = fut.trace
                assert trace is not None, "a job through a zfab broker and worker carries its trace"
                hops = trace["hops"]
                assert list(hops) == ALL_BUT_API, hops
                assert all(v >= 0 for v in hops.values())
                total = sum(hops.values())
                # The client's own reading, taken around submit() and result(), bounds the trace's.
                assert total <= measured + 1e-3
                assert abs(total - measured) <= max(0.05 * measured, 2e-3), (total, measured, hops)
                assert abs(trace["total"] - total) <= 1e-5 * len(hops)
                assert seconds <= hops["run"] < seconds + 0.05, hops


def test_the_broker_queue_hop_holds_the_wait_for_a_credit(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1", env={"ZFAB_POOL_SIZE": "1", "ZFAB_WORKER_PREFETCH": "0"})
        with f.client() as c:
            wait_workers(c, {"w1"})
            first = c.submit("demo", "sleep", kwargs={"seconds": 0.3}, timeout=10)
            second = c.submit("demo", "sleep", kwargs={"seconds": 0.0}, timeout=10)
            first.result(10)
            second.result(10)
            assert first.trace is not None and second.trace is not None
            assert first.trace["hops"]["broker_queue"] < 0.1
            # The one credit was the first job's: the second waited for it in the broker's queue.
            assert second.trace["hops"]["broker_queue"] >= 0.25, second.trace
            assert second.trace["hops"]["run"] < 0.05


def test_a_job_for_several_workers_has_each_workers_hops(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        f.worker("w2")
        with f.client() as c:
            wait_workers(c, {"w1", "w2"})
            fut = c.submit("demo", "sleep", kwargs={"seconds": 0.05}, workers="all", timeout=10)
            fut.result(10)
            assert fut.trace is not None
            assert set(fut.trace["workers"]) == {"w1", "w2"}
            for view in fut.trace["workers"].values():
                assert view["hops"]["run"] >= 0.05
            assert fut.trace["total"] == max(v["total"] for v in fut.trace["workers"].values())


def test_with_hop_traces_off_no_trace_travels(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.start("broker", "broker", "--endpoint", f.endpoint, env={"ZFAB_HOP_TRACES": "false"})
        f.worker("w1", env={"ZFAB_HOP_TRACES": "false"})
        with f.client() as c:
            wait_workers(c, {"w1"})
            fut = c.submit("demo", "echo", kwargs={"data": 1}, timeout=10)
            assert fut.result(10)["w1"]["result"] == 1
            assert fut.trace is None


def test_the_api_shows_each_jobs_hops_and_exports_them_per_hop(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        asyncio.run(_api_hops(f))


async def _api_hops(f: Fabric) -> None:
    async with in_process_api(f) as http:
        # The lean path, then the documented route (an Idempotency-Key goes there), without a wait.
        for path, headers in (("/jobs?wait=10", {}), ("/jobs", {"Idempotency-Key": "hop-trace-1"})):
            body = {"service": "demo", "task": "sleep", "kwargs": {"seconds": 0.05}}
            r = await http.post(path, json=body, headers=headers)
            assert r.status_code in (200, 202), r.text
            uuid = r.json()["uuid"]
            deadline = time.monotonic() + 10
            while (job := (await http.get(f"/jobs/{uuid}")).json())["state"] != "completed":
                assert time.monotonic() < deadline, job
                await asyncio.sleep(0.02)
            trace = job["trace"]
            assert list(trace["hops"]) == list(HOPS), trace
            assert sum(trace["hops"].values()) == pytest.approx(trace["total"], abs=1e-5 * len(HOPS))
            assert 0.05 <= trace["hops"]["run"] < 0.1
            assert trace["hops"]["api"] < 0.05
        metrics = (await http.get("/metrics")).text
        for hop in HOPS:
            line = next(x for x in metrics.splitlines() if x.startswith(f'zfab_job_hop_seconds_count{{hop="{hop}"}}'))
            assert float(line.split()[-1]) >= 2, line
