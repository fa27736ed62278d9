"""A Client on the asyncio transport against a real broker and worker: its socket on the event loop's
thread, 200 jobs awaited concurrently from coroutines, each result back, no owner thread."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from fabric import fabric, wait_workers

from zfab import Client, Settings
from zfab.transport.aioloop import AioLoop, AioTransport, wait_future

DEADLINE = 20.0


def test_a_client_on_the_event_loop_runs_200_concurrent_jobs(tmp_path: Path) -> None:
    with fabric(tmp_path) as f:
        f.broker()
        f.worker("w1")
        with f.client("probe") as probe:
            wait_workers(probe, {"w1"})
        settings = Settings(broker=f.endpoint, keepalive_interval=f.interval, keepalive_multiplier=f.multiplier)

        async def main() -> None:
            # Given a client whose transport is this event loop (started from a coroutine)
            threads_before = {t.name for t in threading.enumerate()}
            client = Client(settings=settings, name="aio", transport=AioTransport(), queued_notice=0)
            client.start()
            assert isinstance(client.loop, AioLoop)
            assert client.loop.owner_ident == threading.get_ident()
            assert not {t.name for t in threading.enumerate()} - threads_before  # no owner thread of its own
            async with asyncio.timeout(DEADLINE):
                while not client.broker_alive:
                    await asyncio.sleep(0.01)

            # When 200 coroutines each submit a job and await it
            async def one(i: int) -> object:
                fut = client.submit("demo", "echo", kwargs={"data": i}, timeout=DEADLINE)
                assert await wait_future(fut, DEADLINE), f"job {i} did not finish"
                return fut.result()["w1"]["result"]

            results = await asyncio.gather(*(one(i) for i in range(200)))
            # Then every one got its own result
            assert results == list(range(200))
            # And the admission of each was settled too, on the loop, before its end
            fut = client.submit("demo", "echo", kwargs={"data": "x"}, timeout=DEADLINE)
            assert await wait_future(fut, DEADLINE) and fut.admission.result(0) == "dispatched"
            # A submission from another thread is handed over to the loop, and MMI answers
            other = await asyncio.to_thread(client.submit, "demo", "echo", kwargs={"data": "t"}, timeout=DEADLINE)
            assert await wait_future(other, DEADLINE) and other.result()["w1"]["result"] == "t"
            mmi = client.mmi_future("show_workers", timeout=5.0)
            assert await wait_future(mmi, DEADLINE)
            assert "w1" in {w["name"] for w in mmi.result()["result"]}
            assert client.loop.stats.send_dropped == 0 and client.jobs_in_flight() == 0
            # And it closes from the coroutine without blocking the loop
            await client.aclose()
            assert client.loop.stopped.is_set()

        asyncio.run(main())
