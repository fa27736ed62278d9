"""Opening zfab's SQLite files the one way they all need: WAL, no fsync per commit, a schema
version, and a file from another version kept aside instead of misread.

Used by the worker's job store and the HTTP API's job table. WAL with synchronous=NORMAL makes
a commit survive a crash of the process (not of the machine) without an fsync per commit, so
durability does not cap throughput.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

log = logging.getLogger(__name__)


def open_sqlite(
    path: Path,
    schema: str,
    version: int,
    *,
    table: str,
    check_same_thread: bool = True,
    also_accept: tuple[int, ...] = (),
    migrations: dict[int, str] | None = None,
) -> sqlite3.Connection:
    """Open (creating the folder, owner-only) and set up `path` with `schema` at `version`.

    `schema` is the newest shape, for a new file; `migrations[v]` turns version v-1 into v, and
    runs (in one transaction) on a file found at an older version. A file at a version neither
    reaches (nor in `also_accept`, read as `also_accept`'s base) is renamed to
    `<name>.v<old>.<epoch>` and a fresh one made: better an empty store than a misread one.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=check_same_thread)
    found = conn.execute("PRAGMA user_version").fetchone()[0]
    has_table = conn.execute("SELECT count(*) FROM sqlite_master WHERE name=?", (table,)).fetchone()[0]
    steps = migrations or {}
    base = max(found, 1) if found in also_accept else found
    if has_table and base < version and all(v in steps for v in range(base + 1, version + 1)):
        conn.execute("BEGIN")
        for v in range(base + 1, version + 1):
            conn.execute(steps[v])
        conn.execute(f"PRAGMA user_version={int(version)}")
        conn.execute("COMMIT")
        log.info("%s migrated from schema v%d to v%d", path, found, version)
        found = version
    if has_table and found != version and found not in also_accept:
        conn.close()
        aside = path.with_name(f"{path.name}.v{found}.{int(time.time())}")
        path.rename(aside)
        log.warning("%s has schema v%d, not v%d; moved aside to %s", path, found, version, aside)
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=check_same_thread)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(schema)
    conn.execute(f"PRAGMA user_version={int(version)}")
    return conn
