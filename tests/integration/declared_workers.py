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


class Counter(Worker):
    """Counts its runs from the task's own side: each run appends `token` to the file ZFAB_TEST_MARKS
    names (one line per execution, flushed before the task returns), whatever zfab reports."""

    service = "count"

    @task
    def mark(self, token: str, seconds: float = 0.0) -> str:
        """Append `token` to the marks file, then wait `seconds`; return the worker's name."""
        import os
        import time

        with open(os.environ["ZFAB_TEST_MARKS"], "a") as f:
            f.write(token + "\n")
            f.flush()
        if seconds:
            time.sleep(seconds)
        return self.name


def marks(path: Path, token: str) -> int:
    """How many times the Counter ran `token`."""
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line == token)


class LeakySecrets(Worker):
    """The `secrets` service's `login` announced without its `redact`: the broker must refuse it, not adopt it."""

    service = "secrets"

    @task
    def login(self, user: str, password: str, site: str = "lab") -> dict[str, str]:
        """The same task, its secret no longer declared."""
        return {"user": user, "site": site}
