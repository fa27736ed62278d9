"""Worker classes with task declarations, for the integration tests (`zfab worker --worker
tests.integration.declared_workers:Secrets`): not a test module, a service the tests start."""

from __future__ import annotations

from pathlib import Path

from service import Worker, task


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
