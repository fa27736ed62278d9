"""The jobs the API submitted: a bounded, insertion-ordered table, and how a job's state is read.

Pure bookkeeping, no I/O. The state is derived from the job's future when asked, not pushed by
a callback, because the future completes on the client's owner thread while this table is
only touched from the event loop: reading a finished future is safe from any thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import uuid as uuidlib
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service.clientjob import JobFuture
from service.errors import BackpressureError, BusyError, ClosedError, JobError, NoWorkersError

from .models import Job, JobErrorInfo, JobRequest, JobState

# Errors that mean the fabric refused the job before any worker ran it: a retry of the same
# Idempotency-Key may submit it again (with the same uuid, so workers still dedupe).
REFUSALS = (NoWorkersError, BusyError, BackpressureError, ClosedError)
IDEMPOTENCY_NAMESPACE = uuidlib.UUID("6f1b7f4e-2c55-4f0e-9d43-0b7d7cf0a6a1")


# uuid4() reads os.urandom per call, a syscall that gives up the GIL; on the event loop, getting
# it back means waiting for the client's owner thread (up to the switch interval). Job uuids
# need to be unique, not secret (any caller with a token may list jobs), so a generator seeded
# once from os.urandom is enough.
_uuid_bits = random.Random(os.urandom(32)).getrandbits


def new_job_uuid() -> str:
    return uuidlib.UUID(int=_uuid_bits(128), version=4).hex


def job_uuid_for_key(key: str, principal: str) -> str:
    """The job uuid an Idempotency-Key stands for; scoped by caller so two tokens never share jobs."""
    return uuidlib.uuid5(IDEMPOTENCY_NAMESPACE, f"{principal}\x00{key}").hex


def fingerprint(req: JobRequest) -> str:
    """What makes two requests 'the same job' for Idempotency-Key purposes."""
    raw = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def _when(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


def state_of(future: JobFuture) -> tuple[JobState, dict[str, Any] | None, BaseException | None]:
    """(state, results, error) of a job right now."""
    if not future.done():
        return JobState.pending, None, None
    if future.cancelled():
        return JobState.error, None, ClosedError("the job's future was cancelled")
    exc = future.exception()
    if exc is not None:
        partial = exc.results if isinstance(exc, JobError) and exc.results else None
        return JobState.error, partial, exc
    results: dict[str, Any] = future.result()
    failed = any(isinstance(v, dict) and v.get("failed") for v in results.values())
    return (JobState.failed if failed else JobState.completed), results, None


@dataclass(slots=True, eq=False)
class JobRecord:
    """One submitted job: what was asked, and the future that answers it."""

    uuid: str
    service: str
    task: str
    workers: str | list[str]
    future: JobFuture
    fingerprint: str  # of the request, when it came with an Idempotency-Key
    cancel_requested: bool = False

    @property
    def done(self) -> bool:
        return self.future.done()

    def refused(self) -> bool:
        """True when the fabric turned the job away before it ran."""
        return self.future.done() and not self.future.cancelled() and isinstance(self.future.exception(), REFUSALS)

    def view(self) -> Job:
        state, results, exc = state_of(self.future)
        t = self.future.timings
        return Job(
            uuid=self.uuid,
            service=self.service,
            task=self.task,
            workers=self.workers,
            state=state,
            results=results,
            error=JobErrorInfo(type=type(exc).__name__, message=str(exc)) if exc is not None else None,
            submitted_at=_when(t.get("submitted")) or datetime.now(UTC),
            completed_at=_when(t.get("completed")) if state is not JobState.pending else None,
            timings=dict(t),
            cancel_requested=self.cancel_requested,
        )


class JobTable:
    """The last `capacity` jobs, oldest evicted first (finished or not: the table must stay bounded)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._jobs: OrderedDict[str, JobRecord] = OrderedDict()

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, uuid: str) -> JobRecord | None:
        return self._jobs.get(uuid)

    def add(self, record: JobRecord) -> None:
        self._jobs.pop(record.uuid, None)
        self._jobs[record.uuid] = record
        while len(self._jobs) > self.capacity:
            self._jobs.popitem(last=False)

    def page(self, limit: int, offset: int) -> list[JobRecord]:
        """Newest first."""
        out: list[JobRecord] = []
        for i, rec in enumerate(reversed(self._jobs.values())):
            if i >= offset + limit:
                break
            if i >= offset:
                out.append(rec)
        return out
