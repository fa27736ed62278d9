"""The audit log: every state-changing HTTP call (who, what, on which job/queue/schedule/limit, from where,
when, its outcome), bounded by count and age, readable by admins at GET /audit.

Recorded by a middleware once the answer's status is known, for every POST, PUT, PATCH and DELETE behind
auth, refusals included (a 403 is worth knowing). POST /jobs is not: a submission is a job, recorded with
its caller in the job table, and an audit row per job would cost the hot path an allocation per job.
MMI actions reach the broker through the API (its routes are audited here); under CURVE the broker
refuses them to any key whose grant does not allow them, and counts the refusals.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .auth import GRANT, Principal
from .problems import responses

AUDITED = frozenset({"POST", "PUT", "PATCH", "DELETE"})
NOT_AUDITED = frozenset({("POST", "/jobs")})  # each job is its own record (the job table, with its caller)


class AuditEntry(BaseModel):
    at: float = Field(description="When (epoch seconds)")
    actor: str = Field(description="The token's or key's name in the access file ('anonymous' on loopback)")
    role: str
    action: str = Field(description="METHOD and route template, e.g. `POST /mmi/services/{service}/pause`")
    target: str = Field(description="The job, queue, schedule or limit acted on (the request's path)")
    peer: str = Field(description="Where the call came from")
    status: int = Field(description="The answer's HTTP status: the outcome")


class AuditPage(BaseModel):
    items: list[AuditEntry]
    total: int
    limit: int
    offset: int


class AuditLog:
    """The newest entries, at most `max_count` and none older than `max_age` seconds."""

    def __init__(self, max_count: int = 10_000, max_age: float = 30 * 86400) -> None:
        self.max_count = max_count
        self.max_age = max_age
        self.entries: deque[AuditEntry] = deque(maxlen=max_count)

    def add(self, entry: AuditEntry) -> None:
        self.entries.append(entry)
        self.trim(entry.at)

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
    log: AuditLog = request.app.state.audit
    rows: list[Any] = [
        e
        for e in log.newest()
        if (actor is None or e.actor == actor)
        and (action is None or action in e.action)
        and (since is None or e.at >= since)
    ]
    return AuditPage(items=rows[offset : offset + limit], total=len(rows), limit=limit, offset=offset)
