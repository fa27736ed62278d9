"""`/schedules`: run a job periodically, every N seconds or on a cron expression.

Each firing submits an ordinary job (see api/schedules/scheduler.py); the schedules live in the API's
database beside the job table (api/store/schedules.py). The router's lifespan runs inside the
app's (FastAPI nests an included router's lifespan in the app's), so the scheduler starts after
the fabric client and stops before it closes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Path, Query, Request, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from ...errors import ProblemError, database_unavailable, unavailable
from ...jobs.admission import check_template
from ...jobs.arguments import secrets_given
from ...models import JobRequest
from ...schedules.scheduler import Scheduler
from ...schedules.timing import CRON_PATTERN, cron_problem
from ...settings import ApiSettings
from ...state import ApiState
from ...store.base import ScheduleBackend, StoreError, is_postgres_url
from ...store.schedules import LAST_JOBS, ScheduleRecord, ScheduleStore
from ..auth import Principal, grant_of
from ..problems import responses

log = logging.getLogger(__name__)

MIN_EVERY = 1.0  # below a second, a schedule is a busy loop submitting jobs
MAX_EVERY = 366 * 86400.0  # a year and a day: longer periods are cron's job
MAX_PAGE = 1000


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    st: ApiState | None = getattr(app.state, "zfab", None)
    s: ApiSettings = st.settings if st is not None else ApiSettings()
    store: ScheduleStore | ScheduleBackend
    if st is not None and st.schedules is not None:
        store = st.schedules  # PostgreSQL: the replicas' shared table
    else:
        path = FilePath(s.api_db) if s.api_db and not is_postgres_url(s.api_db) else None
        store = ScheduleStore(path, mapping_capacity=s.job_history)
    scheduler = Scheduler(
        lambda: getattr(app.state, "zfab", None),
        store,
        capacity=s.max_schedules,
        registry=getattr(app.state, "registry", None),
    )
    await scheduler.start()
    if st is not None and st.replicas is not None:
        st.replicas.on_schedules = scheduler.reload
    app.state.schedules = scheduler
    try:
        yield
    finally:
        app.state.schedules = None
        await scheduler.stop()


router = APIRouter(prefix="/schedules", tags=["schedules"], lifespan=lifespan)


def _valid_cron(expr: str) -> str:
    why = cron_problem(expr)
    if why is not None:
        raise ValueError(why)
    return expr


# A name is one segment of a URL (GET /schedules/{name}): no '/', no control characters. (One that equals
# another schedule's id addresses that one: ids are looked up first.)
NAME_PATTERN = r"^[^/\x00-\x1f\x7f-\x9f]+$"
_NAME = re.compile(NAME_PATTERN)


def _valid_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError("a schedule's name has no '/' or control characters (it is part of its URL)")
    return name


ScheduleId = Annotated[
    str, Path(description="The schedule's id, or its name (names are unique)", min_length=1, max_length=200)
]
Name = Annotated[
    str,
    Field(
        min_length=1,
        max_length=200,
        json_schema_extra={"pattern": NAME_PATTERN},  # checked by _valid_name, with a readable message
        description="Its name: unique, and usable in place of its id in URLs",
    ),
    AfterValidator(_valid_name),
]
Every = Annotated[
    float,
    Field(
        ge=MIN_EVERY,
        le=MAX_EVERY,
        allow_inf_nan=False,
        description=f"Seconds between firings ({MIN_EVERY:g} to {MAX_EVERY:g})",
        examples=[60],
    ),
]
Cron = Annotated[
    str,
    Field(
        max_length=200,
        json_schema_extra={"pattern": CRON_PATTERN},  # checked by _valid_cron, with a readable message
        description="Five-field cron expression in UTC: minute hour day-of-month month day-of-week "
        "(`*`, values, ranges `a-b`, lists `a,b`, steps `/n`, month and day names)",
        examples=["*/5 * * * *"],
    ),
    AfterValidator(_valid_cron),
]


class ScheduleRequest(BaseModel):
    """A job to submit periodically: `every` N seconds, or on a `cron` expression (one of the two)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [{"required": ["every"]}, {"required": ["cron"]}],
            "examples": [
                {"job": {"service": "demo", "task": "echo", "kwargs": {"data": "tick"}}, "every": 60},
                {"job": {"service": "demo", "task": "add", "args": [1, 2]}, "cron": "0 3 * * *", "name": "nightly"},
            ],
        },
    )

    job: JobRequest = Field(description="What each firing submits: the body of POST /jobs")
    every: Every | SkipJsonSchema[None] = None
    cron: Cron | SkipJsonSchema[None] = None
    name: Name | SkipJsonSchema[None] = Field(
        None, description="A unique name, usable in place of its id (GET/PATCH/DELETE /schedules/{name})"
    )
    paused: bool = Field(False, description="Create it paused (resume with PATCH)")

    @model_validator(mode="after")
    def one_timing(self) -> ScheduleRequest:
        if (self.every is None) == (self.cron is None):
            raise ValueError("give exactly one of `every` (seconds) or `cron` (five-field expression)")
        return self


class SchedulePatch(BaseModel):
    """The fields to change; the others stay. Giving `every` or `cron` switches the schedule to it."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "not": {"required": ["every", "cron"]},
            "examples": [{"paused": True}, {"paused": False}, {"every": 300}, {"cron": "0 * * * *"}],
        },
    )

    paused: bool | SkipJsonSchema[None] = Field(
        None, description="true pauses it, false resumes it (from now: no catching up)"
    )
    every: Every | SkipJsonSchema[None] = None
    cron: Cron | SkipJsonSchema[None] = None
    name: Name | SkipJsonSchema[None] = None
    job: JobRequest | SkipJsonSchema[None] = None

    @model_validator(mode="after")
    def one_timing(self) -> SchedulePatch:
        if self.every is not None and self.cron is not None:
            raise ValueError("give at most one of `every` or `cron`")
        return self


class Schedule(BaseModel):
    """A schedule as it stands: its timing, when it fires next, what its last firings submitted."""

    id: str
    name: str | None
    job: dict[str, Any] = Field(description="What each firing submits (the body of POST /jobs)")
    every: float | None = Field(description="Seconds between firings, when timed that way")
    cron: str | None = Field(description="Cron expression (UTC), when timed that way")
    paused: bool
    state: Literal["active", "paused"]
    created_at: datetime
    next_run_at: datetime | None = Field(
        description="When it fires next; null while paused, or for a cron expression that never matches (Feb 30)"
    )
    last_run_at: datetime | None = Field(description="When it last fired")
    runs: int = Field(description="Firings whose job was submitted")
    failures: int = Field(
        description="Firings that failed: refused by the fabric, or whose job ended failed, expired or lost"
    )
    last_error: str | None = Field(
        description="Why the last failure happened (cleared when a later firing's job completes)"
    )
    last_jobs: list[str] = Field(description=f"Uuids of the jobs its last {LAST_JOBS} firings submitted, newest first")


class SchedulePage(BaseModel):
    items: list[Schedule]
    total: int = Field(description="Schedules the API holds (at most ZFAB_MAX_SCHEDULES)")
    limit: int
    offset: int


def _when(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def view(rec: ScheduleRecord) -> Schedule:
    return Schedule(
        id=rec.id,
        name=rec.name,
        job=rec.job,
        every=rec.every,
        cron=rec.cron,
        paused=rec.paused,
        state="paused" if rec.paused else "active",
        created_at=datetime.fromtimestamp(rec.created_at, UTC),
        next_run_at=_when(rec.next_run_at),
        last_run_at=_when(rec.last_run_at),
        runs=rec.runs,
        failures=rec.failures,
        last_error=rec.last_error,
        last_jobs=list(reversed(rec.last_jobs)),
    )


def scheduler_of(request: Request) -> Scheduler:
    sched: Scheduler | None = getattr(request.app.state, "schedules", None)
    if sched is None:
        raise unavailable("the API is starting or stopping; retry shortly")
    return sched


async def known(sched: Scheduler, sid: str, request: Request | None = None) -> ScheduleRecord:
    """The schedule by id, or by its name; with the request, 404 for one of a service outside its caller's scope."""
    try:
        rec = await sched.fetch(sid)  # PostgreSQL: one made on another replica a moment ago is read
    except Exception as exc:
        raise database_unavailable(str(exc)) from None
    if rec is None and len(same := sched.named(sid)) > 1:  # from before names were unique
        ids = ", ".join(r.id for r in same)
        raise ProblemError(
            409, "schedule-name-ambiguous", "Schedule name not unique", f"schedules {ids} are named {sid!r}: use an id"
        )
    if rec is None or (request is not None and not grant_of(request).sees(str(rec.job.get("service", "")))):
        raise ProblemError(404, "schedule-not-found", "Schedule not found", f"no schedule with id or name {sid!r}")
    return rec


def name_free(sched: Scheduler, name: str | None, by: str | None = None) -> None:
    if sched.name_taken(name, by):
        raise ProblemError(
            409,
            "schedule-name-taken",
            "Schedule name taken",
            f"a schedule named {name!r} exists already: choose another name, or change that one (PATCH)",
        )


async def checked(request: Request, job: JobRequest) -> None:
    """The job a schedule will submit, checked now as POST /jobs would be (api/jobs/admission.py); 422 when it
    gives a secret argument: a schedule keeps its job, arguments included, in the API's store, where a
    redacted value is never written (and a job's clear value is never kept to fill it in later)."""
    st: ApiState | None = getattr(request.app.state, "zfab", None)
    if st is not None:
        await check_template(st.schemas, st.client, job)
        secret = secrets_given(st, job)
        if secret:
            raise ProblemError(
                422,
                "secret-arguments",
                "Secret arguments in a schedule",
                f"task {job.task!r} of service {job.service!r} declares {', '.join(map(repr, secret))} secret "
                "(its `redact`): a schedule keeps its job's arguments in the API's store, where a secret is "
                "never written. Leave the secret out of the schedule (the worker can take it from its own "
                "inventory or environment), or submit such jobs with POST /jobs",
                arguments=secret,
            )


@router.post(
    "",
    operation_id="create_schedule",
    summary="Create a periodic schedule",
    status_code=201,
    response_model=Schedule,
    responses=responses(400, 401, 403, 404, 409, 413, 422, 503),
)
async def create_schedule(body: ScheduleRequest, request: Request, response: Response, _: Principal) -> Schedule:
    """Submit `job` every `every` seconds or on `cron` (UTC). The first firing is one period from now
    (or cron's next match). The job is checked as POST /jobs checks one, when the fabric knows its
    service: 404 for a service no worker registered, 400 for a task its workers do not declare, 422
    for arguments its schema refuses. 409 for a name another schedule has, or when ZFAB_MAX_SCHEDULES
    schedules exist."""
    sched = scheduler_of(request)
    if not grant_of(request).sees(body.job.service):
        raise ProblemError(404, "service-not-found", "Service not found", f"no service {body.job.service!r}")
    name_free(sched, body.name)
    await checked(request, body.job)
    if sched.full():
        raise ProblemError(
            409,
            "too-many-schedules",
            "Too many schedules",
            f"the API holds {sched.capacity} schedules, its maximum (ZFAB_MAX_SCHEDULES): delete one first",
        )
    job = body.job.model_dump(mode="json")
    try:
        rec = await sched.add(job, body.every, body.cron, body.name, body.paused)
    except StoreError as exc:  # PostgreSQL away: nothing was made
        raise database_unavailable(str(exc)) from None
    response.headers["Location"] = f"{request.scope.get('root_path', '')}/schedules/{rec.id}"
    return view(rec)


@router.get(
    "",
    operation_id="list_schedules",
    summary="Every schedule, oldest first",
    response_model=SchedulePage,
    responses=responses(401, 403, 422),
)
async def list_schedules(
    request: Request,
    _: Principal,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"Page size (at most {MAX_PAGE})")] = 100,
    offset: Annotated[int, Query(ge=0, description="Schedules to skip")] = 0,
) -> SchedulePage:
    sched = scheduler_of(request)
    grant = grant_of(request)
    recs = [r for r in sched.schedules.values() if grant.sees(str(r.job.get("service", "")))]
    return SchedulePage(
        items=[view(r) for r in recs[offset : offset + limit]], total=len(recs), limit=limit, offset=offset
    )


@router.get(
    "/{sid}",
    operation_id="get_schedule",
    summary="A schedule (by id or name): its next and last runs, its failures and its last jobs",
    response_model=Schedule,
    responses=responses(401, 403, 404, 409, 422),
)
async def get_schedule(sid: ScheduleId, request: Request, _: Principal) -> Schedule:
    return view(await known(scheduler_of(request), sid, request))


@router.patch(
    "/{sid}",
    operation_id="update_schedule",
    summary="Pause, resume, re-time, rename or change a schedule (by id or name)",
    response_model=Schedule,
    responses=responses(400, 401, 403, 404, 409, 413, 422, 503),
)
async def update_schedule(sid: ScheduleId, patch: SchedulePatch, request: Request, _: Principal) -> Schedule:
    """`{"paused": true}` pauses it; `{"paused": false}` resumes it from now (missed slots are not caught up);
    `every` or `cron` re-times it from now; `name` and `job` replace those (a new `job` is checked as
    POST /schedules checks one; a name another schedule has is 409)."""
    sched = scheduler_of(request)
    rec = await known(sched, sid, request)
    changes = patch.model_dump(exclude_unset=True)
    if "job" in changes and patch.job is not None:
        changes["job"] = patch.job.model_dump(mode="json")
    for key in ("paused", "job"):
        if key in changes and changes[key] is None:
            raise ProblemError(422, "validation", "Invalid request", f"body.{key}: may not be null")
    name_free(sched, changes.get("name"), by=rec.id)
    if patch.job is not None and not grant_of(request).sees(patch.job.service):
        raise ProblemError(404, "service-not-found", "Service not found", f"no service {patch.job.service!r}")
    if patch.job is not None:
        await checked(request, patch.job)
    if ("every" in changes or "cron" in changes) and changes.get("every") is None and changes.get("cron") is None:
        raise ProblemError(422, "validation", "Invalid request", "body: give `every` or `cron` to re-time it")
    try:
        return view(await sched.update(rec, changes))
    except StoreError as exc:
        raise database_unavailable(str(exc)) from None


@router.delete(
    "/{sid}",
    operation_id="delete_schedule",
    summary="Delete a schedule, by id or name (the jobs it submitted stay)",
    status_code=204,
    response_class=Response,
    responses=responses(401, 403, 404, 409, 422),
)
async def delete_schedule(sid: ScheduleId, request: Request, _: Principal) -> Response:
    sched = scheduler_of(request)
    rec = await known(sched, sid, request)
    try:
        await sched.delete(rec)
    except StoreError as exc:
        raise database_unavailable(str(exc)) from None
    return Response(status_code=204)
