"""Worker classes with task declarations, for the integration tests (`zfab worker --worker
tests.integration.declared_workers:Secrets`): not a test module, a service the tests start."""

from __future__ import annotations

from service import Worker, task


class Secrets(Worker):
    """A task whose `password` the API must never show."""

    service = "secrets"

    @task(redact=("password",))
    def login(self, user: str, password: str, site: str = "lab") -> dict[str, str]:
        """Pretend to log in; return who and where (never the password)."""
        return {"user": user, "site": site}
