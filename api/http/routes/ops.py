"""Operations routes: liveness, readiness and Prometheus metrics. No auth: probes and scrapers call them.

/healthz and /readyz answer the same JSON shape as the broker's and workers' metrics ports
(`status`, `role`, `version`, `checks`), so one probe parser serves every process.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from zfab.metrics import version

from ...state import ApiState

router = APIRouter(tags=["ops"])

ROLE = "api"


class HealthReport(BaseModel):
    """The health of one zfab process; every process answers this shape."""

    status: Literal["ok", "ready", "not ready"] = Field(
        description="`ok`: alive (/healthz); `ready` or `not ready` (/readyz)", examples=["ready"]
    )
    role: Literal["api", "broker", "worker"] = Field(description="Which kind of zfab process answers")
    version: str = Field(description="zfab version of the process", examples=["0.1.0"])
    checks: dict[str, bool] = Field(description="Each condition the answer rests on, and whether it holds")


def _state(request: Request) -> ApiState | None:
    st: ApiState | None = getattr(request.app.state, "zfab", None)
    return st


@router.get(
    "/healthz",
    operation_id="healthz",
    summary="Liveness: the process answers",
    response_model=HealthReport,
)
async def healthz() -> HealthReport:
    # Alive means the event loop runs this handler; nothing outside the process is asked, so a
    # broker outage never gets a healthy API restarted.
    return HealthReport(status="ok", role=ROLE, version=version(), checks={"event_loop": True})


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="Readiness: the app is started, the broker answers the API's keepalives (and, on PostgreSQL, "
    "the shared database answers)",
    response_model=HealthReport,
    responses={503: {"model": HealthReport, "description": "Not ready: `checks` says which check failed"}},
)
async def readyz(request: Request) -> Response:
    st = _state(request)
    started = st is not None
    broker_alive = st is not None and st.client.broker_alive
    checks = {"started": started, "broker_alive": broker_alive}
    if st is not None and st.replicas is not None:
        # PostgreSQL: a replica that cannot reach the shared database cannot show or take jobs for the
        # others (it refuses POST /jobs), so a load balancer should send requests elsewhere.
        checks["database"] = st.replicas.ok
    ready = all(checks.values())
    report = HealthReport(
        status="ready" if ready else "not ready",
        role=ROLE,
        version=version(),
        checks=checks,
    )
    headers = {} if ready else {"Retry-After": "1"}
    return JSONResponse(report.model_dump(), status_code=200 if ready else 503, headers=headers)


@router.get(
    "/metrics",
    operation_id="metrics",
    summary="Prometheus metrics: this API, its client, and the fabric as the broker sees it",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"}},
)
async def metrics(request: Request) -> Response:
    st = _state(request)
    if st is not None:
        await st.fabric.refresh()  # the fabric families read this cached snapshot
    registry: CollectorRegistry = request.app.state.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
