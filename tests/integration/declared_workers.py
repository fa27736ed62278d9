"""Worker classes with task declarations, for the integration tests (`zfab worker --worker
tests.integration.declared_workers:Secrets`): not a test module, a service the tests start."""

from __future__ import annotations

from pathlib import Path

from zfab import Job, Worker, task


class Secrets(Worker):
    """A task whose `password` the API must never show."""

    service = "secrets"

    @task(redact=("password",))
    def login(self, user: str, password: str, site: str = "lab") -> dict[str, str]:
        """Pretend to log in; return who and where (never the password)."""
        return {"user": user, "site": site}


class Fixable(Worker):
    """A task that fails until its fault is fixed (the test creates the file it needs)."""

    service = "fixable"

    @task
    def needs(self, path: str) -> str:
        """Return the text of the file at `path`; FileNotFoundError until it exists."""
        return Path(path).read_text()


class Limited(Worker):
    """Tasks with a rate and a concurrency limit, which the broker enforces across all workers."""

    service = "limited"

    @task(rate_limit="5/s")
    def paced(self, n: int = 0) -> int:
        """Return n; at most 5 start a second, fabric-wide."""
        return n

    @task(concurrency=2)
    def slow(self, job: Job, seconds: float = 0.5) -> float:
        """Wait `seconds` (cancellable); at most 2 run at once, fabric-wide."""
        job.cancel_event.wait(seconds)
        return seconds
