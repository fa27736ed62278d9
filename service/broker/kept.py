"""Where the broker keeps what a user set and a restart or a failover must not lose: paused queues
(paused.py) and limits set at run time (limits.py), each a small JSON document of its own kind.

- One broker on its own keeps them in files under `$ZFAB_DATA_DIR/broker` (`paused.json`,
  `limits.json`), replaced atomically when a user changes them (FileKept).
- Brokers that share a PostgreSQL lease (`ZFAB_BROKER_LEASE=postgresql://...`) keep them in that
  database, in a table of their own (`zfab_broker_kept`, made when missing, one row per lease name
  and kind), so the broker that takes over starts with what the deposed one held (PgKept). A change
  is handed to one writer thread that keeps only the latest document of each kind (at most one per
  kind waits), so the broker's loop never waits on the database; a write that fails is counted,
  logged and tried again. Reads block: when the broker starts (before its loop runs) and when it
  takes the lease (reread(), on the lease keeper's thread; what was read is applied on the loop).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from ..settings import Settings

log = logging.getLogger(__name__)

KINDS = ("paused", "limits")
DEFAULT_LEASE_NAME = "zfab-broker"  # the lease a postgresql:// URL without a #NAME names
RETRY_SECONDS = 1.0  # a failed write is tried again after this (the latest document, not every one)
MAX_DOCUMENT_BYTES = 8 << 20  # a kept document past this is not read (both kinds are bounded far below)

SCHEMA = """
CREATE TABLE IF NOT EXISTS zfab_broker_kept (
    lease text NOT NULL,
    kind text NOT NULL,
    doc jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (lease, kind)
)"""
UPSERT = """
INSERT INTO zfab_broker_kept (lease, kind, doc, updated_at) VALUES (%s, %s, %s::jsonb, now())
ON CONFLICT (lease, kind) DO UPDATE SET doc = EXCLUDED.doc, updated_at = EXCLUDED.updated_at"""
SELECT = "SELECT doc::text FROM zfab_broker_kept WHERE lease = %s AND kind = %s"


class Kept(Protocol):
    """One small JSON document per kind ("paused", "limits")."""

    write_errors: Counter[str]  # by kind

    def read(self, kind: str) -> Any:
        """The document kept (None: none yet). Raises OSError or ValueError when it cannot be read."""
        ...

    def write(self, kind: str, doc: Any) -> None:
        """Keep `doc` in place of the last one; never raises (a failure is counted and logged)."""
        ...

    def where(self, kind: str) -> str:
        """Where a kind is kept, for the log."""
        ...

    def close(self) -> None: ...


def open_kept(settings: Settings) -> Kept:
    """PostgreSQL when the broker's lease is a postgresql:// URL (the same database), else files."""
    lease = getattr(settings, "broker_lease", None) or ""
    if lease.startswith(("postgresql://", "postgres://")):
        return PgKept(lease)
    return FileKept(Path(settings.data_dir) / "broker")


class FileKept:
    """`DIRECTORY/KIND.json`, replaced atomically (written on the caller's thread: a few hundred bytes)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.write_errors: Counter[str] = Counter()

    def where(self, kind: str) -> str:
        return str(self.directory / f"{kind}.json") if self.directory is not None else "memory"

    def read(self, kind: str) -> Any:
        if self.directory is None:
            return None
        path = self.directory / f"{kind}.json"
        if not path.exists():
            return None
        return json.loads(path.read_text())

    def write(self, kind: str, doc: Any) -> None:
        if self.directory is None:
            return
        path = self.directory / f"{kind}.json"
        tmp = path.with_suffix(".tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with tmp.open("w") as f:
                json.dump(doc, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            self.write_errors[kind] += 1
            log.error("broker: cannot write the %s to %s (%s); a restart forgets the change", kind, path, exc)

    def close(self) -> None:
        pass


def split_url(url: str) -> tuple[str, str]:
    """(the libpq URL, the lease's name): `postgresql://...#NAME` names the lease (default zfab-broker)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(fragment="")), unquote(parts.fragment) or DEFAULT_LEASE_NAME


class PgKept:
    """The documents in PostgreSQL, one row per (lease name, kind); written by one thread of its own."""

    def __init__(self, url: str, *, timeout: float = 5.0) -> None:
        self.dsn, self.lease = split_url(url)
        self.timeout = timeout
        self.write_errors: Counter[str] = Counter()
        self.writes = 0
        self._pending: dict[str, str] = {}  # kind -> the latest document not yet written (bounded: KINDS)
        self._cond = threading.Condition()
        self._closing = False
        self._made_table = False
        self._writer: threading.Thread | None = None

    def where(self, kind: str) -> str:
        return f"PostgreSQL (zfab_broker_kept, lease {self.lease!r}, kind {kind!r})"

    def read(self, kind: str) -> Any:
        import psycopg  # only a broker with a PostgreSQL lease loads it

        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(1, int(self.timeout))) as conn:
                self._make_table(conn)
                row = conn.execute(SELECT, (self.lease, kind)).fetchone()
        except psycopg.Error as exc:
            raise OSError(f"PostgreSQL: {exc}") from None
        if row is None:
            return None
        text = str(row[0])
        if len(text) > MAX_DOCUMENT_BYTES:
            raise ValueError(f"{len(text)} bytes, more than a broker keeps ({MAX_DOCUMENT_BYTES})")
        return json.loads(text)

    def write(self, kind: str, doc: Any) -> None:
        text = json.dumps(doc)
        with self._cond:
            if self._closing:
                self.write_errors[kind] += 1
                return
            self._pending[kind] = text
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="broker-kept", daemon=True)
                self._writer.start()
            self._cond.notify()

    def flush(self, timeout: float) -> bool:
        """Wait until nothing is pending (tests, and close); False at the timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self) -> None:
        """Write what is pending (within the timeout), then stop the writer."""
        self.flush(self.timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._writer is not None:
            self._writer.join(timeout=self.timeout)

    # ---- the writer thread ------------------------------------------------------------------

    _busy = False

    def _write_loop(self) -> None:
        import psycopg

        conn: psycopg.Connection[Any] | None = None
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing)
                if self._closing and not self._pending:
                    break
                batch, self._pending = self._pending, {}
                self._busy = True
            failed: dict[str, str] = {}
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=max(1, int(self.timeout)))
                    self._make_table(conn)
                for kind, text in batch.items():
                    conn.execute(UPSERT, (self.lease, kind, text))
                    self.writes += 1
            except psycopg.Error as exc:
                failed = batch
                for kind in batch:
                    self.write_errors[kind] += 1
                log.error("broker: cannot keep the %s in PostgreSQL (%s); trying again", ", ".join(batch), exc)
                if conn is not None:
                    conn.close()
                conn = None
            with self._cond:
                for kind, text in failed.items():
                    self._pending.setdefault(kind, text)  # unless a newer document came meanwhile
                self._busy = False
                self._cond.notify_all()
                if failed and not self._closing:
                    self._cond.wait(RETRY_SECONDS)
                elif failed:
                    break
        if conn is not None:
            conn.close()

    def _make_table(self, conn: Any) -> None:
        if not self._made_table:
            conn.execute(SCHEMA)
            self._made_table = True


def reread(kept: Kept, call: Callable[[Callable[[], None]], object], loads: tuple[Callable[[Any], None], ...]) -> None:
    """A broker that takes the lease reads what a user set (here, on the caller's thread: it blocks)
    and applies it on its loop through `call` (Transport.call). `loads` are PausedServices.take and
    Limiter.take, in KINDS order. A kind that cannot be read is left as it is (and logged)."""
    docs: list[Any] = []
    for kind in KINDS:
        try:
            docs.append(kept.read(kind))
        except (OSError, ValueError) as exc:
            log.warning("broker: cannot read the %s from %s (%s); kept as they were", kind, kept.where(kind), exc)
            docs.append(_UNREAD)

    def apply() -> None:
        for load, doc in zip(loads, docs, strict=True):
            if doc is not _UNREAD:
                load(doc)

    try:
        call(apply)
    except Exception as exc:  # the loop stopping, or swamped: the caller's thread (the lease keeper) goes on
        log.warning("broker: what a user set, read from %s, was not applied (%s)", kept.where(KINDS[0]), exc)


_UNREAD = object()
