"""The HTTP control plane under load, beside a bare FastAPI endpoint served the same way.

    broker + 1 demo worker + `zfab api` (uvicorn)      POST /jobs?wait=10  demo echo
    bench/bare_app.py (same uvicorn setup)              POST /jobs          returns a dict

Both are driven by the same httpx.AsyncClient load (concurrency 16, bounded count), so the
ratio says what the fabric round trip adds to a FastAPI request; server CPU per request says
it without the load generator (which needs about a core of its own). While the API carries the
job load, a separate client probes /healthz: its p99 shows whether job traffic starves the
event loop. The load generator shares the machine, so read ratios, not absolutes.

    python -m bench.api [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from typing import Any

import httpx

from bench.common import cpu_seconds, free_port, percentile, report, spawn, stop, wait_for

CONCURRENCY = 16
JOB = {"service": "demo", "task": "echo", "kwargs": {"data": "0123456789ab"}}


def _get_ok(url: str, check: Any = None) -> bool:
    try:
        r = httpx.get(url, timeout=1)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and (check is None or check(r.json()))


async def load(base: str, path: str, count: int, expect: str | None) -> tuple[float, list[float]]:
    """POST `count` jobs with CONCURRENCY in flight; (requests/s, latencies in seconds)."""
    latencies: list[float] = []
    todo = iter(range(count))
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as c:

        async def lane() -> None:
            for _ in todo:  # one shared iterator: lanes take the next job as they free up
                t = time.perf_counter()
                r = await c.post(path, json=JOB)
                latencies.append(time.perf_counter() - t)
                if r.status_code != 200 or (expect is not None and r.json().get("state") != expect):
                    raise RuntimeError(f"{path}: {r.status_code} {r.text[:200]}")

        t0 = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(CONCURRENCY)))
        return count / (time.perf_counter() - t0), latencies


async def probe(base: str, stop_event: asyncio.Event) -> list[float]:
    """Sequential GET /healthz on its own connection until told to stop."""
    out: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        while not stop_event.is_set():
            t = time.perf_counter()
            r = await c.get("/healthz")
            out.append(time.perf_counter() - t)
            r.raise_for_status()
            await asyncio.sleep(0.005)
    return out


async def jobs_with_probe(base: str, count: int) -> tuple[float, list[float], list[float]]:
    done = asyncio.Event()
    prober = asyncio.create_task(probe(base, done))
    try:
        rate, lat = await load(base, "/jobs?wait=10", count, "completed")
    finally:
        done.set()
    return rate, lat, await prober


def run(quick: bool = False) -> dict[str, float]:
    """Start the processes, measure, print the figures, return them."""
    count, warmup = (500, 100) if quick else (2000, 300)
    ep = f"tcp://127.0.0.1:{free_port()}"
    api_port, bare_port = free_port(), free_port()
    py = sys.executable
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="zfab-bench-api-") as tmp:
        env = {"ZFAB_BROKER": ep, "ZFAB_DATA_DIR": tmp, "ZFAB_LOG_LEVEL": "WARNING"}
        procs = [
            spawn([py, "-m", "zfab.cli", "broker", "--endpoint", ep], env),
            spawn([py, "-m", "zfab.cli", "worker", "--service", "demo", "--name", "bench-1"], env),
            spawn([py, "-m", "zfab.cli", "api", "--host", "127.0.0.1", "--port", str(api_port)], env),
            spawn([py, "-m", "bench.bare_app", "--port", str(bare_port)], env),
        ]
        api, bare = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{bare_port}"
        try:
            alive = lambda ws: any(w.get("alive") for w in ws)  # noqa: E731
            if not wait_for(lambda: _get_ok(api + "/mmi/workers", alive), 30):
                raise RuntimeError("zfab api + demo worker did not come up within 30 s")
            if not wait_for(lambda: _get_ok(bare + "/healthz"), 30):
                raise RuntimeError("bench.bare_app did not come up within 30 s")
            asyncio.run(load(bare, "/jobs", warmup, "completed"))
            cpu0 = cpu_seconds(procs[3].pid)
            bare_rate, bare_lat = asyncio.run(load(bare, "/jobs", count, "completed"))
            bare_cpu = cpu_seconds(procs[3].pid) - cpu0
            asyncio.run(load(api, "/jobs?wait=10", warmup, "completed"))
            cpu0 = cpu_seconds(procs[2].pid)
            api_rate, api_lat, health = asyncio.run(jobs_with_probe(api, count))
            api_cpu = cpu_seconds(procs[2].pid) - cpu0  # includes the /healthz probes, a few %
        finally:
            stop(procs)
    out = {
        "bare_rps": bare_rate,
        "bare_p50_ms": percentile(bare_lat, 50) * 1000,
        "bare_p99_ms": percentile(bare_lat, 99) * 1000,
        "api_jps": api_rate,
        "api_p50_ms": percentile(api_lat, 50) * 1000,
        "api_p99_ms": percentile(api_lat, 99) * 1000,
        "api_to_bare_ratio": api_rate / bare_rate,
        # Server CPU per request: steadier than rates on a shared machine, and free of the load
        # generator, which needs about a core of its own at these rates.
        "bare_cpu_ms": bare_cpu / count * 1000,
        "api_cpu_ms": api_cpu / count * 1000,
        "healthz_p50_ms": percentile(health, 50) * 1000,
        "healthz_p99_ms": percentile(health, 99) * 1000,
    }
    print(f"-- {count} requests, concurrency {CONCURRENCY}, {os.cpu_count()} CPUs; 'floor' = the bare endpoint")
    report("bare POST /jobs", out["bare_rps"], "/s")
    report("bare p50", out["bare_p50_ms"], "ms")
    report("bare p99", out["bare_p99_ms"], "ms")
    report("api POST /jobs?wait (echo)", out["api_jps"], "/s", floor=out["bare_rps"])
    report("api p50", out["api_p50_ms"], "ms", floor=out["bare_p50_ms"], higher_is_better=False)
    report("api p99", out["api_p99_ms"], "ms", floor=out["bare_p99_ms"], higher_is_better=False)
    report("bare server cpu/request", out["bare_cpu_ms"], "ms")
    report("api server cpu/job", out["api_cpu_ms"], "ms", floor=out["bare_cpu_ms"], higher_is_better=False)
    report("/healthz p50 under job load", out["healthz_p50_ms"], "ms")
    report("/healthz p99 under job load", out["healthz_p99_ms"], "ms")
    print(f"api jobs/s ÷ bare requests/s = {out['api_to_bare_ratio']:.2f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller counts, for a smoke run")
    run(quick=p.parse_args(argv).quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
