"""The Args, Raises and Example sections of `Worker`'s docstrings, appended to them as the package is imported,
so `help(Worker)` and the Python reference (mkdocstrings) show them. They live here because worker.py keeps to
its size (tests/unit/test_layout.py); tests/unit/test_docstrings.py checks that every argument named is real."""

from __future__ import annotations

from ..core.docstrings import document
from .worker import Worker

SECTIONS: dict[str, str] = {
    "": """
        A service is a `Worker` subclass with a `service` name; its tasks are methods marked `@task`,
        whose type hints are their arguments' schema (`list_tasks` serves it). Jobs run on a bounded
        pool of threads (`ZFAB_POOL_SIZE`), or on the worker's event loop for `async def` tasks, never
        on the socket's loop, and are recorded in the worker's job store (SQLite, under `ZFAB_DATA_DIR`).
        `zfab worker --worker module:Class` runs one; so does `start()` in your own process.

        Args:
            broker: the broker's endpoint (default: `ZFAB_BROKER`).
            name: the worker's name (default: `SERVICE-HOSTNAME`, stable across restarts); one process
                holds a name at a time.
            service: the service's name, instead of the class's `service`.
            settings: bounds and timings (default: `Settings()`, from the `ZFAB_*` environment).
            transport: for tests: a stub transport (`zfab.transport.stub`).
            clock: for tests: a fake clock.

        Raises:
            ValueError: the class has no service name and none was given.

        Example:
            ```python
            from zfab import Job, Worker, task


            class Inventory(Worker):
                service = "inventory"

                @task
                def count(self, job: Job, site: str, limit: int = 10) -> int:
                    job.event(f"counting {site}", progress=0.5)
                    return min(limit, 42)


            with Inventory(broker="tcp://127.0.0.1:5555", name="inv-1"):
                ...                                   # serves jobs until the block ends
            ```
    """,
    "start": """
        Opens its job store, starts its pool and connects to the broker; returns the worker itself, so
        `worker = MyWorker().start()` reads well. A `with` block starts and stops it.

        Returns:
            The worker, started.

        Example:
            ```python
            worker = Inventory(name="inv-1").start()
            ```
    """,
    "stop": """
        Args:
            drain: seconds its admitted jobs may take to finish (default: `ZFAB_DRAIN_TIMEOUT`).

        Example:
            ```python
            worker.stop(drain=10)
            ```
    """,
}

document(Worker, SECTIONS)
