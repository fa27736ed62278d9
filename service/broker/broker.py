"""The broker: a mediator of composed parts, its ROUTER owned by one loop (transport/loop.py).

Shaped like zguide's Majordomo: `process_client` and `process_worker` take each frame, `post` de-duplicates
a POST by its uuid, `on_timer` is `mediate()` between two polls. The parts (docs/architecture.md) return what
the broker must do, never calling back into it; what cuts across is hooks (hooks.py); all send through an Outbox.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import zmq

from ..core import protocol as nfp
from ..core.keepalive import Clock
from ..core.logbudget import LogBudget
from ..settings import Settings
from ..transport.base import Frames, LoopFactory, Transport
from ..transport.loop import OwnerLoop
from ..transport.shm import ShmArena
from .admission import Refusal
from .control import BrokerControl
from .crosscut import cross_cutting, publisher_for
from .deadlines import Deadlines
from .dispatch import Dispatch
from .events import EventPublisher
from .identities import Identities
from .inventory import Inventory
from .kept import open_kept, reread
from .limits import Limiter
from .memory import MemoryKeeper, glibc_trim
from .mmi import SID_SERVICE, MmiService
from .outbox import Outbox
from .paused import PausedServices
from .registry import Registry
from .replies import Replies
from .requests import CLIENT_CONTROL, Requests
from .router import check_bind, loop_figures, open_router
from .shmbody import ShmBodies
from .term import Term
from .workers import Loss, Workers

log = logging.getLogger(__name__)

HOUSEKEEPING = 60.0  # seconds between sweeps of the tables keyed by what peers chose


class Broker:
    """Routes jobs from clients to workers grouped in services, through per-service queues. `start()`
    binds and runs the mediate loop on its own thread; `stop()` ends it."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        endpoint: str | None = None,
        transport: LoopFactory | None = None,
        clock: Clock = time.monotonic,
        events: EventPublisher | None = None,
        on_deposed: Callable[[], None] | None = None,
    ) -> None:
        """For tests: `transport` a StubTransport, `clock` its FakeClock, `events` an EventPublisher.
        `on_deposed` runs once it lost its lease for good (`zfab broker` exits: docs/failover.md)."""
        self.settings = s = settings or Settings()
        self.endpoint, self.bound_endpoint, self.clock = endpoint or s.bind_endpoint, "", clock
        self.started_at, self.boot = time.time(), os.urandom(8).hex()  # boot: clients see a restart in keepalives
        self.rejected, self.counts = Counter[str](), Counter[str]()  # malformed frames by reason; routed traffic
        self.peer_log = LogBudget(burst=3, per_second=0.1, clock=clock)  # what peers send: a few lines, not a flood
        self._next_keepalive, self._next_housekeeping = 0.0, clock() + HOUSEKEEPING
        self.loop: Transport = (transport or OwnerLoop)(
            self,
            name="broker",
            outbound_size=s.outbound_queue_size,
            submit_timeout=s.submit_timeout,
            linger=1.0,
            sched_batch=s.sched_batch,
            idle_poll=s.broker_idle_poll_us / 1e6,
        )
        self.registry = reg = Registry.from_settings(s, clock)
        self.identities = ids = Identities(self.loop, None)  # its ZAP handler comes with start() (CURVE)
        self.paused = PausedServices(open_kept(s), s.max_services)  # read by start(); kept as kept.py says
        self.shm = ShmArena(s, clock=clock)  # same-host shared memory (transport/shm.py)
        self.inventory = Inventory(s.broker_inventory) if s.broker_inventory else None  # for NorFab workers
        self.memory = MemoryKeeper(trim=glibc_trim())  # gives back what a burst used (memory.py)
        self.events = events or publisher_for(s, self.loop.context, ids.grants)
        limits = Limiter(self.paused.kept)  # run-time limits: kept, and reread by a new term, as the pauses are
        takeover = (self.paused.kept, self.loop.call, (self.paused.take, limits.take))  # kept.reread's arguments
        self.term = Term.from_settings(s, self.loop, clock, self.endpoint, lambda: reread(*takeover), on_deposed)
        changed: set[bytes] = set()  # services whose queue changed, for queue.<service> events
        self.hooks = hooks = cross_cutting(s, clock, self.term, self.memory, self.events, changed, reg, self.paused)
        self.out = out = Outbox(self.loop, hooks, self.counts)
        self.dispatch = d = Dispatch(
            reg, s, out=out, counts=self.counts, clock=clock, paused=self.paused.names, queue_changed=changed,
            shm=ShmBodies(self.shm, max_bytes=s.max_message_bytes, counts=self.counts, clock=clock), limits=limits,
        )  # fmt: skip
        self.deadlines = Deadlines(d, reg, s, out=out, counts=self.counts)
        self.workers = Workers(reg, s, out=out, identities=ids, counts=self.counts, clock=clock)
        self.replies = Replies(reg, d, self.deadlines, s, out=out, hooks=hooks, counts=self.counts)
        self.requests = Requests(
            reg, d, self.deadlines, s, out=out, identities=ids, hooks=hooks, counts=self.counts, clock=clock,
            grace=s.broker_startup_grace, boot=self.boot, host=self.shm.host,
        )  # fmt: skip
        self.mmi = MmiService(self, BrokerControl(reg, d, self.paused, hooks=hooks, counts=self.counts), out)

    def start(self) -> Broker:
        s = self.settings
        check_bind(s, self.endpoint)
        self.identities.start_zap(s.curve_secret, s.curve_clients, s.access_file)  # under CURVE: who each key is
        for start in (self.paused.load, self.dispatch.limits.load, self.shm.reclaim, *self.hooks.start):
            start()
        self.loop.start()
        return self

    def stop(self) -> None:
        self.identities.stop_zap()  # first: the context cannot terminate while the ZAP socket is open
        for stop in (*self.hooks.stop, self.loop.stop, self.paused.kept.close):
            stop()  # hooks before the loop (its context outlives the publisher's XPUB); what a user set, last

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self, task: str, kwargs: dict[str, Any] | None = None) -> Any:
        """An MMI answer computed on the owner thread (for metrics and tests)."""
        return self.loop.call(lambda: self.mmi.run(task, kwargs or {}))

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        sock = open_router(ctx, self.settings, self.endpoint, bind=self.term.serving)  # a standby's: unbound
        self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return sock

    def on_connected(self) -> None:
        self.term.bound(self.requests, self.workers, self.process_client)  # a new term: grace, epoch, settling

    def on_closing(self) -> None:
        for w in list(self.registry.workers.values()):
            self.out.send(nfp.broker_control(w.ident, nfp.DISCONNECT, w.service))

    def on_batch_end(self) -> None:
        if self.dispatch.dirty or self.registry.freed:
            self.dispatch.pump()

    def on_timer(self, now: float) -> float | None:
        """Majordomo's mediate() between two polls: keepalives and purges, deadlines, the queue, housekeeping."""
        reg, requests = self.registry, self.requests
        keepalives = reg.workers or reg.client_keepalives
        if keepalives and now >= self._next_keepalive:  # Majordomo's send_heartbeats and purge_workers
            soonest, purged = self.workers.tend(now)
            for loss in purged:
                self.lost(loss)
            self._next_keepalive = min(soonest, reg.tend_clients(now, requests.keepalive))
        self.deadlines.tend(now)
        if requests.grace_until is not None and now >= requests.grace_until:
            requests.end_grace()
        if now >= self._next_housekeeping:
            self.housekeeping(now)
        if self.dispatch.dirty or reg.freed:
            self.dispatch.pump()
        wake = min(self._next_keepalive, self._next_housekeeping) if keepalives else self._next_housekeeping
        if (at := self.deadlines.next_deadline()) is not None and at < wake:
            wake = at
        if requests.grace_until is not None:
            wake = min(wake, requests.grace_until)
        for tend in self.hooks.tend:  # after everything above that moves a queue
            if (at := tend(now)) is not None and at < wake:
                wake = at
        return wake

    def on_frames(self, frames: Frames) -> None:
        if len(frames) < 3:
            self.reject("frame_count", f"{len(frames)} frames")
            return
        sender, header = bytes(frames[0]), frames[2]  # the identity is short: bytes already, not copied
        if self.identities.zap is not None and not self.identities.same_key(sender):
            self.reject("identity", f"{sender[:64]!r} used by another key than the one that first used it")
            return
        body = frames[1:]
        try:
            if header == nfp.WORKER:
                self.process_worker(sender, nfp.decode_worker(body, self.settings.max_message_bytes))
            elif header == nfp.CLIENT:
                self.process_client(sender, nfp.decode_client(body, self.settings.max_message_bytes))
            else:
                raise nfp.ProtocolError("header", f"unknown header {bytes(header[:16])!r}")
        except nfp.ProtocolError as exc:
            self.reject(exc.reason, f"from {sender[:64]!r}: {exc.detail}")
            if exc.reason == "oversize" and header == nfp.CLIENT:
                self.requests.refuse_oversize(sender, body)
            elif exc.reason == "oversize" and header == nfp.WORKER:
                self.replies.oversize(self.registry.workers.get(sender), body)

    def reject(self, reason: str, detail: str) -> None:
        """A malformed frame: counted by reason, dropped, and logged within a budget."""
        self.rejected[reason] += 1
        held = self.peer_log.take()
        if held is not None:
            n = self.rejected[reason]
            log.warning("broker dropped a message (%s, %d so far; %d lines held back): %s", reason, n, held, detail)

    def process_client(self, sender: bytes, req: nfp.ClientRequest) -> None:
        self.registry.touch_client(sender)
        if req.command in CLIENT_CONTROL:  # KEEPALIVE, OPEN, DISCONNECT: nothing to route
            self._next_keepalive = min(self._next_keepalive, self.requests.client_control(sender, req.command))
            return
        if req.service == nfp.MMI_SERVICE or req.service == SID_SERVICE:
            if (error := self.mmi.serve(sender, req)) is not None:
                self.reject(error.reason, error.detail)
            return
        try:
            if req.command == nfp.POST:
                self.post(sender, req)
            elif req.command == nfp.DELETE:
                self.requests.delete(sender, req)
            else:
                self.requests.route_request(sender, req)
        except Refusal as r:
            if r.malformed is not None:
                self.reject(r.malformed, r.why)
            self.requests.refuse(sender, req, r)
        except Exception as exc:  # RecursionError, MemoryError...: the request is answered, the loop goes on
            self.requests.failed(sender, req, exc)

    def post(self, sender: bytes, req: nfp.ClientRequest) -> None:
        """Idempotent by uuid: a job waiting, in flight or finished lately is not run twice, and its
        answers go to this connection now (its client reconnected). Only a new one is admitted."""
        reg, ids = self.registry, self.identities
        waiting = self.dispatch.queued.get(req.uuid)
        if waiting is not None:
            if ids.owns(waiting):
                waiting.client = sender
            self.dispatch.requeued(waiting)
            return
        route = reg.routes.get(req.uuid)
        if route is not None:
            if route.job is None or ids.owns(route.job):
                route.client = sender
            self.requests.resend(sender, req, [w for n in route.workers if (w := reg.by_name.get(n)) is not None])
            return
        done_on = reg.finished_on(req.uuid)
        if done_on is not None:  # finished already: its worker answers with the stored result
            self.requests.resend(sender, req, [done_on])
            return
        self.requests.admit(sender, req)

    def process_worker(self, sender: bytes, msg: nfp.WorkerControl | nfp.WorkerReply) -> None:
        worker = self.registry.workers.get(sender)
        if isinstance(msg, nfp.WorkerReply):  # the most frequent: a job's answer
            if worker is None:
                self.workers.disconnect_unknown(sender, b"")
                return
            worker.keepalive.heard(keepalive=False)
            self.replies.forward(worker, msg)
        elif msg.command == nfp.READY:
            self.ready(sender, msg)
        elif worker is None:
            self.workers.disconnect_unknown(sender, msg.service)
        elif msg.command == nfp.KEEPALIVE:
            if (moved := self.workers.heard(worker, msg.stats)) is not None:
                self.dispatch.dirty.add(moved)  # its credits changed: its queue may move
        elif msg.command == nfp.DISCONNECT:
            log.info("worker %s disconnected", worker.label)
            self.lost(self.workers.lose(worker, "disconnected"))

    def ready(self, sender: bytes, msg: nfp.WorkerControl) -> None:
        r = self.workers.ready(sender, msg)
        for loss in r.losses:
            self.lost(loss)
        if r.refused is not None:
            self.reject(*r.refused)
        if r.worker is None or r.svc is None:
            return
        self._next_keepalive = min(self._next_keepalive, r.worker.keepalive.next_deadline())
        self.dispatch.dirty.add(r.svc.name)
        if r.was_tentative:
            self.dispatch.pump()
            self.deadlines.announce_waiting(r.svc)
        for hook in self.hooks.worker:
            hook(r.svc.name, r.worker.name, "ready", "")

    def lost(self, loss: Loss) -> None:
        """A worker gone: its jobs in flight, and its parts still waiting for it, are answered 410."""
        w = loss.worker
        for hook in self.hooks.worker:
            hook(w.service, w.name, "lost", loss.why)
        self.replies.lost(loss)
        if loss.tell is not None:
            self.workers.tell_to_leave(w, loss.tell)

    def housekeeping(self, now: float) -> None:
        """Forget what peers chose names for and nobody used for a while (bounded tables stay small)."""
        self._next_housekeeping = now + HOUSEKEEPING
        self.registry.forget_idle_services()
        self.shm.sweep()  # every RECLAIM_SECONDS: blocks whose creator died
        self.dispatch.limits.sweep(now)  # limit buckets with nothing running or waiting
        self.workers.housekeeping(now, told_for=HOUSEKEEPING)

    def figures(self) -> dict[str, Any]:
        """The broker's own figures, for MMI's show_broker (mmi.py BrokerView)."""
        own = {"endpoint": self.bound_endpoint, "uptime_s": round(time.time() - self.started_at, 3), "boot": self.boot}
        own.update(starting=self.requests.grace_until is not None, frames_rejected=dict(self.rejected))
        own.update(loop_figures(self.loop), counts=dict(self.counts), **self.identities.figures())
        return {**own, **self.memory.facts(self.clock()), **self.dispatch.shm.figures(), **self.term.figures()}
