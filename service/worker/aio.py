"""The worker's event loop for `async def` tasks: one thread, many coroutines.

A job whose task is a coroutine function runs here instead of on a pool thread, at most
ZFAB_ASYNC_CONCURRENCY at once (a semaphore; the rest wait in order), so thousands of jobs that
mostly wait (I/O, timers, other services) cost a coroutine each rather than a thread. Deadlines
and DELETE cancel the coroutine; events and input work as for thread tasks (`job.event()`,
`await job.ask()`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable

from .job import Job

log = logging.getLogger(__name__)


class AsyncRunner:
    def __init__(self, run: Callable[[Job], Awaitable[None]], *, concurrency: int, name: str) -> None:
        self._run = run
        self.concurrency = concurrency
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._limit: asyncio.Semaphore | None = None
        self._thread = threading.Thread(target=self._serve, name=f"zfab-{name}-aio", daemon=True)
        self._started = threading.Event()
        self.running = 0  # coroutines holding a slot (read by other threads for stats)
        self.waiting = 0  # submitted, waiting for a slot

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(10):
            raise TimeoutError(f"{self.name}: the event loop for async tasks did not start")

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._limit = asyncio.Semaphore(self.concurrency)
        self._started.set()
        self.loop.run_forever()
        self.loop.close()

    def submit(self, job: Job) -> None:
        """Any thread: run the job's coroutine on the loop, when a slot is free."""
        self.loop.call_soon_threadsafe(self._spawn, job)

    def _spawn(self, job: Job) -> None:
        self.waiting += 1  # the counters change on the loop's thread only
        self.loop.create_task(self._guarded(job), name=f"zfab job {job.uuid}")

    async def _guarded(self, job: Job) -> None:
        assert self._limit is not None
        async with self._limit:
            self.waiting -= 1
            self.running += 1
            try:
                await self._run(job)
            except Exception:  # the runner answers every job; anything else is a bug to see
                log.exception("%s: async job %s failed outside its task", self.name, job.uuid)
            finally:
                self.running -= 1

    def stop(self, timeout: float = 5.0) -> None:
        if not self._thread.is_alive():
            return

        def cancel_all() -> None:
            for t in asyncio.all_tasks(self.loop):
                t.cancel()
            self.loop.call_later(0.2, self.loop.stop)

        self.loop.call_soon_threadsafe(cancel_all)
        self._thread.join(timeout)
