"""What cuts across the broker's routing: hooks it calls at fixed points, in the spirit of dramatiq's middleware.

A hook overrides the methods of `Hook` for the points it cares about. `Hooks` precomputes one tuple
of bound methods per point, holding only the hooks that override it, so the broker calls a point as
`for h in hooks.admitted: h(...)`: with no hook there, one attribute read and an empty loop, and no
guard per concern anywhere. The tuples are built once, at construction: a hook is never
added later. Hooks run on the broker's owner thread and must not block; the event publisher hands
its events to a thread of its own (events.py).

The points, in a job's order: `admitted` (the broker took a POST), `replied` (a reply the broker made
itself: dispatched, queued, expired, cancelled, lost...), `forwarded` (a worker's RESPONSE or EVENT on
its way to the client, with the outcome when the worker told it as data), `final` (a pushed final
answer about to go out: the hop trace rides on it), `worker` (a worker registered or left),
`queue_now` (a queue paused or resumed), `tend` (every timer pass: returns when it wants the next
one, or None), `start`/`stop`. Concrete hooks: the event publisher (events.py, queueevents.py), hop
traces and memory trimming (below). The broker's counters stay a plain Counter its parts share: a
hook call per count would cost the hot path more than the count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..core import hoptrace
from ..core import protocol as nfp
from ..core.keepalive import Clock
from .memory import MemoryKeeper

if TYPE_CHECKING:
    from ..transport.base import Frames, Transport
    from .jobqueue import QueuedJob
    from .registry import ServiceRecord, WorkerRecord

POINTS = ("admitted", "replied", "forwarded", "final", "worker", "queue_now", "tend", "start", "stop")


class Hook:
    """A concern the broker calls at fixed points; every method a no-op here (override what you need)."""

    def admitted(self, job: QueuedJob, svc: ServiceRecord) -> None:
        """The broker took a POST (queued or sent): its worker's replies come on later frames."""

    def replied(self, uuid: bytes, status: bytes) -> None:
        """The broker answered a job itself (its status says how)."""

    def forwarded(self, worker: WorkerRecord, msg: nfp.WorkerReply, outcome: str | None) -> None:
        """A worker's RESPONSE or EVENT; `outcome` is what its final answer says of the task
        (`completed`, `failed`, `retrying`) when the worker told it as data, else None."""

    def final(self, job: QueuedJob, worker: WorkerRecord, worker_trace: nfp.Frame | None, frames: Frames) -> None:
        """A pushed final answer about to go to its client (`frames`, which a hook may extend)."""

    def worker(self, service: bytes, name: bytes, state: str, why: str) -> None:
        """A worker registered (`ready`) or left (`lost`, with why)."""

    def queue_now(self, service: bytes) -> None:
        """A queue was paused or resumed: its subscribers hear of it now, not at its next turn."""

    def tend(self, now: float) -> float | None:
        """A timer pass: returns when this hook wants the next one (None: it waits for nothing)."""
        return None

    def start(self) -> None:
        """The broker starts (before its loop)."""

    def stop(self) -> None:
        """The broker stops (before its loop)."""


class Hooks:
    """One tuple of bound methods per point, holding only the hooks that override it."""

    admitted: tuple[Callable[[QueuedJob, ServiceRecord], None], ...]
    replied: tuple[Callable[[bytes, bytes], None], ...]
    forwarded: tuple[Callable[[WorkerRecord, nfp.WorkerReply, str | None], None], ...]
    final: tuple[Callable[[QueuedJob, WorkerRecord, nfp.Frame | None, Frames], None], ...]
    worker: tuple[Callable[[bytes, bytes, str, str], None], ...]
    queue_now: tuple[Callable[[bytes], None], ...]
    tend: tuple[Callable[[float], float | None], ...]
    start: tuple[Callable[[], None], ...]
    stop: tuple[Callable[[], None], ...]

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self.all = tuple(hooks)
        for point in POINTS:
            base = getattr(Hook, point)
            bound = tuple(getattr(h, point) for h in self.all if getattr(type(h), point) is not base)
            setattr(self, point, bound)


class TrimMemory(Hook):
    """Gives the OS back what a burst of messages used, once it has passed (memory.py, issue 31)."""

    def __init__(self, keeper: MemoryKeeper, loop: Transport) -> None:
        self.look = keeper.tend
        self.stats = loop.stats  # (its frames received: a burst is what makes a trim worth it)

    def tend(self, now: float) -> float | None:
        return self.look(now, self.stats.received)


Traced = Callable[[bytes, bytes, bytes, bytes], None]  # uuid, service, worker name, the trace frame


class HopTraces(Hook):
    """Every pushed final answer carries its hop trace (docs/protocol.md, "Hop traces"): the worker's
    durations and the broker's own, appended as the answer's last frame; `listeners` (the event
    publisher's `traced`) hear of each frame."""

    def __init__(self, clock: Clock, listeners: Sequence[Traced] = ()) -> None:
        self.clock = clock
        self.listeners = tuple(listeners)

    def final(self, job: QueuedJob, worker: WorkerRecord, worker_trace: nfp.Frame | None, frames: Frames) -> None:
        sent = job.sent_at if job.parts_sent is None else job.parts_sent.get(worker.name, job.sent_at)
        wt = worker_trace if worker_trace is None or type(worker_trace) is bytes else bytes(worker_trace)
        trace = hoptrace.broker_frame(wt, job.queued_at, sent, self.clock())
        frames.append(trace)
        for listen in self.listeners:
            listen(job.uuid, worker.service, worker.name, trace)
