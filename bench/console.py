"""The web console (issue 29) with 100,000 jobs in the API's table: server time of the page shell and of
the first page of GET /jobs it reads (unfiltered, filtered to a state one job in 50 is in, and filtered to
one no job is in, which reads the whole table), and the page weights.

In-process: the app with its lifespan (a fabric client that reaches no broker, a memory-only table)
served over ASGI, its table filled with finished jobs as a restarted API holds them. Server time is the
API's own zfab_http_request_duration_seconds for the request (its middleware's clock), median of the runs.

    python -m bench.console [--jobs 100000] [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import re
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import httpx

from bench.common import free_port, report


def fill(app: Any, n: int) -> None:
    """`n` finished jobs in the table, one in 50 failed, as GET /jobs reads them after a restart."""
    from zfab.api.jobs.record import JobRecord
    from zfab.api.models import Job, JobState

    table = app.state.zfab.jobs
    t0 = time.time() - n * 0.01
    for i in range(n):
        failed = i % 50 == 0
        at = datetime.fromtimestamp(t0 + i * 0.01, UTC)
        stored = Job.model_construct(
            uuid=f"{i:032x}",
            service="demo",
            task="fail" if failed else "echo",
            workers="any",
            state=JobState.FAILED if failed else JobState.COMPLETED,
            reason="demo-1: RuntimeError: boom" if failed else None,
            results={"demo-1": {"result": i, "failed": failed, "errors": [], "messages": []}},
            error=None,
            priority=5,
            retries=0,
            schedule=None,
            submitted_at=at,
            queued_at=at,
            started_at=at,
            finished_at=at,
            completed_at=at,
            timings={"submitted": at.timestamp()},
            cancel_requested=False,
            input_request=None,
        )
        table.add(JobRecord(stored.uuid, "demo", stored.task, "any", None, "", stored=stored), persist=False)


def server_seconds(app: Any, route: str) -> tuple[float, float]:
    """(sum, count) of the API's request-duration histogram for a route template."""
    registry = app.state.registry
    total = registry.get_sample_value("zfab_http_request_duration_seconds_sum", {"route": route, "method": "GET"})
    count = registry.get_sample_value("zfab_http_request_duration_seconds_count", {"route": route, "method": "GET"})
    return total or 0.0, count or 0.0


async def timed(c: httpx.AsyncClient, app: Any, path: str, route: str, runs: int) -> tuple[float, httpx.Response]:
    """Median server time of `runs` GETs of `path`, in ms, and the last answer."""
    times = []
    r = None
    for _ in range(runs):
        before = server_seconds(app, route)[0]
        r = await c.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:200])
        times.append((server_seconds(app, route)[0] - before) * 1000)
    assert r is not None
    return statistics.median(times), r


async def measure(n: int, runs: int) -> dict[str, float]:
    from zfab.api.http.app import create_app
    from zfab.api.http.console.pages import assets
    from zfab.api.settings import ApiSettings

    app = create_app(ApiSettings(broker=f"tcp://127.0.0.1:{free_port()}", api_db="", job_history=n + 10))
    out: dict[str, float] = {}
    async with app.router.lifespan_context(app):
        t = time.perf_counter()
        fill(app, n)
        out["fill_s"] = time.perf_counter() - t
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            out["shell_ms"], shell = await timed(c, app, "/ui", "/ui", runs)
            out["first_page_ms"], page = await timed(c, app, "/jobs?limit=50", "/jobs", runs)
            assert len(page.json()["items"]) == 50 and page.json()["total"] == n
            out["failed_page_ms"], _ = await timed(c, app, "/jobs?limit=50&state=failed", "/jobs", runs)
            # A filter nothing matches reads the whole table: the worst a console's filter can ask.
            out["no_match_ms"], _ = await timed(c, app, "/jobs?limit=50&state=lost", "/jobs", max(1, runs // 5))
            out["shell_bytes"] = len(shell.content)
            linked = set(re.findall(r'(?:src|href)="/ui/static/([^"?]+)', shell.text))
            out["asset_bytes"] = sum(len(assets()[name].body) for name in linked)
            out["asset_gzip_bytes"] = sum(len(assets()[name].gzipped) for name in linked)
            out["shell_gzip_bytes"] = len(gzip.compress(shell.content))
    return out


def run(quick: bool = False, jobs: int | None = None, runs: int | None = None) -> dict[str, float]:
    n = jobs or (20_000 if quick else 100_000)
    got = asyncio.run(measure(n, runs or (5 if quick else 20)))
    print(f"   {n:,} jobs in the table (filled in {got['fill_s']:.1f} s); server time, median:")
    report("console /ui shell", got["shell_ms"], "ms")
    report("GET /jobs first page (50)", got["first_page_ms"], "ms")
    report("GET /jobs state=failed (50)", got["failed_page_ms"], "ms")
    report("GET /jobs no match (scan)", got["no_match_ms"], "ms")
    kib = (got["shell_bytes"] + got["asset_bytes"]) / 1024
    gz = (got["shell_gzip_bytes"] + got["asset_gzip_bytes"]) / 1024
    report("jobs view HTML+JS+CSS", kib, "KiB")
    report("  as sent (gzip)", gz, "KiB")
    return got


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--quick", action="store_true")
    ns = p.parse_args()
    run(ns.quick, ns.jobs, ns.runs)
