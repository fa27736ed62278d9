"""The lease in PostgreSQL: one row per lease name, its holder, epoch and expiry, the expiry computed by the
database's own clock so that no broker's clock decides anything for another (docs/failover.md).

One statement takes, renews or only reads the lease: an UPSERT that changes the row only when this holder
has it or it expired, and returns the row as it is either way. The connection is blocking psycopg on the
lease keeper's thread (keeper.py); `tcp_user_timeout` bounds a round trip whose packets vanish (a partition),
so a cut-off broker hears LeaseUnavailable instead of waiting on the kernel's retransmissions.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg

from .lease import LeaseState, LeaseUnavailable

log = logging.getLogger(__name__)

DEFAULT_NAME = "zfab-broker"

SCHEMA = """
CREATE TABLE IF NOT EXISTS zfab_lease (
    name text PRIMARY KEY,
    holder text NOT NULL,
    epoch bigint NOT NULL,
    expires_at timestamptz NOT NULL
)"""

# Taken when free or expired (epoch + 1: a new term), renewed by its holder; the row as it stands otherwise.
# The CTE's SELECT of the table sees the row before the UPSERT: it is read only when the UPSERT changed nothing.
ACQUIRE = """
WITH up AS (
    INSERT INTO zfab_lease AS l (name, holder, epoch, expires_at)
    VALUES (%(name)s, %(holder)s, 1, clock_timestamp() + make_interval(secs => %(duration)s))
    ON CONFLICT (name) DO UPDATE SET
        holder = EXCLUDED.holder,
        epoch = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > clock_timestamp()
                     THEN l.epoch ELSE l.epoch + 1 END,
        expires_at = EXCLUDED.expires_at
    WHERE l.holder = EXCLUDED.holder OR l.expires_at <= clock_timestamp()
    RETURNING holder, epoch, expires_at
)
SELECT holder, epoch, EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8 FROM up
UNION ALL
SELECT holder, epoch, EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8 FROM zfab_lease
WHERE name = %(name)s AND NOT EXISTS (SELECT 1 FROM up)
"""

RELEASE = "UPDATE zfab_lease SET expires_at = clock_timestamp() WHERE name = %(name)s AND holder = %(holder)s"


def split_url(url: str) -> tuple[str, str]:
    """(the libpq URL, the lease's name): `postgresql://...#NAME` names the lease (default zfab-broker)."""
    parts = urlsplit(url)
    name = unquote(parts.fragment) or DEFAULT_NAME
    return urlunsplit(parts._replace(fragment="")), name


class PgLease:
    """A `Lease` (lease.py) on one PostgreSQL connection, made again after an error."""

    def __init__(self, url: str, *, timeout: float) -> None:
        self.url, self.name = split_url(url)
        self.timeout = timeout
        self.conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self.made_table = False
        self.queries = 0  # round trips tried (bench/failover.py: what an idle standby costs the database)

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self.conn is None or self.conn.closed:
            ms = max(100, int(self.timeout * 1000))
            self.conn = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=max(2, int(self.timeout + 0.999)),  # libpq's floor is 2 s
                tcp_user_timeout=ms,  # sent data unacknowledged this long: the connection fails
                keepalives=1,
                keepalives_idle=max(1, int(self.timeout)),
                keepalives_interval=1,
                keepalives_count=2,
                options=f"-c statement_timeout={ms}",
                application_name="zfab-broker-lease",
            )
        if not self.made_table:
            self.conn.execute(SCHEMA)
            self.made_table = True
        return self.conn

    def acquire_or_renew(self, holder: str, duration: float) -> LeaseState:
        self.queries += 1
        try:
            conn = self._connection()
            row = conn.execute(ACQUIRE, {"name": self.name, "holder": holder, "duration": duration}).fetchone()
        except (psycopg.Error, OSError) as exc:
            self._drop()
            raise LeaseUnavailable(f"PostgreSQL lease {self.name!r}: {exc}".strip()) from None
        if row is None:  # the row exists after the UPSERT: only a concurrent DELETE makes this
            return LeaseState(False, 0, "", 0.0)
        who, epoch, left = str(row[0]), int(row[1]), float(row[2])
        return LeaseState(who == holder and left > 0, epoch, who, left)

    def release(self, holder: str) -> None:
        try:
            self._connection().execute(RELEASE, {"name": self.name, "holder": holder})
        except (psycopg.Error, OSError) as exc:
            log.info("could not release the lease %r (the standby waits it out): %s", self.name, exc)
            self._drop()

    def close(self) -> None:
        self._drop()

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a broken connection: nothing more to learn
                pass
