"""Bridges from the client's thread world into the event loop: awaiting jobs and asking MMI.

The client's futures complete on its owner thread; handlers await them here without ever
blocking the event loop.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from typing import Any

from zfab import Client, JobFuture, wait_future
from zfab.errors import BrokerUnavailableError

MMI_TIMEOUT = 2.0
METRICS_MMI_TIMEOUT = 1.0


async def wait_done(future: Future[Any], timeout: float) -> bool:
    """Wait up to `timeout` seconds for a future of the client's (a job's, its admission); True when it
    is done. Never cancels it: a wait that times out, or a caller that hangs up, leaves the future to
    everyone else. The API's client runs on this event loop, so its futures complete on this thread
    and wake their waiter directly (service.transport.wait_future), without call_soon_threadsafe.
    """
    return await wait_future(future, timeout)


async def await_result(future: JobFuture, timeout: float) -> Any:
    """The job's result (or its error, raised), waiting at most `timeout` seconds (then TimeoutError).

    Like wait_done, a caller that hangs up does not cancel the job's future.
    """
    if not await wait_done(future, timeout):
        raise TimeoutError
    return future.result()


async def mmi(client: Client, task: str, timeout: float = MMI_TIMEOUT, **kwargs: Any) -> Any:
    """Ask the broker's management interface without blocking the event loop.

    The MMI future is awaited on the event loop; answer at once when the broker is known
    to be gone instead of waiting out the timeout.
    """
    if not client.broker_alive:
        raise BrokerUnavailableError(f"the broker at {client.broker} is not answering keepalives")
    fut = client.mmi_future(task, timeout, **kwargs)
    reply = await asyncio.wait_for(asyncio.wrap_future(fut), timeout + 1.0)
    return reply["result"]


class FabricView:
    """The broker's show_broker + show_workers (gone ones too) + show_services for /metrics, cached
    so scrapes stay cheap.

    `refresh` runs in the /metrics handler (async); the FabricCollector's fetch then reads
    `snapshot` synchronously, so generate_latest never waits on the fabric.
    """

    def __init__(self, client: Client, ttl: float) -> None:
        self.client = client
        self.ttl = ttl
        self._value: tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]] = ({}, [], [])
        self._at = float("-inf")
        self._lock = asyncio.Lock()

    def snapshot(self) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        return self._value

    async def refresh(self) -> None:
        if time.monotonic() - self._at < self.ttl:
            return
        async with self._lock:  # concurrent scrapes share one MMI round trip
            if time.monotonic() - self._at < self.ttl:
                return
            try:
                broker, workers, services = await asyncio.gather(
                    mmi(self.client, "show_broker", METRICS_MMI_TIMEOUT),
                    mmi(self.client, "show_workers", METRICS_MMI_TIMEOUT, gone=True),
                    mmi(self.client, "show_services", METRICS_MMI_TIMEOUT),
                )
                self._value = (dict(broker), list(workers), list(services))
            except Exception:  # a scrape must still answer; zfab_broker_up says 0
                self._value = ({}, [], [])
            self._at = time.monotonic()
