"""The audit log: every state-changing HTTP call (who, what, on which job/queue/schedule/limit, from where,
when, its outcome), bounded by count and age, readable by admins at GET /audit.

Recorded by a middleware once the answer's status is known, for every POST, PUT, PATCH and DELETE behind
auth, refusals included (a 403 is worth knowing). A job submission is recorded by its route (the
documented POST /jobs and the lean one), which knows the job: its entry is a tuple, written with
the others in one batched write, never a database round trip on the request's path; the job's own
row names its submitter too (`submitted_by`). MMI actions reach the broker through the API (its
routes are audited here); under CURVE the broker refuses them to any key whose grant does not allow
them, and counts the refusals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterator
from contextlib import suppress

from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from zfab.core.logbudget import LogBudget

from ..store.audit import AuditStore, Row
from .auth import GRANT

log = logging.getLogger(__name__)

AUDITED = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# A job submission's entry is made by its route, which knows the job (api/http/routes/jobs.py, lean.py): the
# middleware records only a refused one.
SUBMISSIONS = frozenset({("POST", "/jobs")})
SUBMIT = "POST /jobs"  # a submission's action; its target is the job's uuid
READ_WAIT = 2.0  # GET /audit waits at most this long for the entries being written


class AuditEntry(BaseModel):
    at: float = Field(description="When (epoch seconds)")
    actor: str = Field(description="The token's or key's name in the access file ('anonymous' on loopback)")
    role: str
    action: str = Field(description="METHOD and route template, e.g. `POST /mmi/services/{service}/pause`")
    target: str = Field(description="The job, queue, schedule or limit acted on (the request's path; a job's uuid)")
    peer: str = Field(description="Where the call came from")
    status: int = Field(description="The answer's HTTP status: the outcome")
    origin: str = Field(
        "api",
        description="`api`: a call to this API; `broker`: an MMI command a CURVE key sent the broker directly "
        "(its action starts with `MMI `; docs/roles.md)",
    )


FIELDS = ("at", "actor", "role", "action", "target", "peer", "status")  # a stored row's columns, in order
BROKER_ACTION = "MMI "  # the action of an entry the broker kept (an MMI command a CURVE key sent it)


def entry(row: Row) -> AuditEntry:
    return AuditEntry(
        **dict(zip(FIELDS, row, strict=True)), origin="broker" if row[3].startswith(BROKER_ACTION) else "api"
    )


class AuditPage(BaseModel):
    items: list[AuditEntry]
    total: int
    limit: int
    offset: int


class AuditLog:
    """The newest entries, at most `max_count` and none older than `max_age` seconds, in memory and, with
    ZFAB_API_DB, in the API's database (`store`: api/store/audit.py), which GET /audit then reads.

    An entry is a Row (a tuple: one allocation, since a job submission makes one); the database gets
    them in batches, one write for whatever gathered while the previous one ran, never one per entry."""

    MAX_PENDING = 10_000  # entries waiting for the database; past it one is dropped from the database (counted)

    def __init__(self, max_count: int = 10_000, max_age: float = 30 * 86400) -> None:
        self.max_count = max_count
        self.max_age = max_age
        self.entries: deque[Row] = deque(maxlen=max_count)
        self.store: AuditStore | None = None
        self._pending: list[Row] = []
        self._kick = asyncio.Event()
        self._idle = asyncio.Event()  # nothing waits for the database: a read finds every entry made so far
        self._idle.set()
        self._writer: asyncio.Task[None] | None = None
        self._writing = False
        self.written = 0
        self.write_errors = 0
        self.dropped = 0
        self._log = LogBudget(burst=3, per_second=0.1)

    @property
    def pending(self) -> int:
        """Entries waiting for the database (a metric: zfab_table_size{table="api_audit_pending"})."""
        return len(self._pending)

    def add(self, row: Row) -> None:
        self.entries.append(row)
        self.trim(row[0])
        if self.store is None:
            return
        if len(self._pending) >= self.MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append(row)
        self._idle.clear()
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name="api audit writer")
        self._kick.set()

    def submitted(self, scope: Scope, uuid: str, status: int) -> None:
        """A job submission: who (the grant auth left in the scope), the job, the answer's status."""
        grant = scope.get(GRANT)
        client = scope.get("client")
        self.add(
            (
                time.time(),
                grant.name if grant is not None else "unauthenticated",
                grant.role if grant is not None else "",
                SUBMIT,
                uuid,
                client[0] if client else "",
                status,
            )
        )

    async def _write_loop(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            store = self.store
            rows, self._pending = self._pending, []
            if store is None or not rows:
                self._idle.set()
                continue
            self._writing = True
            try:
                await store.add(rows)
                self.written += len(rows)
            except Exception as exc:  # the database away: the entries stay in memory
                self.write_errors += 1
                if self._log.take() is not None:
                    log.warning("audit log: %d entries could not be written to the database: %s", len(rows), exc)
            finally:
                self._writing = False
                if not self._pending:
                    self._idle.set()

    async def drain(self) -> None:
        """Wait (up to 5 s) for the entries still to be written (the API is stopping), then stop the writer."""
        deadline = time.monotonic() + 5
        while (self._pending or self._writing) and self._writer is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._writer is not None:
            self._writer.cancel()
            with suppress(asyncio.CancelledError):
                await self._writer
            self._writer = None

    async def page(
        self, actor: str | None, action: str | None, since: float | None, limit: int, offset: int
    ) -> tuple[list[AuditEntry], int]:
        if self.store is not None:
            with suppress(TimeoutError):  # what was recorded before this read is in its answer (a bounded wait)
                await asyncio.wait_for(self._idle.wait(), READ_WAIT)
            rows, total = await self.store.page(actor, action, since, limit, offset)
        else:
            found = [
                r
                for r in self.newest()
                if (actor is None or r[1] == actor)
                and (action is None or action in r[3])
                and (since is None or r[0] >= since)
            ]
            rows, total = found[offset : offset + limit], len(found)
        return [entry(r) for r in rows], total

    def trim(self, now: float) -> None:
        while self.entries and self.entries[0][0] < now - self.max_age:
            self.entries.popleft()

    def newest(self) -> Iterator[Row]:
        self.trim(time.time())
        return reversed(self.entries)


class AuditMiddleware:
    """Records each audited call once its answer's status is out (api/http/app.py puts it outermost)."""

    def __init__(self, app: ASGIApp, log: AuditLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in AUDITED:
            await self.app(scope, receive, send)
            return
        status = 500

        async def watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            self._record(scope, status)

    def _record(self, scope: Scope, status: int) -> None:
        route = scope.get("route")
        template = str(getattr(route, "path", "")) if route is not None else ""
        method = scope["method"]
        if ((method, template) in SUBMISSIONS and status < 400) or (not template and status == 404):
            return  # a job submitted (its route recorded it, with its uuid), or a path no route serves
        grant = scope.get(GRANT)
        client = scope.get("client")
        self.log.add(
            (
                time.time(),
                grant.name if grant is not None else "unauthenticated",
                grant.role if grant is not None else "",
                f"{method} {template or scope['path'][:200]}",
                scope["path"][:500],
                str(client[0]) if client else "",
                status,
            )
        )
