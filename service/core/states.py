"""The one state machine of a job, the same in the Python client, the worker, the REST API, the CLI
and the metrics:

    queued ─► running ◄─► waiting
       │         │
       └─────────┴──► completed | failed | cancelled | expired | lost

A final state carries a `reason` (why it failed, who cancelled it, which deadline passed...).
Pure: the client derives a job's state from what it heard, and its final state from how it ended.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from .errors import (
    BackpressureError,
    BrokerUnavailableError,
    BusyError,
    ClosedError,
    JobCancelledError,
    JobError,
    JobNotFoundError,
    JobTimeoutError,
    NoWorkersError,
    OutcomeUnknownError,
    WorkerLostError,
)


class JobState(StrEnum):
    """Where a job is: one state machine, the same in the Python client, the worker, the REST API, the
    CLI and the metrics.

    queued → running (↔ waiting) → completed | failed | cancelled | expired | lost; a final
    state carries a `reason`."""

    QUEUED = "queued"  #: admitted; waiting for a worker (at the broker, in a worker's prefetch) or its delay
    RUNNING = "running"  #: a worker started it
    WAITING = "waiting"  #: running, and waiting for input from its client
    COMPLETED = "completed"  #: every worker's task returned
    FAILED = "failed"  #: a task raised, or the job was refused (unknown task, bad arguments, a full queue)
    CANCELLED = "cancelled"  #: DELETE stopped it, queued or running
    EXPIRED = "expired"  #: its deadline passed before it finished
    LOST = "lost"  #: its worker (or the broker) was lost, and no retry was left: the outcome is unknown

    @property
    def final(self) -> bool:
        return self not in _UNFINISHED  # a frozenset of members: no enum attribute lookups (asked per job)


State = JobState  # the name the fabric's roles use
_UNFINISHED = frozenset((JobState.QUEUED, JobState.RUNNING, JobState.WAITING))
STATES = tuple(s.value for s in JobState)
UNFINISHED_STATES = tuple(s.value for s in JobState if not s.final)
FINAL_STATES = tuple(s.value for s in JobState if s.final)
# The ends nobody asked for: a job ended so is a dead letter (unless retried), a schedule's failed firing.
DEAD_ENDS = (JobState.FAILED, JobState.EXPIRED, JobState.LOST)


def final_state(results: dict[str, Any] | None, error: BaseException | None) -> tuple[JobState, str | None]:
    """How a job ended, from its results (keyed by worker) or the error that ended it."""
    if error is not None:
        reason = str(error) or type(error).__name__
        if isinstance(error, JobCancelledError):
            return JobState.CANCELLED, reason
        if isinstance(error, JobTimeoutError):
            return JobState.EXPIRED, reason
        if isinstance(error, WorkerLostError | OutcomeUnknownError | BrokerUnavailableError | JobNotFoundError):
            return JobState.LOST, reason
        if isinstance(error, NoWorkersError | BusyError | BackpressureError | ClosedError | JobError):
            return JobState.FAILED, reason
        return JobState.FAILED, f"{type(error).__name__}: {reason}"
    entries = [e for e in (results or {}).values() if isinstance(e, dict)]
    if not any(e.get("failed") for e in entries):
        return JobState.COMPLETED, None
    statuses = {str(e.get("status", "")) for e in entries if e.get("failed")}
    reason = "; ".join(_first_line(e) for e in entries if e.get("failed"))
    if statuses == {"cancelled"}:
        return JobState.CANCELLED, reason
    if statuses == {"timeout"}:
        return JobState.EXPIRED, reason
    return JobState.FAILED, reason


def _first_line(entry: dict[str, Any]) -> str:
    """A failed entry's reason: the exception's one-line message where there is one, not a traceback."""
    messages = [str(m) for m in entry.get("messages") or [] if m]
    if messages:
        return f"{entry.get('worker', '?')}: {messages[-1]}"
    errors = [str(e) for e in entry.get("errors") or [] if e]
    if errors:
        text = errors[-1].strip().splitlines()
        return f"{entry.get('worker', '?')}: {text[-1] if text else ''}"
    return f"{entry.get('worker', '?')}: {entry.get('status', 'failed')}"
