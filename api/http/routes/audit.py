"""`GET /audit`: the audit log (api/http/audit.py), newest first, for admins (zfab/core/access.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from ...errors import database_unavailable
from ...store.base import StoreError
from ..audit import AuditLog, AuditPage
from ..auth import Principal
from ..problems import responses

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
