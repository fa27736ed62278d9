"""`GET /me`: who the caller is to the API (its role, scope, payloads flag and the actions its role allows),
so the console shows no button the caller may not use. The API refuses those calls all the same."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ..auth import Principal, grant_of
from ..problems import responses

router = APIRouter(tags=["access"])


@router.get(
    "/me",
    operation_id="whoami",
    summary="The caller's role, service scope and the actions it may take",
    response_model=dict[str, Any],
    responses={
        200: {
            "content": {
                "application/json": {
                    "example": {
                        "name": "alice",
                        "role": "operator",
                        "scope": ["demo"],
                        "payloads": True,
                        "actions": ["answer", "cancel", "read", "retry", "schedule", "submit"],
                    }
                }
            }
        },
        **responses(401, 403),
    },
)
async def whoami(request: Request, _: Principal) -> dict[str, Any]:
    grant = grant_of(request)
    return {
        "name": grant.name,
        "role": grant.role,
        "scope": list(grant.scope),
        "payloads": grant.payloads,
        "actions": sorted(grant.actions),
    }
