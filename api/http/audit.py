"""The audit log: every state-changing HTTP call (who, what, on which job/queue/schedule/limit, from where,
when, its outcome), bounded by count and age, readable by admins at GET /audit.

Recorded by a middleware once the answer's status is known, for every POST, PUT, PATCH and DELETE behind
auth, refusals included (a 403 is worth knowing). POST /jobs is not: a submission is a job, recorded in the
job table, and an audit row per job would cost the hot path an allocation and a write per job.
MMI actions reach the broker through the API (its routes are audited here); under CURVE the broker
refuses them to any key whose grant does not allow them, and counts the refusals.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from zfab.core.logbudget import LogBudget

from ..errors import database_unavailable
from ..store.audit import AuditStore
from ..store.base import StoreError
from .auth import GRANT, Principal
from .problems import responses

log = logging.getLogger(__name__)

AUDITED = frozenset({"POST", "PUT", "PATCH", "DELETE"})
NOT_AUDITED = frozenset({("POST", "/jobs")})  # each job is its own record (the job table)


class AuditEntry(BaseModel):
    at: float = Field(description="When (epoch seconds)")
    actor: str = Field(description="The token's or key's name in the access file ('anonymous' on loopback)")
    role: str
    action: str = Field(description="METHOD and route template, e.g. `POST /mmi/services/{service}/pause`")
    target: str = Field(description="The job, queue, schedule or limit acted on (the request's path)")
    peer: str = Field(description="Where the call came from")
    status: int = Field(description="The answer's HTTP status: the outcome")


FIELDS = ("at", "actor", "role", "action", "target", "peer", "status")  # a stored row's columns, in order


class AuditPage(BaseModel):
    items: list[AuditEntry]
    total: int
    limit: int
    offset: int


class AuditLog:
    """The newest entries, at most `max_count` and none older than `max_age` seconds, in memory and, with
    ZFAB_API_DB, in the API's database (`store`: api/store/audit.py), which GET /audit then reads."""

    MAX_PENDING = 1000  # entries being written at once; past it one is dropped from the database (counted)

    def __init__(self, max_count: int = 10_000, max_age: float = 30 * 86400) -> None:
        self.max_count = max_count
        self.max_age = max_age
        self.entries: deque[AuditEntry] = deque(maxlen=max_count)
        self.store: AuditStore | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self.write_errors = 0
        self.dropped = 0
        self._log = LogBudget(burst=3, per_second=0.1)

    def add(self, entry: AuditEntry) -> None:
        self.entries.append(entry)
        self.trim(entry.at)
        if self.store is None:
            return
        if len(self._writes) >= self.MAX_PENDING:
            self.dropped += 1
            return
        task = asyncio.get_running_loop().create_task(self._write(self.store, entry))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, store: AuditStore, e: AuditEntry) -> None:
        try:
            await store.add([(e.at, e.actor, e.role, e.action, e.target, e.peer, e.status)])
        except Exception as exc:  # the database away: the entry stays in memory
            self.write_errors += 1
            if self._log.take() is not None:
                log.warning("audit log: an entry could not be written to the database: %s", exc)

    async def drain(self) -> None:
        """Wait for the writes under way (the API is stopping)."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=5)

    async def page(
        self, actor: str | None, action: str | None, since: float | None, limit: int, offset: int
    ) -> tuple[list[AuditEntry], int]:
        if self.store is not None:
            rows, total = await self.store.page(actor, action, since, limit, offset)
            return [AuditEntry(**dict(zip(FIELDS, r, strict=True))) for r in rows], total
        found = [
            e
            for e in self.newest()
            if (actor is None or e.actor == actor)
            and (action is None or action in e.action)
            and (since is None or e.at >= since)
        ]
        return found[offset : offset + limit], len(found)

    def trim(self, now: float) -> None:
        while self.entries and self.entries[0].at < now - self.max_age:
            self.entries.popleft()

    def newest(self) -> Iterator[AuditEntry]:
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
        if (method, template) in NOT_AUDITED or (not template and status == 404):
            return  # a job submission, or a path no route serves
        grant = scope.get(GRANT)
        client = scope.get("client")
        self.log.add(
            AuditEntry(
                at=time.time(),
                actor=grant.name if grant is not None else "unauthenticated",
                role=grant.role if grant is not None else "",
                action=f"{method} {template or scope['path'][:200]}",
                target=scope["path"][:500],
                peer=str(client[0]) if client else "",
                status=status,
            )
        )


router = APIRouter(tags=["audit"])


@router.get(
    "/audit",
    operation_id="read_audit",
    summary="The audit log: state-changing calls, newest first (admins)",
    response_model=AuditPage,
    responses=responses(401, 403, 422),
)
async def read_audit(
    request: Request,
    _: Principal,
    actor: Annotated[str | None, Query(max_length=256, description="Only this token's or key's name")] = None,
    action: Annotated[str | None, Query(max_length=256, description="Only actions containing this text")] = None,
    since: Annotated[float | None, Query(description="Only entries at or after (epoch seconds)")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> AuditPage:
    audit: AuditLog = request.app.state.audit
    try:
        items, total = await audit.page(actor, action, since, limit, offset)
    except StoreError as exc:
        raise database_unavailable(str(exc)) from None
    return AuditPage(items=items, total=total, limit=limit, offset=offset)
