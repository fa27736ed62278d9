"""`/jobs`: submit, read, wait for, cancel and list jobs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Path, Query, Request, Response

# A job the API submits gets the fabric's own kind of uuid: UUIDv7, time-ordered, so each
# worker's job store and the shared PostgreSQL table insert at the end of their uuid index; its
# random bits come from the OS 256 uuids at a time, so the event loop rarely gives up the GIL.
from zfab import MAX_JOB_UUID

from ...errors import ProblemError
from ...jobs.arguments import arguments_of
from ...jobs.filters import JobFilter
from ...jobs.operations import await_job, cancel_local, known_job, retry_job, submit
from ...jobs.record import JobRecord, fingerprint, job_uuid_for_key
from ...jobs.recovery import ensure_live
from ...models import Job, JobPage, JobRequest, JobState, JobSummary
from ...state import ApiState
from ..auth import Principal, forbidden_role, grant_of, not_found_outside
from ..problems import responses
from ..state import api_state

log = logging.getLogger(__name__)

MAX_PAGE = 1000

router = APIRouter(prefix="/jobs", tags=["jobs"])

WaitQuery = Annotated[
    float | None,
    Query(
        ge=0,
        allow_inf_nan=False,
        description="Seconds to wait for the job to finish before answering (capped at ZFAB_DEFAULT_WAIT_MAX)",
        examples=[10],
    ),
]
PreferHeader = Annotated[
    str | None,
    Header(description="RFC 7240 `wait=N`: the same as ?wait=N (the query wins)", examples=["wait=10"]),
]
JobUuid = Annotated[str, Path(description="The job's uuid", max_length=MAX_JOB_UUID)]


def prefer_wait(prefer: str | None) -> float | None:
    """The `wait=N` preference of a Prefer header (RFC 7240), if any."""
    for part in (prefer or "").split(","):
        name, _, value = part.split(";")[0].partition("=")
        if name.strip().lower() == "wait":
            try:
                seconds = float(value.strip().strip('"'))
            except ValueError:
                return None
            return seconds if 0 <= seconds < float("inf") else None
    return None


def wait_bound(wait: float | None, prefer: str | None, cap: float) -> float | None:
    asked = wait if wait is not None else prefer_wait(prefer)
    return None if asked is None else min(asked, cap)


def _applied(request: Request, response: Response, waited: float | None) -> None:
    if waited is not None and request.query_params.get("wait") is None:
        response.headers["Preference-Applied"] = f"wait={waited:g}"


@router.post(
    "",
    operation_id="submit_job",
    summary="Submit a job (optionally wait for it)",
    status_code=202,
    response_model=Job,
    responses={
        200: {"model": Job, "description": "The job finished within the wait bound (any final state)"},
        202: {"description": "Admitted (queued or running); poll the `Location` header, GET /jobs/{uuid}"},
        **responses(400, 401, 403, 404, 409, 413, 415, 422, 429, 503),
    },
)
async def submit_job(
    req: JobRequest,
    request: Request,
    principal: Principal,
    wait: WaitQuery = None,
    prefer: PreferHeader = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=255,
            description="Retries with the same key return the same job instead of running it again",
        ),
    ] = None,
) -> Response:
    """Run `task` of `service` on `workers`. Answers once the broker has admitted the job: 202 with
    the job (`queued` or `running`) and its `Location`; with `?wait=N` (or `Prefer: wait=N`) 200
    with the finished job when it ends in time (any final state: see `state` and `reason`).

    Refused at once: 404 for a service (or worker name) the broker does not know, 400 for a task
    the service does not have, 422 for arguments the task would refuse, 503 + Retry-After for a
    full queue or an unreachable broker. A job waits in the broker's queue while no worker can take
    it, until its `timeout` (default 60 s, counted from the end of its `delay`).
    """
    began = time.monotonic()
    st = api_state(request)
    if not grant_of(request).sees(req.service):
        raise out_of_scope(req.service)
    uuid, fp = (job_uuid_for_key(idempotency_key, principal), fingerprint(req)) if idempotency_key else (None, "")
    bound = wait_bound(wait, prefer, st.settings.default_wait_max)
    grant = grant_of(request)
    rec, fresh = await submit(st, req, uuid, fp, bound, began=began, caller=principal, submitter=grant.name)
    answer = await submitted(
        st, rec, fresh, bound, request.scope.get("root_path", ""), wait is None, principal, grant.payloads
    )
    if fresh:
        request.app.state.audit.submitted(request.scope, rec.uuid, answer.status_code)
    return answer


def out_of_scope(service: str) -> ProblemError:
    """A service outside the caller's scope is, to it, a service that does not exist."""
    return ProblemError(404, "unknown-service", "Unknown service", f"no service {service!r} for this caller")


def without_payloads(view: Job) -> Job:
    """A caller without the payloads flag sees a job's outline: no arguments, no results."""
    view.arguments = None
    view.results = None
    return view


async def submitted(
    st: ApiState,
    rec: JobRecord,
    fresh: bool,
    bound: float | None,
    root: str,
    preferred: bool,
    principal: str,
    payloads: bool = True,
) -> Response:
    """POST /jobs' answer. 200 with a finished job: one that ended within the wait bound, or a retried
    POST of one that had ended. A job this request submitted without waiting is always 202, even when
    it was quick enough to finish before the answer went out: the status must not depend on a race.
    The job as GET /jobs/{uuid} shows it, `arguments` included."""
    view = rec.view(tracebacks=st.settings.tracebacks_for(principal))
    if payloads:
        view.arguments = await arguments_of(st, rec)
    else:
        without_payloads(view)
    status = 200 if view.state.final and (bound is not None or not fresh) else 202
    headers = {"Location": f"{root}/jobs/{rec.uuid}"}
    if bound is not None and preferred:  # the wait came from `Prefer: wait=N`, not ?wait=
        headers["Preference-Applied"] = f"wait={bound:g}"
    # The view's one serialisation, straight to JSON: not validated again against response_model.
    return Response(view.model_dump_json(), status, headers, media_type="application/json")


@router.get(
    "/{uuid}",
    operation_id="get_job",
    summary="Read a job (optionally wait for it)",
    response_model=Job,
    responses=responses(401, 403, 404, 422),
)
async def get_job(
    uuid: JobUuid,
    request: Request,
    response: Response,
    principal: Principal,
    wait: WaitQuery = None,
    prefer: PreferHeader = None,
) -> Job:
    """The job as it stands (`state` says whether it finished). `?wait=N` long-polls until it does.
    `arguments` shows what it was asked (its task's secret arguments as `***`); `attempt` and
    `attempts` the attempts of a retried job, each earlier one with its error."""
    st = api_state(request)
    rec = await known_job(st, uuid)
    not_found_outside(request, rec.service, uuid)
    if not rec.remote:
        await ensure_live(st, rec)
    bound = wait_bound(wait, prefer, st.settings.default_wait_max)
    if bound is not None:
        rec = await await_job(st, rec, bound)
    if st.cluster is not None:
        await st.cluster.settled(rec)
    _applied(request, response, bound)
    view = rec.view(tracebacks=st.settings.tracebacks_for(principal))
    scheduler = getattr(request.app.state, "schedules", None)
    if scheduler is not None:
        view.schedule = scheduler.schedule_of(uuid)
    if not grant_of(request).payloads:
        return without_payloads(view)
    view.arguments = await arguments_of(st, rec)
    return view


@router.delete(
    "/{uuid}",
    operation_id="cancel_job",
    summary="Cancel a job, queued or running",
    status_code=202,
    response_model=Job,
    responses=responses(401, 403, 404, 409, 422, 503),
)
async def cancel_job(uuid: JobUuid, request: Request, principal: Principal) -> Job:
    """Cancel the job (202): a queued one leaves the broker's queue at once and never runs; a
    running one is asked to stop, and ends as its workers report (`cancelled`, or its result)."""
    st = api_state(request)
    rec = await known_job(st, uuid)
    not_found_outside(request, rec.service, uuid)
    if rec.remote:
        if rec.done:
            raise ProblemError(
                409, "job-finished", "Job already finished", f"job {uuid} already finished; nothing to cancel", job=uuid
            )
        assert st.cluster is not None  # only a replica's jobs are remote
        return await st.cluster.forward(rec, "cancel", {})
    done = await cancel_local(st, rec, tracebacks=st.settings.tracebacks_for(principal))
    return done if grant_of(request).payloads else without_payloads(done)


@router.post(
    "/{uuid}/retry",
    operation_id="retry_job",
    summary="Submit a dead job again, as a new job linked to it",
    status_code=202,
    response_model=Job,
    responses={
        200: {"model": Job, "description": "The new job finished within the wait bound (any final state)"},
        202: {"description": "The new job, admitted (queued or running); its `retry_of` names the old one"},
        **responses(400, 401, 403, 404, 409, 422, 429, 503),
    },
)
async def retry_dead_job(
    uuid: JobUuid, request: Request, principal: Principal, wait: WaitQuery = None, prefer: PreferHeader = None
) -> Response:
    """Submit a job that ended failed, expired, lost or cancelled again, with the same request
    (service, task, arguments, target, timeout, priority, retries), as a new job: 202 with it and
    its `Location` (200 with `?wait=N` when it ends in time). The new job's `retry_of` names the old
    one, whose `retried_as` names the new one, and the old one is a dead letter no more
    (`GET /jobs?dead=true`). 409 when the job has not finished, completed, or was retried already
    (the problem's `job` names the job that took over)."""
    st = api_state(request)
    rec = await known_job(st, uuid)
    not_found_outside(request, rec.service, uuid)
    bound = wait_bound(wait, prefer, st.settings.default_wait_max)
    new = await retry_job(st, rec, bound, caller=principal, submitter=grant_of(request).name)
    root = request.scope.get("root_path", "")
    return await submitted(st, new, True, bound, root, wait is None, principal, grant_of(request).payloads)


StateFilter = Annotated[list[JobState] | None, Query(description="Only jobs in these states (repeat the parameter)")]


@router.get(
    "",
    operation_id="list_jobs",
    summary="Recent jobs, newest first",
    response_model=JobPage,
    response_model_exclude_none=False,
    responses=responses(401, 403, 422),
)
async def list_jobs(
    request: Request,
    principal: Principal,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"Page size, at most {MAX_PAGE}")] = 50,
    cursor: Annotated[
        str | None,
        Query(pattern=r"^[0-9]{1,18}$", description="Where the page starts (from the `next` link of the page before)"),
    ] = None,
    state: StateFilter = None,
    service: Annotated[str | None, Query(max_length=256)] = None,
    task: Annotated[str | None, Query(max_length=256)] = None,
    worker: Annotated[str | None, Query(max_length=256, description="Jobs a worker of this name ran")] = None,
    since: Annotated[datetime | None, Query(description="Submitted at or after (ISO 8601)")] = None,
    until: Annotated[datetime | None, Query(description="Submitted before (ISO 8601)")] = None,
    include: Annotated[Literal["results"] | None, Query(description="`results`: whole jobs, not summaries")] = None,
    schedule: Annotated[str | None, Query(max_length=64, description="Jobs a schedule fired")] = None,
    dead: Annotated[
        bool | None,
        Query(description="`true`: dead letters only (ended failed, expired or lost, not retried); `false`: none"),
    ] = None,
) -> JobPage:
    """The jobs this API submitted (up to ZFAB_JOB_HISTORY of them; across restarts with ZFAB_API_DB),
    newest first, as summaries (no results, no events) unless `include=results`. Pages follow
    `next` (cursor pagination: a page is not shifted by jobs submitted meanwhile)."""
    st = api_state(request)
    before = int(cursor) if cursor is not None else None
    flt = JobFilter(frozenset(state) if state else None, service, task, worker, since, until, schedule, dead)
    scheduler = getattr(request.app.state, "schedules", None)
    rows: Iterable[tuple[int, JobRecord, str | None]]
    if st.cluster is not None:
        rows, total = await st.cluster.page(before, limit + 1, flt)
    else:
        made = set(scheduler.jobs_of(schedule)) if schedule is not None and scheduler is not None else None
        rows = ((rec.seq, rec, None) for rec in st.jobs.newest(before) if made is None or rec.uuid in made)
        total = len(st.jobs)
    items: list[Job | JobSummary] = []
    tracebacks = st.settings.tracebacks_for(principal)
    grant = grant_of(request)
    if include == "results" and not grant.payloads:
        raise forbidden_role(grant, "read", "include=results (jobs' results) for a caller without the payloads flag")
    last: int | None = None
    more = False
    for seq, found, sid in rows:
        rec = st.jobs.get(found.uuid) or found  # this replica's own jobs from memory, where they are fresher
        if not grant.sees(rec.service):
            continue  # outside the caller's scope: as if it did not exist
        view = rec.view(tracebacks=tracebacks)
        view.schedule = sid or (scheduler.schedule_of(rec.uuid) if scheduler is not None else None)
        if not flt.matches(view, rec):
            continue
        if len(items) == limit:
            more = True
            break
        items.append(view if include == "results" else JobSummary.of(view))
        last = seq
    nxt = str(request.url.include_query_params(cursor=str(last))) if more and last is not None else None
    if not grant.everywhere:
        total = sum(1 for rec in st.jobs.newest(None) if grant.sees(rec.service))  # not the others' count
    return JobPage(items=items, total=total, limit=limit, next=nxt)


__all__ = ["prefer_wait", "router", "wait_bound"]
