"""The broker's per-service job queue: jobs admitted but not yet sent to a worker.

Pure state: no sockets, no clock of its own (callers pass monotonic times). A job waits here
because no worker of its service has a free credit, because it is delayed (`not_before`), or
because the workers it names are not registered yet. Order: priority (0-9, higher first),
then arrival. Removal is lazy: a job that left (dispatched, expired, cancelled) is marked and
skipped when a heap reaches it, so every operation is O(log n).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..core.protocol import Frame

ANY, ALL, NAMED = "any", "all", "named"


class Spot(Enum):
    READY = "ready"  #: waits for a free credit of any worker of the service
    DELAYED = "delayed"  #: waits for its not_before time
    PARKED = "parked"  #: waits for the workers it names (or, for `all`, any worker) to register
    DIRECTED = "directed"  #: fanned out: some of its parts wait for credits of the workers named
    HELD = "held"  #: its task's rate or concurrency limit holds it (in its bucket: limits.py)
    GONE = "gone"  #: left the queue


@dataclass(slots=True, eq=False)
class QueuedJob:
    """A job as the broker holds it until every part of it is sent."""

    uuid: bytes  # as it travels (a retried attempt's is uuid~N)
    client: bytes
    service: bytes
    target: bytes  # the target frame as the client sent it
    kind: str  # ANY, ALL or NAMED
    names: list[str] | None  # NAMED: the worker names
    body: Frame  # as received: a large one is a view onto ZeroMQ's buffer (forwarded, not copied)
    task: str
    push: bool
    ack: bool
    announce: bool  # the client speaks zfab: tell it when the job is queued, expired, cancelled
    priority: int
    seq: int
    queued_at: float  # monotonic
    not_before: float  # monotonic; 0 = at once
    deadline: float  # monotonic
    timeout: float  # seconds, as asked
    spot: Spot = Spot.READY
    parts_waiting: int = 0  # DIRECTED: parts still waiting for a credit
    told_queued: bool = False  # the client was told "queued": it learns of the dispatch too
    notice: float = 0.0  # seconds it may wait before the client is told "queued" (flags "notice")
    client_key: bytes | None = None  # CURVE: the key of the client that submitted it
    workers: list[bytes] = field(default_factory=list)  # names it was fanned out to
    limit: Any = None  # the limits.Bucket of its task's rate/concurrency limit (None: not limited)
    trace: dict[str, str] | None = None  # the submitter's W3C trace context, for the worker's meta frame
    sent_at: float = 0.0  # monotonic: when it (its latest part) was sent to a worker, for its hop trace
    parts_sent: dict[bytes, float] | None = None  # a job for several workers: when each part was sent
    host: str | None = None  # the client's shared-memory host id (flags "host")
    shm: bool = False  # the body is a handle to a block of that client (core/shmhandle.py)

    @property
    def size(self) -> int:
        return len(self.body)

    def key(self) -> tuple[int, int]:
        """Heap order: higher priority first, then earlier arrival."""
        return (-self.priority, self.seq)


class ServiceQueue:
    """One service's waiting jobs, bounded by the broker (count per service, bytes in all)."""

    __slots__ = ("bytes", "delayed", "parked", "ready", "waiting")

    def __init__(self) -> None:
        self.ready: list[tuple[int, int, QueuedJob]] = []
        self.delayed: list[tuple[float, int, QueuedJob]] = []
        self.parked: OrderedDict[int, QueuedJob] = OrderedDict()
        self.waiting: OrderedDict[bytes, QueuedJob] = OrderedDict()  # arrival order: the first is the oldest
        self.bytes = 0

    @property
    def depth(self) -> int:
        return len(self.waiting)

    def oldest_age(self, now: float) -> float:
        for job in self.waiting.values():
            return max(0.0, now - job.queued_at)
        return 0.0

    def add(self, job: QueuedJob, now: float) -> None:
        """A new (or returned) job: ready, delayed or parked as its time and target say."""
        if job.uuid not in self.waiting:
            self.waiting[job.uuid] = job
            self.bytes += job.size
        self.place(job, now)

    def hold(self, job: QueuedJob) -> None:
        """Count a fanned-out job whose parts wait in its workers' own heaps."""
        if job.uuid not in self.waiting:
            self.waiting[job.uuid] = job
            self.bytes += job.size
        self.parked.pop(job.seq, None)
        job.spot = Spot.DIRECTED

    def place(self, job: QueuedJob, now: float) -> None:
        if job.not_before > now:
            job.spot = Spot.DELAYED
            heapq.heappush(self.delayed, (job.not_before, job.seq, job))
        elif job.kind == ANY and job.limit is not None:
            job.limit.hold(job)  # waits for its limit, apart from the service's other jobs
        elif job.kind == ANY:
            job.spot = Spot.READY
            heapq.heappush(self.ready, (-job.priority, job.seq, job))
        else:
            job.spot = Spot.PARKED
            self.parked[job.seq] = job

    def peek_ready(self) -> QueuedJob | None:
        ready = self.ready
        while ready:
            job = ready[0][2]
            if job.spot is Spot.READY:
                return job
            heapq.heappop(ready)
        return None

    def pop_ready(self) -> QueuedJob | None:
        job = self.peek_ready()
        if job is not None:
            heapq.heappop(self.ready)
        return job

    def due(self, now: float) -> list[QueuedJob]:
        """Delayed jobs whose time has come, moved to ready or parked."""
        out = []
        while self.delayed and self.delayed[0][0] <= now:
            job = heapq.heappop(self.delayed)[2]
            if job.spot is Spot.DELAYED:
                job.not_before = 0.0
                self.place(job, now)
                out.append(job)
        return out

    def next_due(self) -> float | None:
        while self.delayed and self.delayed[0][2].spot is not Spot.DELAYED:
            heapq.heappop(self.delayed)
        return self.delayed[0][0] if self.delayed else None

    def unpark(self, job: QueuedJob) -> None:
        self.parked.pop(job.seq, None)

    def leave(self, job: QueuedJob) -> None:
        """The job is no longer waiting (all sent, expired or cancelled); heaps forget it lazily."""
        if self.waiting.pop(job.uuid, None) is not None:
            self.bytes -= job.size
        self.parked.pop(job.seq, None)
        job.spot = Spot.GONE
