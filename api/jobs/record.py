"""One job as the API holds it (JobRecord), and how it reads: its state from the client's future, its
view (tracebacks kept server-side unless asked for), whether the fabric refused it.

The state is derived from the job's future when asked, not pushed by a callback: the future completes on
the client's owner thread while the API touches a record only from the event loop, and reading a
finished future is safe from any thread. The table that holds records is api/jobs/table.py.
"""

from __future__ import annotations

import hashlib
import json
import uuid as uuidlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from zfab import DEAD_ENDS, JobFuture, decoded_size, final_state
from zfab.errors import (
    BackpressureError,
    BadRequestError,
    BrokerUnavailableError,
    BusyError,
    ClosedError,
    JobError,
    NoWorkersError,
)

from ..models import Attempt, HistoryStep, Job, JobErrorInfo, JobRequest, JobState
from .history import Step, history, input_steps
from .inputs import is_open, pending_input, shown, snapshot

# Errors that mean the fabric refused the job before any worker ran it: a retry of the same
# Idempotency-Key may submit it again (with the same uuid, so workers still dedupe).
REFUSALS = (NoWorkersError, BusyError, BackpressureError, ClosedError)
REFUSAL_NAMES = frozenset(cls.__name__ for cls in REFUSALS)
# A recovery (GET from the workers after an API restart) that ended like this tried nothing:
# the job stays as the database has it, and the next read tries again.
RECOVERY_RETRY = (*REFUSALS, BrokerUnavailableError)
IDEMPOTENCY_NAMESPACE = uuidlib.UUID("6f1b7f4e-2c55-4f0e-9d43-0b7d7cf0a6a1")


def job_uuid_for_key(key: str, principal: str) -> str:
    """The job uuid an Idempotency-Key stands for; scoped by caller so two tokens never share jobs."""
    return uuidlib.uuid5(IDEMPOTENCY_NAMESPACE, f"{principal}\x00{key}").hex


def stored_size(job: Job, raw: int) -> int:
    """What a job's view read back from the database (`raw` bytes of JSON) holds in memory: its results
    as the objects they decoded to, and about its JSON's size again for the rest of the model."""
    return decoded_size(job.results, raw) + raw if job.results else 2 * raw


def encode_request(req: JobRequest) -> bytes:
    """A request as the table holds it: its JSON, which JobRecord.request reads back."""
    return req.model_dump_json().encode()


def fingerprint(req: JobRequest) -> str:
    """What makes two requests 'the same job' for Idempotency-Key purposes."""
    raw = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def _when(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


def state_of(future: JobFuture) -> tuple[JobState, dict[str, Any] | None, BaseException | None]:
    """(state, results, error) of a job right now: the client's state machine, read as it stands."""
    if not future.done():
        return future.state, None, None
    if future.cancelled():
        return JobState.LOST, None, ClosedError("the job's future was cancelled")
    exc = future.exception()
    if not future.state.final:  # resolved by someone other than the client (it sets the state first)
        future.state, future.reason = final_state(None if exc else future.result(), exc)
    if exc is not None:
        partial = exc.results if isinstance(exc, JobError) and exc.results else None
        return future.state, partial, exc
    results: dict[str, Any] = future.result()
    return future.state, results, None


@dataclass(slots=True, eq=False)
class JobRecord:
    """One job: what was asked, and the future that answers it.

    `future` is None for a job known only from the database (the API restarted); `stored`
    is that database view. Reading such a job starts a recovery: `future` then answers it
    from the workers by GET (see api/jobs/recovery.py).
    """

    uuid: str
    service: str
    task: str
    workers: str | list[str]
    future: JobFuture | None
    fingerprint: str  # of the request, when it came with an Idempotency-Key
    timeout: float = 60.0
    # What was asked, as its JSON (kept to submit it again, to show it): decoded when read (`request`),
    # never held decoded, so the table holds and counts its bytes. `priority` and `retries` are read
    # by every view, so they are kept beside it.
    request_json: bytes | None = None
    priority: int = 5
    retries: int | None = None
    seq: int = 0  # order of arrival in the table (cursor pagination)
    counted: int = 0  # bytes of it the table counts (settled when the job finishes)
    cancel_requested: bool = False
    stored: Job | None = None
    stored_bytes: int = 0  # what `stored` holds in memory (see stored_size)
    ran_on: list[str] = field(default_factory=list)  # workers known to run it, from the database
    # Shared store (PostgreSQL): the replica holding the job's future, and what of its events is written.
    owner: str = ""
    remote: bool = False  # read from the shared store, owned by another replica that is alive
    events_written: int = 0  # events written so far (the seq of the last one)
    # Recovery (recovery.py): when the job's workers were first found missing from the broker's live ones.
    absent_since: float | None = None
    event_bytes: int = 0
    final_written: bool = False  # its finished state is committed to the shared store
    written: bool = False  # a row of it is committed (POST waits for it: api/jobs/operations.py recorded())
    retry_of: str | None = None  # the dead job this one submitted again
    submitter: str = ""  # who submitted it (the audit log's actor: a grant's name, made once); "" unknown
    retried_as: str | None = None  # the job that submitted this one again
    retrying: bool = False  # POST /jobs/{uuid}/retry is submitting it again right now
    row_once_taken: bool = False  # a POST's job: no row until the broker takes it (see `writable`)
    unconfirmed: bool = False  # its POST found the broker silent: sent (or queued to be), never confirmed
    _input: tuple[int, dict[str, Any] | None] = (0, None)  # (events scanned, pending request)
    _inputs: tuple[int, list[Step]] = (0, [])  # (events scanned, their input steps: jobs/history.py)

    @property
    def live(self) -> JobFuture | None:
        """The future that answers the job, unless it is a recovery that tried nothing (retry later)."""
        fut = self.future
        if (
            fut is not None
            and self.stored is not None
            and fut.done()
            and not fut.cancelled()
            and isinstance(fut.exception(), RECOVERY_RETRY)
        ):
            return None
        return fut

    @property
    def request(self) -> JobRequest | None:
        """What was asked, decoded from its JSON (a new object at each read)."""
        raw = self.request_json
        return JobRequest.model_validate_json(raw) if raw is not None else None

    @request.setter
    def request(self, req: JobRequest | None) -> None:
        self.request_json = encode_request(req) if req is not None else None
        if req is not None:
            self.priority, self.retries = req.priority, req.retries

    @property
    def size(self) -> int:
        """Bytes the record holds in memory: its request's JSON, its future's results and events, and
        the view of it the database gave (a job known from before a restart)."""
        fut = self.future
        raw = self.request_json
        return (fut.size if fut is not None else 0) + (len(raw) if raw is not None else 0) + self.stored_bytes

    @property
    def done(self) -> bool:
        fut = self.live
        if fut is None:
            return self.stored is not None and self.stored.state.final
        return fut.done()

    @property
    def writable(self) -> bool:
        """May a row of it be written? Not for a POST's job the broker refused at once: its caller has the
        refusal and nothing ran, and a write its end asked for may still be queued when POST drops it."""
        fut = self.live
        return not (self.row_once_taken and fut is not None and refused_at_once(fut))

    def refused(self) -> bool:
        """True when the fabric turned the job away before it ran. Never for a later attempt: a refused
        attempt 2 says nothing of attempt 1, which ran (an Idempotency-Key retry must not run it again)."""
        fut = self.live
        if fut is None:
            stored = self.stored
            return (
                stored is not None
                and stored.attempt <= 1
                and stored.error is not None
                and stored.error.type in REFUSAL_NAMES
            )
        return fut.attempt <= 1 and fut.done() and not fut.cancelled() and isinstance(fut.exception(), REFUSALS)

    def dispatched(self) -> list[str]:
        """The workers that run (or ran) the job, as far as the API knows."""
        fut = self.live
        if fut is not None and fut.done() and not fut.cancelled():
            exc = fut.exception()
            if exc is None and fut.answered is not None:  # known without decoding its result
                return list(fut.answered)
            results = exc.results if isinstance(exc, JobError) else None if exc else fut.result()
            if results:
                return sorted(results)
        if fut is not None and fut.worker:
            return [fut.worker]
        if fut is not None and fut.dispatched:
            return list(fut.dispatched)
        if self.ran_on:
            return list(self.ran_on)
        return list(self.workers) if isinstance(self.workers, list) else []

    def input_request(self) -> dict[str, Any] | None:
        """The worker's open input request, if it waits for one (events are scanned once each)."""
        fut = self.live
        if fut is None or fut.done() or not fut.has_events:
            return None
        seen, request = self._input
        events = snapshot(fut.events)
        if len(events) != seen:
            request = pending_input(events)
            self._input = (len(events), request)
        return request if request is not None and is_open(request) else None

    def input_steps(self) -> list[Step]:
        """The job's input requests and answers as history steps (events are scanned once each)."""
        fut = self.live
        if fut is None or not fut.has_events:
            return []
        seen, steps = self._inputs
        events = snapshot(fut.events)
        if len(events) != seen:
            steps = input_steps(events)
            self._inputs = (len(events), steps)
        return steps

    def view(self, *, tracebacks: bool = True) -> Job:
        """The job as it stands. `tracebacks=False` (REST, by default) keeps tasks' tracebacks
        server-side: a failed entry's `errors` then carry the error's type and message only."""
        fut = self.live
        if fut is None:
            assert self.stored is not None, "a job has a future or a stored view"
            retried_as = self.retried_as or self.stored.retried_as
            stored = self.stored.model_copy(
                update={
                    "cancel_requested": self.cancel_requested,
                    "retried_as": retried_as,
                    "dead": self.stored.dead and retried_as is None,
                }
            )
            if not tracebacks and stored.results:
                stored.results = without_tracebacks(stored.results)
            return stored
        state, results, exc = state_of(fut)
        timings = dict(self.stored.timings) if self.stored else {}
        t = fut.timings
        if self.stored is None:
            timings.update(t)
        elif "completed" in t:  # a recovered job: when the API learnt the outcome
            timings.update(recovered=t.get("submitted", 0.0), completed=t["completed"])
        request = self.input_request() if not state.final else None
        if request is not None:
            state = JobState.WAITING
        steps = history(
            state=state.value,
            finished=state.final,
            reason=fut.reason if state.final else None,
            timings=timings,
            trace=fut.trace,
            results=results,
            worker=fut.worker,
            attempts=fut.attempts,
            inputs=self.input_steps(),
        )
        queued = next((s.at for s in steps if s.state == JobState.QUEUED), None)
        started = next((_when(s.at) for s in steps if s.state == JobState.RUNNING), None)
        finished = _when(timings.get("completed")) if state.final else None
        if not tracebacks and results:
            results = without_tracebacks(results)
        return Job(
            uuid=self.uuid,
            service=self.service,
            task=self.task,
            workers=self.workers,
            state=state,
            reason=fut.reason if state.final else None,
            results=results,
            error=JobErrorInfo(type=type(exc).__name__, message=str(exc)) if exc is not None else None,
            submitted_at=_when(timings.get("submitted")) or datetime.now(UTC),
            queued_at=_when(queued),
            started_at=started,
            finished_at=finished,
            completed_at=finished,
            timings=timings,
            trace=fut.trace if fut.trace is not None else (self.stored.trace if self.stored else None),
            # As dicts: Job's own validation builds the steps in pydantic-core, a third of what a HistoryStep(...)
            # call per step costs in Python (model_construct costs twice as much again).
            history=cast(list[HistoryStep], [s.as_dict() for s in steps]),
            cancel_requested=self.cancel_requested,
            input_request=shown(request) if request is not None else None,
            priority=self.priority,
            retries=self.retries,
            attempt=fut.attempt,
            attempts=[attempt_of(a, tracebacks=tracebacks) for a in fut.attempts],
            dead=state in DEAD_STATES and self.retried_as is None and not refused_at_admission(fut),
            retry_of=self.retry_of,
            retried_as=self.retried_as,
            submitted_by=self.submitter or None,
            outcome_unknown=self.unconfirmed and not state.final and not fut.admission.done(),
        )


DEAD_STATES = frozenset(DEAD_ENDS)


# The broker's refusals of a POST (admission_problem: 404 no such service or worker, 400 no such task,
# 503 a full queue), as the API's client raises them.
AT_ONCE = (NoWorkersError, BadRequestError, BusyError, BackpressureError)


def refused_at_once(fut: JobFuture) -> bool:
    """The broker turned the job away when it was posted: no such service or worker, no such task, a
    full queue. (Not a client that gave up waiting: that job's outcome is not known.)"""
    return refused_at_admission(fut) and isinstance(fut.admission.exception(), AT_ONCE)


def refused_at_admission(fut: JobFuture) -> bool:
    """The broker refused the job before it took it: its POST answered 4xx/503, so the caller knows,
    and it is no dead letter (a job is one when it ended failed, expired or lost after that)."""
    admission = fut.admission
    return admission.done() and admission.exception() is not None


def attempt_of(record: dict[str, Any], *, tracebacks: bool) -> Attempt:
    """An earlier attempt as the client recorded it (service/client/clientjob.py)."""
    errors = [str(e) for e in record.get("errors") or []]
    started, ended = record.get("started"), record.get("completed") or record.get("ended")
    after = record.get("retry_after")
    return Attempt(
        attempt=int(record.get("attempt", 1)),
        worker=record.get("worker"),
        status=str(record.get("status", "error")),
        error=record.get("error"),
        errors=errors if tracebacks else [_last_line(e) for e in errors],
        started_at=_when(started) if isinstance(started, int | float) else None,
        finished_at=_when(ended) if isinstance(ended, int | float) else None,
        retry_after=float(after) if isinstance(after, int | float) else None,
    )


def without_tracebacks(results: dict[str, Any]) -> dict[str, Any]:
    """Results with each traceback in `errors` cut to its last line (`RuntimeError: boom`): the
    full one stays in the worker's job store and log (ZFAB_API_EXPOSE_TRACEBACKS shows it)."""
    out: dict[str, Any] = {}
    for worker, entry in results.items():
        errors = entry.get("errors") if isinstance(entry, dict) else None
        if isinstance(errors, list) and any(isinstance(e, str) and e.startswith("Traceback") for e in errors):
            entry = {**entry, "errors": [_last_line(e) if isinstance(e, str) else e for e in errors]}
        out[worker] = entry
    return out


def _last_line(text: str) -> str:
    if not text.startswith("Traceback"):
        return text
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text
