"""A job as its client tracks it: pure state, built whole when it is submitted, fed the broker's replies
by the owner loop (session.py) through `apply`, which reads as the kinds of message a job hears (a table
of one small method per status); `outcome` says how it ended. Its states (core/states.py) are its future's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core import payloads
from ..core import protocol as nfp
from ..core.payloads import Word
from ..core.states import State
from ..errors import (
    BadRequestError,
    BusyError,
    JobCancelledError,
    JobError,
    JobExpiredError,
    JobNotFoundError,
    NoWorkersError,
    OutcomeUnknownError,
    PayloadTooLargeError,
    WorkerLostError,
)
from .attempts import failed_record, lost_record, retry_hint
from .future import Encoded, JobFuture

EventCallback = Callable[[dict[str, Any]], None]


def ignore_event(event: dict[str, Any]) -> None:
    """The event callback of a job submitted without one."""


# A job submitted without `retries` keeps a body this small after its dispatch, so that a failed attempt
# its task declares retries for can be sent again; a larger one is let go of, unless retries were asked.
KEEP_BODY_BYTES = 64 * 1024
_REFUSAL_ERRORS: dict[bytes, type[JobError]] = {
    nfp.ST_NOT_FOUND: NoWorkersError,
    nfp.ST_BUSY: BusyError,
    nfp.ST_EXPIRED: JobExpiredError,
    nfp.ST_CANCELLED: JobCancelledError,
}
_OK = nfp.ST_OK


@dataclass(slots=True, eq=False)
class ClientJob:
    """One job (or MMI request) in flight, everything it needs given when it is built."""

    uuid: str
    service: bytes
    target: bytes
    body: bytes
    flags: bytes
    future: JobFuture
    deadline: float  # monotonic
    last_heard: float  # monotonic: the last reply, or the submission
    mmi: bool = False
    retries_left: int = 0
    attempt: int = 1
    expected: set[str] | None = None  # workers the broker dispatched to (from 202; known when recovering)
    fields: dict[str, Any] | None = None  # what its flags frame says (rebuilt when it is POSTed again)
    follow_task: bool = False  # no `retries` asked: a failed attempt runs again as its task declares
    resubmitted: bool = False  # POSTed again after the broker came back: the job may have run before
    keep_raw: bool = False  # its client keeps results encoded: the answer that is its whole result is kept
    sent: float = 0.0  # monotonic: this attempt was submitted (its hop trace's start)
    on_event: EventCallback = ignore_event  # called with each event, on the client's owner
    shm_handle: bytes | None = None  # its body's shared-memory block, given back when the job ends
    # What the replies make of it:
    size: int = field(init=False)  # bytes this client holds for it (body, results): the client's byte bound
    results: dict[str, Any] = field(init=False, default_factory=dict)
    statuses: dict[str, bytes] = field(init=False, default_factory=dict)
    lost: set[str] = field(init=False, default_factory=set)
    part_errors: dict[str, str] = field(init=False, default_factory=dict)  # worker -> why the broker ended it
    refused: JobError | None = field(init=False, default=None)
    polls: int = field(init=False, default=0)
    recheck: bool = field(init=False, default=False)  # the broker came back: re-establish it at the next check
    grace: float | None = field(init=False, default=None)  # monotonic: past its deadline, the broker silent
    results_size: int = field(init=False, default=0)  # bytes of this attempt's result payloads
    raw_result: bytes | None = field(init=False, default=None)  # the answer kept as it came (keep_raw)
    traces: dict[str, tuple[float, bytes]] | None = field(init=False, default=None)  # worker -> (s, frame)

    def __post_init__(self) -> None:
        self.size = len(self.body)

    @property
    def timeout(self) -> float:
        return float((self.fields or {}).get("timeout") or 0.0)

    @property
    def told_queued(self) -> bool:
        """The broker said it holds the job in its queue (no worker has it yet)."""
        return "queued" in self.future.timings and "dispatched" not in self.future.timings

    @property
    def wire_uuid(self) -> str:
        """The uuid this attempt travels under: replies to an earlier attempt cannot pass for it."""
        return payloads.wire_uuid(self.uuid, self.attempt)

    @property
    def pending(self) -> set[str]:
        return set() if self.expected is None else self.expected - set(self.statuses) - self.lost

    def _done(self) -> bool:
        expected, statuses, lost = self.expected, self.statuses, self.lost
        return expected is not None and all(w in statuses or w in lost for w in expected)

    # ---- replies -----------------------------------------------------------------------------

    def apply(self, reply: nfp.BrokerReply, now: float) -> bool:
        """Take one reply (at monotonic time `now`) into account; True when the job is now finished."""
        self.last_heard = now
        if self.mmi:
            return self._mmi_answer(reply)
        status = reply.status
        step = _STEPS.get(status)  # the steps of a job on its way: no end among them
        if step is not None:
            step(self, reply)
            return False
        payload = object_of(reply.payload)
        if payloads.is_refusal(status, payload):
            return self._refused(status, payload)
        part = _PARTS.get(status)  # the broker (or a worker) ends one worker's part of it
        if part is not None and (ended := part(self, status, payload)) is not None:
            return ended
        return self._answered(reply, payload, now)

    def _mmi_answer(self, reply: nfp.BrokerReply) -> bool:
        if reply.command != nfp.RESPONSE:
            return False  # NorFab's MMI copy of the answer
        payload = nfp.loads(reply.payload) if reply.payload else None
        if reply.status == _OK:
            self.results = {"result": payload}
        else:
            # The broker's reason as it gave it: a control's {"error": slug, "detail": why}.
            said = payload if isinstance(payload, dict) else None
            self.refused = BadRequestError(f"MMI request refused: {payload}", uuid=self.uuid, results=said)
        return True

    def _started(self, reply: nfp.BrokerReply) -> None:
        """201: a worker started it (NorFab's "job created"), at its receipt less the age the worker says
        it had (a zfab worker holds its 201 10 ms)."""
        fut = self.future
        fut.timings.setdefault("started", time.time() - payloads.age_of(reply.payload))
        fut.move(State.RUNNING)
        fut.admitted("dispatched")

    def _waiting(self, reply: nfp.BrokerReply) -> None:
        """102: its task waits for input from this client."""
        self.future.move(State.WAITING)

    def _pending(self, reply: nfp.BrokerReply) -> None:
        """300: a worker's answer to GET: queued there, or running."""
        started = object_of(reply.payload).get("status") == Word.STARTED
        self.future.move(State.RUNNING if started else State.QUEUED)

    def _queued(self, reply: nfp.BrokerReply) -> None:
        """301: the broker holds it in the service's queue."""
        self.future.timings.setdefault("queued", time.time())
        self.future.admitted("queued")

    def _dispatched(self, reply: nfp.BrokerReply) -> None:
        """202: the broker sent it to the workers it names."""
        fut = self.future
        workers = object_of(reply.payload).get("workers")
        if isinstance(workers, list) and self.expected is None:
            self.expected = {str(w) for w in workers}
            fut.timings.setdefault("dispatched", time.time())
            fut.dispatched = sorted(self.expected)
            if len(workers) == 1:
                fut.worker = str(workers[0])
            if self.retries_left <= 0 and not (self.follow_task and len(self.body) <= KEEP_BODY_BYTES):
                # Dispatched, and never to be POSTed again: from here on a quiet job is polled with GET
                # and a returning broker is asked the same way, so the encoded body (a 10 MB argument is
                # 10 MB here) need not wait out the job beside the caller's own arguments. A job with
                # retries keeps it for its next attempt, and so does a small one whose task may declare them.
                self.size -= len(self.body)
                self.body = b""
        fut.admitted("dispatched")

    def _refused(self, status: bytes, payload: dict[str, Any]) -> bool:
        """The broker's answer about the whole job, which no worker holds (refused, expired, cancelled)."""
        if self.expected is not None and status not in (nfp.ST_EXPIRED, nfp.ST_CANCELLED):
            # A refused GET poll: the job's worker is not registered (yet), e.g. after a broker
            # restart. The job goes on; a 410 or its deadline ends it.
            return False
        why = payloads.errors_of(payload, "refused by the broker")
        cls = _REFUSAL_ERRORS.get(status, BadRequestError)
        if payload.get("status") == Word.TOO_LARGE:
            cls = PayloadTooLargeError
        if self.resubmitted and cls not in (JobExpiredError, JobCancelledError):
            # Sent again after the broker came back: the first copy may have run meanwhile.
            why = f"the job may have run before the broker restarted; submitting it again was refused: {why}"
            cls = OutcomeUnknownError
        hint = payload.get("retry_after")
        self.refused = cls(why, uuid=self.uuid, retry_after=hint if isinstance(hint, int | float) else None)
        return True

    # A part's end says whether the job is finished, or None for no such message (a 408 naming no
    # worker, a 404 without one), which is then read as an answer.

    def _worker_lost(self, status: bytes, payload: dict[str, Any]) -> bool | None:
        """410: the worker running it was lost."""
        worker = str(payload.get("worker", ""))
        self.lost.add(worker)
        if self.expected is None:  # results-only mode: the lost worker was the one running it
            self.expected = {worker}
        return self._done()

    def _part_ended(self, status: bytes, payload: dict[str, Any]) -> bool | None:
        """408/499 for one worker: its deadline passed unanswered, or it was cancelled before it left
        the queue."""
        worker = str(payload.get("worker", ""))
        if not worker:
            return None
        self.statuses[worker] = status
        self.part_errors[worker] = payloads.errors_of(payload, status.decode())
        if self.expected is None:
            self.expected = {worker}
        return self._done()

    def _worker_busy(self, status: bytes, payload: dict[str, Any]) -> bool | None:
        """503 from a worker: its job queue is full."""
        worker = str(payload.get("worker", ""))
        self.statuses[worker] = status
        self.refused = BusyError(f"worker '{worker}': {payloads.errors_of(payload, 'worker busy')}", uuid=self.uuid)
        if self.expected is None:
            self.expected = {worker}
        return self._done()

    def _not_found_at(self, status: bytes, payload: dict[str, Any]) -> bool | None:
        """404 from a worker: it does not know the job."""
        if "worker" not in payload:
            return None
        worker = str(payload["worker"])
        if self.fields is not None and self.expected is not None and worker in self.expected:
            # A worker this client's job was dispatched to does not know it: it restarted before it
            # stored the job. Lost there (retried where asked), not "not found".
            self.lost.add(worker)
            return self._done()
        self.statuses[worker] = status
        if self.expected is None:
            self.expected = {worker}
        return self._done()

    def _answered(self, reply: nfp.BrokerReply, payload: dict[str, Any], now: float) -> bool:
        """200, 400, 500 from workers: {worker name: result entry}."""
        fut = self.future
        fut.admitted("dispatched")
        expected = self.expected
        if expected is not None:
            for w in payload:
                if w not in expected:
                    return False  # a late answer from a worker this job no longer waits on: discard it
        n = len(reply.payload)
        self.size += n
        self.results_size += n
        fut.result_bytes += n
        if reply.trace is not None and len(payload) == 1:
            self._traced(str(next(iter(payload))), reply.trace, now)
        # The whole result as it came, while one answer of a first attempt is all of it (later attempts
        # rewrite their entries' uuid, several answers merge): what an encoded result keeps.
        keep = self.keep_raw and not self.results and self.attempt == 1
        self.raw_result = bytes(reply.payload) if keep else None
        status = reply.status
        for worker, entry in payload.items():
            name = str(worker)
            if self.fields is not None and payloads.interrupted(entry):
                # Its worker restarted while it held the job (a GET after a broker restart or a quiet
                # spell finds it so): the worker was lost, as a 410 would have said; retried where asked.
                self.lost.add(name)
                if self.expected is None:
                    self.expected = {name}
                continue
            if self.attempt > 1 and isinstance(entry, dict):
                entry["juuid"], entry["attempt"] = self.uuid, self.attempt  # the job's own uuid, not the wire's
            self.results[name] = entry
            self.statuses[name] = status
            if self.expected is None:
                self.expected = {name}
        if fut.worker is None and len(self.results) == 1:
            fut.worker = next(iter(self.results))  # no 202 came (results-only mode): the 200 names it
        return self._done()

    def _traced(self, worker: str, frame: nfp.Frame, now: float) -> None:
        traces = self.traces = self.traces or {}
        traces[worker] = (max(0.0, now - self.sent), bytes(frame))

    # ---- its end -----------------------------------------------------------------------------

    def ended(self, now: float) -> None:
        """The job ends here at monotonic `now` (its future is settled next): the end of its last
        answer's `total`, so the client's own work on that answer counts in `client_broker`. Its
        future's trace is built from these figures when it is first read (most jobs' never are)."""
        traces = self.traces
        if traces:
            last = max(traces, key=lambda w: traces[w][0]) if len(traces) > 1 else next(iter(traces))
            t, frame = traces[last]
            traces[last] = (max(t, now - self.sent), frame)
            self.future._trace_from = traces

    def encoded(self, results: dict[str, Any]) -> Encoded:
        """`results` (its outcome) held as JSON: the answer's own bytes when it was one answer."""
        raw = self.raw_result
        if raw is None or len(results) != 1:
            raw = nfp.dumps(results)
        return Encoded(raw)

    def outcome(self) -> tuple[dict[str, Any] | None, JobError | None]:
        """The finished job's result dictionary, or the error to raise."""
        refused = self.refused
        if self.mmi:
            return (self.results if refused is None else None), refused
        if refused is not None and not self.results:
            return None, refused
        if self.lost:
            names = ", ".join(sorted(self.lost))
            return None, WorkerLostError(
                f"worker {names} was lost while running job {self.uuid}", uuid=self.uuid, results=self.results
            )
        if refused is None:
            for st in self.statuses.values():
                if st != _OK:
                    break
            else:
                return self.results, None  # every worker answered 200: the common end, read at once
        if self.statuses and all(s == nfp.ST_NOT_FOUND for s in self.statuses.values()):
            return None, JobNotFoundError(f"no worker knows job {self.uuid}", uuid=self.uuid)
        for status, cls in ((nfp.ST_EXPIRED, JobExpiredError), (nfp.ST_CANCELLED, JobCancelledError)):
            parts = [w for w, st in self.statuses.items() if st == status]
            if parts:
                why = "; ".join(f"{w}: {self.part_errors.get(w, '')}" for w in sorted(parts))
                return None, cls(why, uuid=self.uuid, results=self.results)
        if self.results and all(s == nfp.ST_BAD_REQUEST for s in self.statuses.values()):
            errors = "; ".join(
                str(e) for entry in self.results.values() if isinstance(entry, dict) for e in entry.get("errors") or []
            )
            return None, BadRequestError(errors or "bad request", uuid=self.uuid, results=self.results)
        if refused is not None:
            refused.results = self.results  # what did arrive, as every JobError carries
            return None, refused
        return self.results, None

    # ---- attempts ----------------------------------------------------------------------------

    def retry(self) -> bool:
        """After a worker was lost: True (and the job reset for another attempt) if retries remain."""
        if not self.lost or self.retries_left <= 0 or self.target != b"any":
            return False
        self.retries_left -= 1
        self._remember(lost_record(", ".join(sorted(self.lost))))
        self._next_attempt(self.last_heard)
        return True

    def retry_failed(self, clock: Callable[[], float]) -> bool:
        """After an attempt that failed and whose worker said it may run again (its entry's
        `retry`): True, and the job reset for the next attempt, which the broker holds for the wait
        the worker named (flags `not_before`) and whose timeout counts from then. False when the
        job ends here: no wait named, no retries left, or no body kept to send again. `clock` is
        the client's monotonic clock, read (with the wall clock) only for an attempt that runs again."""
        if self.mmi or self.target != b"any" or len(self.results) != 1 or self.lost or self.refused is not None:
            return False
        ((worker, entry),) = self.results.items()
        retry = retry_hint(entry)
        if retry is None or self.attempt >= payloads.MAX_ATTEMPT:
            return False
        hint, after = retry
        if not self.body or self.fields is None:
            # Let go of after the dispatch (a large body and no `retries` asked): it cannot be sent again.
            hint["not_sent"] = (
                f"the client no longer held the request (it keeps {KEEP_BODY_BYTES} bytes at most "
                "unless the job is submitted with retries)"
            )
            return False
        if not self.follow_task:
            if self.retries_left <= 0:
                hint["not_sent"] = "no retries left"
                return False
            self.retries_left -= 1
        self._remember(failed_record(worker, entry, after))
        self.size -= self.results_size
        self.future.result_bytes -= self.results_size
        self.results_size = 0
        now = clock()
        fields = {k: v for k, v in self.fields.items() if k != "known"}
        fields["not_before"] = round(time.time() + after, 3)
        self.fields = fields
        self.flags = nfp.dumps(fields)
        self.deadline = payloads.job_deadline(now, self.timeout, after)
        self._next_attempt(now)
        return True

    def _remember(self, record: dict[str, Any]) -> None:
        """An attempt that ended and runs again: kept in the future's `attempts` (bounded in bytes)."""
        fut = self.future
        record = {"attempt": self.attempt, **record, "ended": time.time()}
        size = len(nfp.dumps(record))
        fut.attempts.append(record)
        fut.result_bytes += size
        self.size += size

    def _next_attempt(self, now: float) -> None:
        self.attempt += 1
        self.sent, self.traces = now, None
        self.future.attempt = self.attempt
        self.body = payloads.with_attempt(self.body, self.attempt)
        self.expected = None
        self.results, self.statuses, self.lost, self.refused = {}, {}, set(), None
        self.raw_result = None
        self.future.timings["retried"] = time.time()
        for step in ("queued", "dispatched", "started"):
            self.future.timings.pop(step, None)
        self.future.worker = None
        self.future.dispatched = None
        self.future.state = State.QUEUED


# What each status says, read by ClientJob.apply: a step on the job's way (never its end), or the end of
# one worker's part; any other status is an answer of workers (200, 400, 500), unless the broker refused.
_STEPS: dict[bytes, Callable[[ClientJob, nfp.BrokerReply], None]] = {
    nfp.ST_WORKER_ACCEPTED: ClientJob._started,
    nfp.ST_WAITING_INPUT: ClientJob._waiting,
    nfp.ST_PENDING: ClientJob._pending,
    nfp.ST_QUEUED: ClientJob._queued,
    nfp.ST_DISPATCHED: ClientJob._dispatched,
}
_PARTS: dict[bytes, Callable[[ClientJob, bytes, dict[str, Any]], bool | None]] = {
    nfp.ST_WORKER_LOST: ClientJob._worker_lost,
    nfp.ST_EXPIRED: ClientJob._part_ended,
    nfp.ST_CANCELLED: ClientJob._part_ended,
    nfp.ST_BUSY: ClientJob._worker_busy,
    nfp.ST_NOT_FOUND: ClientJob._not_found_at,
}


def object_of(raw: nfp.Frame) -> dict[str, Any]:
    """A reply's payload as a JSON object; {} for none, or for one that is not JSON or no object."""
    if not raw:
        return {}
    try:
        payload = nfp.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return payload if isinstance(payload, dict) else {}
