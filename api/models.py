"""Request and response bodies of the HTTP API (they are also its OpenAPI schema)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from zfab import MAX_NAME_BYTES
from zfab import JobState as JobState  # the one state machine (core/states.py): its values are the API's

# The broker drops frames whose service or worker name is longer than MAX_NAME_BYTES; checking
# here turns a job that would silently time out into a 422.
MIN_JOB_TIMEOUT = 0.001  # the broker refuses a shorter one (service/broker/admission.py)
MAX_JOB_TIMEOUT = 86_400.0
MAX_DELAY = 7 * 86_400.0
MAX_RETRIES = 10
MAX_BACKOFF = 3600.0
MMI_SERVICE = "mmi.service.broker"


def _name(value: str) -> str:
    if len(value.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"longer than {MAX_NAME_BYTES} bytes in UTF-8")
    return value


def _service(value: str) -> str:
    if value == MMI_SERVICE:
        raise ValueError(f"'{MMI_SERVICE}' is the broker itself; use the /mmi routes")
    return _name(value)


def _worker_name(value: str) -> str:
    if value.startswith("["):
        raise ValueError("a worker name must not start with '['; send a JSON list of names instead")
    return _name(value)


# The schema states what validation enforces: 256 bytes of UTF-8 is at least 64 characters of any
# script, and a worker name never starts with "[" (that is a JSON list of names).
_NAME_SCHEMA = {"maxLength": MAX_NAME_BYTES // 4}
Name = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_BYTES, json_schema_extra=_NAME_SCHEMA), AfterValidator(_name)
]
ServiceName = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_BYTES, json_schema_extra=_NAME_SCHEMA), AfterValidator(_service)
]
WorkerName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_BYTES, pattern=r"^[^\[]", json_schema_extra=_NAME_SCHEMA),
    AfterValidator(_worker_name),
]
Target = WorkerName | Annotated[list[WorkerName], Field(min_length=1, max_length=1000)]


class JobRequest(BaseModel):
    """A job to run: a task of a service, on some of its workers."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"service": "demo", "task": "echo", "kwargs": {"data": "hi"}},
                {"service": "demo", "task": "add", "args": [1, 2], "workers": "all", "timeout": 10},
            ]
        },
    )

    service: ServiceName = Field(description="Service whose workers run the task", examples=["demo"])
    task: Name = Field(description="Task name (see GET /mmi/services/{service}/tasks)", examples=["echo"])
    args: list[Any] = Field(default_factory=list, max_length=10_000, description="Positional arguments")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments")
    workers: Target = Field(
        "any", description="`any` (one worker), `all`, a worker name, or a list of names", examples=["any"]
    )
    timeout: float = Field(
        60.0,
        ge=MIN_JOB_TIMEOUT,
        le=MAX_JOB_TIMEOUT,
        allow_inf_nan=False,
        description="Seconds the job may take, end to end (default 60); counted from the end of its `delay`. "
        "Past it the job is `expired`, queued or running.",
    )
    priority: int = Field(5, ge=0, le=9, description="Queue order at the broker: 9 first, 0 last (default 5)")
    delay: float = Field(
        0.0, ge=0, le=MAX_DELAY, allow_inf_nan=False, description="Seconds the broker holds the job before it may run"
    )
    retries: int | None = Field(
        None,
        ge=0,
        le=MAX_RETRIES,
        description="Attempts after the first (target `any`): when its worker is lost, and when its task raises "
        "(after `backoff`). Unset: as the task declares (`@task(retries=...)`); 0: none",
    )
    backoff: float | None = Field(
        None,
        ge=0,
        le=MAX_BACKOFF,
        allow_inf_nan=False,
        description="Seconds before the second attempt of a failed job, doubling for each next one (at most "
        "300 s, or this value if larger; ±10 % jitter). Unset: as the task declares, else 1",
    )


class TaskLimits(BaseModel):
    """A task's rate and concurrency limits, set at run time (they replace what it declares)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"rate_limit": "5/s"}, {"concurrency": 2, "limit_key": "site"}]},
    )

    rate_limit: str | None = Field(
        None, max_length=64, description="At most this many start, evenly spaced: `5/s`, `100/m`, `10 per hour`"
    )
    concurrency: int | None = Field(None, ge=1, le=1_000_000, description="At most this many at once, fabric-wide")
    limit_key: str | None = Field(
        None, min_length=1, max_length=128, description="Apply both per value of this argument of the job"
    )


class JobErrorInfo(BaseModel):
    """The fabric error that ended a job (expired, lost, cancelled, refused), as the Python client raises it."""

    type: str = Field(description="The fabric error, e.g. JobTimeoutError, NoWorkersError, WorkerLostError")
    message: str


class Attempt(BaseModel):
    """An earlier attempt of a retried job: how it ended, and how long the next one waited."""

    attempt: int = Field(description="1 for the first")
    worker: str | None = Field(None, description="The worker that ran it (or, lost, the one lost)")
    status: str = Field(description="How it ended on its worker: `error`, `timeout`, `lost`")
    error: str | None = Field(None, description="The error in one line")
    errors: list[str] = Field(
        default_factory=list, description="Its errors (tracebacks: see ZFAB_API_EXPOSE_TRACEBACKS)"
    )
    started_at: datetime | None = None
    finished_at: datetime | None = None
    retry_after: float | None = Field(None, description="Seconds the next attempt waited in the broker's queue")


class JobArguments(BaseModel):
    """What a job was asked, as GET /jobs/{uuid} shows it: redacted as its task declares, bounded in bytes."""

    model_config = ConfigDict(extra="forbid")

    args: list[Any] | None = Field(description="Positional arguments; null when over the bound (see `bytes`)")
    kwargs: dict[str, Any] | None = Field(description="Keyword arguments; null when over the bound")
    redacted: list[str] = Field(
        default_factory=list, description="Arguments shown as `***`: the task declares them secret (`redact=`)"
    )
    bytes: int = Field(description="Size of the arguments as JSON")
    omitted: str | None = Field(None, description="Why `args` and `kwargs` are not shown, when they are not")


class HopTrace(BaseModel):
    """Where a job's time went, hop by hop: durations each process measured on its own clock."""

    total: float = Field(description="Seconds from the request being read to the final answer arriving")
    hops: dict[str, float] = Field(
        description="Seconds at each hop, in the order the job passed them: api, client_broker (both ways), "
        "broker_queue, broker_worker (both ways), worker_queue, run, worker_result; they add up to `total`. "
        "Only hops the fabric measured appear (docs/protocol.md, Hop traces)"
    )


class HistoryStep(BaseModel):
    """One state of a job, at the time the process that saw it says it happened, placed on the API's clock
    (docs/protocol.md, "Times across processes")."""

    state: str = Field(
        description="`submitted`, `queued`, `running`, `waiting`, or how it (or an earlier attempt) ended"
    )
    at: datetime
    by: Literal["api", "broker", "worker"] = Field(description="The process that saw it happen")
    worker: str | None = None
    note: str = ""


class JobTrace(HopTrace):
    """A finished job's hop trace (its last attempt's); for a job several workers ran, the slowest's."""

    workers: dict[str, HopTrace] | None = Field(None, description="Each worker's, for a job sent to several")


class Job(BaseModel):
    """A job the API submitted, as it stands now."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "uuid": "5f0c6bd1e5b24f5c9d7a2a8d3c1e0f11",
                    "service": "demo",
                    "task": "echo",
                    "workers": "any",
                    "state": "completed",
                    "results": {
                        "demo-1": {
                            "result": "hi",
                            "failed": False,
                            "errors": [],
                            "messages": [],
                            "juuid": "5f0c6bd1e5b24f5c9d7a2a8d3c1e0f11",
                            "task": "demo-1:echo",
                            "status": "200",
                            "service": "demo",
                        }
                    },
                    "error": None,
                    "submitted_at": "2025-01-01T12:00:00.000000Z",
                    "completed_at": "2025-01-01T12:00:00.004000Z",
                    "timings": {"submitted": 1735732800.0, "dispatched": 1735732800.001, "completed": 1735732800.004},
                    "trace": {
                        "total": 0.004,
                        "hops": {
                            "api": 0.00012,
                            "client_broker": 0.00081,
                            "broker_queue": 0.00004,
                            "broker_worker": 0.00093,
                            "worker_queue": 0.00021,
                            "run": 0.00184,
                            "worker_result": 0.00005,
                        },
                    },
                    "cancel_requested": False,
                }
            ]
        }
    )

    uuid: str
    service: str
    task: str
    workers: str | list[str] = Field(description="The target the job was submitted to")
    state: JobState
    reason: str | None = Field(None, description="Why a job ended as it did (for final states other than completed)")
    results: dict[str, Any] | None = Field(
        description="Results keyed by worker name, as Client.run_job returns them; null while pending "
        "(an `error` job keeps whatever results did arrive)"
    )
    error: JobErrorInfo | None = None
    priority: int = 5
    retries: int | None = Field(None, description="The retries asked for (null: as the task declares)")
    attempt: int = Field(1, description="The attempt that runs (or ran last): 2, 3... after retries")
    attempts: list[Attempt] = Field(
        [],  # not default_factory=list: see `history`
        description="Each earlier attempt of a retried job, with its error (the last one's outcome is in `results`)",
    )
    arguments: JobArguments | None = Field(
        None, description="What the job was asked (GET /jobs/{uuid}; redacted as its task declares)"
    )
    dead: bool = Field(
        False,
        description="A dead letter: it ended failed, expired or lost after the fabric took it, and was not "
        "submitted again yet (POST /jobs/{uuid}/retry; GET /jobs?dead=true lists them)",
    )
    outcome_unknown: bool = Field(
        False,
        description="The broker has not confirmed it took the job (it was silent when the job was sent): it "
        "may run or may never have reached the broker. The API keeps following it and this job ends in what "
        "happened (ran once, or `lost`: never confirmed); do not submit it again, GET /jobs/{uuid}?wait=N",
    )
    retry_of: str | None = Field(None, description="The job this one submitted again (POST /jobs/{uuid}/retry)")
    retried_as: str | None = Field(None, description="The job that submitted this one again")
    submitted_by: str | None = Field(
        None,
        description="Who submitted it: the token's or key's name, as the audit log names it (`anonymous` on "
        "loopback); none for a schedule's job (see `schedule`) or one recorded before zfab kept it",
    )
    schedule: str | None = Field(None, description="The schedule that fired it, if one did")
    submitted_at: datetime
    queued_at: datetime | None = Field(None, description="When the broker admitted it to its queue")
    started_at: datetime | None = Field(None, description="When a worker started it")
    finished_at: datetime | None = Field(None, description="When it reached its final state")
    completed_at: datetime | None = Field(None, description="The same as finished_at (kept for older clients)")
    timings: dict[str, float] = Field(description="Epoch seconds at each hop the client saw")
    history: list[HistoryStep] = Field(
        # A default (copied per model), not a default_factory: model_construct inspects a factory's signature
        # on every call, 2 ms for `list` (the console's test builds a 100,000-job table that way).
        [],
        description="Each state in the order it happened, at the time the broker or worker that saw it says "
        "(`queued_at`, `started_at` are its times too)",
    )
    trace: JobTrace | None = Field(
        None, description="Once it ended: where its time went, hop by hop (null: the fabric sent no trace)"
    )
    cancel_requested: bool = False
    input_request: dict[str, Any] | None = Field(
        None,
        description="While `state` is `waiting`: what the worker asks (`id`, `question`, the JSON `schema` the "
        "answer must match, `timeout` in seconds, `worker`, `asked_at` and `deadline` on the API's clock, "
        "`expires_in`: seconds left when this answer was made); answer with POST /jobs/{uuid}/input",
    )


class InputAnswer(BaseModel):
    """The answer to a job's pending input request."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"value": "Ada"}, {"value": 3, "input_id": "9f1c"}]}
    )

    value: Any = Field(description="The answer; the worker checks it against the request's `schema`")
    input_id: str | None = Field(
        None, max_length=128, description="The `input_request.id` answered (default: the job's latest request)"
    )


class JobSummary(BaseModel):
    """A job in a listing: where it is and when, without its results or events (`include=results` for those)."""

    uuid: str
    service: str
    task: str
    workers: str | list[str]
    state: JobState
    reason: str | None = None
    submitted_at: datetime
    queued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    priority: int = 5
    cancel_requested: bool = False
    schedule: str | None = None
    dead: bool = False
    retry_of: str | None = None
    retried_as: str | None = None

    @classmethod
    def of(cls, job: Job) -> JobSummary:
        return cls(
            uuid=job.uuid,
            service=job.service,
            task=job.task,
            workers=job.workers,
            state=job.state,
            reason=job.reason,
            submitted_at=job.submitted_at,
            queued_at=job.queued_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            priority=job.priority,
            cancel_requested=job.cancel_requested,
            schedule=job.schedule,
            dead=job.dead,
            retry_of=job.retry_of,
            retried_as=job.retried_as,
        )


class JobPage(BaseModel):
    """Recent jobs, newest first: summaries, or whole jobs with `include=results`."""

    items: list[Job | JobSummary]
    total: int = Field(description="Jobs the API remembers (bounded by ZFAB_JOB_HISTORY)")
    limit: int
    next: str | None = Field(None, description="The next page's URL (same filters), or null on the last page")


class Problem(BaseModel):
    """An error, as RFC 9457 problem details (`application/problem+json`)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "type": "https://zfab.dev/problems/no-workers",
                    "title": "No live workers",
                    "status": 503,
                    "detail": "service 'demo' is unknown: no worker has registered it",
                }
            ]
        },
    )

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
