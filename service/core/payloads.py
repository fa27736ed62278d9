"""The payload rules of NFP as zfab speaks it: every JSON body inside a frame, built and read here.

`protocol.py` owns the frames; this module owns what travels in them: the POST body and the
flags frame a client sends, the result entries and status replies a worker sends, the
broker's dispatch replies and refusals, the status words they carry, and the per-attempt
wire uuid of a retried job. Producers and consumers both use it, so a rule lives in one
place. Pure: no sockets, no threads. `docs/protocol.md` documents each shape.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final

from . import shmhandle
from .errors import ProtocolError
from .protocol import Frame, dumps, loads
from .retries import MAX_RETRIES, Backoff, read_backoff
from .schemacheck import is_number

# ---- job uuids ----------------------------------------------------------------------

ATTEMPT_SEP: Final = "~"
MAX_JOB_UUID: Final = 100
"""Characters a job uuid may have. Its wire form adds `~N` for attempt N ≥ 2 and stays within
MAX_UUID_BYTES (128), the bound every decoder checks."""


MAX_ATTEMPT: Final = shmhandle.MAX_ATTEMPT  # 10,000: a shared-memory handle carries it too
"""The highest attempt number a POST body may carry (a job lost again and again, or retried)."""


def check_job_uuid(uuid: str) -> None:
    """Raise ValueError unless `uuid` can name a job: 1..MAX_JOB_UUID characters of ASCII, no `~`."""
    if not uuid or len(uuid) > MAX_JOB_UUID or ATTEMPT_SEP in uuid or not uuid.isascii():
        raise ValueError(f"job uuid must be 1..{MAX_JOB_UUID} ASCII characters without {ATTEMPT_SEP!r}")


def wire_uuid(uuid: str, attempt: int) -> str:
    """The uuid attempt `attempt` of a job travels under: replies to an earlier attempt cannot pass for it."""
    return uuid if attempt <= 1 else f"{uuid}{ATTEMPT_SEP}{attempt}"


def split_wire_uuid(wire: str) -> tuple[str, int]:
    """(job uuid, attempt) of a uuid as it travels; attempt 1 has no suffix."""
    base, _, n = wire.partition(ATTEMPT_SEP)
    return base, int(n) if n.isdigit() else 1


# ---- status words -----------------------------------------------------------------------


class Word(StrEnum):
    """The `status` word of a broker or worker status payload (NorFab's spelling where it has one)."""

    QUEUED = "QUEUED"  #: broker, 301: admitted, waiting in the service's queue
    DISPATCHED = "DISPATCHED"  #: broker, 202: sent to the workers named in `workers`
    EXPIRED = "EXPIRED"  #: broker, 408: the deadline passed in the queue, or with no answer from a worker
    CANCELLED = "CANCELLED"  #: broker, 499: cancelled while queued
    FAILED = "FAILED"  #: broker, 400/404: refused (unknown service or task, bad target or flags)
    TOO_LARGE = "TOO LARGE"  #: broker, 400: the request is over its message limit (core/sizes.py)
    BUSY = "BUSY"  #: broker or worker, 503: a bound is full
    LOST = "LOST"  #: broker, 410: the worker running the job was lost
    ACCEPTED = "ACCEPTED"  #: worker, 201: stored
    PENDING = "PENDING"  #: worker, 300: queued on the worker
    STARTED = "STARTED"  #: worker, 300/102: running
    NOT_FOUND = "JOB NOT FOUND"  #: worker, 404
    NOT_KEPT = "RESULT NOT KEPT"  #: worker, 404: finished, but its result was too large to store and has left memory
    CANCELLING = "CANCELLING"  #: worker, 202 to DELETE: the running job was asked to stop
    UNSUPPORTED = "UNSUPPORTED"  #: worker, 400: a command it does not take


class Outcome(StrEnum):
    """The `status` of a result entry: how the task ended on its worker."""

    COMPLETED = "completed"  #: the task returned
    ERROR = "error"  #: the task raised, or the request was bad
    TIMEOUT = "timeout"  #: the job's deadline passed
    CANCELLED = "cancelled"  #: DELETE stopped it


# ---- client → broker: the POST body and the flags frame ---------------------------------

EMPTY_BODY: Final = b'{"task":"","args":[],"kwargs":{}}'
"""The body of a GET (and of a POST that only recovers a job): workers read the uuid, not the body."""


def post_body(
    task: str,
    args: list[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    timeout: float | None = None,
    push: bool | None = None,
    ack: bool | None = None,
    retries: int | None = None,
    backoff: dict[str, float] | None = None,
) -> bytes:
    """A POST body: NorFab's `task`, `args`, `kwargs`, plus zfab's `timeout`, `push`, `ack`,
    `retries` and `backoff` (the job's own retry policy) when given."""
    body: dict[str, Any] = {"task": task, "args": args or [], "kwargs": kwargs or {}}
    if timeout is not None:
        body["timeout"] = timeout
    if push is not None:
        body["push"] = push
    if ack is not None:
        body["ack"] = ack
    if retries is not None:
        body["retries"] = retries
    if backoff is not None:
        body["backoff"] = backoff
    return dumps(body)


def with_attempt(body: bytes, attempt: int) -> bytes:
    """The same POST body, marked as attempt `attempt` of its job (a shared-memory handle says it)."""
    if shmhandle.is_handle(body):
        return shmhandle.with_attempt(body, attempt)
    obj = loads(body)
    obj["attempt"] = attempt
    return dumps(obj)


@dataclass(slots=True)
class PostBody:
    """A POST body as a worker reads it."""

    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    timeout: float | None
    push: bool
    ack: bool
    attempt: int = 1
    retries: int | None = None  # the job's own count of retries (None: as its task declares)
    backoff: Backoff | None = None  # the job's own schedule (None: as its task declares)


def read_post_body(raw: Frame) -> PostBody:
    """Read and check a POST body; raises ProtocolError("json", why) for anything malformed."""
    try:
        body = loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep for the parser
        raise ProtocolError("json", f"bad request body: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError("json", "bad request body: POST body must be a JSON object")
    args = body.get("args") or []
    kwargs = body.get("kwargs") or {}
    timeout = body.get("timeout")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ProtocolError("json", "bad request body: args must be a JSON list and kwargs a JSON object")
    if timeout is not None and (not is_number(timeout) or timeout <= 0):
        raise ProtocolError("json", "bad request body: timeout must be a positive number of seconds")
    attempt = body.get("attempt", 1)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or not 1 <= attempt <= MAX_ATTEMPT:
        raise ProtocolError("json", f"bad request body: attempt must be a whole number from 1 to {MAX_ATTEMPT}")
    retries = body.get("retries")
    if retries is not None and (
        isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= MAX_RETRIES
    ):
        raise ProtocolError("json", f"bad request body: retries must be a whole number from 0 to {MAX_RETRIES}")
    backoff = body.get("backoff")
    try:
        schedule = read_backoff(backoff) if backoff is not None else None
    except (ValueError, TypeError) as exc:
        raise ProtocolError("json", f"bad request body: {exc}") from None
    return PostBody(
        task=str(body.get("task", "")),
        args=args,
        kwargs=kwargs,
        timeout=float(timeout) if timeout is not None else None,
        push=bool(body.get("push", False)),
        ack=bool(body.get("ack", True)),
        attempt=attempt,
        retries=retries,
        backoff=schedule,
    )


def job_deadline(start: float, timeout: float, delay: float = 0.0) -> float:
    """When a job submitted at `start` expires: its `timeout` counts from the end of its `delay`
    (docs/protocol.md, flags `timeout`), so a job held longer than its timeout still gets all of it.
    The one rule the client, the API and the broker use; `start` and the answer on one clock."""
    return start + max(0.0, delay) + timeout


def timeout_left(deadline: float, now: float, timeout: float) -> float:
    """The `timeout` to send again at `now` (a resubmission that keeps its delay, flags
    `not_before`) so that job_deadline() gives the same `deadline`: all of it while the delay
    lasts, what is left of it after."""
    return max(0.001, min(timeout, deadline - now))


def flags(*, push: bool, ack: bool) -> bytes:
    """The optional 8th client frame: `push` results when ready, `ack` (202/201) or results only."""
    return dumps({"push": push, "ack": ack})


NO_ACK: Final = b'{"ack":false}'

TRACEPARENT: Final = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
MAX_TRACESTATE: Final = 512  # characters: W3C allows 32 members of up to 256 each; more is not carried


def trace_context(fields: dict[str, Any]) -> dict[str, str] | None:
    """The W3C trace context (`traceparent`, `tracestate`) among a flags frame's or meta frame's
    fields, or None; ValueError naming what is malformed (service/tracing.py makes and reads it)."""
    parent = fields.get("traceparent")
    if parent is None:
        return None
    if not isinstance(parent, str) or not TRACEPARENT.match(parent):
        raise ValueError("traceparent must be a W3C trace context: 00-<32 hex>-<16 hex>-<2 hex>")
    out = {"traceparent": parent}
    state = fields.get("tracestate")
    if state is not None:
        if not isinstance(state, str) or len(state) > MAX_TRACESTATE or not state.isascii():
            raise ValueError(f"tracestate must be ASCII text of at most {MAX_TRACESTATE} characters")
        out["tracestate"] = state
    return out


"""Flags of GETs and PUTs a zfab client sends: no 202 from the broker (it knows its workers)."""


# ---- worker → client: result entries and status replies -----------------------------------


_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text


def iso(ts: float | None) -> str | None:
    """What datetime.fromtimestamp(ts, UTC).isoformat() says, at a third of its cost: two per
    result entry, and the date and time change once a second. Microseconds are rounded as
    datetime rounds them (half to even, carried into the second) and left out when 0."""
    global _second
    if ts is None:
        return None
    frac, whole = math.modf(ts)
    us = round(frac * 1e6)
    if us >= 1_000_000:
        whole, us = whole + 1, us - 1_000_000
    elif us < 0:
        whole, us = whole - 1, us + 1_000_000
    sec = int(whole)
    cached = _second
    if cached[0] == sec:
        text = cached[1]
    else:
        text = datetime.fromtimestamp(sec, UTC).replace(tzinfo=None).isoformat()
        _second = (sec, text)
    return f"{text}.{us:06d}+00:00" if us else f"{text}+00:00"


def result_entry(
    *,
    worker: str,
    service: str,
    uuid: str,
    task: str,
    result: Any,
    failed: bool,
    status: str,
    errors: list[str],
    messages: list[str] | None = None,
    received: float | None = None,
    started: float | None = None,
    completed: float | None = None,
) -> dict[str, Any]:
    """One worker's result: NorFab's Result keys, then zfab's per-hop timestamps (epoch seconds)."""
    return {
        "result": result,
        "failed": failed,
        "errors": errors,
        "messages": messages or [],
        "juuid": uuid,
        "task": f"{worker}:{task}",
        "status": status,
        "resources": [],
        "resources_failed": [],
        "task_started": iso(started),
        "task_completed": iso(completed),
        "service": service,
        "worker": worker,
        "timestamps": {"received": received, "started": started, "completed": completed},
    }


# How a worker's store answers for a job its previous run left unfinished (worker/jobstore.py): the
# worker stopped (killed, crashed) with the job queued or running, so it did not run to an end there.
INTERRUPTED = "interrupted: the worker stopped while the job was queued or running"


def interrupted(entry: Any) -> bool:
    """True for a result entry that says its worker's restart cut the job short (not the task's doing)."""
    if not isinstance(entry, dict) or not entry.get("failed"):
        return False
    errors = entry.get("errors")
    return isinstance(errors, list) and any(isinstance(e, str) and e.startswith(INTERRUPTED) for e in errors)


def failure(worker: str, service: str, uuid: str, task: str, errors: list[str]) -> dict[str, Any]:
    """{worker: entry} for a job that failed before it ran (bad body, unknown task, interrupted)."""
    entry = result_entry(
        worker=worker, service=service, uuid=uuid, task=task, result=None, failed=True, status="error", errors=errors
    )
    return {worker: entry}


def worker_status(worker: str, service: str, uuid: str, word: str, **extra: Any) -> dict[str, Any]:
    """A worker's status reply (201, 300, 102, 404, 503, and its answer to DELETE)."""
    return {"worker": worker, "uuid": uuid, "service": service, "status": word, **extra}


MAX_AGE = 3600.0  # seconds: an `age` past this (or none, or not a number) says nothing


def age_of(payload: bytes | memoryview | None) -> float:
    """The `age` a reply carries (a worker's 201: seconds since the job started, on its own clock), 0 when
    it carries none that makes sense. A receiver places the event at its receipt less the age."""
    if not payload or len(payload) > 4096:
        return 0.0
    try:
        body = loads(payload)
    except (ValueError, RecursionError):
        return 0.0
    age = body.get("age") if isinstance(body, dict) else None
    if not isinstance(age, int | float) or isinstance(age, bool) or not 0.0 <= age <= MAX_AGE:
        return 0.0
    return float(age)


# ---- broker → client: dispatch replies, refusals, lost workers -------------------------------


def dispatched(uuid: bytes, target: bytes, service: bytes, workers: list[str]) -> dict[str, Any]:
    """The broker's 202: the job went to these workers."""
    return {
        "workers": workers,
        "uuid": uuid.decode(errors="replace"),
        "target": target.decode(errors="replace"),
        "status": Word.DISPATCHED.value,
        "service": service.decode(errors="replace"),
    }


def refusal(uuid: bytes, target: bytes, service: bytes, word: Word, why: str) -> dict[str, Any]:
    """The broker's 400/503: the job went nowhere. `workers` is null, which no worker reply has."""
    return {
        "workers": None,
        "uuid": uuid.decode(errors="replace"),
        "target": target.decode(errors="replace"),
        "status": word.value,
        "service": service.decode(errors="replace"),
        "errors": [why],
    }


def lost(worker: str, uuid: bytes, service: bytes, why: str, word: Word = Word.LOST) -> dict[str, Any]:
    """The broker's answer for one worker's part of a job: 410 lost, or 408 expired (no answer in time)."""
    return {
        "worker": worker,
        "uuid": uuid.decode(errors="replace"),
        "status": word.value,
        "service": service.decode(errors="replace"),
        "errors": [why],
    }


def is_refusal(status: bytes, payload: dict[str, Any]) -> bool:
    """True for the broker's own answer about a whole job that no worker holds (400/404/503 refused,
    408 expired in the queue, 499 cancelled while queued), as opposed to a worker's reply."""
    return "target" in payload and payload.get("workers", 0) is None


def errors_of(payload: dict[str, Any], default: str) -> str:
    """The `errors` of a status payload as one line."""
    return "; ".join(str(e) for e in payload.get("errors") or []) or default
