"""The broker: its ROUTER socket is owned by one mediate loop (see loop.py).

Named after what the spec says happens: `process_client`, `process_worker`,
`dispatch`, `purge_workers`, `send_keepalives`. MMI lives in mmi.py.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from typing import Any

import zmq

from ..core import payloads
from ..core import protocol as nfp
from ..core.keepalive import Clock
from ..core.payloads import Word
from ..errors import SecurityError
from ..settings import Settings
from ..transport.base import Frames, LoopFactory, Transport
from ..transport.loop import OwnerLoop
from ..transport.security import ZapHandler, curve_server, is_loopback
from .mmi import MmiService
from .registry import Registry, WorkerRecord

log = logging.getLogger(__name__)


class Broker:
    """Routes jobs from clients to workers grouped in services.

    `start()` binds and runs the mediate loop on its own thread; `stop()` ends it.
    """

    TOLD_TO_LEAVE_MAX = 10_000  # unknown identities remembered for DISCONNECT rate-limiting

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        endpoint: str | None = None,
        transport: LoopFactory | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        """`transport` and `clock` are for tests: a StubTransport and its FakeClock (transport/stub.py)."""
        self.settings = settings or Settings()
        self.endpoint = endpoint or self.settings.bind_endpoint
        s = self.settings
        self.registry = Registry(
            interval=s.keepalive_interval,
            multiplier=s.keepalive_multiplier,
            max_inflight_per_worker=s.max_inflight_per_worker,
            max_routes=s.max_routes,
            clock=clock,
        )
        self.clock = clock
        self.started_at = time.time()
        self.rejected: Counter[str] = Counter()  # malformed frames by reason
        self.counts: Counter[str] = Counter()  # routed traffic by kind
        self.purged: Counter[str] = Counter()  # workers purged, by service
        self._warned: Counter[str] = Counter()
        self._next_timer = 0.0
        self.bound_endpoint = ""
        self.mmi = MmiService(self)
        self.zap: ZapHandler | None = None
        self.told_to_leave: OrderedDict[bytes, float] = OrderedDict()  # unknown worker -> last DISCONNECT
        self.loop: Transport = (transport or OwnerLoop)(
            self,
            name="broker",
            outbound_size=s.outbound_queue_size,
            submit_timeout=s.submit_timeout,
            linger=1.0,
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
        if curve:
            assert s.curve_clients is not None
            self.zap = ZapHandler(self.loop.context, s.curve_clients)
            self.zap.start()
        self.loop.start()
        log.info("broker listening on %s%s", self.bound_endpoint, " (CURVE)" if curve else "")
        return self

    def stop(self) -> None:
        if self.zap is not None:
            self.zap.stop()  # first: the context cannot terminate while the ZAP socket is open
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
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # A worker reconnecting with its old identity takes the route over at once.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        # Unroutable sends raise instead of vanishing silently, so they are counted.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        if self.settings.curve_secret:
            curve_server(sock, self.settings.curve_secret)
        sock.bind(self.endpoint)
        self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return sock

    def on_batch_end(self) -> None:
        pass

    def on_connected(self) -> None:
        pass

    def on_closing(self) -> None:
        for w in list(self.registry.workers.values()):
            self.send(nfp.broker_control(w.name, nfp.DISCONNECT, w.service))

    def on_timer(self, now: float) -> float | None:
        if not self.registry.workers:
            return None
        if now >= self._next_timer:
            self.purge_workers()
            self.send_keepalives()
            self._next_timer = min(
                (w.keepalive.next_deadline() for w in self.registry.workers.values()), default=now + 3600
            )
        return self._next_timer

    def on_frames(self, frames: Frames) -> None:
        if len(frames) < 3:
            self.reject("frame_count", f"{len(frames)} frames")
            return
        sender, header = frames[0], frames[2]
        body = frames[1:]
        try:
            if header == nfp.CLIENT:
                self.process_client(sender, nfp.decode_client(body, self.settings.max_message_bytes))
            elif header == nfp.WORKER:
                if self.zap is not None and not self.zap.may_register(sender, self.loop.user_id):
                    self.reject("auth", f"worker frame from {sender[:64]!r} with a key not issued for that name")
                    return
                self.process_worker(sender, nfp.decode_worker(body, self.settings.max_message_bytes))
            else:
                raise nfp.ProtocolError("header", f"unknown header {bytes(header[:16])!r}")
        except nfp.ProtocolError as exc:
            self.reject(exc.reason, f"from {sender[:64]!r}: {exc.detail}")

    # ---- helpers -------------------------------------------------------------

    def send(self, frames: Frames) -> None:
        if not self.loop.send_now(frames):
            self.counts["send_failed"] += 1

    def reject(self, reason: str, detail: str) -> None:
        self.rejected[reason] += 1
        n = self._warned[reason] = self._warned[reason] + 1
        if n <= 3 or n % 1000 == 0:
            log.warning("broker dropped a malformed message (%s, %d so far): %s", reason, n, detail)

    def reply(self, client: bytes, service: bytes, uuid: bytes, status: bytes, payload: Any) -> None:
        self.send(nfp.broker_reply(client, nfp.RESPONSE, service, uuid, status, nfp.dumps(payload)))

    # ---- clients -------------------------------------------------------------

    def process_client(self, sender: bytes, req: nfp.ClientRequest) -> None:
        self.registry.touch_client(sender)
        if req.command == nfp.KEEPALIVE:
            self.counts["client_keepalive"] += 1
            self.send(nfp.broker_reply(sender, nfp.KEEPALIVE, req.service, req.uuid, nfp.ST_OK, b""))
            return
        if req.service == nfp.MMI_SERVICE:
            self.process_mmi(sender, req)
            return
        if req.command in (nfp.OPEN, nfp.DISCONNECT):
            return  # NorFab clients may announce themselves; nothing to route
        self.dispatch(sender, req)

    def process_mmi(self, sender: bytes, req: nfp.ClientRequest) -> None:
        try:
            status, answer = self.mmi.answer(req.body)
        except nfp.ProtocolError as exc:
            self.reject(exc.reason, exc.detail)
            self.reply(sender, nfp.MMI_SERVICE, req.uuid, nfp.ST_BAD_REQUEST, {"errors": [exc.detail]})
            return
        self.counts["mmi"] += 1
        # NorFab's broker answers MMI twice, as RESPONSE and as MMI; its clients read either.
        for cmd in (nfp.RESPONSE, nfp.MMI):
            self.send(nfp.broker_reply(sender, cmd, nfp.MMI_SERVICE, req.uuid, status, answer))

    def dispatch(self, sender: bytes, req: nfp.ClientRequest) -> None:
        """Send a client's POST/GET/PUT/DELETE to the workers its target names."""
        reg = self.registry
        try:
            target = nfp.parse_target(req.target)
        except nfp.ProtocolError as exc:
            self.reject(exc.reason, exc.detail)
            self._refuse(sender, req, nfp.ST_BAD_REQUEST, Word.FAILED, f"bad target: {exc.detail}")
            return
        route = reg.routes.get(req.uuid) if req.command == nfp.POST else None
        if route is not None:
            # A retried POST of a job in flight goes back to the workers that have it;
            # they answer with its state instead of running it twice.
            self.counts["post_retried"] += 1
            workers = [reg.workers[n] for n in route.workers if n in reg.workers]
            self._dispatched(sender, req, workers)
            for w in workers:
                self.send(nfp.broker_job(w.name, req.command, sender, req.uuid, req.body))
            return
        done_on = reg.finished_on(req.uuid) if req.command == nfp.POST else None
        if done_on is not None:
            # Finished already: the worker answers with the stored result instead of a rerun.
            self.counts["post_retried"] += 1
            self._dispatched(sender, req, [done_on])
            self.send(nfp.broker_job(done_on.name, req.command, sender, req.uuid, req.body))
            return
        workers = reg.select(req.service, target)
        if not workers:
            self.counts["no_workers"] += 1
            svc = req.service.decode(errors="replace")
            known = req.service in reg.services
            why = (
                f"service '{svc}' has no live worker matching target {req.target.decode(errors='replace')!r}"
                if known
                else f"service '{svc}' is unknown: no worker has registered it"
            )
            self._refuse(sender, req, nfp.ST_BAD_REQUEST, Word.FAILED, why)
            return
        if req.command == nfp.POST:
            if not reg.has_capacity(workers):
                self.counts["busy"] += 1
                self._refuse(
                    sender,
                    req,
                    nfp.ST_BUSY,
                    Word.BUSY,
                    "broker is at its bound of jobs in flight for these workers; retry later",
                )
                return
            reg.add_route(req.uuid, sender, req.service, workers, push=bool(req.flags.get("push")))
            self.counts["post"] += 1
        else:
            self.counts[nfp.COMMAND_NAMES[req.command].lower()] += 1
        # Without a 202 a client can only wait for one worker: ack=false skips it for one worker only.
        if req.command in (nfp.POST, nfp.GET) and (req.flags.get("ack", True) or len(workers) > 1):
            self._dispatched(sender, req, workers)
        for w in workers:
            self.send(nfp.broker_job(w.name, req.command, sender, req.uuid, req.body))

    def _dispatched(self, sender: bytes, req: nfp.ClientRequest, workers: list[WorkerRecord]) -> None:
        answer = payloads.dispatched(req.uuid, req.target, req.service, [w.label for w in workers])
        self.reply(sender, req.service, req.uuid, nfp.ST_DISPATCHED, answer)

    def _refuse(self, sender: bytes, req: nfp.ClientRequest, status: bytes, word: Word, why: str) -> None:
        self.reply(
            sender, req.service, req.uuid, status, payloads.refusal(req.uuid, req.target, req.service, word, why)
        )

    # ---- workers -------------------------------------------------------------

    def process_worker(self, sender: bytes, msg: nfp.WorkerControl | nfp.WorkerReply) -> None:
        reg = self.registry
        worker = reg.workers.get(sender)
        if isinstance(msg, nfp.WorkerControl):
            if msg.command == nfp.READY:
                if worker is not None:
                    # Same identity, fresh start (restart or reconnect): its jobs in flight are gone.
                    self._lose(worker, "re-registered")
                rec = reg.register_worker(sender, msg.service)
                self._next_timer = 0.0
                log.info("worker %s ready for service %s", rec.label, msg.service.decode(errors="replace"))
                return
            if worker is None:
                self._disconnect_unknown(sender, msg.service)
                return
            if msg.command == nfp.KEEPALIVE:
                worker.keepalive.heard()
                if msg.stats is not None:
                    worker.stats = msg.stats
            elif msg.command == nfp.DISCONNECT:
                log.info("worker %s disconnected", worker.label)
                self._lose(worker, "disconnected")
            return
        if worker is None:
            self._disconnect_unknown(sender, b"")
            return
        worker.keepalive.heard(keepalive=False)
        self.forward(worker, msg)

    def forward(self, worker: WorkerRecord, msg: nfp.WorkerReply) -> None:
        """Route a worker's reply to its client; final replies close the worker's share of the job."""
        forward = True
        if msg.command == nfp.RESPONSE and msg.status in nfp.FINAL_STATUSES:
            route = self.registry.complete(worker, msg.uuid)
            if route is not None and not route.push:
                # A NorFab client collects results with GET; the completion only frees the slot.
                forward = False
            elif route is None and msg.uuid in self.registry.routes:
                # The job is in flight elsewhere now (this worker was purged and the job
                # retried): a late result from the lost attempt is discarded.
                self.counts["stale_results"] += 1
                forward = False
        if forward:
            self.counts["forwarded"] += 1
            self.send(nfp.broker_reply(msg.client, msg.command, worker.service, msg.uuid, msg.status, msg.payload))

    def _disconnect_unknown(self, sender: bytes, service: bytes) -> None:
        # After a broker restart workers learn at their next frame that they must re-register.
        # Once per keepalive interval per identity: a burst of frames from before the worker
        # re-registers must not make it reconnect again (and lose what it was sent meanwhile).
        self.counts["unknown_worker"] += 1
        now = self.clock()
        last = self.told_to_leave.get(sender)
        if last is not None and now - last < self.settings.keepalive_interval:
            return
        self.told_to_leave[sender] = now
        self.told_to_leave.move_to_end(sender)
        if len(self.told_to_leave) > self.TOLD_TO_LEAVE_MAX:
            self.told_to_leave.popitem(last=False)
        self.send(nfp.broker_control(sender, nfp.DISCONNECT, service))

    def _lose(self, worker: WorkerRecord, why_lost: str) -> None:
        lost = self.registry.remove_worker(worker)
        for uuid, client in lost.items():
            self.counts["jobs_lost"] += 1
            why = f"worker '{worker.label}' was lost ({why_lost}) before it answered"
            self.reply(
                client, worker.service, uuid, nfp.ST_WORKER_LOST, payloads.lost(worker.label, uuid, worker.service, why)
            )

    def purge_workers(self) -> None:
        for w in self.registry.expired_workers():
            log.warning("worker %s missed its keepalives for %.1f s; purged", w.label, w.keepalive.hold_time)
            self.purged[w.service.decode(errors="replace")] += 1
            self.send(nfp.broker_control(w.name, nfp.DISCONNECT, w.service))
            self._lose(w, "keepalives expired")

    def send_keepalives(self) -> None:
        for w in self.registry.workers.values():
            if w.keepalive.due():
                self.send(nfp.broker_control(w.name, nfp.KEEPALIVE, w.service))
                w.keepalive.mark_sent()
