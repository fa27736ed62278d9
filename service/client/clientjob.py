"""A job as its client tracks it: pure state fed with the broker's replies.

No sockets or threads: the client's owner loop calls `apply` for each reply and
`outcome` tells whether the job is finished and how.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..core import payloads
from ..core import protocol as nfp
from ..core.lazy import lazy
from ..errors import (
    BadRequestError,
    BusyError,
    JobError,
    JobNotFoundError,
    NoWorkersError,
    WorkerLostError,
)

MAX_EVENTS_PER_JOB = 10_000
_NOT_YET = frozenset({nfp.ST_WORKER_ACCEPTED, nfp.ST_PENDING, nfp.ST_WAITING_INPUT})


class JobFuture(Future[Any]):
    """A submitted job: `result()` gives the dictionary keyed by worker name, or raises.

    `events` holds the job's events as they arrive (bounded); `chunks` the stream chunks
    of a streaming job, bounded by its credit window.
    """

    def __init__(self, uuid: str, stream_window: int = 0) -> None:
        super().__init__()
        self.uuid = uuid
        self.events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS_PER_JOB)
        self.timings: dict[str, float] = {}
        self._changed: threading.Condition | None = None  # made on first use: most jobs never need it
        self.chunks: queue.Queue[bytes] | None = queue.Queue(maxsize=stream_window + 1) if stream_window else None
        self.worker: str | None = None  # the one worker running it, once known (202 or first event)
        self.dispatched: list[str] | None = None  # every worker the broker sent it to (from 202)
        self.add_done_callback(self._notify)

    @property
    def changed(self) -> threading.Condition:
        """Notified on each event and when the job ends."""
        return lazy(self, "_changed", threading.Condition)

    def add_event(self, event: dict[str, Any]) -> None:
        with self.changed:
            self.events.append(event)
            self.changed.notify_all()

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
    refused: JobError | None = None
    polls: int = 0
    retries_left: int = 0
    attempt: int = 1

    @property
    def wire_uuid(self) -> str:
        """The uuid this attempt travels under: replies to an earlier attempt cannot pass for it."""
        return payloads.wire_uuid(self.uuid, self.attempt)

    def retry(self) -> bool:
        """After a worker was lost: True (and the job reset for another attempt) if retries remain."""
        if not self.lost or self.retries_left <= 0 or self.target != b"any":
            return False
        self.retries_left -= 1
        self.attempt += 1
        self.body = payloads.with_attempt(self.body, self.attempt)
        self.expected = None
        self.results, self.statuses, self.lost, self.refused = {}, {}, set(), None
        self.future.timings["retried"] = time.time()
        self.future.worker = None
        self.future.dispatched = None
        return True

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
                payload = json.loads(reply.payload) if reply.payload else None
                if reply.status == nfp.ST_OK:
                    self.results = {"result": payload}
                else:
                    self.refused = BadRequestError(f"MMI request refused: {payload}", uuid=self.uuid)
                return True
            return False
        status = reply.status
        if status in _NOT_YET:
            return False  # 201/300/102: the job goes on; nothing in their bodies changes what it waits for
        try:
            payload = json.loads(reply.payload) if reply.payload else {}
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        if status == nfp.ST_DISPATCHED:
            workers = payload.get("workers")
            if isinstance(workers, list) and self.expected is None:
                self.expected = {str(w) for w in workers}
                self.future.timings.setdefault("dispatched", time.time())
                self.future.dispatched = sorted(self.expected)
                if len(workers) == 1:
                    self.future.worker = str(workers[0])
            return False
        if status == nfp.ST_WORKER_LOST:
            worker = str(payload.get("worker", ""))
            self.lost.add(worker)
            if self.expected is None:  # results-only mode: the lost worker was the one running it
                self.expected = {worker}
            return self._done()
        if payloads.is_refusal(status, payload):
            if self.expected is not None:
                # A refused GET poll: the job's worker is not registered (yet), e.g. after a
                # broker restart. The job goes on; a 410 or its deadline ends it.
                return False
            # A refusal from the broker itself: no worker matched, or the fabric is full.
            cls: type[JobError] = BusyError if status == nfp.ST_BUSY else NoWorkersError
            self.refused = cls(payloads.errors_of(payload, "refused by broker"), uuid=self.uuid)
            return True
        if status == nfp.ST_BUSY:
            worker = str(payload.get("worker", ""))
            self.statuses[worker] = status
            self.refused = BusyError(f"worker '{worker}': {payloads.errors_of(payload, 'worker busy')}", uuid=self.uuid)
            if self.expected is None:
                self.expected = {worker}
            return self._done()
        if status == nfp.ST_NOT_FOUND and "worker" in payload:
            self.statuses[str(payload["worker"])] = status
            if self.expected is None:
                self.expected = {str(payload["worker"])}
            return self._done()
        # 200, 400, 500 from a worker: {worker_name: result entry}
        if self.expected is not None and not set(payload) <= self.expected:
            return False  # a late answer from a worker this job no longer waits on: discard it
        for worker, entry in payload.items():
            if self.attempt > 1 and isinstance(entry, dict):
                entry["juuid"], entry["attempt"] = self.uuid, self.attempt  # the job's own uuid, not the wire's
            self.results[str(worker)] = entry
            self.statuses[str(worker)] = status
            if self.expected is None:
                self.expected = {str(worker)}
        return self._done()

    def _done(self) -> bool:
        return self.expected is not None and not self.pending

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
        if self.results and all(s == nfp.ST_BAD_REQUEST for s in self.statuses.values()):
            errors = "; ".join(
                str(e) for entry in self.results.values() if isinstance(entry, dict) for e in entry.get("errors") or []
            )
            return None, BadRequestError(errors or "bad request", uuid=self.uuid, results=self.results)
        if self.refused is not None:
            self.refused.results = self.results  # what did arrive, as every JobError carries
            return None, self.refused
        return self.results, None


def outcome_of(result: dict[str, Any] | None, error: BaseException | None) -> str:
    """A bounded label for how a job ended: completed, failed, or the error's kind."""
    if error is not None:
        name = type(error).__name__.removesuffix("Error")
        return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_") or "error"
    if result and any(isinstance(v, dict) and v.get("failed") for v in result.values()):
        return "failed"
    return "completed"
