"""Credit-based dispatch: the broker's job queue and what leaves it.

A worker holds at most its credits in jobs (pool size + prefetch, announced in READY); what no
worker can take now waits in its service's queue (jobqueue.py) until a credit frees, its delay
ends, or its deadline passes. Runs on the broker's owner thread; sends through the broker.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Container
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core import payloads, shmhandle
from ..core import protocol as nfp
from ..core.histogram import Histogram
from ..core.payloads import Word
from ..core.shmhandle import HandleError
from ..settings import Settings
from ..transport.shm import ShmArena
from .admission import Refusal, answer, bad
from .jobqueue import ANY, QueuedJob, Spot
from .limits import OVERFLOW, Bucket, Limiter
from .registry import Registry, Route, ServiceRecord, WorkerRecord

MAX_NOTICES = 100_000  # "queued" notices held for later; beyond it a client is told at once

if TYPE_CHECKING:
    from collections import Counter

log = logging.getLogger(__name__)

QUEUED_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600)

Reply = Callable[[bytes, bytes, bytes, bytes, Any], None]  # client, service, uuid, status, payload


class Dispatcher:
    """Queues, sends and expires jobs. `reply(client, service, uuid, status, payload)` answers
    a client; `send(frames)` sends raw frames (both owner-direct)."""

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        *,
        reply: Reply,
        send: Callable[[list[nfp.Frame]], None],
        counts: Counter[str],
        clock: Callable[[], float],
    ) -> None:
        self.reg = registry
        self.s = settings
        self.reply = reply
        self.send = send
        self.counts = counts
        self.clock = clock
        self.queued: dict[bytes, QueuedJob] = {}  # every waiting job by wire uuid (dedupe, cancel)
        self.queued_bytes = 0
        self.expiry: list[tuple[float, int, QueuedJob]] = []  # deadlines of waiting jobs
        self.route_expiry: list[tuple[float, bytes]] = []  # deadlines (+ grace) of dispatched jobs
        self.delays: list[tuple[float, int, QueuedJob]] = []  # ends of delays, across services
        self.directed: set[bytes] = set()  # identities of workers with parts waiting for their credits
        self.dirty: set[bytes] = set()  # services whose queue may move (a credit freed, a worker came)
        # Services whose queue's depth or bytes changed: the broker's loop publishes them, coalesced
        # (events.py tend_queues; emptied there, or it holds at most every service once).
        self.queue_changed: set[bytes] = set()
        # "queued" notices a client asked to have only if its job still waits by then: (due, seq,
        # job). Entries of jobs dispatched meanwhile go when due; past MAX_NOTICES, told at once.
        self.notices: list[tuple[float, int, QueuedJob]] = []
        # Services whose queue is paused (paused.py): their jobs are admitted and queued, never sent.
        self.paused: Container[bytes] = frozenset()
        self.shm: ShmArena | None = None  # reads a client's block for a worker that cannot map it
        # Tasks' rate and concurrency limits (limits.py); a route's end frees its job's slot.
        self.limits = Limiter(Path(settings.data_dir) / "broker")
        registry.on_drop = self._route_ended

    # ---- admission ---------------------------------------------------------------

    def admit(self, svc: ServiceRecord, job: QueuedJob, *, announce_now: bool = True) -> None:
        """Send the job now if a worker can take it and nothing waits ahead of it; else queue it."""
        now = self.clock()
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
                self._tell_queued(job)

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

    def _leave(self, svc: ServiceRecord, job: QueuedJob) -> None:
        if self.queued.pop(job.uuid, None) is not None:
            self.queued_bytes -= job.size
            if job.limit is not None:
                job.limit.queued -= 1
        svc.queue.leave(job)
        self.queue_changed.add(svc.name)

    def _tell_queued(self, job: QueuedJob) -> None:
        job.told_queued = True
        depth = self.reg.services[job.service].queue.depth if job.service in self.reg.services else 0
        self.reply(job.client, job.service, job.uuid, nfp.ST_QUEUED, answer(job, Word.QUEUED, depth=depth))

    def tell_waiting(self, now: float) -> None:
        """Notices that came due: jobs still waiting are told "queued"."""
        while self.notices and self.notices[0][0] <= now:
            job = heapq.heappop(self.notices)[2]
            if not job.told_queued and job.spot is not Spot.GONE and self.queued.get(job.uuid) is job:
                self._tell_queued(job)

    def requeued(self, job: QueuedJob) -> None:
        """A POST repeated for a job that waits: the same answer again (none yet for a job whose
        service no worker has confirmed while the broker starts)."""
        self.counts["post_retried"] += 1
        if job.announce and job.told_queued:
            self._tell_queued(job)

    # ---- sending -----------------------------------------------------------------

    def _post(self, w: WorkerRecord, job: QueuedJob, now: float, body: nfp.Frame | None = None) -> None:
        if body is None:
            body = job.body
            if job.shm and w.host != job.host:
                read = self._shm_bytes(job)  # a part for a worker on another host (or a NorFab one): bytes
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

    def check_handle(self, job: QueuedJob) -> None:
        """A POST whose body is a handle: refused (400, counted `shm_refused`) when it is malformed or
        claims more than a message may carry, before anything is read. The broker forwards handles
        unread; it reads one only for a worker that cannot take it (_shm_bytes), within this bound."""
        try:
            shmhandle.check_claim(job.body, self.s.max_message_bytes)
        except HandleError as exc:
            self.counts["shm_refused"] += 1
            raise bad(exc.detail) from None

    def _shm_bytes(self, job: QueuedJob) -> nfp.Frame | str:
        """The body a client's handle names, read here (the broker is on the client's host, or the
        client would not have sent one) for a worker that cannot take a handle: copied with pread
        (transport/shm.py), so a block cut meanwhile reads short instead of faulting, and only a
        block of the broker's own user, within ZFAB_MAX_MESSAGE_BYTES. For an unreadable block, why
        (counted `shm_unreadable`)."""
        if self.shm is None:
            return job.body
        try:
            body: nfp.Frame = self.shm.read(job.body)
            attempt = shmhandle.decode_handle(job.body).attempt
            if attempt > 1:  # a retried job: its block's body says attempt 1
                body = payloads.with_attempt(bytes(body), attempt)
        except HandleError as exc:
            self.counts["shm_unreadable"] += 1
            n = self.counts["shm_unreadable"]
            if n <= 3 or n % 1000 == 0:  # a peer sending bad handles cannot flood the log
                log.warning("broker: the body of job %r cannot be read from shared memory: %s", job.uuid[:64], exc)
            return exc.detail
        self.counts["shm_materialized"] += 1
        return body

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
            read = self._shm_bytes(job)  # a worker on another host (or a NorFab one) gets the bytes
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
            self._leave(svc, job)
        job.spot = Spot.GONE
        why = f"the broker could not read the job's body from shared memory for worker {w.label}: {why}"
        self.reply(job.client, job.service, job.uuid, nfp.ST_BAD_REQUEST, answer(job, Word.FAILED, why))

    def _fan_out(self, svc: ServiceRecord, job: QueuedJob, workers: list[WorkerRecord], now: float) -> None:
        """A job for `all`, a name or a list: every worker gets its part, now or when it has a credit."""
        body: nfp.Frame | None = None  # bytes for the workers that take no handle, read once
        if job.shm and (other := next((w for w in workers if w.host != job.host and w.free > 0), None)):
            read = self._shm_bytes(job)
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
            self._leave(svc, job)

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

    # ---- moving the queue ----------------------------------------------------------

    def pump(self) -> None:
        """Send what the freed credits allow, for every service marked dirty."""
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
        opened = self._open_buckets(svc.name, now)
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
            self._leave(svc, job)
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

    def _route_ended(self, route: Route) -> None:
        """A dispatched job ended (or went back to the queue): its limit's slot is free again."""
        job = route.job
        if job is not None and job.limit is not None:
            self.limits.finished(job.limit)
            if job.limit.top() is not None:
                self.dirty.add(job.service)

    def relimit(self, service: bytes, task: str) -> None:
        """A task's limit was set or cleared: buckets with the same key take the new numbers; the
        jobs waiting in others are placed again, under the new rule or none."""
        svc = self.reg.services.get(service)
        rule = self.limits.rule(service, task, svc.tasks if svc is not None else None)
        waiting: list[QueuedJob] = []
        stale: set[Bucket] = set()
        for b in self.limits.of_task(service, task):
            if rule is not None and rule.key == b.rule.key:
                b.rule = rule
                continue
            stale.add(b)
            while (job := b.pop()) is not None:
                waiting.append(job)
        now = self.clock()
        # Delayed jobs hold their bucket too: they enter the new one when their delay ends.
        delayed = [j for j in svc.queue.waiting.values() if j.spot is Spot.DELAYED and j.limit in stale] if svc else []
        schema = (svc.tasks or {}).get(task) if svc else None
        for job in waiting + delayed:
            if job.uuid in self.queued:
                job.limit.queued -= 1
            job.limit = None
            if rule is not None:
                job.limit = self.limits.bucket_for(job, rule, schema, now)
                if job.uuid in self.queued:
                    job.limit.queued += 1
            if svc is not None and job.spot is not Spot.DELAYED:
                svc.queue.place(job, now)
        if svc is not None:
            self.dirty.add(service)

    def resumed(self, name: bytes) -> None:
        """A paused queue resumes: its jobs go as credits allow, from the next pump."""
        svc = self.reg.services.get(name)
        if svc is not None:
            svc.roster_changed = True  # jobs parked for named workers (or `all`) are looked at again
            self.dirty.add(name)

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
            self._leave(svc, job)

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

    def worker_lost(self, svc: ServiceRecord | None, w: WorkerRecord) -> dict[bytes, bytes]:
        """The worker is gone: its parts that never left the queue end with it (they named it).
        Returns them as uuid -> client, like the jobs it had in flight."""
        lost: dict[bytes, bytes] = {}
        self.directed.discard(w.ident)
        while w.directed:
            job = heapq.heappop(w.directed)[2]
            if job.spot is not Spot.DIRECTED:
                continue
            job.parts_waiting -= 1
            if job.parts_waiting <= 0 and svc is not None:
                self._leave(svc, job)
            route = self.reg.routes.get(job.uuid)
            if route is not None:
                route.workers.discard(w.name)
                if not route.workers:
                    self.reg.drop_route(job.uuid)
            lost[job.uuid] = job.client
        return lost

    # ---- cancel and expiry ------------------------------------------------------------

    def cancel(self, job: QueuedJob) -> None:
        """DELETE of a waiting job: it leaves the queue now and never runs."""
        svc = self.reg.services.get(job.service)
        if svc is not None:
            self._leave(svc, job)
        job.spot = Spot.GONE
        self.counts["cancelled_in_queue"] += 1
        self.reply(
            job.client, job.service, job.uuid, nfp.ST_CANCELLED, answer(job, Word.CANCELLED, "cancelled while queued")
        )

    def cancel_quietly(self, job: QueuedJob) -> None:
        """The job leaves the queue; the caller answers the client."""
        svc = self.reg.services.get(job.service)
        if svc is not None:
            self._leave(svc, job)
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
                self._tell_queued(job)

    def expire(self, now: float) -> None:
        while self.expiry and self.expiry[0][0] <= now:
            job = heapq.heappop(self.expiry)[2]
            if job.spot is Spot.GONE or job.uuid not in self.queued:
                continue
            svc = self.reg.services.get(job.service)
            if job.spot is Spot.DIRECTED:
                self._expire_parts(job, now)
            else:
                why = f"deadline of {job.timeout:g} s passed while the job waited in the queue: no worker took it"
                self.reply(job.client, job.service, job.uuid, nfp.ST_EXPIRED, answer(job, Word.EXPIRED, why))
            if svc is not None:
                svc.expired_queue += 1
                self._leave(svc, job)
            job.spot = Spot.GONE
            self.counts["expired_in_queue"] += 1
        while self.route_expiry and self.route_expiry[0][0] <= now:
            deadline, uuid = heapq.heappop(self.route_expiry)
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
            self.dirty.add(svc.name)
        self.counts["expired_in_flight"] += 1

    def next_deadline(self) -> float | None:
        """The earliest expiry or end of a delay (heap tops only: this runs on every loop turn)."""
        out: float | None = None
        for heap in (self.expiry, self.delays, self.notices):
            while heap and heap[0][2].spot is Spot.GONE:
                heapq.heappop(heap)
            if heap:
                out = heap[0][0] if out is None else min(out, heap[0][0])
        if self.route_expiry:
            out = self.route_expiry[0][0] if out is None else min(out, self.route_expiry[0][0])
        if self.limits.timers:
            opens = self.limits.next_deadline()
            if opens is not None:
                out = opens if out is None else min(out, opens)
        return out

    def due(self, now: float) -> None:
        """Mark services whose delayed jobs are due, so the next pump moves them."""
        while self.delays and self.delays[0][0] <= now:
            job = heapq.heappop(self.delays)[2]
            if job.spot is Spot.DELAYED:
                self.dirty.add(job.service)
        if self.limits.timers:
            self.dirty |= self.limits.due(now)
