"""A worker for the shared-memory tests (`zfab worker --worker tests.integration.shm_workers:Holder`):
not a test module, a service the tests start."""

from __future__ import annotations

import threading
import time

from zfab import Job, Worker, task


class Holder(Worker):
    """Tasks that keep a large argument a while, or make a large result from a small request."""

    service = "holder"

    @task
    def hold(self, data: str, seconds: float, job: Job) -> int:
        """Keep `data` for `seconds` (a job to kill its worker in), then say its length."""
        pause = threading.Event()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            job.check()
            pause.wait(0.05)
        return len(data)

    @task(retries=2, backoff=0.01, retry_on=RuntimeError)
    def second_time(self, data: str, job: Job) -> int:
        """Fail the first attempt, then say the length of `data`."""
        if job.attempt < 2:
            raise RuntimeError("first attempt fails")
        return len(data)

    @task
    def big(self, n: int) -> str:
        """A result of `n` characters."""
        return "x" * n
