"""A job's 202 (dispatched), held a moment and left out when the job's final answer goes first.

The broker's twin of the worker's held 201 (worker/notices.py). A zfab client that asks for it (flags
`ack_late`, docs/protocol.md Extensions 1) gets the 202 of a job sent to one worker DISPATCH_HOLD
after the dispatch, and only if the job is still in flight then: most jobs answer sooner, and their
202 was one of the five messages each cost (a send here, a wake-up and a decode in the client) for
news the result brings anyway. A worker's other answer for the job (201, an event, a stream chunk)
takes the held 202 with it first, so the client hears of a job in NFP's order. The broker's own
record of the dispatch (its `replied` hooks: events, audit) is made at the dispatch, held or not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..transport.base import Frames

if TYPE_CHECKING:
    from .jobqueue import QueuedJob
    from .registry import Registry

DISPATCH_HOLD = 0.01  # seconds: as long as a worker holds a 201 (worker/notices.py STARTED_NOTICE_DELAY)
MAX_HELD = 100_000  # beyond it a 202 goes at once (routes are bounded at about as many)


class HeldAcks:
    """202s waiting out DISPATCH_HOLD, in due order (one hold for all: insertion order is due order)."""

    __slots__ = ("held", "left_out", "reg", "send")

    def __init__(self, registry: Registry, send: Callable[[Frames], None]) -> None:
        self.reg = registry
        self.send = send
        self.held: dict[bytes, tuple[float, QueuedJob, Frames]] = {}
        self.left_out = 0  # 202s never sent: the job's final answer went first

    def hold(self, job: QueuedJob, frames: Frames, now: float) -> bool:
        """Hold the job's 202; False (nothing held) when the table is full: send it now."""
        if len(self.held) >= MAX_HELD:
            return False
        self.held.pop(job.uuid, None)  # (a repeated dispatch goes to the end: insertion order is due order)
        self.held[job.uuid] = (now + DISPATCH_HOLD, job, frames)
        return True

    def before(self, uuid: bytes) -> None:
        """A worker's answer for the job is about to go to its client: a held 202 goes first."""
        entry = self.held.pop(uuid, None)
        if entry is not None:
            self.send(entry[2])

    def answered(self, uuid: bytes) -> None:
        """The job's final answer is about to go: its held 202 never will."""
        if self.held.pop(uuid, None) is not None:
            self.left_out += 1

    def due(self, now: float) -> None:
        """Send the 202s that are due, of jobs still in flight under the same dispatch (a job that ended
        otherwise, lost or expired or cancelled, has no route, and its client has been told)."""
        held, routes = self.held, self.reg.routes
        while held:
            uuid = next(iter(held))
            at, job, frames = held[uuid]
            if at > now:
                return
            del held[uuid]
            route = routes.get(uuid)
            if route is not None and route.job is job:
                self.send(frames)
            else:
                self.left_out += 1

    def next_at(self) -> float | None:
        for at, _, _ in self.held.values():
            return at
        return None
