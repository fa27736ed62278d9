"""The broker: a mediator of composed parts, its ROUTER owned by one loop (transport/loop.py).

Shaped like zguide's Majordomo: `process_client` and `process_worker` take each frame, `post`
de-duplicates a POST by its uuid, and `on_timer` is `mediate()` between two polls (keepalives and
purges, deadlines, the queue, housekeeping). The parts do the rest and return what the broker must
do, never calling back into it: workers.py (READY, the keepalive wave, purge and loss), requests.py
(admission, GET/PUT/DELETE), dispatch.py (credits and the queue), deadlines.py (expiry, notices,
cancel), replies.py (workers' answers to clients), mmi.py (a view and a control). What cuts across
(events, hop traces, memory trimming) is hooks (hooks.py); every part sends through one Outbox.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import zmq

from ..core import payloads
from ..core import protocol as nfp
from ..core.keepalive import Clock, KeepAlive
from ..core.logbudget import LogBudget
from ..core.payloads import Word
from ..errors import SecurityError
from ..settings import Settings
from ..transport.base import Frames, LoopFactory, Transport
from ..transport.loop import OwnerLoop
from ..transport.security import ZapHandler, is_loopback
from ..transport.shm import ShmArena
from .admission import Refusal
from .control import BrokerControl
from .deadlines import Deadlines
from .dispatch import Dispatch
from .events import EventPublisher
from .hooks import Hook, Hooks, HopTraces, TrimMemory
from .identities import Identities
from .inventory import Inventory
from .limits import Limiter
from .memory import MemoryKeeper, glibc_trim
from .mmi import SID_SERVICE, MmiService
from .outbox import Outbox
from .paused import PausedServices
from .queueevents import QueueEvents
from .registry import Registry, WorkerRecord
from .replies import Replies
from .requests import Requests
from .router import open_router
from .shmbody import ShmBodies
from .workers import Loss, Workers

log = logging.getLogger(__name__)

HOUSEKEEPING = 60.0  # seconds between sweeps of the tables keyed by what peers chose


class Broker:
    """Routes jobs from clients to workers grouped in services, through per-service queues.

    `start()` binds and runs the mediate loop on its own thread; `stop()` ends it.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        endpoint: str | None = None,
        transport: LoopFactory | None = None,
        clock: Clock = time.monotonic,
        events: EventPublisher | None = None,
    ) -> None:
        """`transport` and `clock` are for tests (a StubTransport and its FakeClock, transport/stub.py), and
        `events` a publisher that replaces the one ZFAB_BROKER_EVENTS would make."""
        self.settings = s = settings or Settings()
        self.endpoint = endpoint or s.bind_endpoint
        self.clock = clock
        self.registry = reg = Registry(
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
        self.rejected: Counter[str] = Counter()  # malformed frames by reason
        self.counts: Counter[str] = Counter()  # routed traffic by kind
        self.reject_log = LogBudget(burst=3, per_second=0.1, clock=clock)  # a flood of bad frames: a few lines
        self._next_keepalive = 0.0
        self._next_housekeeping = clock() + HOUSEKEEPING
        self.bound_endpoint = ""
        self.loop: Transport = (transport or OwnerLoop)(
            self, name="broker", outbound_size=s.outbound_queue_size, submit_timeout=s.submit_timeout, linger=1.0
        )
        self.identities = ids = Identities(self.loop, None)  # its ZAP handler comes with start() (CURVE)
        self.paused = PausedServices(Path(s.data_dir) / "broker", s.max_services)  # read by start()
        # Same-host shared memory: its host id in keepalive answers; it reads a client's block only
        # for a worker on another host, and reclaims the blocks of processes that died.
        self.shm = ShmArena(s, clock=clock)
        # NorFab workers ask the broker for their inventory (sid.service.broker, inventory.py).
        self.inventory: Inventory | None = Inventory(s.broker_inventory) if s.broker_inventory else None
        self.memory = MemoryKeeper(trim=glibc_trim())  # gives back what a burst used (memory.py, issue 31)
        self.events = events or _publisher(s, self.loop)  # job state changes by topic (events.py); off unless set
        queue_changed: set[bytes] = set()
        self.hooks = hooks = Hooks(self._hooks(queue_changed))
        self.out = out = Outbox(self.loop, hooks, self.counts)
        self.dispatch = d = Dispatch(
            reg, s, out=out, counts=self.counts, clock=clock, paused=self.paused, limits=Limiter(Path(s.data_dir) / "broker"),
            shm=ShmBodies(self.shm, max_bytes=s.max_message_bytes, counts=self.counts, clock=clock),
            queue_changed=queue_changed,
        )  # fmt: skip
        self.deadlines = Deadlines(d, reg, s, out=out, counts=self.counts)
        self.workers = Workers(reg, s, out=out, identities=ids, counts=self.counts, clock=clock)
        self.replies = Replies(reg, d, s, out=out, hooks=hooks, counts=self.counts)
        self.requests = Requests(
            reg, d, self.deadlines, s, out=out, identities=ids, hooks=hooks, counts=self.counts, clock=clock,
            grace=s.broker_startup_grace,
        )  # fmt: skip
        self.mmi = MmiService(self, BrokerControl(reg, d, self.paused, hooks=hooks, counts=self.counts))

    def _hooks(self, queue_changed: set[bytes]) -> list[Hook]:
        """What cuts across, in the order each point calls it: trimming, events, hop traces."""
        s, out = self.settings, []
        if self.memory.enabled:
            out.append(TrimMemory(self.memory, self.loop))
        publishers = [self.events] if self.events else []
        for p in publishers:
            out += [p, QueueEvents(p, queue_changed, registry=self.registry, paused=self.paused, settings=s)]
        if s.hop_traces:
            out.append(HopTraces(self.clock, [p.traced for p in publishers]))
        return out

    @property
    def zap(self) -> ZapHandler | None:
        return self.identities.zap

    @zap.setter
    def zap(self, handler: ZapHandler | None) -> None:
        self.identities.zap = handler

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
        if s.broker_events and not curve and not s.insecure and not is_loopback(s.broker_events):
            raise SecurityError(f"refusing to bind the events endpoint {s.broker_events} without CURVE")
        if curve:
            assert s.curve_clients is not None
            self.zap = ZapHandler(self.loop.context, s.curve_clients)
            self.zap.start()
        self.paused.load()
        self.shm.reclaim()
        self.dispatch.limits.load()
        for start in self.hooks.start:
            start()
        self.loop.start()
        log.debug("broker listening on %s%s", self.bound_endpoint, " (CURVE)" if curve else "")
        return self

    def stop(self) -> None:
        if self.zap is not None:
            self.zap.stop()  # first: the context cannot terminate while the ZAP socket is open
        for stop in self.hooks.stop:
            stop()  # before the loop: its context cannot terminate while the publisher's XPUB is open
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
        sock = open_router(ctx, self.settings, self.endpoint)
        self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return sock

    def on_connected(self) -> None:
        pass

    def on_closing(self) -> None:
        for w in list(self.registry.workers.values()):
            self.out.send(nfp.broker_control(w.ident, nfp.DISCONNECT, w.service))

    def on_batch_end(self) -> None:
        if self.dispatch.dirty or self.registry.freed:
            self.dispatch.pump()

    def on_timer(self, now: float) -> float | None:
        """Majordomo's mediate() between two polls: keepalives and purges, deadlines, the queue, housekeeping."""
        reg, d, r = self.registry, self.dispatch, self.requests
        if (reg.workers or reg.client_keepalives) and now >= self._next_keepalive:
            self._next_keepalive = min(self.send_keepalives(now), reg.tend_clients(now, self._client_keepalive))
        self.deadlines.expire(now)
        self.deadlines.due(now)
        self.deadlines.tell_waiting(now)
        if r.grace_until is not None and now >= r.grace_until:
            r.end_grace()
        if now >= self._next_housekeeping:
            self.housekeeping(now)
        if d.dirty or reg.freed:
            d.pump()
        deadlines = [self._next_housekeeping, self.deadlines.next_deadline(), r.grace_until]
        for tend in self.hooks.tend:  # after everything above that moves a queue
            deadlines.append(tend(now))
        if reg.workers or reg.client_keepalives:
            deadlines.append(self._next_keepalive)
        return min(t for t in deadlines if t is not None)

    def on_frames(self, frames: Frames) -> None:
        if len(frames) < 3:
            self.reject("frame_count", f"{len(frames)} frames")
            return
        sender, header = bytes(frames[0]), frames[2]  # the identity is short: bytes already, not copied
        ids = self.identities
        if ids.zap is not None and not ids.same_key(sender):
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
        held = self.reject_log.take()
        if held is not None:
            n = self.rejected[reason]
            log.warning("broker dropped a message (%s, %d so far; %d lines held back): %s", reason, n, held, detail)

    # ---- clients -------------------------------------------------------------

    def process_client(self, sender: bytes, req: nfp.ClientRequest) -> None:
        self.registry.touch_client(sender)
        if req.command == nfp.KEEPALIVE:
            self.counts["client_keepalive"] += 1
            ka = self.registry.client_keepalive_heard(sender)
            if ka is not None:  # not an answer to the wave's: answered at once
                self._client_keepalive(sender, ka)
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
                self.requests.delete(sender, req)
            else:
                self.requests.route_request(sender, req)
        except Refusal as r:
            if r.malformed is not None:
                self.reject(r.malformed, r.why)
            self.requests.refuse(sender, req, r)
        except Exception as exc:  # RecursionError, MemoryError...: the request is answered, the loop goes on
            self.counts["handler_errors"] += 1
            log.exception("broker failed on a %s", nfp.COMMAND_NAMES[req.command])
            why = f"the broker could not handle this request: {type(exc).__name__}: {str(exc)[:200]}"
            self.requests.refuse(sender, req, Refusal(nfp.ST_ERROR, Word.FAILED, why))

    def post(self, sender: bytes, req: nfp.ClientRequest) -> None:
        """A POST is idempotent by uuid: a job waiting, in flight or finished lately is never run twice
        (the same answer again, or its workers answer with its state). Only a new one is admitted."""
        reg, ids = self.registry, self.identities
        waiting = self.dispatch.queued.get(req.uuid)
        if waiting is not None:
            # From another connection it is the job's client again (it reconnected, or the API
            # restarted): answers go there now.
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

    def process_mmi(self, sender: bytes, req: nfp.ClientRequest) -> None:
        try:
            status, answer = self.mmi.answer(req.body, req.service)
        except nfp.ProtocolError as exc:
            self.reject(exc.reason, exc.detail)
            status, answer = nfp.ST_BAD_REQUEST, nfp.dumps({"errors": [exc.detail]})
        self.counts["mmi"] += 1
        # NorFab's broker answers MMI twice, as RESPONSE and as MMI; its clients read either
        # (NFPClient.mmi() only the MMI copy), refusals included.
        for cmd in (nfp.RESPONSE, nfp.MMI):
            self.out.send(nfp.broker_reply(sender, cmd, req.service, req.uuid, status, answer))

    def _client_keepalive(self, client: bytes, ka: KeepAlive) -> bool:
        facts: dict[str, Any] = {"boot": self.boot, "max": self.settings.max_message_bytes}
        if self.shm.host:
            facts["host"] = self.shm.host
        return self.requests.keepalive(client, ka, facts)

    # ---- workers -------------------------------------------------------------

    def process_worker(self, sender: bytes, msg: nfp.WorkerControl | nfp.WorkerReply) -> None:
        worker = self.registry.workers.get(sender)
        if isinstance(msg, nfp.WorkerReply):  # the most frequent: a job's answer
            if worker is None:
                self.workers.disconnect_unknown(sender, b"")
                return
            worker.keepalive.heard(keepalive=False)
            self.replies.forward(worker, msg)
            return
        if msg.command == nfp.READY:
            self.ready(sender, msg)
        elif worker is None:
            self.workers.disconnect_unknown(sender, msg.service)
        elif msg.command == nfp.KEEPALIVE:
            if self.workers.heard(worker, msg.stats):
                self.relevel(worker)
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

    def relevel(self, w: WorkerRecord) -> None:
        """Its credits or draining changed: filed under its new level, its queue looked at again."""
        svc = self.registry.services.get(w.service)
        if svc is not None:
            self.registry.set_level(svc, w)
            self.dispatch.dirty.add(svc.name)

    def send_keepalives(self, now: float) -> float:
        """The workers' keepalive wave and purge (workers.py); returns when the next is due."""
        soonest, purged = self.workers.tend(now)
        for loss in purged:
            self.lost(loss)
        return soonest

    def lost(self, loss: Loss) -> None:
        """A worker gone: its jobs in flight, and its parts still waiting for it, are answered 410."""
        w = loss.worker
        jobs = loss.jobs
        jobs.update(self.dispatch.worker_lost(loss.svc, w))
        for hook in self.hooks.worker:
            hook(w.service, w.name, "lost", loss.why)
        why = f"worker '{w.label}' was lost ({loss.why}) before it answered"
        for uuid, client in jobs.items():
            self.counts["jobs_lost"] += 1
            self.out.reply(client, w.service, uuid, nfp.ST_WORKER_LOST, payloads.lost(w.label, uuid, w.service, why))
        if loss.svc is not None:
            self.dispatch.dirty.add(loss.svc.name)
        if loss.tell is not None:
            self.workers.tell_to_leave(w, loss.tell)

    def housekeeping(self, now: float) -> None:
        """Forget what peers chose names for and nobody used for a while (bounded tables stay small)."""
        self._next_housekeeping = now + HOUSEKEEPING
        self.registry.forget_idle_services()
        self.shm.sweep()  # every RECLAIM_SECONDS: blocks whose creator died
        self.dispatch.limits.sweep(now)  # limit buckets with nothing running or waiting
        self.workers.housekeeping(now, told_for=HOUSEKEEPING)

    # ---- what MMI reads (mmi.py BrokerView) ------------------------------------

    def figures(self) -> dict[str, Any]:
        st = self.loop.stats
        return {
            "endpoint": self.bound_endpoint,
            "uptime_s": round(time.time() - self.started_at, 3),
            "boot": self.boot,
            "starting": self.requests.grace_until is not None,
            "identities_bound": len(self.identities.keys),
            "identities_capacity": self.identities.KEYS_MAX,
            "outbound_queue_depth": self.loop.queue_depth(),
            "outbound_queue_capacity": self.loop.outbound_size,
            "frames_received": st.received,
            "frames_sent": st.sent,
            "frames_send_dropped": st.send_dropped,
            "handler_errors": st.handler_errors,
            "frames_rejected": dict(self.rejected),
            "counts": dict(self.counts),
            **self.memory.facts(self.clock()),
            "shm_host": self.shm.host,
            "shm_threshold": self.shm.threshold if self.shm.enabled else None,
            "shm_reclaimed": self.shm.counts["reclaimed"],
        }


def _publisher(s: Settings, loop: Transport) -> EventPublisher | None:
    """The event publisher ZFAB_BROKER_EVENTS asks for (events.py), or None: no events."""
    if not s.broker_events:
        return None
    return EventPublisher(
        s.broker_events,
        hwm=s.broker_events_hwm,
        queue_size=s.broker_events_queue,
        max_subscriptions=s.broker_events_subscriptions,
        curve_secret=s.curve_secret,
        context=loop.context,
    )
