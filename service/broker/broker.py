"""The broker: its ROUTER socket is owned by one mediate loop (transport/loop.py).

Named after what the spec says happens: `process_client`, `process_worker`, `post` (admission),
`forward`, `tend_workers` (purge and keepalives). The job queue and credits are dispatcher.py's,
the tables registry.py's, MMI mmi.py's.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import zmq

from ..core import payloads, sizes
from ..core import protocol as nfp
from ..core.keepalive import Clock, KeepAlive
from ..core.payloads import Word
from ..errors import SecurityError
from ..settings import Settings
from ..transport.base import Frames, LoopFactory, Transport
from ..transport.loop import OwnerLoop
from ..transport.security import ZapHandler, curve_server, is_loopback
from ..transport.shm import ShmArena
from .admission import Refusal, answer, bad, read_job, unknown_task
from .dispatcher import Dispatcher
from .events import EventPublisher
from .inventory import Inventory
from .jobqueue import ANY, NAMED, QueuedJob, Spot
from .memory import MemoryKeeper, glibc_trim
from .mmi import SID_SERVICE, MmiService
from .paused import PausedServices
from .registry import Registry, Route, ServiceRecord, WorkerRecord
from .workerside import WorkerSide

log = logging.getLogger(__name__)

HOUSEKEEPING = 60.0  # seconds between sweeps of the tables keyed by what peers chose
RCVHWM = 1000  # messages one peer may have waiting in the ROUTER's receive pipe
ALL_SERVICE = b"all"  # NorFab's pseudo-service: workers of every service (Broker.across)


class Broker(WorkerSide):
    """Routes jobs from clients to workers grouped in services, through per-service queues.

    `start()` binds and runs the mediate loop on its own thread; `stop()` ends it.
    """

    TOLD_TO_LEAVE_MAX = 10_000  # unknown identities remembered for DISCONNECT rate-limiting
    GONE_MAX = 1000  # workers that left, kept a while for metrics (state dead)
    KEYS_MAX = 100_000  # identities bound to the CURVE key that first used them

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        endpoint: str | None = None,
        transport: LoopFactory | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        """`transport` and `clock` are for tests: a StubTransport and its FakeClock (transport/stub.py)."""
        self.settings = s = settings or Settings()
        self.endpoint = endpoint or s.bind_endpoint
        self.clock = clock
        self.registry = Registry(
            interval=s.keepalive_interval,
            multiplier=s.keepalive_multiplier,
            max_inflight_per_worker=s.max_inflight_per_worker,
            max_routes=s.max_routes,
            max_clients=s.max_clients,
            max_services=s.max_services,
            service_memory=s.service_memory_seconds,
            clock=clock,
        )
        self.started_at = time.time()
        self.boot = os.urandom(8).hex()  # this broker's incarnation: clients see a restart in keepalives
        self.grace_until: float | None = clock() + s.broker_startup_grace
        self.rejected: Counter[str] = Counter()  # malformed frames by reason
        self.counts: Counter[str] = Counter()  # routed traffic by kind
        self._warned: Counter[str] = Counter()
        self._seq = itertools.count()
        self._next_keepalive = 0.0
        self._next_housekeeping = clock() + HOUSEKEEPING
        self.bound_endpoint = ""
        self.zap: ZapHandler | None = None
        # unknown worker -> last DISCONNECT and the reason a zfab worker was told first (purged)
        self.told_to_leave: OrderedDict[bytes, tuple[float, str | None]] = OrderedDict()
        self.gone: OrderedDict[bytes, dict[str, Any]] = OrderedDict()  # worker name -> how it left
        self.keys: OrderedDict[bytes, bytes] = OrderedDict()  # identity -> ZAP user id of its first frame
        # Gives the OS back what a burst of messages used, once it has passed (memory.py, issue 31).
        self.memory = MemoryKeeper(trim=glibc_trim())
        self.loop: Transport = (transport or OwnerLoop)(
            self, name="broker", outbound_size=s.outbound_queue_size, submit_timeout=s.submit_timeout, linger=1.0
        )
        self.dispatch = Dispatcher(self.registry, s, reply=self.reply, send=self.send, counts=self.counts, clock=clock)
        # Paused service queues: kept in the data directory, read by start() (paused.py).
        self.paused = PausedServices(Path(s.data_dir) / "broker", s.max_services)
        self.dispatch.paused = self.paused
        # Same-host shared memory: its host id in keepalive answers; it reads a client's block only
        # for a worker on another host, and reclaims the blocks of processes that died.
        self.shm = ShmArena(s, clock=clock)
        self.dispatch.shm = self.shm
        self.mmi = MmiService(self)
        # NorFab workers ask the broker for their inventory (sid.service.broker, inventory.py).
        self.inventory: Inventory | None = Inventory(s.broker_inventory) if s.broker_inventory else None
        self.events: EventPublisher | None = None  # job state changes by topic (events.py); off unless set
        if s.broker_events:
            self.events = EventPublisher(
                s.broker_events,
                hwm=s.broker_events_hwm,
                queue_size=s.broker_events_queue,
                max_subscriptions=s.broker_events_subscriptions,
                curve_secret=s.curve_secret,
                context=self.loop.context,
            )

    # ---- lifecycle (any thread) ------------------------------------------------

    def start(self) -> Broker:
        s = self.settings
        curve = bool(s.curve_secret)
        if curve != bool(s.curve_clients):
            raise SecurityError("CURVE needs both curve_secret (the broker's key) and curve_clients (accepted keys)")
        if not curve and not s.insecure and not is_loopback(self.endpoint):
            raise SecurityError(
                f"refusing to bind {self.endpoint} without CURVE: anyone who reaches it could submit jobs. "
                "Set ZFAB_CURVE_SECRET and ZFAB_CURVE_CLIENTS (see `zfab keys`), or pass --insecure."
            )
        if curve and s.broker_handover:
            raise SecurityError(
                "ZFAB_BROKER_HANDOVER with CURVE would let any peer with a key take another's identity: unset one"
            )
        if curve:
            assert s.curve_clients is not None
            self.zap = ZapHandler(self.loop.context, s.curve_clients)
            self.zap.start()
        self.paused.load()
        self.shm.reclaim()
        self.dispatch.limits.load()
        if self.events is not None:
            if not curve and not s.insecure and not is_loopback(self.events.endpoint):
                raise SecurityError(f"refusing to bind the events endpoint {self.events.endpoint} without CURVE")
            self.events.start()
        self.loop.start()
        log.debug("broker listening on %s%s", self.bound_endpoint, " (CURVE)" if curve else "")
        return self

    def stop(self) -> None:
        if self.zap is not None:
            self.zap.stop()  # first: the context cannot terminate while the ZAP socket is open
        if self.events is not None:
            self.events.stop()  # before the loop: its context cannot terminate while the XPUB is open
        self.loop.stop()

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self, task: str, kwargs: dict[str, Any] | None = None) -> Any:
        """An MMI answer computed on the owner thread (for metrics and tests)."""
        return self.loop.call(lambda: self.mmi.run(task, kwargs or {}))

    # ---- Role: owner thread only ------------------------------------------------

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        s = self.settings
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # No handover by default: a second connection under an identity in use is ignored by
        # libzmq, so no peer can take another's route (and its frames). zfab peers make a fresh
        # identity per connection, so they never collide with a stale one of their own. A NorFab
        # peer's identity is its name: a NorFab worker that reconnects while its old connection
        # is still open here loses its READY (libzmq drops the new connection's first frames)
        # unless the new connection takes the route over, as NorFab's own broker lets it
        # (ZFAB_BROKER_HANDOVER, refused with CURVE in start()).
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1 if s.broker_handover else 0)
        # Unroutable sends raise instead of vanishing silently, so they are counted.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Above the limit: a message a little over it is answered (TOO LARGE) and counted, not the
        # connection of its sender silently dropped by libzmq (core/sizes.py).
        sock.setsockopt(zmq.MAXMSGSIZE, sizes.socket_cap(s.max_message_bytes))
        sock.setsockopt(zmq.SNDHWM, 10_000)
        # Per peer: what one connection may have waiting in libzmq before it is read no further (its
        # sender then waits). 10,000 let one peer's flood of small frames take 13 MB there, which
        # the allocator kept after the flood (issue 31, docs/broker-memory.md).
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        # ZMTP heartbeats drop half-open connections (a peer's host gone), so the identity it held
        # is free again. Twice the hold time: the DISCONNECT a purge sends (at one hold time)
        # still reaches a stopped peer's socket buffer before its connection is closed. A ping
        # per hold time, not per keepalive interval: NFP keepalives already prove live peers, and
        # with 1,000 workers pings every 2.5 s cost the I/O thread a third of its time.
        sock.setsockopt(zmq.HEARTBEAT_IVL, int(s.hold_time * 1000))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(2 * s.hold_time * 1000))
        if s.curve_secret:
            curve_server(sock, s.curve_secret)
        sock.bind(self.endpoint)
        self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return sock

    def on_connected(self) -> None:
        pass

    def on_closing(self) -> None:
        for w in list(self.registry.workers.values()):
            self.send(nfp.broker_control(w.ident, nfp.DISCONNECT, w.service))

    def on_batch_end(self) -> None:
        if self.dispatch.dirty:
            self.dispatch.pump()

    def on_timer(self, now: float) -> float | None:
        reg = self.registry
        if (reg.workers or reg.client_keepalives) and now >= self._next_keepalive:
            self._next_keepalive = min(self.tend_workers(now), reg.tend_clients(now, self._send_client_keepalive))
        d = self.dispatch
        d.expire(now)
        d.due(now)
        d.tell_waiting(now)
        if self.grace_until is not None and now >= self.grace_until:
            self.end_grace()
        if now >= self._next_housekeeping:
            self.housekeeping(now)
        if d.dirty:
            d.pump()
        deadlines = [self._next_housekeeping, d.next_deadline(), self.grace_until]
        if self.events is not None and d.queue_changed:  # after everything above that moves a queue
            deadlines.append(self.events.tend_queues(now, d.queue_changed, self.queue_facts))
        deadlines.append(self.memory.tend(now, self.loop.stats.received))
        if reg.workers or reg.client_keepalives:
            deadlines.append(self._next_keepalive)
        return min(t for t in deadlines if t is not None)

    def on_frames(self, frames: Frames) -> None:
        if len(frames) < 3:
            self.reject("frame_count", f"{len(frames)} frames")
            return
        sender, header = bytes(frames[0]), frames[2]  # the identity is short: bytes already, not copied
        if self.zap is not None and not self._same_key(sender):
            self.reject("identity", f"{sender[:64]!r} used by another key than the one that first used it")
            return
        body = frames[1:]
        try:
            if header == nfp.CLIENT:
                self.process_client(sender, nfp.decode_client(body, self.settings.max_message_bytes))
            elif header == nfp.WORKER:
                self.process_worker(sender, nfp.decode_worker(body, self.settings.max_message_bytes))
            else:
                raise nfp.ProtocolError("header", f"unknown header {bytes(header[:16])!r}")
        except nfp.ProtocolError as exc:
            self.reject(exc.reason, f"from {sender[:64]!r}: {exc.detail}")
            if exc.reason == "oversize" and header == nfp.CLIENT:
                self._refuse_oversize(sender, body)
            elif exc.reason == "oversize" and header == nfp.WORKER:
                self.oversize_result(sender, body)

    def _refuse_oversize(self, sender: bytes, body: Frames) -> None:
        """A client's request over the message limit (its own limit was larger, or it is no zfab
        client): answered 400 TOO LARGE naming the limit, so it fails now instead of at its timeout.
        The socket's cap (core/sizes.py) let it in; the envelope is read at that bound, not the body."""
        limit = self.settings.max_message_bytes
        try:
            req = nfp.decode_client(body, sizes.socket_cap(limit))
        except nfp.ProtocolError:
            return  # not a request that could be answered (counted above)
        if req.command in (nfp.KEEPALIVE, nfp.OPEN, nfp.DISCONNECT) or not req.uuid:
            return
        size = sum(len(f) for f in body)
        uuid = req.uuid.decode(errors="replace")
        why = sizes.too_large(f"the request of job {uuid}", size, limit)
        self._refuse(sender, req, Refusal(nfp.ST_BAD_REQUEST, Word.TOO_LARGE, why))

    # ---- helpers -------------------------------------------------------------

    def queue_facts(self, name: bytes) -> tuple[int, int, int, bool]:
        """A service's queue for its queue.<service> event: depth, bytes, capacity, paused."""
        svc = self.registry.services.get(name)
        depth, nbytes = (svc.queue.depth, svc.queue.bytes) if svc is not None else (0, 0)
        return depth, nbytes, self.settings.service_queue_size, name in self.paused

    def send(self, frames: Frames) -> None:
        if not self.loop.send_now(frames):
            self.counts["send_failed"] += 1

    def reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        n = self._warned[reason] = self._warned[reason] + 1
        if n <= 3 or n % 1000 == 0:
            log.warning("broker dropped a message (%s, %d so far): %s", reason, n, detail)

    def reply(self, client: bytes, service: bytes, uuid: bytes, status: bytes, payload: Any) -> None:
        if self.events is not None:
            self.events.reply(uuid, status)
        self.send(nfp.broker_reply(client, nfp.RESPONSE, service, uuid, status, nfp.dumps(payload)))

    def _refuse(self, sender: bytes, req: nfp.ClientRequest, r: Refusal) -> None:
        body = payloads.refusal(req.uuid, req.target, req.service, r.word, r.why)
        if r.retry_after is not None:
            body["retry_after"] = r.retry_after
        self.counts[f"refused_{r.status.decode()}"] += 1
        self.reply(sender, req.service, req.uuid, r.status, body)
        if req.command == nfp.MMI:
            # NorFab's NFPClient.mmi() reads only MMI frames: a refused MMI request is answered in
            # both, as every MMI answer is, or it waits out its whole timeout.
            self.send(nfp.broker_reply(sender, nfp.MMI, req.service, req.uuid, r.status, nfp.dumps(body)))

    def _same_key(self, sender: bytes) -> bool:
        """CURVE: an identity belongs to the key that first used it (bounded, least recent forgotten)."""
        user = self.loop.user_id or b""
        bound = self.keys.get(sender)
        if bound is None:
            self.keys[sender] = user
            if len(self.keys) > self.KEYS_MAX:
                self.keys.popitem(last=False)
            return True
        self.keys.move_to_end(sender)
        return bound == user

    def _owner_of(self, job: Any) -> bool:
        """May the sender of this frame take over the job's answers? Under CURVE only with the key
        that submitted it (another key could otherwise divert a job's results)."""
        return self.zap is None or job.client_key == self.loop.user_id

    def in_grace(self) -> bool:
        return self.grace_until is not None

    # ---- clients -------------------------------------------------------------

    def process_client(self, sender: bytes, req: nfp.ClientRequest) -> None:
        self.registry.touch_client(sender)
        if req.command == nfp.KEEPALIVE:
            self.counts["client_keepalive"] += 1
            ka = self.registry.client_keepalive_heard(sender)
            if ka is not None:  # not an answer to the wave's: answered at once
                self._send_client_keepalive(sender, ka)
                self._next_keepalive = min(self._next_keepalive, ka.next_due)
            return
        if req.command in (nfp.OPEN, nfp.DISCONNECT):
            if req.command == nfp.DISCONNECT:  # a zfab client closing: no more keepalive waves for it
                self.registry.client_keepalives.pop(sender, None)
            return  # NorFab clients may announce themselves; nothing to route
        if req.service == nfp.MMI_SERVICE or req.service == SID_SERVICE:
            self.process_mmi(sender, req)
            return
        try:
            if req.command == nfp.POST:
                self.post(sender, req)
            elif req.command == nfp.DELETE:
                self.delete(sender, req)
            else:
                self.route_request(sender, req)
        except Refusal as r:
            if r.malformed is not None:
                self.reject(r.malformed, r.why)
            self._refuse(sender, req, r)
        except Exception as exc:  # RecursionError, MemoryError...: the request is answered, the loop goes on
            self.counts["handler_errors"] += 1
            log.exception("broker failed on a %s", nfp.COMMAND_NAMES[req.command])
            why = f"the broker could not handle this request: {type(exc).__name__}: {str(exc)[:200]}"
            self._refuse(sender, req, Refusal(nfp.ST_ERROR, Word.FAILED, why))

    def _send_client_keepalive(self, client: bytes, ka: KeepAlive) -> bool:
        """The keepalive answer frame, carrying this broker's incarnation; False when the client is gone."""
        facts: dict[str, Any] = {"boot": self.boot, "max": self.settings.max_message_bytes}
        if self.shm.host:
            facts["host"] = self.shm.host
        boot = nfp.dumps(facts)
        ka.mark_sent()
        return self.loop.send_now(nfp.broker_reply(client, nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", nfp.ST_OK, boot))

    def process_mmi(self, sender: bytes, req: nfp.ClientRequest) -> None:
        try:
            status, answer_ = self.mmi.answer(req.body, req.service)
        except nfp.ProtocolError as exc:
            self.reject(exc.reason, exc.detail)
            status, answer_ = nfp.ST_BAD_REQUEST, nfp.dumps({"errors": [exc.detail]})
        self.counts["mmi"] += 1
        # NorFab's broker answers MMI twice, as RESPONSE and as MMI; its clients read either
        # (NFPClient.mmi() only the MMI copy), refusals included.
        for cmd in (nfp.RESPONSE, nfp.MMI):
            self.send(nfp.broker_reply(sender, cmd, req.service, req.uuid, status, answer_))

    def post(self, sender: bytes, req: nfp.ClientRequest) -> None:
        """Admission: a POST is queued or sent at once (dispatcher.py), or refused with a reason."""
        reg, d = self.registry, self.dispatch
        waiting = d.queued.get(req.uuid)
        if waiting is not None:
            # Idempotent by uuid: the same answer, no second copy. From another connection it is the
            # job's client again (it reconnected, or the API restarted): answers go there now.
            if self._owner_of(waiting):
                waiting.client = sender
            d.requeued(waiting)
            return
        route = reg.routes.get(req.uuid)
        if route is not None:
            if route.job is None or self._owner_of(route.job):
                route.client = sender
            # A retried POST of a job in flight goes back to the workers that have it;
            # they answer with its state instead of running it twice.
            self.counts["post_retried"] += 1
            workers = [w for n in route.workers if (w := reg.by_name.get(n)) is not None]
            self._resend(sender, req, workers)
            return
        done_on = reg.finished_on(req.uuid)
        if done_on is not None:
            # Finished already: the worker answers with the stored result instead of a rerun.
            self.counts["post_retried"] += 1
            self._resend(sender, req, [done_on])
            return
        job = read_job(
            sender, req, now=self.clock(), seq=next(self._seq), default_timeout=self.settings.default_job_timeout
        )
        if job.shm:
            d.check_handle(job)
        if req.service == ALL_SERVICE:
            self.post_across(job, req)
            return
        svc = self._service_for(req)
        if job.task and svc.tasks is not None and job.task not in svc.tasks:
            raise unknown_task(svc.label, job.task, svc.tasks)
        if job.kind == NAMED and job.names and not self.in_grace() and not req.flags.get("known"):
            seen = svc.workers_seen
            if not any(n.encode() in seen for n in job.names):
                names = ", ".join(job.names)
                raise Refusal(
                    nfp.ST_NOT_FOUND, Word.FAILED, f"no worker named {names} has registered for service '{svc.label}'"
                )
        d.admit(svc, job, announce_now=not svc.tentative)
        if self.events is not None:  # admitted (queued or sent): its worker's replies come on later frames
            task = job.task if svc.tasks and job.task in svc.tasks else None
            self.events.admitted(req.uuid, svc.name, task, single=job.kind == ANY)

    def post_across(self, job: QueuedJob, req: nfp.ClientRequest) -> None:
        """NorFab's `all` pseudo-service: a job for workers of every service, sent at once to the
        live workers its target picks (`across`), as NorFab's broker does: past the queues and the
        credits (it carries management tasks such as get_stats to every worker), one 202 naming
        them all, each worker's answers under its own service."""
        workers = self.across(nfp.parse_target(req.target))
        if not workers:
            self.counts["no_workers"] += 1
            raise bad(f"no live worker of any service matches target {req.target.decode(errors='replace')!r}")
        self.dispatch.send_across(job, workers)

    def across(self, target: str | list[str], route: Route | None = None) -> list[WorkerRecord]:
        """The workers NorFab's target rules pick across services: `all` every live worker, `any`
        one per service (a job's GET: the workers it went to), a name or a list those workers."""
        reg = self.registry
        if target == "all":
            return [w for svc in reg.services.values() for w in reg.live(svc)]
        if target == "any":
            if route is not None:
                return [w for n in route.workers if (w := reg.by_name.get(n)) is not None]
            picked = (reg.least_loaded(svc) or next(iter(reg.live(svc)), None) for svc in reg.services.values())
            return [w for w in picked if w is not None]
        named: dict[bytes, WorkerRecord] = {}
        for n in [target] if isinstance(target, str) else target:
            w = reg.by_name.get(n.encode())
            if w is not None and w.keepalive.is_alive():
                named[w.name] = w
        return list(named.values())

    def _resend(self, sender: bytes, req: nfp.ClientRequest, workers: list[WorkerRecord]) -> None:
        self.reply(
            sender,
            req.service,
            req.uuid,
            nfp.ST_DISPATCHED,
            payloads.dispatched(req.uuid, req.target, req.service, [w.label for w in workers]),
        )
        for w in workers:
            self.send(nfp.broker_job(w.ident, req.command, sender, req.uuid, req.body))

    def _service_for(self, req: nfp.ClientRequest) -> ServiceRecord:
        """The service a POST names; a name never registered is refused, except while the broker
        starts (its workers may not be back yet) or when the client vouches for it (`known`: a job
        of it was admitted before, e.g. by the broker that restarted)."""
        reg = self.registry
        svc = reg.service(req.service)
        if svc is not None:
            return svc
        label = req.service.decode(errors="replace")
        known = bool(req.flags.get("known"))
        if not known and not self.in_grace():
            raise Refusal(
                nfp.ST_NOT_FOUND,
                Word.FAILED,
                f"service '{label}' is unknown: no worker has registered it with this broker "
                f"(up {time.time() - self.started_at:.0f} s)",
            )
        svc = reg.service(req.service, create=True, tentative=not known)
        if svc is None:
            raise Refusal(nfp.ST_BUSY, Word.BUSY, f"the broker remembers {reg.max_services} services already")
        return svc

    def end_grace(self) -> None:
        """The startup grace is over: a service no worker confirmed was a mistake (a typo), and the
        jobs that waited for it are refused now (they had no answer yet)."""
        self.grace_until = None
        reg = self.registry
        for svc in [s for s in reg.services.values() if s.tentative]:
            for job in list(svc.queue.waiting.values()):
                why = f"service '{svc.label}' is unknown: no worker registered it while the broker started"
                body = answer(job, Word.FAILED, why)
                self.dispatch.cancel_quietly(job)
                self.reply(job.client, job.service, job.uuid, nfp.ST_NOT_FOUND, body)
            del reg.services[svc.name]

    def delete(self, sender: bytes, req: nfp.ClientRequest) -> None:
        """Cancel: a waiting job leaves the queue at once; a dispatched one is asked of its workers."""
        job = self.dispatch.queued.get(req.uuid)
        if job is not None and job.spot is not Spot.DIRECTED:
            self.dispatch.cancel(job)
            return
        if job is not None:
            self.dispatch.cancel_parts(job)
            if req.uuid not in self.registry.routes:
                return  # no part had left: nothing to ask of a worker
        self.route_request(sender, req)

    def route_request(self, sender: bytes, req: nfp.ClientRequest) -> None:
        """GET/PUT/DELETE go to the workers named (or the job's, for its uuid), as they are now."""
        reg = self.registry
        try:
            target = nfp.parse_target(req.target)
        except nfp.ProtocolError as exc:
            raise bad(f"bad target: {exc.detail}", malformed=exc.reason) from None
        route = reg.routes.get(req.uuid)
        if route is not None and (route.job is None or self._owner_of(route.job)):
            route.client = sender  # its client, reconnected: the job's answers go there now
        svc = reg.service(req.service)
        if req.service == ALL_SERVICE:
            workers = self.across(target, route)
        elif svc is None:
            raise Refusal(nfp.ST_NOT_FOUND, Word.FAILED, f"service '{req.service.decode(errors='replace')}' is unknown")
        elif target == "any":
            workers = [w for n in route.workers if (w := reg.by_name.get(n))] if route else []
            if not workers and (w := reg.least_loaded(svc) or next(iter(reg.live(svc)), None)) is not None:
                workers = [w]
        else:
            workers = reg.resolve(svc, None if target == "all" else [target] if isinstance(target, str) else target)
        if not workers:
            self.counts["no_workers"] += 1
            raise bad(
                f"service '{req.service.decode(errors='replace')}' has no live worker matching target "
                f"{req.target.decode(errors='replace')!r}"
            )
        self.counts[nfp.COMMAND_NAMES[req.command].lower()] += 1
        if req.command == nfp.GET and (req.flags.get("ack", True) or len(workers) > 1):
            self.reply(
                sender,
                req.service,
                req.uuid,
                nfp.ST_DISPATCHED,
                payloads.dispatched(req.uuid, req.target, req.service, [w.label for w in workers]),
            )
        for w in workers:
            self.send(nfp.broker_job(w.ident, req.command, sender, req.uuid, req.body))

    def housekeeping(self, now: float) -> None:
        """Forget what peers chose names for and nobody used for a while (bounded tables stay small)."""
        self._next_housekeeping = now + HOUSEKEEPING
        self.registry.forget_idle_services()
        self.shm.sweep()  # every RECLAIM_SECONDS: blocks whose creator died
        self.dispatch.limits.sweep(now)  # limit buckets with nothing running or waiting
        keep = self.settings.gone_worker_seconds
        while self.gone and now - next(iter(self.gone.values()))["at"] > keep:
            self.gone.popitem(last=False)
        while self.told_to_leave and now - next(iter(self.told_to_leave.values()))[0] > HOUSEKEEPING:
            self.told_to_leave.popitem(last=False)
