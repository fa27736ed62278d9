"""A job as its client tracks it: pure state fed with the broker's replies.

No sockets or threads: the client's owner loop calls `apply` for each reply and
`outcome` tells whether the job is finished and how.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..core import hoptrace, payloads
from ..core import protocol as nfp
from ..core.lazy import lazy
from ..core.payloads import Word
from ..core.retries import MAX_BACKOFF
from ..core.schemacheck import is_number
from ..core.states import State, final_state
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

_ADMISSION_LOCK = threading.Lock()
MAX_EVENTS_PER_JOB = 1000
MAX_EVENT_BYTES_PER_JOB = 1024 * 1024  # events a future holds, in bytes: older ones make room
# A job submitted without `retries` keeps a body this small after its dispatch, so that a failed
# attempt its task declares retries for can be sent again; a larger one is let go of (a 10 MB
# argument need not wait out its job twice), and submit(retries=N) keeps any.
KEEP_BODY_BYTES = 64 * 1024
MAX_ATTEMPT_ERROR = 4096  # characters of each error an earlier attempt's record keeps
_REFUSAL_ERRORS: dict[bytes, type[JobError]] = {
    nfp.ST_NOT_FOUND: NoWorkersError,
    nfp.ST_BUSY: BusyError,
    nfp.ST_EXPIRED: JobExpiredError,
    nfp.ST_CANCELLED: JobCancelledError,
}


# Objects walked to measure what a decoded event holds; past it, the worst ratio JSON decodes at (a
# list of one-item lists of ints: [[0],[1],...] is ~17x its text as Python objects) stands for the rest.
SIZE_WALK_NODES = 4096
WORST_DECODE_RATIO = 24


def decoded_size(obj: Any, wire: int = 0) -> int:
    """Bytes `obj` (decoded JSON: dicts, lists, str, numbers) holds as Python objects, at least `wire`.
    A walk of at most SIZE_WALK_NODES objects; a larger one is counted at WORST_DECODE_RATIO x `wire`."""
    total, stack, budget = 0, [obj], SIZE_WALK_NODES
    while stack:
        budget -= 1
        if budget < 0:
            return max(total, wire * WORST_DECODE_RATIO)
        o = stack.pop()
        total += sys.getsizeof(o)
        if type(o) is dict:
            stack.extend(o.keys())
            stack.extend(o.values())
        elif type(o) is list:
            stack.extend(o)
    return max(total, wire)


class Encoded:
    """A finished job's result held as the JSON it came as; JobFuture.result() decodes it at each read."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw


class JobFuture(Future[Any]):
    """A submitted job: `result()` gives the dictionary keyed by worker name, or raises.

    `state` and `reason` follow the job (core/states.py); `admission` resolves once the broker
    took the job ("queued" or "dispatched") or raises why it would not. `events` holds the job's
    events as they arrive (bounded in count and bytes); `chunks` the stream chunks of a
    streaming job, bounded by its credit window. `attempt` is the attempt that runs (or ran
    last) and `attempts` what each earlier one ended with (its worker, error, times, the wait
    before the next), for a job that was retried.
    """

    def __init__(self, uuid: str, stream_window: int = 0, max_events: int = MAX_EVENTS_PER_JOB) -> None:
        super().__init__()
        self.uuid = uuid
        self.state = State.QUEUED
        self.reason: str | None = None
        self._admission: Future[str] | None = None  # made when asked for: most callers never ask
        self._admitted: str | None = None
        self._refusal: BaseException | None = None
        self.events: deque[dict[str, Any]] = deque(maxlen=max_events)
        self._event_sizes: deque[int] = deque()  # each held event's size, in step with `events`
        self.events_bytes = 0
        self.events_dropped = 0
        self.result_bytes = 0
        self.timings: dict[str, float] = {}
        self._changed: threading.Condition | None = None  # made on first use: most jobs never need it
        self.chunks: queue.Queue[bytes] | None = queue.Queue(maxsize=stream_window + 1) if stream_window else None
        self.worker: str | None = None  # the one worker running it, once known (202 or first event)
        self.dispatched: list[str] | None = None  # every worker the broker sent it to (from 202)
        self.attempt = 1  # the attempt that runs (or ran last): 2, 3... once retried
        self.attempts: list[dict[str, Any]] = []  # each earlier attempt: its worker, error, times, wait
        # Where the (last) attempt's time went, hop by hop (core/hoptrace.py), once it ended with
        # traced answers: {"total": s, "hops": {hop: s}}, and "workers" for a job sent to several.
        self._trace: dict[str, Any] | None = None
        self._trace_from: dict[str, tuple[float, bytes]] | None = None  # what it is built from, once ended
        self.trace_rejected = 0  # figures of its trace that were no duration (counted when it is built)
        # Seconds its submitter held the job before submit() (the API's hop), set by the submitter.
        self.held_before = 0.0
        self.answered: list[str] | None = None  # the workers whose answers make its result, once it ended
        self.add_done_callback(self._notify)

    def result(self, timeout: float | None = None) -> Any:
        """The result dictionary keyed by worker name (decoded anew at each call when its client keeps
        results encoded: `Client(encoded_results=True)`), or the job's error raised."""
        value = super().result(timeout)
        return nfp.loads(value.raw) if type(value) is Encoded else value

    @property
    def trace(self) -> dict[str, Any] | None:
        """Where the (last) attempt's time went, hop by hop (core/hoptrace.py), once it ended with a
        traced answer: {"total": s, "hops": {hop: s}}; for a job several workers ran, the slowest's,
        with each worker's under "workers". None: no answer carried a trace."""
        if self._trace is None and (raw := self._trace_from) is not None:
            self._trace_from = None
            self._trace, self.trace_rejected = build_trace(raw, self.held_before)
        return self._trace

    @property
    def size(self) -> int:
        """Bytes this future holds: its results (their JSON, as an encoded result holds them) and its
        events (as decoded objects), what a table of finished jobs must bound."""
        return self.result_bytes + self.events_bytes

    @property
    def changed(self) -> threading.Condition:
        """Notified on each event and when the job ends."""
        return lazy(self, "_changed", threading.Condition)

    def add_event(self, event: dict[str, Any], size: int = 0) -> None:
        """Keep `event` (`size`: the bytes it holds, see decoded_size); the oldest go first past the count
        or byte bound, each taking its own size with it (the worker's job store keeps them all)."""
        with self.changed:
            events, sizes = self.events, self._event_sizes
            if len(events) == events.maxlen:
                events.popleft()  # made room for here, so its size leaves with it
                self.events_bytes -= sizes.popleft()
                self.events_dropped += 1
            events.append(event)
            sizes.append(size)
            self.events_bytes += size
            while self.events_bytes > MAX_EVENT_BYTES_PER_JOB and len(events) > 1:
                events.popleft()
                self.events_bytes -= sizes.popleft()
                self.events_dropped += 1
            self.changed.notify_all()

    @property
    def admission(self) -> Future[str]:
        """Resolves once the broker took the job ("queued", "dispatched"), or raises why it would not."""
        with _ADMISSION_LOCK:
            fut = self._admission
            if fut is None:
                fut = self._admission = Future()
                if self._admitted is not None:
                    fut.set_result(self._admitted)
                elif self._refusal is not None:
                    fut.set_exception(self._refusal)
            return fut

    def admitted(self, how: str) -> None:
        with _ADMISSION_LOCK:
            if self._admitted is None:
                self._admitted = how
                if self._admission is not None and not self._admission.done():
                    self._admission.set_result(how)

    def refused(self, error: BaseException) -> None:
        """The job ended before the broker took it (its refusal, or the client gave up)."""
        with _ADMISSION_LOCK:
            if self._admitted is None:
                self._refusal = error  # kept: the admission future may be asked for only later
                if self._admission is not None and not self._admission.done():
                    self._admission.set_exception(error)

    def move(self, state: State) -> None:
        """A step of a job not finished yet (queued, running, waiting)."""
        if not self.state.final:
            self.state = state

    @staticmethod
    def _notify(fut: Future[Any]) -> None:
        assert isinstance(fut, JobFuture)
        c = fut._changed
        if c is not None:  # nobody waits unless someone made it
            with c:
                c.notify_all()


@dataclass(slots=True, eq=False)
class ClientJob:
    uuid: str
    service: bytes
    target: bytes
    body: bytes
    flags: bytes
    future: JobFuture
    deadline: float  # monotonic
    last_heard: float  # monotonic: the last reply, or the submission
    mmi: bool = False
    expected: set[str] | None = None  # workers the broker dispatched to (from 202)
    results: dict[str, Any] = field(default_factory=dict)
    statuses: dict[str, bytes] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    part_errors: dict[str, str] = field(default_factory=dict)  # worker -> why the broker ended its part
    refused: JobError | None = None
    polls: int = 0
    retries_left: int = 0
    attempt: int = 1
    size: int = 0  # bytes this client holds for it (body, results): the client's byte bound
    fields: dict[str, Any] | None = None  # what its flags frame says (rebuilt when it is POSTed again)
    recheck: bool = False  # the broker came back: re-establish it at the next check
    grace: float | None = None  # monotonic: its deadline passed with the broker silent; its end awaited until then
    resubmitted: bool = False  # POSTed again after the broker came back: the job may have run before
    follow_task: bool = False  # no `retries` asked: a failed attempt runs again as its task declares
    results_size: int = 0  # bytes of this attempt's result payloads (let go of when it is retried)
    keep_raw: bool = False  # its client keeps results encoded: the answer that is its whole result is kept
    raw_result: bytes | None = None  # that answer, as it came (a copy of a view: a mapping is given back)
    sent: float = 0.0  # monotonic: this attempt was submitted (its hop trace's start)
    traces: dict[str, tuple[float, bytes]] | None = None  # worker -> (seconds to its answer, its trace frame)
    trace_rejected: int = 0  # figures of trace frames that were no duration (or frames of a wrong length)

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

    def retry(self) -> bool:
        """After a worker was lost: True (and the job reset for another attempt) if retries remain."""
        if not self.lost or self.retries_left <= 0 or self.target != b"any":
            return False
        self.retries_left -= 1
        names = ", ".join(sorted(self.lost))
        self._remember({"worker": names, "status": "lost", "error": f"worker {names} was lost while running it"})
        self._next_attempt(self.last_heard)
        return True

    def retry_failed(self, now: float, epoch: float) -> bool:
        """After an attempt that failed and whose worker said it may run again (its entry's
        `retry`): True, and the job reset for the next attempt, which the broker holds for the wait
        the worker named (flags `not_before`) and whose timeout counts from then. False when the
        job ends here: no wait named, no retries left, or no body kept to send again. `now` is
        the client's monotonic clock, `epoch` the wall clock."""
        if self.mmi or self.target != b"any" or len(self.results) != 1 or self.lost or self.refused is not None:
            return False
        entry = next(iter(self.results.values()))
        hint = entry.get("retry") if isinstance(entry, dict) and entry.get("failed") else None
        after = hint.get("after") if isinstance(hint, dict) else None
        if not is_number(after) or not 0 <= after <= MAX_BACKOFF or self.attempt >= payloads.MAX_ATTEMPT:
            return False
        assert isinstance(entry, dict) and isinstance(hint, dict)
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
        worker = next(iter(self.results))
        self._remember(
            {
                "worker": worker,
                "status": str(entry.get("status", "error")),
                "error": _one_line(entry),
                "errors": [str(e)[:MAX_ATTEMPT_ERROR] for e in (entry.get("errors") or [])[:3]],
                "started": (entry.get("timestamps") or {}).get("started"),
                "completed": (entry.get("timestamps") or {}).get("completed"),
                "retry_after": float(after),
            }
        )
        self.size -= self.results_size
        self.future.result_bytes -= self.results_size
        self.results_size = 0
        fields = {k: v for k, v in self.fields.items() if k != "known"}
        fields["not_before"] = round(epoch + float(after), 3)
        self.fields = fields
        self.flags = nfp.dumps(fields)
        self.deadline = payloads.job_deadline(now, self.timeout, float(after))
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

    @property
    def pending(self) -> set[str]:
        if self.expected is None:
            return set()
        return self.expected - set(self.statuses) - self.lost

    def apply(self, reply: nfp.BrokerReply, now: float) -> bool:
        """Take one reply (at monotonic time `now`) into account; True when the job is now finished."""
        self.last_heard = now
        if self.mmi:
            if reply.command == nfp.RESPONSE:
                payload = nfp.loads(reply.payload) if reply.payload else None
                if reply.status == nfp.ST_OK:
                    self.results = {"result": payload}
                else:
                    # The broker's reason as it gave it: a control's {"error": slug, "detail": why}.
                    said = payload if isinstance(payload, dict) else None
                    self.refused = BadRequestError(f"MMI request refused: {payload}", uuid=self.uuid, results=said)
                return True
            return False
        status = reply.status
        fut = self.future
        if status == nfp.ST_WORKER_ACCEPTED:  # a worker started it (NorFab's "job created")
            # At its receipt less the age the worker says it had (a zfab worker holds its 201 10 ms).
            fut.timings.setdefault("started", time.time() - payloads.age_of(reply.payload))
            fut.move(State.RUNNING)
            fut.admitted("dispatched")
            return False
        if status == nfp.ST_WAITING_INPUT:
            fut.move(State.WAITING)
            return False
        try:
            payload = nfp.loads(reply.payload) if reply.payload else {}
        except (ValueError, RecursionError):
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        if status == nfp.ST_PENDING:  # a worker's answer to GET: queued there, or running
            fut.move(State.RUNNING if payload.get("status") == Word.STARTED else State.QUEUED)
            return False
        if status == nfp.ST_QUEUED:
            fut.timings.setdefault("queued", time.time())
            fut.admitted("queued")
            return False
        if status == nfp.ST_DISPATCHED:
            workers = payload.get("workers")
            if isinstance(workers, list) and self.expected is None:
                self.expected = {str(w) for w in workers}
                fut.timings.setdefault("dispatched", time.time())
                fut.dispatched = sorted(self.expected)
                if len(workers) == 1:
                    fut.worker = str(workers[0])
                if self.retries_left <= 0 and not (self.follow_task and len(self.body) <= KEEP_BODY_BYTES):
                    # Dispatched, and never to be POSTed again: from here on a quiet job is polled
                    # with GET and a returning broker is asked the same way, so the encoded body
                    # (a 10 MB argument is 10 MB here) need not wait out the job beside the
                    # caller's own arguments. A job with retries keeps it for its next attempt,
                    # and so does a small one whose task may declare retries.
                    self.size -= len(self.body)
                    self.body = b""
            fut.admitted("dispatched")
            return False
        if payloads.is_refusal(status, payload):
            if self.expected is not None and status not in (nfp.ST_EXPIRED, nfp.ST_CANCELLED):
                # A refused GET poll: the job's worker is not registered (yet), e.g. after a
                # broker restart. The job goes on; a 410 or its deadline ends it.
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
        worker = str(payload.get("worker", ""))
        if status == nfp.ST_WORKER_LOST:
            self.lost.add(worker)
            if self.expected is None:  # results-only mode: the lost worker was the one running it
                self.expected = {worker}
            return self._done()
        if status in (nfp.ST_EXPIRED, nfp.ST_CANCELLED) and worker:
            # The broker ends one worker's part: its deadline passed unanswered, or it was
            # cancelled before it left the queue.
            self.statuses[worker] = status
            self.part_errors[worker] = payloads.errors_of(payload, status.decode())
            if self.expected is None:
                self.expected = {worker}
            return self._done()
        if status == nfp.ST_BUSY:
            self.statuses[worker] = status
            self.refused = BusyError(f"worker '{worker}': {payloads.errors_of(payload, 'worker busy')}", uuid=self.uuid)
            if self.expected is None:
                self.expected = {worker}
            return self._done()
        if status == nfp.ST_NOT_FOUND and "worker" in payload:
            if self.fields is not None and self.expected is not None and worker in self.expected:
                # A worker this client's job was dispatched to does not know it: it restarted before
                # it stored the job. Lost there (retried where asked), not "not found".
                self.lost.add(worker)
                return self._done()
            self.statuses[worker] = status
            if self.expected is None:
                self.expected = {worker}
            return self._done()
        fut.admitted("dispatched")
        # 200, 400, 500 from a worker: {worker_name: result entry}
        if self.expected is not None and not set(payload) <= self.expected:
            return False  # a late answer from a worker this job no longer waits on: discard it
        self.size += len(reply.payload)
        self.results_size += len(reply.payload)
        fut.result_bytes += len(reply.payload)
        if reply.trace is not None and len(payload) == 1:
            self._traced(str(next(iter(payload))), reply.trace, now)
        # The whole result as it came, while one answer of a first attempt is all of it (later attempts
        # rewrite their entries' uuid, several answers merge): what an encoded result keeps.
        keep = self.keep_raw and not self.results and self.attempt == 1
        self.raw_result = bytes(reply.payload) if keep else None
        for worker, entry in payload.items():
            if self.fields is not None and payloads.interrupted(entry):
                # Its worker restarted while it held the job (a GET after a broker restart or a quiet
                # spell finds it so): the worker was lost, as a 410 would have said; retried where asked.
                self.lost.add(str(worker))
                if self.expected is None:
                    self.expected = {str(worker)}
                continue
            if self.attempt > 1 and isinstance(entry, dict):
                entry["juuid"], entry["attempt"] = self.uuid, self.attempt  # the job's own uuid, not the wire's
            self.results[str(worker)] = entry
            self.statuses[str(worker)] = status
            if self.expected is None:
                self.expected = {str(worker)}
        if fut.worker is None and len(self.results) == 1:
            fut.worker = next(iter(self.results))  # no 202 came (results-only mode): the 200 names it
        return self._done()

    def _done(self) -> bool:
        return self.expected is not None and not self.pending

    def _traced(self, worker: str, frame: nfp.Frame, now: float) -> None:
        if self.traces is None:
            self.traces = {}
        self.traces[worker] = (max(0.0, now - self.sent), bytes(frame))

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
        if self.mmi:
            return (self.results if self.refused is None else None), self.refused
        if self.refused is not None and not self.results:
            return None, self.refused
        if self.lost:
            names = ", ".join(sorted(self.lost))
            return None, WorkerLostError(
                f"worker {names} was lost while running job {self.uuid}", uuid=self.uuid, results=self.results
            )
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
        if self.refused is not None:
            self.refused.results = self.results  # what did arrive, as every JobError carries
            return None, self.refused
        return self.results, None


def build_trace(traces: dict[str, tuple[float, bytes]], held: float) -> tuple[dict[str, Any] | None, int]:
    """A job's trace from each worker's (seconds to its answer, trace frame), and the figures that
    were no duration. `held`: seconds the submitter held it first (the `api` hop)."""
    if len(traces) == 1:
        ((t, frame),) = traces.values()
        hops, bad = hoptrace.hops(t, frame, held)
        return ({"total": t + held, "hops": hops} if hops else None), bad
    views: dict[str, dict[str, Any]] = {}
    bad = 0
    for w, (t, frame) in traces.items():
        hops, n = hoptrace.hops(t, frame, held)
        bad += n
        if hops:
            views[w] = {"total": t + held, "hops": hops}
    if not views:
        return None, bad
    last = max(views, key=lambda w: traces[w][0])
    return {**views[last], "workers": views}, bad


def _one_line(entry: dict[str, Any]) -> str:
    """A failed entry's error in one line: its last message, else its traceback's last line."""
    for key in ("messages", "errors"):
        texts = [str(t) for t in entry.get(key) or [] if t]
        if texts:
            lines = texts[-1].strip().splitlines()
            return (lines[-1] if lines else "")[:MAX_ATTEMPT_ERROR]
    return str(entry.get("status", "failed"))


def outcome_of(result: dict[str, Any] | None, error: BaseException | None) -> str:
    """A bounded label for how a job ended: its final state (core/states.py)."""
    return final_state(result, error)[0].value
