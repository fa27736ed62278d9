"""Deadlines at the broker: what happens when time passes (expiry, notices, delays) or a client cancels.

A waiting job past its deadline is answered `expired` and never dispatched afterwards; a dispatched
one with no final answer within its deadline and ZFAB_ROUTE_GRACE frees its slots, its outcome
unknown. A "queued" notice held for later goes out if its job still waits when it is due. DELETE
of a waiting job takes it out of the queue. The heaps are the dispatcher's (dispatch.py keeps them
as it queues and sends); this module reads and pops them. Runs on the broker's owner thread.
"""

from __future__ import annotations

import heapq
from collections import Counter

from ..core import payloads
from ..core import protocol as nfp
from ..core.payloads import Word
from ..settings import Settings
from .admission import answer
from .dispatch import Dispatch
from .jobqueue import QueuedJob, Spot
from .outbox import Outbox
from .registry import Registry, Route, ServiceRecord, WorkerRecord


class Deadlines:
    """Expiry, held notices, delays that end, and cancels, over the dispatcher's queue."""

    def __init__(
        self, dispatch: Dispatch, registry: Registry, settings: Settings, *, out: Outbox, counts: Counter[str]
    ) -> None:
        self.d = dispatch
        self.reg = registry
        self.s = settings
        self.reply = out.reply
        self.counts = counts

    def tend(self, now: float) -> None:
        """A timer pass (every turn of the loop): expiries, delays that ended, notices that came due,
        each looked at only when the top of its heap is due."""
        d = self.d
        if (d.expiry and d.expiry[0][0] <= now) or (d.route_expiry and d.route_expiry[0][0] <= now):
            self.expire(now)
        if (d.delays and d.delays[0][0] <= now) or d.limits.timers:
            self.due(now)
        if d.notices and d.notices[0][0] <= now:
            self.tell_waiting(now)

    def tell_waiting(self, now: float) -> None:
        """Notices that came due: jobs still waiting are told "queued"."""
        while self.d.notices and self.d.notices[0][0] <= now:
            job = heapq.heappop(self.d.notices)[2]
            if not job.told_queued and job.spot is not Spot.GONE and self.d.queued.get(job.uuid) is job:
                self.d.tell_queued(job)

    def cancel(self, job: QueuedJob) -> None:
        """DELETE of a waiting job: it leaves the queue now and never runs."""
        svc = self.reg.services.get(job.service)
        if svc is not None:
            self.d.leave(svc, job)
        job.spot = Spot.GONE
        self.counts["cancelled_in_queue"] += 1
        self.reply(
            job.client, job.service, job.uuid, nfp.ST_CANCELLED, answer(job, Word.CANCELLED, "cancelled while queued")
        )

    def cancel_quietly(self, job: QueuedJob) -> None:
        """The job leaves the queue; the caller answers the client."""
        svc = self.reg.services.get(job.service)
        if svc is not None:
            self.d.leave(svc, job)
        job.spot = Spot.GONE

    def cancel_parts(self, job: QueuedJob) -> None:
        """DELETE of a fanned-out job: its parts still waiting never go out; the sent ones are
        asked of their workers by the caller."""
        route = self.reg.routes.get(job.uuid)
        if route is not None:
            for name in list(route.workers):
                w = self.reg.by_name.get(name)
                if w is not None and job.uuid in w.inflight:
                    continue
                route.workers.discard(name)
                body = payloads.lost(
                    name.decode(errors="replace"), job.uuid, job.service, "cancelled while queued", Word.CANCELLED
                )
                self.reply(job.client, job.service, job.uuid, nfp.ST_CANCELLED, body)
            if not route.workers:
                self.reg.drop_route(job.uuid)
        self.cancel_quietly(job)

    def announce_waiting(self, svc: ServiceRecord) -> None:
        """A service a worker just confirmed: its jobs held without an answer are told "queued"."""
        for job in list(svc.queue.waiting.values()):
            if job.announce and not job.told_queued:
                self.d.tell_queued(job)

    def expire(self, now: float) -> None:
        while self.d.expiry and self.d.expiry[0][0] <= now:
            job = heapq.heappop(self.d.expiry)[2]
            if job.spot is Spot.GONE or job.uuid not in self.d.queued:
                continue
            svc = self.reg.services.get(job.service)
            if job.spot is Spot.DIRECTED:
                self._expire_parts(job, now)
            else:
                why = f"deadline of {job.timeout:g} s passed while the job waited in the queue: no worker took it"
                self.reply(job.client, job.service, job.uuid, nfp.ST_EXPIRED, answer(job, Word.EXPIRED, why))
            if svc is not None:
                svc.expired_queue += 1
                self.d.leave(svc, job)
            job.spot = Spot.GONE
            self.counts["expired_in_queue"] += 1
        while self.d.route_expiry and self.d.route_expiry[0][0] <= now:
            deadline, uuid = heapq.heappop(self.d.route_expiry)
            route = self.reg.routes.get(uuid)
            if route is None or route.deadline != deadline:
                continue
            self._expire_route(route)

    def _expire_parts(self, job: QueuedJob, now: float) -> None:
        """A fanned-out job whose deadline passed with parts still waiting: those workers never got it."""
        route = self.reg.routes.get(job.uuid)
        if route is None:
            return
        for name in list(route.workers):
            w = self.reg.by_name.get(name)
            if w is not None and job.uuid in w.inflight:
                continue  # that part was sent: its worker answers, or the route's own deadline ends it
            route.workers.discard(name)
            why = (
                f"deadline of {job.timeout:g} s passed before worker '{name.decode(errors='replace')}' had room for it"
            )
            body = payloads.lost(name.decode(errors="replace"), job.uuid, job.service, why, Word.EXPIRED)
            self.reply(job.client, job.service, job.uuid, nfp.ST_EXPIRED, body)
        if not route.workers:
            self.reg.drop_route(job.uuid)

    def _expire_route(self, route: Route) -> None:
        """No final answer within the deadline and the grace: free the slots; the outcome is unknown."""
        svc = self.reg.services.get(route.service)
        for name in list(route.workers):
            w = self.reg.by_name.get(name)
            if w is not None:
                self.reg.release(w, route.uuid)
            label = name.decode(errors="replace")
            why = (
                f"no answer from worker '{label}' within the job's deadline and a grace of {self.s.route_grace:g} s;"
                " its outcome is unknown"
            )
            body = payloads.lost(label, route.uuid, route.service, why, Word.EXPIRED)
            self.reply(route.client, route.service, route.uuid, nfp.ST_EXPIRED, body)
        self.reg.drop_route(route.uuid)
        if svc is not None:
            svc.expired_worker += 1
            self.d.dirty.add(svc.name)
        self.counts["expired_in_flight"] += 1

    def next_deadline(self) -> float | None:
        """The earliest expiry or end of a delay (heap tops only: this runs on every loop turn)."""
        out: float | None = None
        for heap in (self.d.expiry, self.d.delays, self.d.notices):
            while heap and heap[0][2].spot is Spot.GONE:
                heapq.heappop(heap)
            if heap:
                out = heap[0][0] if out is None else min(out, heap[0][0])
        if self.d.route_expiry:
            out = self.d.route_expiry[0][0] if out is None else min(out, self.d.route_expiry[0][0])
        if self.d.limits.timers:
            opens = self.d.limits.next_deadline()
            if opens is not None:
                out = opens if out is None else min(out, opens)
        return out

    def due(self, now: float) -> None:
        """Mark services whose delayed jobs are due, so the next pump moves them."""
        while self.d.delays and self.d.delays[0][0] <= now:
            job = heapq.heappop(self.d.delays)[2]
            if job.spot is Spot.DELAYED:
                self.d.dirty.add(job.service)
        if self.d.limits.timers:
            self.d.dirty |= self.d.limits.due(now)

    def parts_lost(self, svc: ServiceRecord | None, w: WorkerRecord) -> dict[bytes, bytes]:
        """The worker is gone: its parts that never left the queue end with it (they named it).
        Returns them as uuid -> client, like the jobs it had in flight."""
        lost: dict[bytes, bytes] = {}
        self.d.directed.discard(w.ident)
        while w.directed:
            job = heapq.heappop(w.directed)[2]
            if job.spot is not Spot.DIRECTED:
                continue
            job.parts_waiting -= 1
            if job.parts_waiting <= 0 and svc is not None:
                self.d.leave(svc, job)
            route = self.reg.routes.get(job.uuid)
            if route is not None:
                route.workers.discard(w.name)
                if not route.workers:
                    self.reg.drop_route(job.uuid)
            lost[job.uuid] = job.client
        return lost
