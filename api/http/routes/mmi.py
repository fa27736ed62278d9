"""`/mmi`: the broker's management interface (workers, services, the broker itself) over HTTP."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request

from zfab import MAX_NAME_BYTES
from zfab.core.access import scoped_broker
from zfab.errors import BadRequestError, NoWorkersError, ZfabError

from ...errors import ProblemError, from_fabric_error, unavailable
from ...fabric import MMI_TIMEOUT, mmi, wait_done
from ...models import MMI_SERVICE, TaskLimits
from ..auth import Principal, grant_of
from ..problems import responses
from ..state import api_state

LIST_TASKS_TIMEOUT = 5.0

router = APIRouter(prefix="/mmi", tags=["mmi"])

_WORKER_EXAMPLE = {
    "name": "demo-1",
    "service": "demo",
    "status": "alive",
    "alive": True,
    "holdtime_left_s": 14.2,
    "keepalives_sent": 12,
    "keepalives_received": 12,
    "alive_for_s": 30.1,
    "jobs_in_flight": 0,
}


async def _ask(request: Request, task: str, **kwargs: Any) -> Any:
    try:
        return await mmi(api_state(request).client, task, MMI_TIMEOUT, **kwargs)
    except ZfabError as exc:
        raise from_fabric_error(exc) from None


@router.get(
    "/broker",
    operation_id="mmi_show_broker",
    summary="The broker: endpoint, uptime, queues, counters",
    response_model=dict[str, Any],
    responses={
        200: {"content": {"application/json": {"example": {"endpoint": "tcp://127.0.0.1:5555", "workers": 2}}}},
        **responses(401, 403, 503, 504),
    },
)
async def show_broker(request: Request, _: Principal) -> dict[str, Any]:
    result: dict[str, Any] = await _ask(request, "show_broker")
    return scoped_broker(grant_of(request), result)


@router.get(
    "/workers",
    operation_id="mmi_show_workers",
    summary="Workers the broker knows, with keepalive figures",
    response_model=list[dict[str, Any]],
    responses={
        200: {"content": {"application/json": {"example": [_WORKER_EXAMPLE]}}},
        **responses(401, 403, 422, 503, 504),
    },
)
async def show_workers(
    request: Request,
    _: Principal,
    service: Annotated[str | None, Query(max_length=MAX_NAME_BYTES, description="Only this service")] = None,
    status: Annotated[Literal["alive", "dead"] | None, Query(description="Only workers in this state")] = None,
) -> list[dict[str, Any]]:
    kwargs = {k: v for k, v in (("service", service), ("status", status)) if v}
    result: list[dict[str, Any]] = await _ask(request, "show_workers", **kwargs)
    return _scoped(request, result)


@router.get(
    "/services",
    operation_id="mmi_show_services",
    summary="Services and how many of their workers are alive",
    response_model=list[dict[str, Any]],
    responses={
        200: {
            "content": {
                "application/json": {
                    "example": [{"service": "demo", "workers": 2, "alive": 2, "jobs_in_flight": 0, "purged": 0}]
                }
            }
        },
        **responses(401, 403, 503, 504),
    },
)
async def show_services(request: Request, _: Principal) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = await _ask(request, "show_services")
    return _scoped(request, result)


@router.get(
    "/services/{service}/tasks",
    operation_id="mmi_list_tasks",
    summary="A service's tasks with the JSON schema of their arguments",
    response_model=list[dict[str, Any]],
    responses={
        200: {
            "content": {
                "application/json": {
                    "example": [{"name": "echo", "description": "Return `data` unchanged.", "inputSchema": {}}]
                }
            }
        },
        **responses(401, 403, 404, 422, 503, 504),
    },
)
async def list_tasks(
    request: Request,
    _: Principal,
    service: Annotated[str, Path(min_length=1, max_length=MAX_NAME_BYTES, description="Service name")],
) -> list[dict[str, Any]]:
    """Runs the service's built-in `list_tasks` task on one of its workers."""
    st = api_state(request)
    if service == MMI_SERVICE or len(service.encode()) > MAX_NAME_BYTES or not grant_of(request).sees(service):
        raise _no_service(f"'{service}' is not a worker service")
    if not st.client.broker_alive:
        raise unavailable(f"the broker at {st.client.broker} is not answering; retry shortly")
    try:
        fut = st.client.submit(service, "list_tasks", workers="any", timeout=LIST_TASKS_TIMEOUT)
    except ZfabError as exc:
        raise from_fabric_error(exc) from None
    await wait_done(fut, LIST_TASKS_TIMEOUT + 1.0)
    if not fut.done():
        raise ProblemError(504, "timeout", "The fabric did not answer in time", f"list_tasks of '{service}'")
    error = fut.exception()
    if isinstance(error, NoWorkersError):
        raise _no_service(str(error))
    if isinstance(error, ZfabError):
        raise from_fabric_error(error) from None
    entry = next(iter(fut.result().values()), None)  # "any": one worker answered
    if not isinstance(entry, dict) or entry.get("failed") or not isinstance(entry.get("result"), list):
        errors = entry.get("errors") if isinstance(entry, dict) else None
        detail = "; ".join(str(e) for e in errors or []) or "unexpected list_tasks result"
        raise ProblemError(502, "worker-error", "The worker could not list its tasks", detail)
    tasks: list[dict[str, Any]] = entry["result"]
    return tasks


ServicePath = Annotated[str, Path(min_length=1, max_length=MAX_NAME_BYTES, description="Service name")]
_PAUSE_EXAMPLE = {"service": "demo", "paused": True, "changed": True, "queue_depth": 0}


@router.post(
    "/services/{service}/pause",
    operation_id="mmi_pause_service",
    summary="Pause a service's queue: jobs are admitted and queued, none is sent",
    response_model=dict[str, Any],
    responses={
        200: {"content": {"application/json": {"example": _PAUSE_EXAMPLE}}},
        **responses(401, 403, 404, 422, 503, 504),
    },
)
async def pause_service(request: Request, _: Principal, service: ServicePath) -> dict[str, Any]:
    """The broker keeps admitting the service's jobs into its queue (bounded as ever, and each still
    expires at its deadline) and sends none to a worker until the queue is resumed. Paused services
    survive a broker restart (its data directory). `changed` is false when it was paused already."""
    return await _control(request, "pause_service", service)


@router.post(
    "/services/{service}/resume",
    operation_id="mmi_resume_service",
    summary="Resume a paused service's queue",
    response_model=dict[str, Any],
    responses={
        200: {"content": {"application/json": {"example": {**_PAUSE_EXAMPLE, "paused": False, "queue_depth": 1000}}}},
        **responses(401, 403, 404, 422, 503, 504),
    },
)
async def resume_service(request: Request, _: Principal, service: ServicePath) -> dict[str, Any]:
    """The queued jobs go to the service's workers as their credits allow, in queue order."""
    return await _control(request, "resume_service", service)


TaskPath = Annotated[str, Path(min_length=1, max_length=MAX_NAME_BYTES, description="Task name")]
_LIMIT_EXAMPLE = {
    "service": "demo",
    "task": "echo",
    "rate_limit": "5/s",
    "concurrency": None,
    "limit_key": None,
    "source": "set",
    "running": 0,
    "held": 0,
}


@router.get(
    "/limits",
    operation_id="mmi_show_limits",
    summary="Tasks with a rate or concurrency limit, and the jobs running and waiting on each",
    response_model=list[dict[str, Any]],
    responses={200: {"content": {"application/json": {"example": [_LIMIT_EXAMPLE]}}}, **responses(401, 403, 503, 504)},
)
async def show_limits(request: Request, _: Principal) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = await _ask(request, "show_limits")
    return _scoped(request, result)


@router.put(
    "/services/{service}/tasks/{task}/limits",
    operation_id="mmi_set_limit",
    summary="Set a task's rate and concurrency limits at run time",
    response_model=dict[str, Any],
    responses={
        200: {"content": {"application/json": {"example": {**_LIMIT_EXAMPLE, "changed": True}}}},
        **responses(400, 401, 403, 404, 415, 422, 503, 504),
    },
)
async def set_limit(
    request: Request, _: Principal, service: ServicePath, task: TaskPath, limits: TaskLimits
) -> dict[str, Any]:
    """The broker enforces them across all the service's workers from now on, in place of what the
    task declares (all fields null: no limit at all), until DELETE; they survive a broker restart.
    Jobs over a limit wait in the broker's queue (`queued`), never fail."""
    return await _control(request, "set_limit", service, task_name=task, **limits.model_dump())


@router.delete(
    "/services/{service}/tasks/{task}/limits",
    operation_id="mmi_clear_limit",
    summary="Clear a task's limits set at run time (back to what it declares)",
    response_model=dict[str, Any],
    responses={
        200: {"content": {"application/json": {"example": _LIMIT_EXAMPLE}}},
        **responses(401, 403, 404, 422, 503, 504),
    },
)
async def clear_limit(request: Request, _: Principal, service: ServicePath, task: TaskPath) -> dict[str, Any]:
    return await _control(request, "clear_limit", service, task_name=task)


async def _control(request: Request, command: str, service: str, **kwargs: Any) -> dict[str, Any]:
    if service == MMI_SERVICE or len(service.encode()) > MAX_NAME_BYTES:
        raise _no_service(f"'{service}' is not a worker service")
    if not grant_of(request).sees(service):  # outside the caller's scope: as if it did not exist
        raise _no_service(f"service '{service}' is unknown: no worker has registered it with the broker")
    try:
        result: dict[str, Any] = await mmi(api_state(request).client, command, MMI_TIMEOUT, service=service, **kwargs)
    except BadRequestError as exc:
        why = exc.results or {}  # the broker's {"error": slug, "detail": why}
        slug, detail = why.get("error"), str(why.get("detail") or exc)
        if slug == "unknown-service":
            raise _no_service(f"service '{service}' is unknown: no worker has registered it with the broker") from None
        if slug == "unknown-task":
            raise ProblemError(404, "task-not-found", "Task not found", detail) from None
        if slug in ("bad-request", "too-many"):
            raise ProblemError(400, "bad-control", "Refused by the broker", detail) from None
        raise from_fabric_error(exc) from None
    except ZfabError as exc:
        raise from_fabric_error(exc) from None
    return result


def _scoped(request: Request, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows (workers, services, limits) of services in the caller's scope."""
    grant = grant_of(request)
    if grant.everywhere:
        return rows
    return [r for r in rows if isinstance(r, dict) and grant.sees(str(r.get("service", "")))]


def _no_service(detail: str) -> ProblemError:
    return ProblemError(404, "service-not-found", "Service not found", detail)
