"""queue.<service> events: a service's queue (depth, bytes, capacity, paused), coalesced.

A busy queue changes with every job; its subscribers hear of it a few times a second (QUEUE_INTERVAL),
and of a pause or resume at once. A hook (hooks.py) beside the publisher (events.py).
"""

from __future__ import annotations

from collections.abc import Container

from ..settings import Settings
from .events import EventPublisher
from .hooks import Hook
from .registry import Registry

QUEUE_INTERVAL = 0.25  # seconds between two queue.<service> events of a busy queue (coalesced in between)


class QueueEvents(Hook):
    """queue.<service> events: the queues whose depth or bytes changed (the dispatcher's `changed`
    set, emptied here) at most once per QUEUE_INTERVAL, and a paused or resumed queue at once."""

    def __init__(
        self,
        publisher: EventPublisher,
        changed: set[bytes],
        *,
        registry: Registry,
        paused: Container[bytes],
        settings: Settings,
    ) -> None:
        self.publisher = publisher
        self.changed = changed
        self.reg = registry
        self.paused = paused
        self.s = settings
        self.next_turn = 0.0

    def facts(self, name: bytes) -> tuple[int, int, int, bool]:
        """A service's queue for its queue.<service> event: depth, bytes, capacity, paused."""
        svc = self.reg.services.get(name)
        depth, nbytes = (svc.queue.depth, svc.queue.bytes) if svc is not None else (0, 0)
        return depth, nbytes, self.s.service_queue_size, name in self.paused

    def queue_now(self, service: bytes) -> None:
        self.publisher.queue(service, self.facts(service))

    def tend(self, now: float) -> float | None:
        """Publish the changed queues at most once per QUEUE_INTERVAL: a busy queue changes with every
        job, its subscribers hear of it a few times a second. Returns when to look again while changes
        wait for their turn (None: none waits)."""
        changed = self.changed
        if not changed:
            return None
        if not self.publisher.active:
            changed.clear()
            self.publisher._queue_last.clear()  # a later subscriber is told the next change, whatever was last
            return None
        if now < self.next_turn:
            return self.next_turn
        for name in changed:
            self.publisher.queue(name, self.facts(name))
        changed.clear()
        self.next_turn = now + QUEUE_INTERVAL
        return None
