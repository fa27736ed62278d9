"""Credit-based dispatch: the broker's job queue and what leaves it (admit, pump, fan-out, busy).

A worker holds at most its credits in jobs (pool size + prefetch, announced in READY); what no
worker can take now waits in its service's queue (jobqueue.py) until a credit frees, its delay
ends, or its deadline passes (deadlines.py reads the heaps kept here). Runs on the broker's owner
thread; sends through the Outbox it is given (outbox.py), never through its owner.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

from ..core import payloads
from ..core import protocol as nfp
from ..core.histogram import Histogram
from ..core.payloads import Word
from ..settings import Settings
from .admission import Refusal, answer
from .jobqueue import ANY, QueuedJob, Spot
from .limits import OVERFLOW, Bucket, Limiter
from .outbox import Outbox
from .registry import Registry, Route, ServiceRecord, WorkerRecord
from .shmbody import ShmBodies

MAX_NOTICES = 100_000  # "queued" notices held for later; beyond it a client is told at once

if TYPE_CHECKING:
    from collections import Counter

log = logging.getLogger(__name__)

QUEUED_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600)


class Dispatch:
    """Admits, queues and sends jobs as credits allow. What it sends goes through `out` (owner-direct)."""

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        *,
        out: Outbox,
        counts: Counter[str],
        clock: Callable[[], float],
        paused: Container[bytes],
        shm: ShmBodies,
        limits: Limiter,
        queue_changed: set[bytes],
    ) -> None:
        self.reg = registry
        self.s = settings
        self.out = out
        self.reply = out.reply
        self.send = out.send
        self.counts = counts
        self.clock = clock
        self.queued: dict[bytes, QueuedJob] = {}  # every waiting job by wire uuid (dedupe, cancel)
        self.queued_bytes = 0
        self.expiry: list[tuple[float, int, QueuedJob]] = []  # deadlines of waiting jobs
        self.route_expiry: list[tuple[float, bytes]] = []  # deadlines (+ grace) of dispatched jobs
        self.delays: list[tuple[float, int, QueuedJob]] = []  # ends of delays, across services
        self.directed: set[bytes] = set()  # identities of workers with parts waiting for their credits
        self.dirty: set[bytes] = set()  # services whose queue may move (a credit freed, a worker came)
        self.queue_changed = queue_changed  # services whose queue changed (queueevents.py publishes them)
        # "queued" notices a client asked to have only if its job still waits by then: (due, seq,
        # job). Entries of jobs dispatched meanwhile go when due; past MAX_NOTICES, told at once.
        self.notices: list[tuple[float, int, QueuedJob]] = []
        self.paused = paused  # services whose jobs are admitted and queued, never sent (paused.py)
        self.shm = shm  # reads a client's block for a worker that cannot map it (shmbody.py)
        self.limits = limits  # tasks' rate and concurrency limits: a route's end frees a slot (free_limits)

    def admit(self, svc: ServiceRecord, job: QueuedJob, *, announce_now: bool = True) -> None:
        """Send the job now if a worker can take it and nothing waits ahead of it; else queue it."""
        now = self.clock()
        if self.reg.freed:
            self.free_limits()
        if self.queued_bytes + self.reg.held_bytes + job.size > self.s.broker_queue_bytes:
            # A job sent at once is held too (until it starts, or ends): the bound is on both.
            raise Refusal(
                nfp.ST_BUSY,
                Word.BUSY,
                f"the broker holds {self.queued_bytes} bytes of queued and {self.reg.held_bytes} of dispatched "
                f"request bodies, of {self.s.broker_queue_bytes}; retry later",
                retry_after=self._retry_hint(svc),
            )
        if job.kind == ANY:
            rule = self.limits.rule(svc.name, job.task, svc.tasks)
            if rule is not None:
                job.limit = self.limits.bucket_for(job, rule, (svc.tasks or {}).get(job.task), now)
                if job.limit.key == OVERFLOW:
                    self.counts["limit_overflow"] += 1  # the table is full: it shares its task's bucket
        if job.not_before <= now and len(self.reg.routes) < self.reg.max_routes and svc.name not in self.paused:
            if job.kind == ANY:
                b = job.limit
                if svc.queue.peek_ready() is None and (b is None or (b.top() is None and b.open(now))):
                    w = self.reg.least_loaded(svc)
                    if w is not None:
                        self._send_any(svc, job, w, now)
                        return
            else:
                workers = self.reg.resolve(svc, job.names)
                if workers:
                    if any(w.free <= 0 for w in workers):
                        self._check_room(svc, job)
                    self._fan_out(svc, job, workers, now)
                    return
        self._check_room(svc, job)
        self._enqueue(svc, job, now)
        if job.announce and announce_now:
            if job.notice > 0 and len(self.notices) < MAX_NOTICES:
                # A job dispatched within its notice costs its client no 301 (and, with ack
                # false, no 202 either): under a pipelined load nearly every job queues briefly.
                heapq.heappush(self.notices, (now + job.notice, job.seq, job))
            else:
                self.tell_queued(job)

    def _check_room(self, svc: ServiceRecord, job: QueuedJob) -> None:
        if svc.queue.depth >= self.s.service_queue_size:
            raise Refusal(
                nfp.ST_BUSY,
                Word.BUSY,
                f"the queue of service '{svc.label}' is full ({self.s.service_queue_size} jobs); retry later",
                retry_after=self._retry_hint(svc),
            )

    def _retry_hint(self, svc: ServiceRecord) -> float:
        # Seconds until room is likely: the rate the service dispatches at is not tracked, so a
        # bounded guess that grows with the backlog's age keeps clients from hammering.
        return float(min(30, max(1, round(svc.queue.oldest_age(self.clock()) / 10))))

    def _enqueue(self, svc: ServiceRecord, job: QueuedJob, now: float) -> None:
        svc.queue.add(job, now)
        self.queue_changed.add(svc.name)
        if job.limit is not None:
            if job.uuid not in self.queued:
                job.limit.queued += 1  # its bucket lives while it waits, delayed or held (limits.py)
            self.limits.arm(job.limit, now)  # its rate lets the next start then: wake for it
        self.queued[job.uuid] = job
        self.queued_bytes += job.size
        heapq.heappush(self.expiry, (job.deadline, job.seq, job))
        if job.not_before > now:
            heapq.heappush(self.delays, (job.not_before, job.seq, job))
        self.counts["queued"] += 1

    def leave(self, svc: ServiceRecord, job: QueuedJob) -> None:
        if self.queued.pop(job.uuid, None) is not None:
            self.queued_bytes -= job.size
            if job.limit is not None:
                job.limit.queued -= 1
        svc.queue.leave(job)
        self.queue_changed.add(svc.name)

    def tell_queued(self, job: QueuedJob) -> None:
        job.told_queued = True
        depth = self.reg.services[job.service].queue.depth if job.service in self.reg.services else 0
        self.reply(job.client, job.service, job.uuid, nfp.ST_QUEUED, answer(job, Word.QUEUED, depth=depth))

    def requeued(self, job: QueuedJob) -> None:
        """A POST repeated for a job that waits: the same answer again (none yet for a job whose
        service no worker has confirmed while the broker starts)."""
        self.counts["post_retried"] += 1
        if job.announce and job.told_queued:
            self.tell_queued(job)

    def _post(self, w: WorkerRecord, job: QueuedJob, now: float, body: nfp.Frame | None = None) -> None:
        if body is None:
            body = job.body
            if job.shm and w.host != job.host:
                read = self.shm.read(job)  # a part for a worker on another host (or a NorFab one): bytes
                if not isinstance(read, str):  # (unreadable: the handle, which its worker refuses with a reason)
                    body = read
        frames = nfp.broker_job(w.ident, nfp.POST, job.client, job.uuid, body)
        job.sent_at = now  # the hop trace's end of broker_queue, start of broker_wait
        if job.kind != ANY:
            if job.parts_sent is None:
                job.parts_sent = {}
            job.parts_sent[w.name] = now
        if w.v2:
            # zfab workers learn what is left of the deadline (time queued is spent) and how long
            # the job waited here (their wait-time histogram), and the submitter's trace context.
            meta: dict[str, Any] = {
                "deadline": round(max(0.0, job.deadline - now), 3),
                "queued": round(now - job.queued_at, 6),
            }
            if job.trace is not None:
                meta.update(job.trace)
            if job.host is not None and job.host == w.host:
                meta["host"] = job.host  # client and worker share shared memory: a large result may too
            frames.append(nfp.dumps(meta))
        self.send(frames)

    def _dispatched(self, job: QueuedJob, workers: list[WorkerRecord]) -> None:
        body = payloads.dispatched(job.uuid, job.target, job.service, [w.label for w in workers])
        self.reply(job.client, job.service, job.uuid, nfp.ST_DISPATCHED, body)

    def _observe_queued(self, svc: ServiceRecord, job: QueuedJob, now: float) -> None:
        h = svc.queued_seconds
        if h is None:
            h = svc.queued_seconds = Histogram(QUEUED_BUCKETS)
        h.observe(max(0.0, now - job.queued_at - max(0.0, job.not_before - job.queued_at)))

    def _route(self, job: QueuedJob, workers: list[WorkerRecord]) -> Route:
        deadline = job.deadline + self.s.route_grace
        heapq.heappush(self.route_expiry, (deadline, job.uuid))
        return self.reg.add_route(job, workers, deadline)

    def _send_any(self, svc: ServiceRecord, job: QueuedJob, w: WorkerRecord, now: float) -> None:
        body: nfp.Frame | None = None
        if job.shm and w.host != job.host:
            read = self.shm.read(job)  # a worker on another host (or a NorFab one) gets the bytes
            if isinstance(read, str):
                self._unreadable(svc, job, w, read)
                return
            body = read
        if job.limit is not None:
            job.limit.started(now)
        route = self._route(job, [w])
        if body is not None:
            # The bytes read from the block count against the broker's byte bound like a body sent
            # as bytes, until the worker starts the job (let_go) or it ends.
            route.held += len(body)
            self.reg.held_bytes += len(body)
        # Without a 202 a client can only wait for one worker, so ack=false skips it; a client told
        # "queued" learns the dispatch either way.
        if job.ack or job.told_queued:
            self._dispatched(job, [w])
        self.reg.send_to(svc, w, job.uuid, job.client)
        self._post(w, job, now, body)
        self._observe_queued(svc, job, now)
        self.counts["post"] += 1

    def _unreadable(self, svc: ServiceRecord, job: QueuedJob, w: WorkerRecord, why: str) -> None:
        """A job whose body the broker must send as bytes and cannot read from the client's block
        (gone, cut, another user's): it fails here, before any part is sent, with the reason, rather
        than reach a worker as a handle it cannot take."""
        if job.uuid in self.queued:
            self.leave(svc, job)
        job.spot = Spot.GONE
        why = f"the broker could not read the job's body from shared memory for worker {w.label}: {why}"
        self.reply(job.client, job.service, job.uuid, nfp.ST_BAD_REQUEST, answer(job, Word.FAILED, why))

    def _fan_out(self, svc: ServiceRecord, job: QueuedJob, workers: list[WorkerRecord], now: float) -> None:
        """A job for `all`, a name or a list: every worker gets its part, now or when it has a credit."""
        body: nfp.Frame | None = None  # bytes for the workers that take no handle, read once
        if job.shm and (other := next((w for w in workers if w.host != job.host and w.free > 0), None)):
            read = self.shm.read(job)
            if isinstance(read, str):
                self._unreadable(svc, job, other, read)
                return
            body = read
        job.workers = [w.name for w in workers]
        self._route(job, workers)
        if job.ack or len(workers) > 1:
            self._dispatched(job, workers)  # NorFab's order: the 202 before the POSTs it announces
        waiting = 0
        for w in workers:
            if w.free > 0:
                self.reg.send_to(svc, w, job.uuid, job.client)
                self._post(w, job, now, body if w.host != job.host else None)
            else:
                heapq.heappush(w.directed, (-job.priority, job.seq, job))
                self.directed.add(w.ident)
                waiting += 1
        self._observe_queued(svc, job, now)
        self.counts["post"] += 1
        if waiting:
            job.parts_waiting = waiting
            self._hold(svc, job)
        elif job.uuid in self.queued:
            self.leave(svc, job)

    def send_across(self, job: QueuedJob, workers: list[WorkerRecord]) -> None:
        """A job of NorFab's `all` pseudo-service: every worker picked gets it now, credits or not,
        as NorFab's broker sends it (the 202 first, naming them all)."""
        now = self.clock()
        job.workers = [w.name for w in workers]
        self._route(job, workers)
        self._dispatched(job, workers)
        for w in workers:
            svc = self.reg.services.get(w.service)
            if svc is not None:
                self.reg.send_to(svc, w, job.uuid, job.client)
            self._post(w, job, now)
        self.counts["post_across"] += 1

    def _hold(self, svc: ServiceRecord, job: QueuedJob) -> None:
        """Keep a fanned-out job in the queue's count (and deadline) while parts of it wait for credits."""
        if job.uuid not in self.queued:
            self.queued[job.uuid] = job
            self.queued_bytes += job.size
            heapq.heappush(self.expiry, (job.deadline, job.seq, job))
        svc.queue.hold(job)
        self.queue_changed.add(svc.name)

    def pump(self) -> None:
        """Send what the freed credits allow, for every service marked dirty."""
        if self.reg.freed:
            self.free_limits()
        dirty, self.dirty = self.dirty, set()
        now = self.clock()
        for name in dirty:
            svc = self.reg.services.get(name)
            if svc is not None:
                self._pump(svc, now)

    def _pump(self, svc: ServiceRecord, now: float) -> None:
        if svc.name in self.paused:
            return  # resume() marks it dirty (and its parked jobs as free to go) again
        # Parts for named workers go first: they can go nowhere else.
        for ident in [i for i in self.directed if i in svc.workers]:
            named = svc.workers[ident]
            while named.directed and named.free > 0:
                self._send_part(svc, named, heapq.heappop(named.directed)[2], now)
            if not named.directed:
                self.directed.discard(ident)
        for due in svc.queue.due(now):
            if due.kind != ANY:
                self.unpark(svc, due, now)
        if svc.roster_changed:  # a worker came: jobs waiting for it (or for any worker, `all`) may go
            svc.roster_changed = False
            for parked in list(svc.queue.parked.values()):
                self.unpark(svc, parked, now)
        q = svc.queue
        opened = self._open_buckets(svc.name, now) if self.limits.buckets else []
        while len(self.reg.routes) < self.reg.max_routes:
            job = q.peek_ready()
            b = None
            while opened:  # the best open bucket's first job, if it goes before the ready heap's
                top = opened[0][1].top()
                if top is None:
                    heapq.heappop(opened)  # its jobs left (expired, cancelled) meanwhile
                elif top.key() != opened[0][0]:
                    heapq.heapreplace(opened, (top.key(), opened[0][1]))
                else:
                    if job is None or top.key() < job.key():
                        b, job = opened[0][1], top
                    break
            if job is None:
                break
            w = self.reg.least_loaded(svc)
            if w is None:
                break
            if b is None:
                q.pop_ready()
            else:
                b.pop()
            self.leave(svc, job)
            self._send_any(svc, job, w, now)
            if b is not None:
                top = b.top()
                if top is not None and b.open(now):
                    heapq.heapreplace(opened, (top.key(), b))
                else:
                    heapq.heappop(opened)
                    if top is not None:
                        self.limits.arm(b, now)

    def _open_buckets(self, service: bytes, now: float) -> list[tuple[tuple[int, int], Bucket]]:
        """The service's limit buckets that have a job waiting and may start one now, as a heap by
        their first job's order; those the rate closes are armed to be looked at when it opens."""
        out: list[tuple[tuple[int, int], Bucket]] = []
        for b in self.limits.of_service(service):
            top = b.top()
            if top is None:
                continue
            if b.open(now):
                out.append((top.key(), b))
            else:
                self.limits.arm(b, now)
        heapq.heapify(out)
        return out

    def free_limits(self) -> None:
        """Dispatched jobs ended (or went back to the queue): the limit slots the registry says their
        routes held are free again (Registry.drop_route returns them as data, in `freed`)."""
        freed, self.reg.freed = self.reg.freed, []
        for b in freed:
            self.limits.finished(b)
            if b.top() is not None:
                self.dirty.add(b.service)

    def unpark(self, svc: ServiceRecord, job: QueuedJob, now: float) -> None:
        workers = self.reg.resolve(svc, job.names)
        if workers:
            svc.queue.unpark(job)
            self._fan_out(svc, job, workers, now)

    def _send_part(self, svc: ServiceRecord, w: WorkerRecord, job: QueuedJob, now: float) -> None:
        if job.spot is not Spot.DIRECTED:
            return  # expired or cancelled while it waited
        self.reg.send_to(svc, w, job.uuid, job.client)
        self._post(w, job, now)
        job.parts_waiting -= 1
        if job.parts_waiting <= 0:
            self.leave(svc, job)

    def busy(self, svc: ServiceRecord, w: WorkerRecord, uuid: bytes) -> bool:
        """The worker answered 503 for a job it was sent: it had no room after all. Hold back its
        credit until its next report and put the job back in front. True when handled here."""
        route = self.reg.routes.get(uuid)
        if uuid not in w.inflight or route is None or route.job is None or route.started:
            return False  # (after its 201 the job has no body to send again: the 503 goes to the client)
        self.reg.release(w, uuid)
        w.throttle = max(0, w.credits - len(w.inflight))
        self.reg.set_level(svc, w)
        job = route.job
        self.counts["worker_busy"] += 1
        now = self.clock()
        if job.kind == ANY:
            route.workers.discard(w.name)
            if not route.workers:
                self.reg.drop_route(uuid)
            job.not_before = 0.0
            self._enqueue(svc, job, now)
        else:
            heapq.heappush(w.directed, (-job.priority, job.seq, job))
            self.directed.add(w.ident)
            job.parts_waiting += 1
            self._hold(svc, job)
        self.dirty.add(svc.name)
        return True

    def started(self, route: Route, w: WorkerRecord) -> None:
        """The job's one worker started it (201). A busy answer, the only reason to send the body
        again (above), comes before the 201, never after: so a running job holds no body here (nor a
        view pinning ZeroMQ's message) for as long as it runs. The job stays, for the owner checks
        of GET and DELETE."""
        job = route.job
        if job is not None and job.kind == ANY and w.name in route.workers:
            job.body = b""
            self.reg.let_go(route)
