"""What a client's POST asks of the broker, read and checked before the job is queued or sent.

Pure: reads the request frames (the flags frame carries zfab's job fields, so the broker never
parses a job's body), returns a QueuedJob or raises Refusal with the status and reason the
client gets. docs/protocol.md lists the flags.
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..core import payloads, shmhandle
from ..core import protocol as nfp
from ..core.payloads import Word
from ..core.schemacheck import is_number
from .jobqueue import ALL, ANY, NAMED, QueuedJob

MAX_PRIORITY = 9
DEFAULT_PRIORITY = 5
MAX_DELAY = 7 * 86_400.0  # a week: further out is a schedule, not a delay
MAX_TIMEOUT = 7 * 86_400.0
MAX_NOTICE = 10.0  # seconds a client may ask the broker to wait before it says "queued"


class Refusal(Exception):
    """The broker will not take the job: `status` and `word` go to the client with `why`."""

    def __init__(
        self, status: bytes, word: Word, why: str, retry_after: float | None = None, malformed: str | None = None
    ) -> None:
        super().__init__(why)
        self.status = status
        self.word = word
        self.why = why
        self.retry_after = retry_after
        self.malformed = malformed  # a reason the frame counts as malformed under (zfab_frames_rejected_total)


def bad(why: str, malformed: str | None = None) -> Refusal:
    return Refusal(nfp.ST_BAD_REQUEST, Word.FAILED, why, malformed=malformed)


def _number(flags: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = flags.get(key)
    if value is None:
        return None
    if not is_number(value) or not math.isfinite(value):
        raise bad(f"{key} must be a number of seconds")
    if not lo <= value <= hi:
        raise bad(f"{key} {value} is out of range ({lo:g}..{hi:g})")
    return float(value)


def read_job(sender: bytes, req: nfp.ClientRequest, *, now: float, seq: int, default_timeout: float) -> QueuedJob:
    """The job a POST asks for. `now` is the broker's monotonic clock."""
    flags = req.flags
    try:
        target = nfp.parse_target(req.target)
    except nfp.ProtocolError as exc:
        raise bad(f"bad target: {exc.detail}", malformed=exc.reason) from None
    if target == ANY:
        kind, names = ANY, None
    elif target == ALL:
        kind, names = ALL, None
    else:
        kind, names = NAMED, [target] if isinstance(target, str) else target
        if not names:
            raise bad("bad target: an empty list of workers")
    timeout = _number(flags, "timeout", 1e-3, MAX_TIMEOUT) or default_timeout
    priority = flags.get("priority", DEFAULT_PRIORITY)
    if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:  # (a bool is no priority either)
        raise bad(f"priority must be a whole number from 0 to {MAX_PRIORITY}, not {priority!r}")
    # The flags a plain job leaves out are looked up once here, not read through _number each.
    delay = (_number(flags, "delay", 0.0, MAX_DELAY) or 0.0) if "delay" in flags else 0.0
    if "not_before" in flags:
        # An epoch time from the client: how far ahead it is, on our monotonic clock.
        not_before = _number(flags, "not_before", 0.0, 1e11)
        if not_before is not None:
            delay = max(delay, min(MAX_DELAY, not_before - time.time()))
    task = flags.get("task")
    notice = (_number(flags, "notice", 0.0, MAX_NOTICE) or 0.0) if "notice" in flags else 0.0
    try:
        # W3C trace context: passed on to the worker untouched (service/tracing.py)
        trace = payloads.trace_context(flags) if "traceparent" in flags else None
    except ValueError as exc:
        raise bad(str(exc)) from None
    host = shmhandle.check_host(flags.get("host")) if "host" in flags else None
    return QueuedJob(
        uuid=req.uuid,
        client=sender,
        service=req.service,
        target=req.target,
        kind=kind,
        names=names,
        body=req.body,
        task=task if isinstance(task, str) else "",
        push=bool(flags.get("push")),
        ack=bool(flags.get("ack", True)),
        announce=bool(flags),  # a flags frame means a zfab client: it understands queued/expired/cancelled
        priority=priority,
        seq=seq,
        queued_at=now,
        not_before=now + delay if delay > 0 else 0.0,
        deadline=payloads.job_deadline(now, timeout, delay),
        timeout=timeout,
        notice=notice,
        trace=trace,
        host=host,
        shm=host is not None and shmhandle.is_handle(req.body),
    )


def unknown_task(service: str, task: str, tasks: dict[str, Any]) -> Refusal:
    return bad(f"task '{task}' is not a task of service '{service}'; its tasks are: {', '.join(sorted(tasks))}")


def answer(job: QueuedJob, word: Word, why: str | None = None, **extra: Any) -> dict[str, Any]:
    """What the broker tells a zfab client about its whole job (queued, expired, cancelled, refused)."""
    body = payloads.refusal(job.uuid, job.target, job.service, word, why or "")
    if why is None:
        body["workers"] = []  # an admission, not a refusal: no worker yet
        del body["errors"]
    body.update(extra)
    return body
