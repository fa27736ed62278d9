"""The broker's tables: workers, services, clients and job routes, with the routing decisions.

Pure state and arithmetic: no sockets. The broker's owner loop is the only user, so nothing
here locks. Every table has a bound; the ones keyed by names peers choose (services, clients,
identities) also forget entries nobody used for a while.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.histogram import Histogram
from ..core.keepalive import Clock, KeepAlive
from ..settings import Settings
from .jobqueue import QueuedJob, ServiceQueue

if TYPE_CHECKING:
    from .limits import Bucket

PROTOCOL_V2 = 2  # a worker whose READY says {"v": 2} speaks zfab's extensions (meta frame, reasons)
# A live worker is never silent for more than 1.2 keepalive intervals (core/keepalive.py ANSWER_DELAY):
# one silent for twice that, and at least a second, has lost its connection or is stopped, and a new
# connection may take its name (docs/protocol.md, "One owner per name").
SILENT_INTERVALS = 2.0
MIN_SILENCE = 1.0


@dataclass(slots=True, eq=False)
class WorkerRecord:
    """A worker as the broker knows it: one connection (its ROUTER identity) under one name."""

    ident: bytes  # the ROUTER identity of this connection: frames to the worker go there
    name: bytes  # what clients target and MMI shows (a NorFab worker's name is its identity)
    service: bytes
    keepalive: KeepAlive
    credits: int  # jobs it said it can hold at once (pool + prefetch), or the default
    v2: bool = False  # speaks zfab's extensions
    inflight: dict[bytes, bytes] = field(default_factory=dict)  # job (wire) uuid -> client identity
    directed: list[tuple[int, int, QueuedJob]] = field(default_factory=list)  # parts waiting for it (heap)
    stats: dict[str, Any] = field(default_factory=dict)  # last figures the worker reported
    registered_at: float = field(default_factory=time.time)
    jobs_dispatched: int = 0
    level: int = -1  # its bucket in the service's free levels (-1: not free)
    throttle: int = 0  # credits held back after it answered busy: it knows better than we do
    host: str | None = None  # its shared-memory host id (READY announce): a client's handle may go to it
    origin: str = "another connection"  # where it runs, as its READY said (host name, pid): for refusals
    rivals: int = 0  # READYs under its name the broker refused while it held the name
    label: str = field(init=False, default="")  # its name as text (logs, answers), decoded once

    def __post_init__(self) -> None:
        self.label = self.name.decode(errors="replace")

    @property
    def draining(self) -> bool:
        return bool(self.stats.get("draining"))

    @property
    def free(self) -> int:
        """Credits left: jobs the broker may still send it."""
        return self.credits - self.throttle - len(self.inflight)


@dataclass(slots=True, eq=False)
class ServiceRecord:
    name: bytes
    workers: dict[bytes, WorkerRecord] = field(default_factory=dict)  # by identity
    queue: ServiceQueue = field(default_factory=ServiceQueue)
    tasks: dict[str, Any] | None = None  # task -> argument schema, from its workers (None: not announced)
    declared: dict[str, Any] = field(default_factory=dict)  # task -> schema as first declared (declarations.py)
    levels: list[dict[bytes, WorkerRecord]] = field(default_factory=list)  # free workers by jobs in flight
    low: int = 0  # no free worker sits below this level: the search starts here, not at 0
    last_active: float = 0.0  # monotonic: a worker registered or a job came
    tentative: bool = False  # made for a POST while the broker starts; no worker has confirmed it yet
    roster_changed: bool = False  # a worker registered since the last pump: parked jobs may go
    workers_seen: set[bytes] = field(default_factory=set)  # names that ever registered (bounded by the broker)
    # Time from admission to dispatch; it goes with the record (a histogram per service name the
    # broker ever dispatched for, in a table of its own, outlived the services bound).
    queued_seconds: Histogram | None = None
    purged: int = 0
    expired_queue: int = 0
    expired_worker: int = 0
    dispatched: int = 0

    @property
    def label(self) -> str:
        return self.name.decode(errors="replace")

    @property
    def idle(self) -> bool:
        return not self.workers and not self.queue.depth


@dataclass(slots=True)
class ClientRecord:
    identity: bytes
    first_seen: float
    last_seen: float
    requests: int = 0


@dataclass(slots=True, eq=False)
class Route:
    """A dispatched job the broker waits on: who asked, and which workers still owe a final reply."""

    uuid: bytes
    client: bytes
    service: bytes
    workers: set[bytes]  # worker names
    push: bool  # forward the worker's completion to the client (zfab clients ask for it)
    deadline: float  # monotonic: past it (plus the grace) the broker frees the slots unanswered
    job: QueuedJob | None = None  # what was sent (kept to put it back in the queue if a worker says busy)
    held: int = 0  # bytes of the job's body counted in Registry.held_bytes (0 once let go)
    started: bool = False  # its one worker sent 201: the body is gone, a busy answer cannot requeue it
    ended: set[bytes] = field(default_factory=set)  # names whose part ended (their later answers are GETs')


class Registry:
    """Workers by identity and name, services (bounded), clients (bounded), routes (bounded)."""

    def __init__(
        self,
        *,
        interval: float,
        multiplier: int,
        max_inflight_per_worker: int = 1000,
        max_routes: int = 100_000,
        max_clients: int = 10_000,
        max_services: int = 1000,
        service_memory: float = 86_400.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self.interval = interval
        self.multiplier = multiplier
        self.max_inflight_per_worker = max_inflight_per_worker
        self.max_routes = max_routes
        self.max_clients = max_clients
        self.max_services = max_services
        self.service_memory = service_memory
        self.clock = clock
        self.workers: dict[bytes, WorkerRecord] = {}  # by identity
        self.by_name: dict[bytes, WorkerRecord] = {}
        self.services: OrderedDict[bytes, ServiceRecord] = OrderedDict()  # least recently active first
        self.clients: OrderedDict[bytes, ClientRecord] = OrderedDict()
        # zfab clients that keep alive (NorFab's send no keepalive), least recently heard first:
        # they get the workers' keepalive wave and answer it. Bounded like the clients table.
        self.client_keepalives: OrderedDict[bytes, KeepAlive] = OrderedDict()
        self.routes: dict[bytes, Route] = {}
        # Limit slots of routes that ended, returned as data for the dispatcher to free (Dispatch.free_limits,
        # before its next admission or pump): at most the routes dropped since then.
        self.freed: list[Bucket] = []
        # Bytes of the request bodies the routes keep (for a busy answer's requeue), counted with
        # the queued ones against ZFAB_BROKER_QUEUE_BYTES: always changed by add_route, let_go and
        # drop_route, never by a bare `del routes[...]`.
        self.held_bytes = 0
        # Jobs finished recently and the worker that ran them, so a POST retried after its result
        # was missed goes back to that worker instead of running again (LRU-bounded).
        self.finished: OrderedDict[bytes, bytes] = OrderedDict()
        self.max_finished = max_routes

    @classmethod
    def from_settings(cls, s: Settings, clock: Clock) -> Registry:
        """The tables bounded as the settings say."""
        return cls(
            interval=s.keepalive_interval,
            multiplier=s.keepalive_multiplier,
            max_inflight_per_worker=s.max_inflight_per_worker,
            max_routes=s.max_routes,
            max_clients=s.max_clients,
            max_services=s.max_services,
            service_memory=s.service_memory_seconds,
            clock=clock,
        )

    # ---- services ------------------------------------------------------------

    def service(self, name: bytes, *, create: bool = False, tentative: bool = False) -> ServiceRecord | None:
        """The service record; with `create`, made if there is room (forgetting the stalest idle one)."""
        svc = self.services.get(name)
        if svc is not None:
            svc.last_active = self.clock()
            self.services.move_to_end(name)
            return svc
        if not create:
            return None
        if len(self.services) >= self.max_services and not self._evict_idle_service():
            return None
        svc = self.services[name] = ServiceRecord(name, last_active=self.clock(), tentative=tentative)
        return svc

    def _evict_idle_service(self) -> bool:
        for name, svc in self.services.items():
            if svc.idle:
                del self.services[name]
                return True
        return False

    def forget_idle_services(self) -> list[ServiceRecord]:
        """Services with no worker and no queued job for `service_memory` seconds are forgotten."""
        cutoff = self.clock() - self.service_memory
        gone = [s for s in self.services.values() if s.idle and s.last_active < cutoff]
        for s in gone:
            del self.services[s.name]
        return gone

    # ---- workers -------------------------------------------------------------

    def register_worker(
        self, ident: bytes, name: bytes, svc: ServiceRecord, *, credits: int, v2: bool, tasks: dict[str, Any] | None
    ) -> WorkerRecord:
        """READY: a new connection. The caller has dropped any record it replaces."""
        rec = WorkerRecord(
            ident,
            name,
            svc.name,
            KeepAlive(self.interval, self.multiplier, self.clock),
            credits=max(1, min(credits, self.max_inflight_per_worker)),
            v2=v2,
        )
        self.workers[ident] = rec
        self.by_name[name] = rec
        svc.workers[ident] = rec
        svc.roster_changed = True
        if tasks is not None:
            # The service's tasks are what its workers announce; a newer worker's list wins.
            svc.tasks = dict(tasks)
        self.set_level(svc, rec)
        return rec

    def remove_worker(self, rec: WorkerRecord) -> dict[bytes, bytes]:
        """Forget a worker; returns the jobs it had in flight (uuid -> client)."""
        self.workers.pop(rec.ident, None)
        if self.by_name.get(rec.name) is rec:
            del self.by_name[rec.name]
        svc = self.services.get(rec.service)
        if svc is not None:
            svc.workers.pop(rec.ident, None)
            svc.last_active = self.clock()
            self._unlevel(svc, rec)
        lost = dict(rec.inflight)
        for uuid in lost:
            route = self.routes.get(uuid)
            if route is not None:
                route.workers.discard(rec.name)
                if not route.workers:
                    self.drop_route(uuid)
        rec.inflight.clear()
        return lost

    @property
    def silence_bound(self) -> float:
        """How long a worker may go unheard and still hold its name against a new connection."""
        return min(self.interval * self.multiplier, max(SILENT_INTERVALS * self.interval, MIN_SILENCE))

    def expired_workers(self) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.keepalive.expired()]

    # ---- free credits: workers by jobs in flight, so `any` finds the least loaded in O(levels) ----

    def set_level(self, svc: ServiceRecord, w: WorkerRecord) -> None:
        """File the worker under its current load, or out of the free levels when it has no credit."""
        n = len(w.inflight)  # (w.free and w.draining inlined: this runs twice per job)
        level = n if w.credits - w.throttle - n > 0 and w.ident in svc.workers and not w.stats.get("draining") else -1
        if level == w.level:
            return
        if w.level >= 0:
            svc.levels[w.level].pop(w.ident, None)
            w.level = -1
        if level >= 0:
            while len(svc.levels) <= level:
                svc.levels.append({})
            svc.levels[level][w.ident] = w  # appended last: equals take turns
            w.level = level
            if level < svc.low:
                svc.low = level

    def _unlevel(self, svc: ServiceRecord, w: WorkerRecord) -> None:
        if w.level >= 0:
            svc.levels[w.level].pop(w.ident, None)
            w.level = -1

    def least_loaded(self, svc: ServiceRecord) -> WorkerRecord | None:
        """The live worker with credit left and the fewest jobs in flight (turns among equals).

        One busy worker with 200 jobs in flight sits at level 200: walking the empty levels below
        it (a list copy each) was a fifth of the broker's CPU per pipelined job. `low` skips them,
        and moves up only past levels found empty, so the walk costs O(1) amortised."""
        levels = svc.levels
        i, n = svc.low, len(levels)
        while i < n:
            bucket = levels[i]
            if bucket:
                for w in bucket.values():
                    if w.keepalive.is_alive():
                        svc.low = i
                        return w
                for w in list(bucket.values()):  # all expired, about to be purged
                    self._unlevel(svc, w)
            i += 1
        svc.low = n
        return None

    def live(self, svc: ServiceRecord) -> list[WorkerRecord]:
        return [w for w in svc.workers.values() if w.keepalive.is_alive() and not w.draining]

    def resolve(self, svc: ServiceRecord, names: list[str] | None) -> list[WorkerRecord]:
        """The live workers a targeted job goes to: all of them (None), or those named."""
        if names is None:
            return self.live(svc)
        picked: dict[bytes, WorkerRecord] = {}
        for n in names:
            w = self.by_name.get(n.encode())
            if w is not None and w.service == svc.name and w.keepalive.is_alive():
                picked[w.name] = w
        return list(picked.values())

    # ---- clients -------------------------------------------------------------

    def touch_client(self, identity: bytes) -> ClientRecord:
        now = time.time()
        rec = self.clients.get(identity)
        if rec is None:
            rec = self.clients[identity] = ClientRecord(identity, now, now)
            if len(self.clients) > self.max_clients:
                self.clients.popitem(last=False)  # forget the longest-idle client
        else:
            rec.last_seen = now
            self.clients.move_to_end(identity)
        rec.requests += 1
        return rec

    def client_keepalive_heard(self, identity: bytes) -> KeepAlive | None:
        """A client's keepalive: its state when the broker must answer it now, None when it
        answers one the broker sent it within half an interval (the wave's)."""
        ka = self.client_keepalives.get(identity)
        if ka is None:
            ka = self.client_keepalives[identity] = KeepAlive(self.interval, self.multiplier, self.clock)
            if len(self.client_keepalives) > self.max_clients:
                self.client_keepalives.popitem(last=False)
        else:
            self.client_keepalives.move_to_end(identity)
        ka.heard()
        return None if ka.sent_within_window() else ka

    def tend_clients(self, now: float, send: Callable[[bytes, KeepAlive], bool]) -> float:
        """The clients' part of a keepalive pass (the broker's tend_workers): `send` a keepalive
        to those due with the wave; one not heard for its hold time, or that `send` finds gone,
        leaves the table. Returns when the next pass is needed for them."""
        soonest = math.inf
        gone = []
        for ident, ka in self.client_keepalives.items():
            if now >= ka.expires_at or (ka.due_with_wave(now) and not send(ident, ka)):
                gone.append(ident)
                continue
            soonest = min(soonest, ka.next_due, ka.expires_at)
        for ident in gone:
            del self.client_keepalives[ident]
        return soonest

    # ---- routes ----------------------------------------------------------------

    def add_route(self, job: QueuedJob, workers: list[WorkerRecord], deadline: float) -> Route:
        route = self.routes.get(job.uuid)
        if route is None:
            route = self.routes[job.uuid] = Route(job.uuid, job.client, job.service, set(), job.push, deadline, job)
            route.held = job.size
            self.held_bytes += route.held
        for w in workers:
            route.workers.add(w.name)
        return route

    def drop_route(self, uuid: bytes) -> Route | None:
        """The job is no longer in flight anywhere: its route goes, and the body it kept with it."""
        route = self.routes.pop(uuid, None)
        if route is not None:
            self.held_bytes -= route.held
            route.held = 0
            job = route.job
            if job is not None and job.limit is not None:
                self.freed.append(job.limit)
        return route

    def let_go(self, route: Route) -> None:
        """The route no longer needs its job's body (it started): the bytes are not held any more."""
        route.started = True
        self.held_bytes -= route.held
        route.held = 0

    def send_to(self, svc: ServiceRecord, w: WorkerRecord, uuid: bytes, client: bytes) -> None:
        """Account for a job part sent to `w`: it takes one of its credits."""
        w.inflight[uuid] = client
        w.jobs_dispatched += 1
        svc.dispatched += 1
        self.set_level(svc, w)

    def complete(self, worker: WorkerRecord, uuid: bytes) -> Route | None:
        """A worker's final reply for a job. Returns the route if the job was in flight on it."""
        if worker.inflight.pop(uuid, None) is None:
            return None
        svc = self.services.get(worker.service)
        if svc is not None:
            self.set_level(svc, worker)
        route = self.routes.get(uuid)
        if route is None:
            return None
        route.workers.discard(worker.name)
        route.ended.add(worker.name)
        if not route.workers:
            self.drop_route(uuid)
        self.finished[uuid] = worker.name
        if len(self.finished) > self.max_finished:
            self.finished.popitem(last=False)
        return route

    def release(self, worker: WorkerRecord, uuid: bytes) -> None:
        """Free the worker's credit for a job without completing the route (busy: it goes back to the queue)."""
        if worker.inflight.pop(uuid, None) is not None:
            svc = self.services.get(worker.service)
            if svc is not None:
                self.set_level(svc, worker)

    def finished_on(self, uuid: bytes) -> WorkerRecord | None:
        """The live worker that recently finished this job, if any."""
        name = self.finished.get(uuid)
        return self.by_name.get(name) if name is not None else None

    def inflight_by_client(self) -> dict[bytes, int]:
        """Jobs in flight per client identity (for MMI; a pass over the routes)."""
        counts: dict[bytes, int] = {}
        for r in self.routes.values():
            counts[r.client] = counts.get(r.client, 0) + 1
        return counts
