"""A bounded pool of job threads: jobs never run on a socket's owner loop."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class JobPool(Generic[T]):
    """`size` threads run `runner(item)` for items taken from a queue bounded at `capacity`."""

    def __init__(self, runner: Callable[[T], None], *, size: int, capacity: int, name: str = "job") -> None:
        self.runner = runner
        self.size = size
        self.capacity = capacity
        # SimpleQueue is C: put and get cost no Python Condition. The bound is the worker's
        # admission (it never admits more than `capacity` jobs waiting), checked again here.
        self._q: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"zfab-{name}-{i}", daemon=True) for i in range(size)]
        self._running = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def put(self, item: T) -> None:
        """Queue a job; raises queue.Full when `capacity` jobs wait already."""
        if self._q.qsize() >= self.capacity:
            raise queue.Full
        self._q.put(item)

    def depth(self) -> int:
        return self._q.qsize()

    @property
    def running(self) -> int:
        return self._running

    def stop(self, timeout: float = 5.0) -> None:
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            t.join(timeout / max(1, len(self._threads)))

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            with self._lock:
                self._running += 1
            try:
                self.runner(item)
            except Exception:
                log.exception("job runner failed")
            finally:
                with self._lock:
                    self._running -= 1
