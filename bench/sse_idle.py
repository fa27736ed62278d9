"""Idle `GET /events` readers cost the API nothing per job (issue 38, item 3): the API's CPU per job with
no event stream open, and with 100 streams open on a prefix no event has.

One broker with its event publisher, one demo worker and `zfab api` as processes; 100 streams are
httpx streams read by this process (each reads what comes: pings only). Jobs are POST /jobs?wait=10 of
demo echo, 8 at a time. The phases alternate (none, idle, none, idle) so drift of the machine falls on
both; each figure is the median of its phase's runs, with the idle streams' ratio to none.

A busy shared machine makes the API's CPU per job swing by 2x between runs of the same phase, so the
hub's own cost is measured too, in this process: the event loop's CPU per batch of three job events
(what a job publishes) with no stream and with 100 idle streams waiting on it. Measured on a busy
2-core machine, 5,000 batches, median of 3: 58 us a batch without streams, 61 with 100 idle ones;
before the hub grouped streams by prefix, every batch woke every stream: 61 and 3,634 us.

    python -m bench.sse_idle [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from typing import Any

import httpx

from bench.common import cpu_seconds, free_port, report
from bench.harness import Fabric

READERS = 100
JOB = {"service": "demo", "task": "echo", "kwargs": {"data": 1}}


async def _jobs(base: str, n: int, lanes: int = 8) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:

        async def lane(k: int) -> None:
            for _ in range(k):
                r = await c.post("/jobs?wait=10", json=JOB)
                r.raise_for_status()

        await asyncio.gather(*(lane(n // lanes) for _ in range(lanes)))


async def _phase(base: str, pid: int, n: int, readers: int) -> float:
    """The API's CPU microseconds per job over `n` jobs, with `readers` idle event streams open."""
    limits = httpx.Limits(max_connections=readers + 1)
    async with httpx.AsyncClient(base_url=base, timeout=None, limits=limits) as c:
        opened = asyncio.Event()
        count = 0

        async def read() -> None:
            nonlocal count
            async with c.stream("GET", "/events", params={"topic": "nothing.matches."}) as r:
                r.raise_for_status()
                count += 1
                if count == readers:
                    opened.set()
                async for _ in r.aiter_raw():
                    pass

        tasks = [asyncio.create_task(read()) for _ in range(readers)]
        if readers:
            await asyncio.wait_for(opened.wait(), 30)
        await asyncio.sleep(0.5)
        cpu0 = cpu_seconds(pid)
        await _jobs(base, n)
        used = cpu_seconds(pid) - cpu0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return used / n * 1e6


async def _hub_cost(readers: int, batches: int) -> float:
    """Microseconds of this thread's CPU per batch of three job events the hub takes in, with `readers`
    streams waiting as GET /events' streams wait (arm, read the ring, await) on a prefix none has."""
    import time

    from zfab.api.http.routes.topics import TopicHub

    hub = TopicHub("tcp://127.0.0.1:1", None, capacity=10_000, max_bytes=16 << 20, max_streams=readers + 1)
    hub._loop = asyncio.get_running_loop()

    async def stream(topic: str) -> None:
        r = hub.join(topic, hub.last_id)
        while True:
            waiter = hub.arm(r)
            last, _, _ = hub.after(r.last, topic)
            r.last = max(r.last, last)
            await waiter

    tasks = [asyncio.create_task(stream(f"nothing.matches.{i}.")) for i in range(readers)]
    await asyncio.sleep(0.01)
    batch = [
        {"topic": f"job.demo.echo.{s}", "uuid": "0" * 32, "worker": "w1"} for s in ("queued", "running", "completed")
    ]
    t0 = time.thread_time()
    for _ in range(batches):
        hub._add(batch)
        for _ in range(3):
            await asyncio.sleep(0)  # the wake-up it scheduled runs, and any stream it woke
    used = (time.thread_time() - t0) / batches * 1e6
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return used


def run(quick: bool = False) -> dict[str, Any]:
    n, trials = (400, 2) if quick else (2000, 3)
    phases: dict[str, list[float]] = {"none": [], "idle": []}
    with tempfile.TemporaryDirectory(prefix="zfab-bench-sse-") as tmp:
        events = f"tcp://127.0.0.1:{free_port()}"
        fab = Fabric(tmp, ZFAB_BROKER_EVENTS=events)
        with fab:
            fab.start_broker()
            fab.start_worker("bench-0")
            api = fab.start_api(ZFAB_API_EVENT_STREAMS=str(READERS + 10))
            fab.wait_api_workers(1)
            asyncio.run(_jobs(fab.api_url, 200))  # warm
            for _ in range(trials):
                phases["none"].append(asyncio.run(_phase(fab.api_url, api.pid, n, 0)))
                phases["idle"].append(asyncio.run(_phase(fab.api_url, api.pid, n, READERS)))
    hub_none = statistics.median(asyncio.run(_hub_cost(0, 5000)) for _ in range(3))
    hub_idle = statistics.median(asyncio.run(_hub_cost(READERS, 5000)) for _ in range(3))
    report("hub CPU/batch, no streams", hub_none, "us", higher_is_better=False)
    report(f"hub CPU/batch, {READERS} idle", hub_idle, "us", floor=hub_none, higher_is_better=False, vs="no streams")
    none, idle = statistics.median(phases["none"]), statistics.median(phases["idle"])
    report("API CPU/job, no streams", none, "us", higher_is_better=False)
    report(f"API CPU/job, {READERS} idle", idle, "us", floor=none, higher_is_better=False, vs="no streams")
    return {"none_us": none, "idle_us": idle, "hub_none_us": hub_none, "hub_idle_us": hub_idle, "runs": phases}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true")
    print(run(quick=p.parse_args().quick))


if __name__ == "__main__":
    main()
