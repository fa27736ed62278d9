"""The `demo` service: small tasks that make a fresh fabric useful and serve tests and benchmarks."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ..worker.job import Job
from ..worker.task import task
from ..worker.worker import Worker


class DemoWorker(Worker):
    service = "demo"

    @task
    def echo(self, data: Any = None) -> Any:
        """Return `data` unchanged."""
        return data

    @task
    def add(self, a: float, b: float) -> float:
        """Return a + b."""
        return a + b

    @task
    def sleep(self, seconds: float, job: Job) -> float:
        """Sleep for `seconds` (cancellable, honours the job's deadline); return the seconds slept."""
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        start = time.monotonic()
        while (left := seconds - (time.monotonic() - start)) > 0:
            job.check()
            job.cancel_event.wait(min(0.05, left))
        return round(time.monotonic() - start, 3)

    @task
    def fail(self, message: str = "demo failure") -> None:
        """Raise RuntimeError(message): shows how a failed task reports."""
        raise RuntimeError(message)

    @task(retries=3, retry_on=RuntimeError)
    def flaky(self, job: Job, failures: int = 2) -> dict[str, int]:
        """Raise RuntimeError on the first `failures` attempts, then return which attempt succeeded:
        the task declares 3 retries, 1 s after the first failure and doubling (±10 %)."""
        if job.attempt <= failures:
            raise RuntimeError(f"attempt {job.attempt} of {job.attempts} fails on purpose")
        return {"attempt": job.attempt}

    @task
    def progress(self, job: Job, steps: int = 5, delay: float = 0.1) -> dict[str, int]:
        """Emit `steps` progress events, `delay` seconds apart."""
        if not 0 < steps <= 10_000:
            raise ValueError("steps must be between 1 and 10000")
        for i in range(1, steps + 1):
            job.check()
            job.event(f"step {i} of {steps}", progress=i / steps, data={"step": i})
            if delay > 0:
                job.cancel_event.wait(delay)
        return {"steps": steps}

    @task
    def ask(self, job: Job, question: str = "What is your name?", timeout: float = 60.0) -> dict[str, Any]:
        """Ask the client a question (status 102 while waiting) and return its answer."""
        answer = job.request_input(question, {"type": "string", "minLength": 1}, timeout=timeout)
        return {"question": question, "answer": answer}


class AsyncDemoWorker(Worker):
    """The `demo-async` service: tasks that wait on the worker's event loop (`async def`), so one
    worker holds thousands of them at once (ZFAB_ASYNC_CONCURRENCY)."""

    service = "demo-async"

    @task
    async def nap(self, seconds: float, job: Job) -> float:
        """Await `seconds` on the worker's event loop (an async task: thousands wait at once, no
        thread each); cancellable, honours the deadline. Returns the seconds slept."""
        if seconds < 0:
            raise ValueError("seconds must not be negative")
        start = time.monotonic()
        await asyncio.sleep(seconds)
        job.check()
        return round(time.monotonic() - start, 3)
