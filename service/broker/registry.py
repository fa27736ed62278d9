"""The broker's tables: workers, services, clients and job routes, with routing decisions.

Pure state and arithmetic: no sockets. The broker's owner loop is the only user, so
nothing here locks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..core.keepalive import Clock, KeepAlive


@dataclass(slots=True)
class WorkerRecord:
    """A worker as the broker knows it, keyed by its ROUTER identity (the worker name)."""

    name: bytes
    service: bytes
    keepalive: KeepAlive
    inflight: dict[bytes, bytes] = field(default_factory=dict)  # job uuid -> client id
    stats: dict[str, Any] = field(default_factory=dict)  # last figures the worker reported
    registered_at: float = field(default_factory=time.time)
    jobs_dispatched: int = 0

    @property
    def label(self) -> str:
        return self.name.decode(errors="replace")


@dataclass(slots=True)
class ServiceRecord:
    name: bytes
    workers: dict[bytes, WorkerRecord] = field(default_factory=dict)
    rr: int = 0  # round-robin cursor for ties in least-loaded dispatch


@dataclass(slots=True)
class ClientRecord:
    identity: bytes
    first_seen: float
    last_seen: float
    requests: int = 0


@dataclass(slots=True)
class Route:
    """A job the broker dispatched and is waiting on: who asked, and who still owes a final reply."""

    client: bytes
    service: bytes
    workers: set[bytes]
    push: bool  # forward the worker's completion to the client (zfab clients ask for it)


class Registry:
    """Workers by name and by service, clients (LRU-bounded) and job routes (bounded)."""

    def __init__(
        self,
        *,
        interval: float,
        multiplier: int,
        max_inflight_per_worker: int = 1000,
        max_routes: int = 100_000,
        max_clients: int = 10_000,
        clock: Clock = time.monotonic,
    ) -> None:
        self.interval = interval
        self.multiplier = multiplier
        self.max_inflight_per_worker = max_inflight_per_worker
        self.max_routes = max_routes
        self.max_clients = max_clients
        self.clock = clock
        self.workers: dict[bytes, WorkerRecord] = {}
        self.services: dict[bytes, ServiceRecord] = {}
        self.clients: OrderedDict[bytes, ClientRecord] = OrderedDict()
        self.routes: dict[bytes, Route] = {}
        # Jobs finished recently and where they ran, so a POST retried after its result
        # was missed goes back to that worker instead of running again (LRU-bounded).
        self.finished: OrderedDict[bytes, bytes] = OrderedDict()
        self.max_finished = max_routes

    # ---- workers -------------------------------------------------------------

    def register_worker(self, name: bytes, service: bytes) -> WorkerRecord:
        """READY: a new worker, or a known one starting afresh (after a reconnect)."""
        old = self.workers.get(name)
        if old is not None:
            self.remove_worker(old)
        rec = WorkerRecord(name, service, KeepAlive(self.interval, self.multiplier, self.clock))
        self.workers[name] = rec
        svc = self.services.get(service)
        if svc is None:
            svc = self.services[service] = ServiceRecord(service)
        svc.workers[name] = rec
        return rec

    def remove_worker(self, rec: WorkerRecord) -> dict[bytes, bytes]:
        """Forget a worker; returns the jobs it had in flight (uuid -> client)."""
        self.workers.pop(rec.name, None)
        svc = self.services.get(rec.service)
        if svc is not None:
            svc.workers.pop(rec.name, None)
        lost = dict(rec.inflight)
        for uuid in lost:
            route = self.routes.get(uuid)
            if route is not None:
                route.workers.discard(rec.name)
                if not route.workers:
                    del self.routes[uuid]
        rec.inflight.clear()
        return lost

    def expired_workers(self) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.keepalive.expired()]

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

    # ---- routing -------------------------------------------------------------

    def select(self, service: bytes, target: str | list[str]) -> list[WorkerRecord]:
        """The live workers a request goes to: least-loaded for `any`."""
        svc = self.services.get(service)
        if svc is None or not svc.workers:
            return []
        if target == "any":
            return self._least_loaded(svc)
        if target == "all":
            return [w for w in svc.workers.values() if w.keepalive.is_alive()]
        names = [target] if isinstance(target, str) else target
        picked: dict[bytes, WorkerRecord] = {}
        for n in names:
            w = svc.workers.get(n.encode())
            if w is not None and w.keepalive.is_alive():
                picked[w.name] = w
        return list(picked.values())

    def _least_loaded(self, svc: ServiceRecord) -> list[WorkerRecord]:
        workers = list(svc.workers.values())
        n = len(workers)
        best: WorkerRecord | None = None
        start = svc.rr % n
        for i in range(n):
            w = workers[(start + i) % n]
            if not w.keepalive.is_alive() or w.stats.get("draining"):
                continue  # a stopping worker finishes what it has but takes nothing new
            if best is None or len(w.inflight) < len(best.inflight):
                best = w
        svc.rr = (start + 1) % n
        return [best] if best is not None else []

    def has_capacity(self, workers: list[WorkerRecord]) -> bool:
        if len(self.routes) >= self.max_routes:
            return False
        return all(len(w.inflight) < self.max_inflight_per_worker for w in workers)

    def add_route(self, uuid: bytes, client: bytes, service: bytes, workers: list[WorkerRecord], push: bool) -> None:
        route = self.routes.get(uuid)
        if route is None:
            route = self.routes[uuid] = Route(client, service, set(), push)
        for w in workers:
            route.workers.add(w.name)
            w.inflight[uuid] = client
            w.jobs_dispatched += 1

    def complete(self, worker: WorkerRecord, uuid: bytes) -> Route | None:
        """A worker's final reply for a job. Returns the route if the job was in flight on it."""
        if worker.inflight.pop(uuid, None) is None:
            return None
        route = self.routes.get(uuid)
        if route is None:
            return None
        route.workers.discard(worker.name)
        if not route.workers:
            del self.routes[uuid]
        self.finished[uuid] = worker.name
        if len(self.finished) > self.max_finished:
            self.finished.popitem(last=False)
        return route

    def finished_on(self, uuid: bytes) -> WorkerRecord | None:
        """The live worker that recently finished this job, if any."""
        name = self.finished.get(uuid)
        return self.workers.get(name) if name is not None else None

    def inflight_by_client(self) -> dict[bytes, int]:
        """Jobs in flight per client identity (for MMI; a pass over the routes)."""
        counts: dict[bytes, int] = {}
        for r in self.routes.values():
            counts[r.client] = counts.get(r.client, 0) + 1
        return counts
