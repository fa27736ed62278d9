"""Where the API keeps its jobs and schedules: the store interface, and which implementation a
ZFAB_API_DB value picks.

- a path (the default, `<data_dir>/api/jobs.sqlite`): SQLite, embedded, one API process
  (api/store/sqlite.py, api/store/schedules.py; their blocking calls run in threads);
- `postgresql://user:pass@host:port/db`: PostgreSQL, shared by every API replica that names it
  (api/store/postgres.py; psycopg's asyncio API, nothing blocks the event loop), with the coordination
  between replicas in api/replicas/coordination.py;
- empty: memory only.

The job store is what the Persister writes the table's changed jobs to and what reads fall back on
for a job the in-memory table does not hold; `shared` says whether other replicas write it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..jobs.record import JobRecord
from .schedules import ScheduleRecord, ScheduleStore
from .sqlite import JobDB, row_of

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(value: str | None) -> bool:
    return bool(value) and str(value).startswith(POSTGRES_SCHEMES)


def redacted(url: str) -> str:
    """A database URL fit for a log line: the password replaced."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in creds:
        return url
    return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"


class StoreError(Exception):
    """The store could not be reached or refused a statement (PostgreSQL down, a full disk)."""


class JobStore(Protocol):
    """The job table beyond memory."""

    label: str  # for log lines (a path, or a URL without its password)
    shared: bool  # other API replicas read and write it too

    async def load(self, broker: str) -> list[JobRecord]:
        """Jobs to hold in memory at start (SQLite: the newest of this broker; PostgreSQL: none)."""
        ...

    async def read(self, uuid: str) -> JobRecord | None: ...

    async def write(self, records: Sequence[JobRecord], broker: str) -> None:
        """Record the jobs as they stand now; raises StoreError when it could not."""
        ...

    async def close(self) -> None: ...


class ScheduleBackend(Protocol):
    """The schedules table and the job -> schedule mapping, as the scheduler uses them."""

    shared: bool
    mapping_capacity: int

    async def load(self) -> list[ScheduleRecord]: ...

    async def save(self, rows: Sequence[tuple[Any, ...]], fired: Sequence[tuple[str, str, float]] = ()) -> None: ...

    async def delete(self, schedule_id: str) -> None: ...

    async def mapping(self) -> list[tuple[str, str]]: ...

    async def close(self) -> None: ...


class SharedScheduleBackend(ScheduleBackend, Protocol):
    """A schedule store other replicas share (PostgreSQL): reads by id and claimed firings."""

    async def read(self, ids: Sequence[str]) -> list[ScheduleRecord]: ...

    async def fire_claimed(
        self, ids: Sequence[str], now: float, advance: Callable[[list[ScheduleRecord]], None]
    ) -> tuple[list[ScheduleRecord], list[str]]: ...

    async def record_firings(
        self, outcomes: Sequence[tuple[str, bool, str | None]], fired: Sequence[tuple[str, str, float]]
    ) -> None: ...


class SqliteJobStore:
    """api/store/sqlite.py's JobDB behind the async interface: each call in a thread."""

    shared = False

    def __init__(self, db: JobDB) -> None:
        self.db = db
        self.label = str(db.path)

    @classmethod
    async def open(cls, path: Path, capacity: int) -> SqliteJobStore:
        return cls(await asyncio.to_thread(JobDB, path, capacity))

    async def load(self, broker: str) -> list[JobRecord]:
        return await asyncio.to_thread(self.db.load, broker)

    async def read(self, uuid: str) -> JobRecord | None:
        return await asyncio.to_thread(self.db.read, uuid)

    async def write(self, records: Sequence[JobRecord], broker: str) -> None:
        def write() -> None:
            # Rows are made in the thread too: model_dump_json of many results is CPU the loop must not spend.
            self.db.write([row_of(rec, broker) for rec in records])

        try:
            await asyncio.to_thread(write)
        except Exception as exc:  # sqlite3.Error, OSError: a full disk must not stop the writer
            raise StoreError(str(exc)) from exc

    async def close(self) -> None:
        await asyncio.to_thread(self.db.close)


class SqliteSchedules:
    """api/store/schedules.py's ScheduleStore (SQLite, or memory) behind the async interface."""

    shared = False

    def __init__(self, store: ScheduleStore) -> None:
        self.store = store
        self.mapping_capacity = store.mapping_capacity

    async def load(self) -> list[ScheduleRecord]:
        return await asyncio.to_thread(self.store.load)

    async def save(self, rows: Sequence[tuple[Any, ...]], fired: Sequence[tuple[str, str, float]] = ()) -> None:
        await asyncio.to_thread(self.store.save, rows, fired)

    async def delete(self, schedule_id: str) -> None:
        await asyncio.to_thread(self.store.delete, schedule_id)

    async def mapping(self) -> list[tuple[str, str]]:
        return await asyncio.to_thread(self.store.mapping)

    async def close(self) -> None:
        await asyncio.to_thread(self.store.close)
