"""A job as a worker runs it, and the handle task code gets to talk back to its client."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from .errors import JobCancelledError, JobTimeoutError

_EVENT_LOCK = threading.Lock()


class JobState(StrEnum):
    """Where a job is on its worker."""

    RECEIVED = "received"  #: stored, waiting for a pool thread
    RUNNING = "running"  #: a pool thread runs it
    WAITING_INPUT = "waiting_input"  #: the task waits for its client
    COMPLETED = "completed"  #: the task returned
    FAILED = "failed"  #: the task raised, timed out, or was cancelled

    @property
    def final(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED)


def iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat() if ts is not None else None


@dataclass(slots=True, eq=False)
class Job:
    """Task code receives this when it declares a parameter annotated `Job`."""

    uuid: str
    client: bytes
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    timeout: float | None
    push: bool
    ack: bool
    request: bytes = b""  # the raw POST body, as stored
    received_at: float = field(default_factory=time.time)
    started_at: float | None = None
    completed_at: float | None = None
    state: JobState = JobState.RECEIVED
    status_code: bytes = b"300"
    result_payload: bytes = b""
    event_seq: int = 0
    emit: Callable[[Job, dict[str, Any]], None] | None = None
    _cancel: threading.Event | None = None

    @property
    def cancel_event(self) -> threading.Event:
        """Set when the job is cancelled; tasks may wait on it instead of sleeping."""
        # Made on first use: most jobs never need one, and an Event costs a Condition.
        ev = self._cancel
        if ev is None:
            with _EVENT_LOCK:
                if self._cancel is None:
                    self._cancel = threading.Event()
                ev = self._cancel
        return ev

    @property
    def deadline(self) -> float | None:
        return self.received_at + self.timeout if self.timeout else None

    @property
    def cancelled(self) -> bool:
        return self._cancel is not None and self._cancel.is_set()

    def expired(self) -> bool:
        d = self.deadline
        return d is not None and time.time() >= d

    def check(self) -> None:
        """Raise if the job was cancelled or ran past its deadline: call it between steps."""
        if self.cancelled:
            raise JobCancelledError(f"job {self.uuid} was cancelled", uuid=self.uuid)
        if self.expired():
            raise JobTimeoutError(f"job {self.uuid} ran past its {self.timeout} s deadline", uuid=self.uuid)

    def event(
        self,
        message: str,
        *,
        severity: str = "INFO",
        progress: float | None = None,
        data: dict[str, Any] | None = None,
        event_type: str = "progress",
        status: str = "running",
    ) -> None:
        """Send a progress event to the client as it happens (and keep it in the job store)."""
        payload: dict[str, Any] = {
            "event_type": event_type,
            "message": message,
            "severity": severity,
            "status": status,
            "task": self.task,
            "juuid": self.uuid,
            "timestamp": iso(time.time()),
        }
        if progress is not None:
            payload["progress"] = max(0.0, min(1.0, float(progress)))
        if data:
            payload["extras"] = data
        if self.emit is not None:
            self.emit(self, payload)
