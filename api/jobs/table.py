"""The jobs the API knows: a bounded, insertion-ordered table of JobRecords (api/jobs/record.py).

Bookkeeping, no I/O. The client's owner thread only appends to `dirty` (a deque, safe across threads)
and schedules wake-ups with call_soon_threadsafe; everything else happens on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from zfab import BoundedLRU, JobFuture

from .record import JobRecord

DEFAULT_MAX_BYTES = 256 * 1024 * 1024  # requests, results and events the table keeps in memory


def _counted(rec: JobRecord) -> int:
    return rec.counted


def _released(rec: JobRecord) -> bool:
    """A job the byte bound may let go of: finished (its row is in the database) and holding something."""
    return rec.done and bool(rec.counted)


class JobTable:
    """The last `capacity` jobs, oldest evicted first (finished or not: the table must stay bounded).

    With a `loop`, it also tells who cares when a job changes: `dirty` collects the uuids to
    persist, `listen` gives an asyncio.Event set on each event and on completion (for SSE).
    """

    def __init__(
        self, capacity: int, loop: asyncio.AbstractEventLoop | None = None, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.loop = loop
        # The loop's thread (the table is made on it), where the API's client finishes its jobs: a wake-up
        # from there is a call_soon, not a call_soon_threadsafe and its self-pipe write.
        self._loop_thread = threading.get_ident()
        # What each job holds is its `counted` bytes: its request (as JSON), and once it finished its
        # results and events (settle).
        self._jobs: BoundedLRU[str, JobRecord] = BoundedLRU(max_count=capacity, max_bytes=max_bytes, size=_counted)
        self._seq = 0
        # Reads a job the table let go of from the API's database (set by the persister); None: memory only.
        self.loader: Callable[[str], Awaitable[JobRecord | None]] | None = None
        self.persisting = False  # set when a persister drains `dirty`; otherwise nothing is collected
        self.persist_events = False  # a shared store: each event is written too (other replicas stream them)
        self.lingering: dict[str, JobRecord] = {}  # shared store: running jobs the table let go of
        self.dirty: deque[str] = deque()
        self.kick = asyncio.Event()  # set when `dirty` gains entries (the persister waits on it)
        self._kicked = False
        self._listeners: dict[str, set[asyncio.Event]] = {}
        self.closing = False  # the server is stopping: streams end (callers resume with Last-Event-ID)
        self.released = 0  # finished jobs let go of for the byte bound (still in the database)

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def bytes(self) -> int:
        """Requests (as JSON) of its jobs, and results and events of finished ones."""
        return self._jobs.bytes

    def get(self, uuid: str) -> JobRecord | None:
        return self._jobs.get(uuid)

    def record(self, uuid: str) -> JobRecord | None:
        """The job to write: in the table, or let go of by it while still running (shared store)."""
        rec = self._jobs.get(uuid)
        return rec if rec is not None else self.lingering.get(uuid)  # the persister drops it once written done

    def add(self, record: JobRecord, *, persist: bool = True) -> None:
        self._jobs.pop(record.uuid)
        self._seq += 1
        record.seq = self._seq
        record.counted = record.size  # its request now; its results and events when it ends (settle)
        self._jobs.put(record.uuid, record)
        for gone in self._jobs.shed(by_bytes=False):  # finished or not: the table must stay bounded
            if self.persist_events and gone.live is not None and not gone.done:
                # A shared store: other replicas wait on this job's row, so its end is still written
                # (bounded by the jobs the client holds in flight); see record().
                self.lingering[gone.uuid] = gone
        if record.future is not None:
            self.watch(record.future)
        if persist:
            self.touch(record.uuid)
        self.trim()

    def discard(self, uuid: str) -> None:
        """Forget a job the fabric refused at once (POST /jobs answered the refusal): it never ran, so it
        is no row of the table or the database (a write already queued for it finds nothing)."""
        self._jobs.pop(uuid)

    def watch(self, future: JobFuture) -> None:
        """Persist and wake listeners when `future` (a job's, or its recovery's) finishes."""
        uuid = future.uuid
        future.add_done_callback(lambda _: self.changed(uuid, finished=True))

    def newest(self, before: int | None = None) -> Iterator[JobRecord]:
        """Newest first; with `before`, only those that arrived before that sequence number."""
        for rec in self._jobs.newest():
            if before is None or rec.seq < before:
                yield rec

    def settle(self, uuid: str) -> None:
        """A job finished (event loop): count what it holds, and let the oldest finished jobs go while
        the table is over its byte bound. They stay in the database, where GET finds them."""
        rec = self._jobs.get(uuid)
        if rec is not None and rec.done:
            size = rec.size
            self._jobs.grew(size - rec.counted)
            rec.counted = size
        self.trim()

    def trim(self) -> None:
        """Let the oldest finished jobs go while the table holds more than its byte bound (a job not
        finished yet stays: what it holds is bounded by the jobs in flight, see api/jobs/shares.py)."""
        self.released += len(self._jobs.shed(_released))

    def page(self, limit: int, offset: int) -> list[JobRecord]:
        """Newest first."""
        out: list[JobRecord] = []
        for i, rec in enumerate(self._jobs.newest()):
            if i >= offset + limit:
                break
            if i >= offset:
                out.append(rec)
        return out

    # ---- change notification (any thread) -------------------------------------------

    def touch(self, uuid: str) -> None:
        """Mark a job for the next database write."""
        if not self.persisting:
            return
        self.dirty.append(uuid)
        if not self._kicked and self.loop is not None:
            self._kicked = True
            self._soon(self.kick.set)

    def rearm(self) -> None:
        """The persister took the kick: the next touch kicks again (event loop only)."""
        self.kick.clear()
        self._kicked = False

    def changed(self, uuid: str, *, finished: bool = False) -> None:
        """A job got an event or finished (called on the client's owner thread)."""
        if finished:
            self.touch(uuid)
            self._soon(lambda: self.settle(uuid))
        elif self.persist_events:
            self.touch(uuid)
        if uuid in self._listeners:
            self._soon(lambda: self._wake(uuid))

    def _soon(self, fn: Any) -> None:
        if self.loop is None:
            return
        try:
            if threading.get_ident() == self._loop_thread:
                self.loop.call_soon(fn)
                return
            self.loop.call_soon_threadsafe(fn)
        except RuntimeError:
            pass  # the loop has closed: nobody is left to wake

    def _wake(self, uuid: str) -> None:
        for ev in self._listeners.get(uuid, ()):
            ev.set()

    def close_streams(self) -> None:
        """The server is stopping: wake every stream so it ends (any thread, signal handlers too)."""
        self._soon(self._close_streams)

    def _close_streams(self) -> None:
        self.closing = True
        for group in self._listeners.values():
            for ev in group:
                ev.set()

    def listen(self, uuid: str) -> asyncio.Event:
        """An event set whenever the job changes; give it back with `unlisten` (event loop only)."""
        ev = asyncio.Event()
        self._listeners.setdefault(uuid, set()).add(ev)
        return ev

    def unlisten(self, uuid: str, ev: asyncio.Event) -> None:
        group = self._listeners.get(uuid)
        if group is not None:
            group.discard(ev)
            if not group:
                del self._listeners[uuid]
