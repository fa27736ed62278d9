"""Operations routes: liveness, readiness and Prometheus metrics. No auth: probes and scrapers call them."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .models import Health, Ready
from .problems import ProblemError, responses, unavailable
from .state import ApiState

router = APIRouter(tags=["ops"])


@router.get("/healthz", operation_id="healthz", summary="Liveness: the process answers", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="Readiness: the broker answers the API's keepalives",
    response_model=Ready,
    responses=responses(503),
)
async def readyz(request: Request) -> Ready:
    st: ApiState | None = getattr(request.app.state, "zfab", None)
    if st is None:
        raise unavailable("the API is starting or stopping")
    client = st.client
    if not client.broker_alive:
        raise ProblemError(
            503,
            "broker-unavailable",
            "Not ready",
            f"the broker at {client.broker} has not answered within its hold time ({client.keepalive.hold_time:g} s)",
            {"Retry-After": "1"},
        )
    return Ready(status="ready", broker=client.broker)


@router.get(
    "/metrics",
    operation_id="metrics",
    summary="Prometheus metrics: this API, its client, and the fabric as the broker sees it",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"}},
)
async def metrics(request: Request) -> Response:
    st: ApiState | None = getattr(request.app.state, "zfab", None)
    if st is not None:
        await st.fabric.refresh()  # the fabric families read this cached snapshot
    registry: CollectorRegistry = request.app.state.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
