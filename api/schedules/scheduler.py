"""The scheduler: one task on the API's event loop that submits each schedule's job when it is due.

It sleeps until the earliest due time and is woken early by any change (a new, paused, resumed,
re-timed or deleted schedule): no polling tick. Each firing is an ordinary job, submitted through
`api.jobs.submit.submit_record` like POST /jobs (same states, same metrics, same table), and its uuid is
recorded against the schedule.

With PostgreSQL (API replicas) every replica runs this loop over the same schedules, kept in step by
the `zfab_schedules` notification (api/replicas/coordination.py). A due schedule fires once per slot across them:
the firing replica first claims the row with SELECT ... FOR UPDATE SKIP LOCKED and moves its
next_run_at on in that transaction (api/store/pgschedules.py `fire_claimed`); a replica that finds it locked or
already moved on lets it be. The job is submitted after that commit, so a replica dying in between
loses that one firing rather than firing it twice.

A firing that falls due while the broker is silent waits for it for up to one hold time (keepalive
interval × multiplier, counted from the due time or from the API's start, whichever is later), so
the firing missed while the API was down is not lost to the moments before its client reaches the
broker. A firing the fabric still refuses (no broker, no workers, busy) is counted on the schedule
(`failures`, `last_error`) and not retried: the next slot comes as usual. So is a firing whose job
ended failed, expired or lost (its end, read from the job's future, is counted by the replica that
submitted it); a job of it that completes clears `last_error`.

A schedule is addressed by its id or by its name (ids first): names are unique among the schedules this
API holds (with PostgreSQL, as this replica last read them).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Any, cast

from prometheus_client import CollectorRegistry

from zfab import BoundedLRU

from ..errors import ProblemError
from ..jobs.arguments import recorded_json
from ..jobs.record import JobRecord
from ..jobs.submit import submit_record
from ..models import JobRequest, JobState
from ..state import ApiState
from ..store.base import ScheduleBackend, SharedScheduleBackend, SqliteSchedules
from ..store.schedules import ScheduleRecord, ScheduleStore
from .metrics import FAILED_ENDS, ScheduleMetrics
from .timing import first, following

log = logging.getLogger(__name__)

# The longest the loop sleeps even with nothing due sooner: wall-clock time (which cron follows) can
# jump (NTP, a suspended VM) while asyncio sleeps on the monotonic clock; waking now and then re-reads it.
MAX_SLEEP = 60.0
# Shared store: a due schedule another replica holds (locked, or moved on already) is looked at again
# this much later unless its notification comes first; and everything is re-read this often.
CLAIM_BACKOFF = 0.5
CLAIM_RETRY = 2.0  # the database did not answer the claim: try again this much later
RESYNC = 60.0


def plan(
    recs: Iterable[ScheduleRecord], now: float, started_at: float, silent: tuple[float, float] | None
) -> tuple[list[ScheduleRecord], float | None]:
    """The schedules to fire now, and when to look again for those held back.

    `silent` is (hold time, check step) while the broker does not answer: a due schedule then waits
    for it, up to a hold time from its due time or from the scheduler's start (whichever is later),
    and is looked at again one step later; past that it fires (and is counted refused).
    """
    due = [r for r in recs if r.next_run_at is not None and r.next_run_at <= now]
    if silent is None or not due:
        return due, None
    hold, step = silent
    held = [r for r in due if now - max(r.next_run_at or now, started_at) < hold]
    return [r for r in due if r not in held], (now + step if held else None)


def next_wake(recs: Iterable[ScheduleRecord], now: float, recheck: float | None) -> float | None:
    """The earliest time something is due after `now` (or `recheck`); None when nothing ever is."""
    times = [r.next_run_at for r in recs if r.next_run_at is not None and r.next_run_at > now]
    if recheck is not None:
        times.append(recheck)
    return min(times, default=None)


class Scheduler:
    """Holds every schedule in memory (at most ZFAB_MAX_SCHEDULES) and their store; fires them when due."""

    def __init__(
        self,
        state: Callable[[], ApiState | None],
        store: ScheduleStore | ScheduleBackend,
        *,
        capacity: int,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.store = store
        self.backend: ScheduleBackend = SqliteSchedules(store) if isinstance(store, ScheduleStore) else store
        self.shared = self.backend.shared  # PostgreSQL: other replicas fire these schedules too
        self._shared = cast(SharedScheduleBackend, self.backend) if self.shared else None
        self.capacity = capacity
        self.clock = clock
        self.schedules: dict[str, ScheduleRecord] = {}
        # job uuid -> schedule id, newest last, as many as the store keeps (the API's job history):
        # read on the event loop by whoever labels or filters jobs, so held in memory.
        self.made: BoundedLRU[str, str] = BoundedLRU(max_count=max(1, self.backend.mapping_capacity))
        # (self.schedules is replaced on each reload: the metrics read it at each scrape)
        self.metrics = ScheduleMetrics(lambda: self.schedules.values(), registry) if registry is not None else None
        self._changed = asyncio.Event()
        self._writes = asyncio.Lock()  # one write at a time, in order: a later state never loses to an earlier
        self._task: asyncio.Task[None] | None = None
        self._reloads: set[asyncio.Task[None]] = set()
        self._resync_at = 0.0
        self._claims_failing = False
        self._naming: set[str] = set()  # names of schedules being written (add/update): taken already
        self._outcomes: set[asyncio.Task[None]] = set()  # writes of fired jobs' failures
        self.started_at = clock()

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        now = self.started_at = self.clock()
        for job, sid in await self.backend.mapping():
            self.made.put(job, sid)
        self.made.shed()
        for rec in await self.backend.load():
            if not rec.paused and rec.next_run_at is None:
                rec.next_run_at = first(rec.every, rec.cron, now)
            # A next_run_at in the past was missed while the API was down: it is due now, and fires
            # once on the first pass; `following` then skips every other slot it missed.
            self.schedules[rec.id] = rec
        missed = sum(1 for r in self.schedules.values() if r.next_run_at is not None and r.next_run_at <= now)
        if self.schedules:
            log.info("zfab api: %d schedules (%d missed while down: firing once each)", len(self.schedules), missed)
        self._resync_at = time.monotonic() + RESYNC
        self._task = asyncio.create_task(self._run(), name="zfab scheduler")

    async def stop(self) -> None:
        for task in [self._task, *self._reloads, *self._outcomes]:
            if task is not None:
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
        async with self._writes:  # a write in flight finishes before the store closes
            await self.backend.close()
        if self.metrics is not None:
            self.metrics.close()

    # ---- changes (from the routes) ---------------------------------------------------------------

    def full(self) -> bool:
        return len(self.schedules) >= self.capacity

    def named(self, name: str) -> list[ScheduleRecord]:
        """The schedules of that name (one, or none; several only from before names were unique)."""
        return [r for r in self.schedules.values() if r.name == name]

    def name_taken(self, name: str | None, by: str | None = None) -> bool:
        """Another schedule than `by` holds the name, or is being written with it."""
        if name is None:
            return False
        return name in self._naming or any(r.id != by for r in self.named(name))

    async def add(
        self, job: dict[str, Any], every: float | None, cron: str | None, name: str | None, paused: bool
    ) -> ScheduleRecord:
        now = self.clock()
        rec = ScheduleRecord(
            id=uuidlib.uuid4().hex,
            job=job,
            every=every,
            cron=cron,
            name=name,
            paused=paused,
            created_at=now,
            next_run_at=None if paused else first(every, cron, now),
        )
        if name is not None:
            self._naming.add(name)  # a second create with it, while this one is written, is refused
        try:
            await self._save([rec])  # on disk before it exists: a schedule answered 201 survives a restart
        finally:
            self._naming.discard(name or "")
        self.schedules[rec.id] = rec
        self._changed.set()
        return rec

    async def update(self, rec: ScheduleRecord, changes: dict[str, Any]) -> ScheduleRecord:
        """Apply the PATCH fields given (paused, every, cron, name, job)."""
        now = self.clock()
        retimed = "every" in changes or "cron" in changes
        if retimed:
            rec.every, rec.cron = changes.get("every"), changes.get("cron")
        if "name" in changes:
            rec.name = changes["name"]
        if "job" in changes:
            rec.job = changes["job"]
        resumed = changes.get("paused") is False and rec.paused
        if "paused" in changes:
            rec.paused = bool(changes["paused"])
        if rec.paused:
            rec.next_run_at = None
        elif retimed or resumed or rec.next_run_at is None:
            rec.next_run_at = first(rec.every, rec.cron, now)  # a resumed schedule does not catch up
        renamed = changes.get("name")
        if renamed is not None:
            self._naming.add(renamed)
        try:
            await self._save([rec])
        finally:
            self._naming.discard(renamed or "")
        self._changed.set()
        return rec

    async def delete(self, rec: ScheduleRecord) -> None:
        self.schedules.pop(rec.id, None)  # first: it must not fire while the delete is written
        self._changed.set()
        async with self._writes:
            await self.backend.delete(rec.id)

    async def fetch(self, sid: str) -> ScheduleRecord | None:
        """A schedule by id: from memory, or (shared store) from the database if another replica just made it."""
        rec = self.schedules.get(sid)
        if rec is None:
            same = self.named(sid)
            if len(same) == 1:
                return same[0]
        if rec is None and self._shared is not None:
            for found in await self._shared.read([sid]):
                rec = self.schedules[found.id] = found
                self._changed.set()
        return rec

    def reload(self, ids: list[str] | None) -> None:
        """Another replica changed these schedules (None: maybe any): read them again (event loop)."""
        task = asyncio.ensure_future(self._reload(ids))
        self._reloads.add(task)
        task.add_done_callback(self._reloads.discard)

    async def _reload(self, ids: list[str] | None) -> None:
        try:
            if ids is None or self._shared is None:
                recs = await self.backend.load()
                self.schedules = {r.id: r for r in recs}
            else:
                recs = await self._shared.read(ids)
                found = {r.id: r for r in recs}
                for sid in ids:
                    if sid in found:
                        self.schedules[sid] = found[sid]
                    else:
                        self.schedules.pop(sid, None)  # deleted
        except Exception as exc:  # the database is away: the periodic resync catches up
            log.warning("api schedules: could not reload %s: %s", "all" if ids is None else ",".join(ids), exc)
            return
        for rec in recs:
            for job in rec.last_jobs:
                self.made.put(job, rec.id)
        self.made.shed()
        self._changed.set()

    def schedule_of(self, job_uuid: str) -> str | None:
        """The id of the schedule whose firing submitted this job, if one did (a dict lookup)."""
        return self.made.get(job_uuid)

    def jobs_of(self, schedule_id: str) -> list[str]:
        """The uuids of the jobs this schedule made that are still remembered, newest first."""
        return [u for u, sid in self.made.newest_items() if sid == schedule_id]

    # ---- the loop ------------------------------------------------------------------------------

    def _broker_wait(self) -> tuple[float, float] | None:
        """(hold time, check step) while the broker is silent; None when it answers."""
        st = self.state()
        if st is None or st.client.broker_alive:
            return None
        s = st.settings
        return s.keepalive_interval * s.keepalive_multiplier, s.keepalive_interval

    async def _run(self) -> None:
        while True:
            self._changed.clear()
            now = self.clock()
            due, recheck = plan(self.schedules.values(), now, self.started_at, self._broker_wait())
            if due and self._shared is not None:
                await self._fire_shared(self._shared, due, now)
            elif due:
                fired = [self.fire(r, now) for r in due]
                try:
                    await self._save(due, [f for f in fired if f is not None])
                except Exception:  # the loop must outlive a full disk; the schedules go on in memory
                    log.exception("api schedules: could not record %d firings", len(due))
            if self.shared and time.monotonic() >= self._resync_at:
                self._resync_at = time.monotonic() + RESYNC
                self.reload(None)  # a notification lost while the listener reconnected
            wake = next_wake(self.schedules.values(), now, recheck)
            delay = MAX_SLEEP if wake is None else min(max(0.0, wake - self.clock()), MAX_SLEEP)
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that lands as the event is set,
            # and stop() would wait on a loop that never ends.
            with suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._changed.wait()

    async def _fire_shared(self, backend: SharedScheduleBackend, due: list[ScheduleRecord], now: float) -> None:
        """Fire what this replica can claim of `due` (see the module's doc): claim and move on, then submit."""
        dues: dict[str, float] = {}

        def advance(recs: list[ScheduleRecord]) -> None:
            for r in recs:
                dues[r.id] = r.next_run_at if r.next_run_at is not None else now
                self._advance(r, now)

        backoff = CLAIM_BACKOFF
        try:
            claimed, passed = await backend.fire_claimed([r.id for r in due], now, advance)
            if self._claims_failing:
                self._claims_failing = False
                log.info("api schedules: the database answers again; due firings resume")
        except Exception as exc:  # no database, no firing: once it is back the slot fires once
            if not self._claims_failing:  # once per outage, not at every retry
                log.warning("api schedules: cannot claim %d due firings (retrying): %s", len(due), exc)
            self._claims_failing = True
            claimed, passed, backoff = [], [r.id for r in due], CLAIM_RETRY
        for sid in passed:
            rec = self.schedules.get(sid)
            if rec is not None and rec.next_run_at is not None and rec.next_run_at <= now:
                rec.next_run_at = now + backoff  # its notification brings the real time
        outcomes: list[tuple[str, bool, str | None]] = []
        fired: list[tuple[str, str, float]] = []
        for rec in claimed:
            row = self._submit(rec, now, dues.get(rec.id, now))
            outcomes.append((rec.id, row is not None, rec.last_error))
            if row is not None:
                fired.append(row)
            if rec.id in self.schedules:  # not deleted meanwhile (its notification may have come already)
                self.schedules[rec.id] = rec
        if outcomes:
            try:
                async with self._writes:
                    await backend.record_firings(outcomes, fired)
            except Exception:
                log.exception("api schedules: could not record %d firings", len(outcomes))

    @staticmethod
    def _advance(rec: ScheduleRecord, now: float) -> None:
        due = rec.next_run_at if rec.next_run_at is not None else now
        rec.next_run_at = following(rec.every, rec.cron, due, now)
        rec.last_run_at = now

    def fire(self, rec: ScheduleRecord, now: float) -> tuple[str, str, float] | None:
        """Submit the schedule's job (on the event loop, as POST /jobs does); the mapping row, or None if refused."""
        due = rec.next_run_at if rec.next_run_at is not None else now
        self._advance(rec, now)
        return self._submit(rec, now, due)

    def _submit(self, rec: ScheduleRecord, now: float, due: float) -> tuple[str, str, float] | None:
        st = self.state()
        outcome, row = "refused", None
        try:
            if st is None:
                raise ProblemError(503, "starting", "API starting", "the API is starting or stopping")
            req = JobRequest.model_validate(rec.job)
            # A template made before its task's declaration was known may give a secret: its job is
            # recorded with it redacted all the same (routes/schedules.py refuses such a schedule otherwise).
            kept = recorded_json(st, req, None) if st.schemas.secrets(req.service, req.task) else None
            made = submit_record(st, req, None, "", raw=kept)
            job = made.uuid
        except ProblemError as exc:
            rec.failures += 1
            rec.last_error = exc.detail
            log.warning("schedule %s: firing refused: %s", rec.id, exc.detail)
        except Exception as exc:  # a template an upgraded API no longer accepts, a bug: counted, not fatal
            rec.failures += 1
            rec.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("schedule %s: firing failed", rec.id)
        else:
            rec.runs += 1
            self._follow(rec.id, made)
            rec.last_jobs.append(job)
            self.made.put(job, rec.id)
            self.made.shed()
            outcome, row = "submitted", (job, rec.id, now)
        if self.metrics is not None:
            self.metrics.firings.labels(outcome).inc()
            self.metrics.delay.observe(max(0.0, now - due))
            if row is None:
                self.metrics.failures.labels("refused").inc()
        return row

    # ---- how the jobs it fired ended ------------------------------------------------------------

    def _follow(self, sid: str, made: JobRecord) -> None:
        """Count the job's end against its schedule when it comes (on the event loop)."""
        fut = made.live
        if fut is None:
            return
        loop = asyncio.get_running_loop()
        uuid = made.uuid

        def ended(_: object) -> None:
            # The API's client ends jobs on this loop's thread; call_soon_threadsafe serves any other.
            with suppress(RuntimeError):  # the loop has closed: nobody is left to count it
                loop.call_soon_threadsafe(self._ended, sid, uuid, made)

        fut.add_done_callback(ended)

    def _ended(self, sid: str, uuid: str, made: JobRecord) -> None:
        view = made.view(tracebacks=False)
        state, rec = view.state.value, self.schedules.get(sid)
        if rec is None:  # deleted meanwhile
            return
        if state == JobState.COMPLETED:
            if rec.last_error is None:
                return
            rec.last_error = None
            outcome: tuple[str, bool, str | None] | None = None
        elif state in FAILED_ENDS:
            rec.failures += 1
            why = view.reason or (view.error.message if view.error else "")
            rec.last_error = f"job {uuid} {state}" + (f": {why}" if why else "")
            outcome = (sid, False, rec.last_error)
            if self.metrics is not None:
                self.metrics.failures.labels(state).inc()
        else:  # cancelled: someone meant it
            return
        task = asyncio.ensure_future(self._record_end(rec, outcome))
        self._outcomes.add(task)
        task.add_done_callback(self._outcomes.discard)

    async def _record_end(self, rec: ScheduleRecord, outcome: tuple[str, bool, str | None] | None) -> None:
        try:
            if self._shared is None:
                await self._save([rec])
            elif outcome is not None:  # counted in the row, not written over it (other replicas fire it too)
                async with self._writes:
                    await self._shared.record_firings([outcome], [])
        except Exception as exc:  # the count stays in memory; the next write of the schedule carries it
            log.warning("api schedules: could not record how a job of schedule %s ended: %s", rec.id, exc)

    async def _save(self, recs: list[ScheduleRecord], fired: list[tuple[str, str, float]] | None = None) -> None:
        rows = [r.row() for r in recs]  # taken now, on the loop: what is written is this moment's state
        async with self._writes:
            await self.backend.save(rows, fired or [])
