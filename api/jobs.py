"""`/jobs`: submit, read, wait for, cancel and list jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response

from service import MAX_JOB_UUID
from service.errors import BadRequestError, ZfabError

from .auth import Principal
from .fabric import wait_done
from .jobtable import REFUSALS, JobRecord, fingerprint, job_uuid_for_key, new_job_uuid
from .models import Job, JobPage, JobRequest
from .problems import ProblemError, from_fabric_error, responses, unavailable
from .recovery import ensure_live
from .state import ApiState, api_state

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


def submit_record(st: ApiState, req: JobRequest, uuid: str | None, fp: str) -> JobRecord:
    """Submit a job to the fabric and remember it in the table (POST /jobs, schedules)."""
    if not st.client.broker_alive:
        raise unavailable(f"the broker at {st.client.broker} is not answering; retry shortly")
    juuid = uuid or new_job_uuid()
    table = st.jobs
    try:
        fut = st.client.submit(
            req.service,
            req.task,
            req.args,
            req.kwargs,
            req.workers,
            req.timeout,
            uuid=juuid,
            on_event=lambda _: table.changed(juuid),  # wakes the job's SSE streams, if any
        )
    except ZfabError as exc:
        raise from_fabric_error(exc) from None
    rec = JobRecord(fut.uuid, req.service, req.task, req.workers, fut, fp, req.timeout)
    table.add(rec)
    return rec


async def wait_for_job(rec: JobRecord, bound: float) -> None:
    """Wait up to `bound` seconds for the job to finish (not at all for one that cannot: see ensure_live)."""
    fut = rec.live
    if fut is not None:
        await wait_done(fut, bound)


@router.post(
    "",
    operation_id="submit_job",
    summary="Submit a job (optionally wait for it)",
    status_code=202,
    response_model=Job,
    responses={
        200: {"model": Job, "description": "The job finished within the wait bound (any final state)"},
        202: {"description": "Accepted; poll the `Location` header, GET /jobs/{uuid}"},
        **responses(400, 401, 403, 409, 413, 422, 503),
    },
)
async def submit_job(
    req: JobRequest,
    request: Request,
    response: Response,
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
) -> Job:
    """Run `task` of `service` on `workers`. Answers 202 with the pending job and its `Location`;
    with `?wait=N` (or `Prefer: wait=N`) answers 200 with the finished job when it ends in time.

    A job that was refused (no live workers, fabric busy) or rejected (unknown task, bad
    arguments) while the request waited answers 503 or 400; a job that timed out or lost its
    worker is a finished job in state `error`.
    """
    st = api_state(request)
    uuid, fp = (job_uuid_for_key(idempotency_key, principal), fingerprint(req)) if idempotency_key else (None, "")
    rec = st.jobs.get(uuid) if uuid else None
    if rec is not None and rec.fingerprint != fp:
        # 409, not the 422 of the IETF idempotency draft: 422 already means "fix your body",
        # while this request is fine and only clashes with one the server remembers.
        raise ProblemError(
            409,
            "idempotency-key-reused",
            "Idempotency-Key reused",
            "this Idempotency-Key was used for a different request; use a new key for a new job",
            job=rec.uuid,
        )
    fresh = rec is None or rec.refused()
    if rec is None or fresh:
        rec = submit_record(st, req, uuid, fp)
    else:
        await ensure_live(st, rec)
    bound = wait_bound(wait, prefer, st.settings.default_wait_max)
    if bound is not None:
        await wait_for_job(rec, bound)
        fut = rec.live
        exc = fut.exception() if fut is not None and fut.done() and not fut.cancelled() else None
        if isinstance(exc, (*REFUSALS, BadRequestError)):
            raise from_fabric_error(exc, rec.uuid)
    _applied(request, response, bound)
    view = rec.view()
    response.headers["Location"] = f"{request.scope.get('root_path', '')}/jobs/{rec.uuid}"
    # 200 with a finished job: one that ended within the wait bound, or a retried POST of one that
    # had ended. A job this request submitted without waiting is always 202, even when it was quick
    # enough to finish before the answer went out: the status must not depend on a race.
    finished = view.state.finished
    response.status_code = 200 if finished and (bound is not None or not fresh) else 202
    return view


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
    _: Principal,
    wait: WaitQuery = None,
    prefer: PreferHeader = None,
) -> Job:
    """The job as it stands (`state` says whether it finished). `?wait=N` long-polls until it does."""
    st = api_state(request)
    rec = known_job(st, uuid)
    await ensure_live(st, rec)
    bound = wait_bound(wait, prefer, st.settings.default_wait_max)
    if bound is not None:
        await wait_for_job(rec, bound)
    _applied(request, response, bound)
    return rec.view()


@router.delete(
    "/{uuid}",
    operation_id="cancel_job",
    summary="Cancel a pending job",
    status_code=202,
    response_model=Job,
    responses=responses(401, 403, 404, 409, 422, 503),
)
async def cancel_job(uuid: JobUuid, request: Request, _: Principal) -> Job:
    """Ask the job's workers to cancel it (202); the job then ends as its workers report."""
    st = api_state(request)
    rec = known_job(st, uuid)
    await ensure_live(st, rec)
    if rec.live is None and not rec.done:
        raise unavailable(f"job {uuid} ran before the API restarted and none of its workers answers yet; retry shortly")
    try:
        # False when the client no longer tracks the job: it has finished.
        sent = not rec.done and st.client.cancel(uuid)
    except ZfabError as exc:
        raise from_fabric_error(exc, uuid) from None
    if not sent:
        raise ProblemError(
            409, "job-finished", "Job already finished", f"job {uuid} already finished; nothing to cancel", job=uuid
        )
    rec.cancel_requested = True
    st.jobs.touch(uuid)
    return rec.view()


@router.get(
    "",
    operation_id="list_jobs",
    summary="Recent jobs, newest first",
    response_model=JobPage,
    responses=responses(401, 403, 422),
)
async def list_jobs(
    request: Request,
    _: Principal,
    limit: Annotated[int, Query(ge=1, description=f"Page size (capped at {MAX_PAGE})")] = 50,
    offset: Annotated[int, Query(ge=0, description="Jobs to skip, from the newest")] = 0,
) -> JobPage:
    """The jobs this API submitted (up to ZFAB_JOB_HISTORY of them; across restarts with ZFAB_API_DB).

    A job from before a restart that had not finished reads as `pending` here until a
    GET /jobs/{uuid} recovers it from its workers."""
    st = api_state(request)
    limit = min(limit, MAX_PAGE)
    items = [rec.view() for rec in st.jobs.page(limit, offset)]
    return JobPage(items=items, total=len(st.jobs), limit=limit, offset=offset)


def known_job(st: ApiState, uuid: str) -> JobRecord:
    """The job, or a 404 problem."""
    rec = st.jobs.get(uuid)
    if rec is None:
        raise ProblemError(
            404,
            "job-not-found",
            "Job not found",
            f"no job {uuid} here: this API remembers the last {st.jobs.capacity} jobs it submitted",
        )
    return rec
