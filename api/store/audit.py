"""The audit log in the API's database: a table `audit` beside the job table, in the SQLite file or the shared
PostgreSQL database ZFAB_API_DB names, bounded by count and age (ZFAB_API_AUDIT_COUNT, ZFAB_API_AUDIT_DAYS).

Entries come in batches (api/http/audit.py's writer: whatever gathered while the previous write ran, job
submissions included), one executemany each. SQLite writes go to a thread; PostgreSQL's through the
API's pool. Pruning (the oldest past the count, any past the age) runs with a write, at most every
PRUNE_EVERY seconds. An entry taken from the broker's log (api/http/brokeraudit.py) has the peer
`broker:<log>:<seq>`, unique: taken twice (by two replicas, or after a restart), it is stored once.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .postgres import PgDatabase

Row = tuple[float, str, str, str, str, str, int]  # at, actor, role, action, target, peer, status
COLUMNS = "at, actor, role, action, target, peer, status"
PRUNE_EVERY = 60.0

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL, actor TEXT NOT NULL, role TEXT NOT NULL, action TEXT NOT NULL,
    target TEXT NOT NULL, peer TEXT NOT NULL, status INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_at ON audit(at);
CREATE UNIQUE INDEX IF NOT EXISTS audit_broker_once ON audit(peer) WHERE peer LIKE 'broker:%';
"""


class AuditStore(Protocol):
    async def add(self, rows: Sequence[Row]) -> None: ...

    async def page(
        self, actor: str | None, action: str | None, since: float | None, limit: int, offset: int
    ) -> tuple[list[Row], int]:
        """(newest first, from `offset`, at most `limit`; how many match)."""
        ...

    async def close(self) -> None: ...


def _where(actor: str | None, action: str | None, since: float | None, mark: str) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if actor is not None:
        clauses.append(f"actor = {mark}")
        params.append(actor)
    if action is not None:
        clauses.append(f"instr(action, {mark}) > 0" if mark == "?" else f"strpos(action, {mark}) > 0")
        params.append(action)
    if since is not None:
        clauses.append(f"at >= {mark}")
        params.append(since)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class SqliteAudit:
    """The `audit` table in the API's SQLite file (its own connection; the job table's is the persister's)."""

    def __init__(self, path: Path, max_count: int, max_age: float) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=5)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(SQLITE_SCHEMA)
        self._lock = threading.Lock()
        self.max_count, self.max_age = max_count, max_age
        self._pruned_at = 0.0

    def _add(self, rows: Sequence[Row]) -> None:
        with self._lock:
            # OR IGNORE: a broker's entry taken again (an API restarted reads the broker's log from its start)
            self._conn.executemany(f"INSERT OR IGNORE INTO audit ({COLUMNS}) VALUES (?,?,?,?,?,?,?)", rows)
            if time.monotonic() - self._pruned_at >= PRUNE_EVERY:
                self._pruned_at = time.monotonic()
                self._conn.execute("DELETE FROM audit WHERE at < ?", (time.time() - self.max_age,))
                self._conn.execute("DELETE FROM audit WHERE id <= (SELECT max(id) FROM audit) - ?", (self.max_count,))

    async def add(self, rows: Sequence[Row]) -> None:
        await asyncio.to_thread(self._add, rows)

    def _page(
        self, actor: str | None, action: str | None, since: float | None, limit: int, offset: int
    ) -> tuple[list[Row], int]:
        where, params = _where(actor, action, since, "?")
        with self._lock:
            total = self._conn.execute(f"SELECT count(*) FROM audit{where}", params).fetchone()[0]
            rows = self._conn.execute(
                f"SELECT {COLUMNS} FROM audit{where} ORDER BY id DESC LIMIT ? OFFSET ?", [*params, limit, offset]
            ).fetchall()
        return [tuple(r) for r in rows], int(total)

    async def page(
        self, actor: str | None, action: str | None, since: float | None, limit: int, offset: int
    ) -> tuple[list[Row], int]:
        return await asyncio.to_thread(self._page, actor, action, since, limit, offset)

    async def close(self) -> None:
        with self._lock:
            self._conn.close()


class PgAudit:
    """The `audit` table of the shared PostgreSQL database (schema v2: api/store/schema.py): every replica's
    entries in one log."""

    def __init__(self, db: PgDatabase, max_count: int, max_age: float) -> None:
        self.db = db
        self.max_count, self.max_age = max_count, max_age
        self._pruned_at = 0.0

    async def add(self, rows: Sequence[Row]) -> None:
        async with self.db.connection() as conn:
            async with conn.cursor() as cur:
                # A broker's entry that another replica (or this one before a restart) took already: once.
                await cur.executemany(
                    f"INSERT INTO audit ({COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING", rows
                )
            if time.monotonic() - self._pruned_at >= PRUNE_EVERY:
                self._pruned_at = time.monotonic()
                await conn.execute("DELETE FROM audit WHERE at < %s", (time.time() - self.max_age,))
                await conn.execute("DELETE FROM audit WHERE id <= (SELECT max(id) FROM audit) - %s", (self.max_count,))

    async def page(
        self, actor: str | None, action: str | None, since: float | None, limit: int, offset: int
    ) -> tuple[list[Row], int]:
        where, params = _where(actor, action, since, "%s")
        async with self.db.connection() as conn:
            cur = await conn.execute(f"SELECT count(*) FROM audit{where}", params)
            found = await cur.fetchone()
            cur = await conn.execute(
                f"SELECT {COLUMNS} FROM audit{where} ORDER BY id DESC LIMIT %s OFFSET %s",
                [*params, limit, offset],
            )
            rows = await cur.fetchall()
        return [tuple(r) for r in rows], int(found[0]) if found else 0

    async def close(self) -> None:
        return None  # the pool is the database's, closed with it
