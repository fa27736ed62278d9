"""What `Client.submit` asks of the broker, checked and spelt out: its arguments' bounds, and the
fields of its flags frame (docs/protocol.md "The flags frame"). Pure but for the wall clock, which
turns a delay into the epoch time a resubmission after a restart still means."""

from __future__ import annotations

import time
from typing import Any

from ..core.retries import MAX_RETRIES

# Under a pipelined load nearly every job waits in the broker's queue for a moment; telling the
# client of each was a third message per job (and made ack=false pay for a 202 too).
QUEUED_NOTICE = 1.0


def check(timeout: float, priority: int | None, delay: float | None, retries: int | None) -> None:
    """ValueError for a submission no broker would take as meant."""
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    if priority is not None and not 0 <= priority <= 9:
        raise ValueError("priority must be from 0 to 9")
    if delay is not None and delay < 0:
        raise ValueError("delay must not be negative")
    if retries is not None and not 0 <= retries <= MAX_RETRIES:
        raise ValueError(f"retries must be from 0 to {MAX_RETRIES}")


def job_fields(
    task: str,
    timeout: float,
    how: tuple[bool, bool, float, str | None],
    priority: int | None,
    delay: float | None,
    not_before: float | None,
    *,
    known: bool,
) -> dict[str, Any]:
    """The flags frame of a job: how it is answered (`how`: its client's push, ack, queued notice and
    shared-memory host), its task and timeout, when the broker says it is queued, its priority, the
    epoch time it is held until, whether its service is known already (a resubmission)."""
    push, ack, queued_notice, host = how
    fields: dict[str, Any] = {"push": push, "ack": ack, "task": task, "timeout": timeout}
    if queued_notice > 0:
        # Well before the deadline: a job that expires in the queue is known to have been queued.
        fields["notice"] = min(queued_notice, round(timeout / 2, 3))
    if priority is not None:
        fields["priority"] = priority
    if delay:
        # The broker holds it; an epoch time (not seconds) survives a resubmission after a restart.
        not_before = max(not_before or 0.0, time.time() + delay)
    if not_before is not None:
        fields["not_before"] = not_before
    if known:
        fields["known"] = True
    if host is not None and push:
        # A worker on this host may answer a large result by handle (only a pushed result: one
        # collected with GET comes as bytes, and its block would wait out its linger unread).
        fields["host"] = host
    return fields


def held_for(fields: dict[str, Any]) -> float:
    """Seconds the broker holds the job before it may run: its timeout counts from then."""
    not_before = fields.get("not_before")
    return 0.0 if not_before is None else max(0.0, not_before - time.time())
