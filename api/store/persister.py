"""Writes the job table's changed jobs to the API's store in batches, off the request path.

The table marks jobs dirty (on submit, when they finish, on a cancel; with a shared store also on
each event), and the Persister writes whatever is dirty in one transaction at most every `delay`
seconds. On every store, a job's row follows what the API knows of it: admitted (queued),
dispatched (its workers), running, and its attempt; the sweep finds such changes, which come as
replies rather than events, within STATE_SWEEP. Recovery after a restart reads them: a job last
known dispatched or running is never submitted again, only asked of the fabric
(api/jobs/recovery.py). Both stores batch for a few milliseconds only, since POST /jobs answers
once its job's row is committed (on PostgreSQL so that any replica finds it next; on SQLite so that
a job the API acknowledged is found after a crash); jobs that change while a write is in flight
gather for the next one. A store silent past RECORD_TIMEOUT (SQLite) is not waited for longer: the
job is answered, and its row follows.

A write that fails (the database is away) is retried with a growing pause: with a shared store the
jobs stay dirty until it is back; with SQLite they are dropped as before (a full disk is logged).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from dataclasses import dataclass, field

from zfab import JobFuture

from ..jobs.table import JobTable
from .base import JobStore, StoreError

log = logging.getLogger(__name__)

# SQLite: what a batch gathers. POST /jobs answers once its job's row is written (api/jobs/operations.py
# recorded()), so the pause is short; jobs that change while a write is in flight gather for the next.
FLUSH_DELAY = 0.002
# PostgreSQL: no gathering pause, since a POST waits for its row; jobs that change while a write is in
# flight (most of them, under load) gather for the next one anyway.
SHARED_FLUSH_DELAY = 0.002
STATE_SWEEP = 0.25  # how often a change without an event (queued -> dispatched -> running, an attempt) is looked for
RETRY_MAX = 5.0


def known(fut: JobFuture) -> tuple[str, int, int]:
    """What a job's row records of it: its state, its attempt, and whether a worker is known."""
    return fut.state.value, fut.attempt, 1 if (fut.worker or fut.dispatched) else 0


@dataclass(slots=True, eq=False)
class Persister:
    store: JobStore
    table: JobTable
    broker: str
    written: int = 0
    failures: int = 0
    delay: float = FLUSH_DELAY
    _task: asyncio.Task[None] | None = None
    _sweeper: asyncio.Task[None] | None = None
    _durable: dict[str, list[tuple[asyncio.Future[None], bool]]] = field(default_factory=dict)
    # Unfinished jobs -> what their row says (state, attempt, workers), bounded by the jobs the client tracks.
    _open: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    _retry: float = 0.0

    def start(self) -> None:
        self.table.persisting = True
        self.table.loader = self.store.read
        if self.store.shared:
            self.delay = SHARED_FLUSH_DELAY
            self.table.persist_events = True  # other replicas stream them from the database
        self._sweeper = asyncio.create_task(self._sweep(), name="api job state sweep")
        self._task = asyncio.create_task(self._run(), name="api job db writer")

    async def _run(self) -> None:
        while True:
            await self.table.kick.wait()
            self.table.rearm()
            await asyncio.sleep(self.delay)  # gather what else changes meanwhile into the same transaction
            if not await self.flush() and self.store.shared:
                self._retry = min(RETRY_MAX, max(0.25, self._retry * 2))
                await asyncio.sleep(self._retry)
            else:
                self._retry = 0.0

    async def flush(self) -> bool:
        """Write what is dirty now; False when the store refused (the jobs are then dirty again, if shared)."""
        dirty = self.table.dirty
        uuids: dict[str, None] = {}
        while dirty:
            uuids[dirty.popleft()] = None
        records = [rec for uuid in uuids if (rec := self.table.record(uuid)) is not None and rec.writable]
        if not records:
            return True
        finished = {rec.uuid for rec in records if rec.done}  # before the rows are made: these are written final
        # What each row will show at least (read before the rows are made, so never newer than written).
        states = {rec.uuid: known(fut) for rec in records if (fut := rec.live) is not None}
        ok = True
        try:
            await self.store.write(records, self.broker)
            self.written += len(records)
        except StoreError as exc:
            ok = False
            self.failures += 1
            log.error("api job db %s: could not record %d jobs: %s", self.store.label, len(records), exc)
            if self.store.shared:
                for rec in records:
                    self.table.touch(rec.uuid)
        for rec in records:
            if rec.uuid in states and rec.uuid not in finished:
                self._open[rec.uuid] = states[rec.uuid]
            else:
                self._open.pop(rec.uuid, None)
        if ok:
            for rec in records:
                rec.written = True
                final = rec.uuid in finished
                if final:
                    rec.final_written = True
                    self.table.lingering.pop(rec.uuid, None)
                waiters = self._durable.pop(rec.uuid, [])
                for waiter, wants_final in waiters:
                    if final or not wants_final:
                        if not waiter.done():
                            waiter.set_result(None)
                    else:
                        self._durable.setdefault(rec.uuid, []).append((waiter, wants_final))
        return ok

    def durable(self, uuid: str, *, final: bool = False) -> asyncio.Future[None]:
        """Resolves once a write that includes the job (touched already) has committed; with `final`, a
        write of it finished (so that another replica reads what this one is about to answer)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._durable.setdefault(uuid, []).append((fut, final))
        return fut

    async def _sweep(self) -> None:
        """A job that is dispatched, starts running or starts another attempt says so by a reply, not an
        event: look for such changes now and then (jobs in memory only, no database read), so the row
        (and other replicas) know it before the job ends, and a restarted API never submits again a
        job that left the broker's queue."""
        while True:
            await asyncio.sleep(STATE_SWEEP)
            for uuid, was in list(self._open.items()):
                rec = self.table.get(uuid) or self.table.lingering.get(uuid)
                fut = rec.live if rec is not None else None
                if fut is None or fut.done():
                    self._open.pop(uuid, None)  # a finished job is written by its done callback
                elif (now := known(fut)) != was:
                    self._open[uuid] = now
                    self.table.touch(uuid)

    async def stop(self) -> None:
        """Write what is still dirty; the store stays open (close it after the client)."""
        for task in (self._sweeper, self._task):
            if task is not None:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
        await self.flush()
        for waiters in self._durable.values():
            for waiter, _ in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self._durable.clear()
