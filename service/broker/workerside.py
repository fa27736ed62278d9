"""The broker's worker side: registration, keepalives, replies, purges (mixed into Broker).

What a worker sends is handled here; what a client sends, and the loop's plumbing, in broker.py.
Runs on the broker's owner thread.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict
from typing import Any

from ..core import hoptrace, payloads, shmhandle, sizes
from ..core import protocol as nfp
from ..core.keepalive import Clock
from ..settings import Settings
from ..transport.base import Frames, Transport
from ..transport.security import ZapHandler
from .dispatcher import Dispatcher
from .events import EventPublisher
from .jobqueue import QueuedJob
from .registry import PROTOCOL_V2, Registry, Route, WorkerRecord

log = logging.getLogger(__name__)

MAX_TASKS = 1000  # tasks a worker may announce
MAX_ENTRY_SNIFF = 1 << 20  # a failed entry larger than this keeps its status (it is read on the broker's loop)
MAX_NAMES_SEEN = 10_000  # worker names remembered per service (to tell a typo from a worker away)


def norfab_status(worker: str, status: bytes, payload: nfp.Frame) -> bytes:
    """The status a NorFab client is told a zfab worker's final answer with. A task that could not
    run (unknown task, bad arguments: 400; a handler failure: 500) is a failed result entry, which
    NorFab's workers answer with 200 and NorFab's client keeps as the job's result; under 4xx/5xx it
    would fail the whole job with no entry (and, for a job on several workers, drop the others')."""
    if status not in (nfp.ST_BAD_REQUEST, nfp.ST_ERROR) or len(payload) > MAX_ENTRY_SNIFF:
        return status
    try:
        body = nfp.loads(payload)
    except (ValueError, RecursionError):
        return status
    entry = body.get(worker) if isinstance(body, dict) and len(body) == 1 else None
    return nfp.ST_OK if isinstance(entry, dict) and entry.get("failed") is True else status


class WorkerSide:
    """The Broker's handlers for worker frames; the attributes below are the Broker's."""

    settings: Settings
    registry: Registry
    dispatch: Dispatcher
    loop: Transport
    zap: ZapHandler | None
    events: EventPublisher | None
    clock: Clock
    counts: Counter[str]
    gone: OrderedDict[bytes, dict[str, Any]]
    told_to_leave: OrderedDict[bytes, tuple[float, str | None]]
    keys: OrderedDict[bytes, bytes]
    _next_keepalive: float
    TOLD_TO_LEAVE_MAX: int
    GONE_MAX: int

    def send(self, frames: Frames) -> None:
        raise NotImplementedError

    def reject(self, reason: str, detail: str) -> None:
        raise NotImplementedError

    def reply(self, client: bytes, service: bytes, uuid: bytes, status: bytes, payload: Any) -> None:
        raise NotImplementedError

    def process_worker(self, sender: bytes, msg: nfp.WorkerControl | nfp.WorkerReply) -> None:
        reg = self.registry
        worker = reg.workers.get(sender)
        if isinstance(msg, nfp.WorkerControl):
            if msg.command == nfp.READY:
                self.ready(sender, msg)
                return
            if worker is None:
                self._disconnect_unknown(sender, msg.service)
                return
            if msg.command == nfp.KEEPALIVE:
                worker.keepalive.heard()
                if msg.stats is not None:
                    was = (worker.draining, worker.throttle, worker.credits)
                    worker.stats = msg.stats
                    worker.throttle = 0  # a fresh report: its own figures say what it holds
                    credits = msg.stats.get("credits")
                    if isinstance(credits, int) and not isinstance(credits, bool) and credits >= 1:
                        # Its prefetch adapts to its jobs' run times (worker.py compute_credits).
                        worker.credits = min(credits, self.registry.max_inflight_per_worker)
                    if (worker.draining, worker.throttle, worker.credits) != was:
                        self._relevel(worker)
            elif msg.command == nfp.DISCONNECT:
                log.info("worker %s disconnected", worker.label)
                self._lose(worker, "disconnected")
            return
        if worker is None:
            self._disconnect_unknown(sender, b"")
            return
        worker.keepalive.heard(keepalive=False)
        self.forward(worker, msg)

    def oversize_result(self, sender: bytes, body: Frames) -> None:
        """A worker's final answer over our message limit (its own limit is larger): its client gets a
        failed entry naming the limit in its place, and the worker's credit is freed, instead of the
        job waiting out its deadline. Events and stream chunks over it are dropped (counted)."""
        limit = self.settings.max_message_bytes
        worker = self.registry.workers.get(sender)
        try:
            msg = nfp.decode_worker(body, sizes.socket_cap(limit))
        except nfp.ProtocolError:
            return
        if worker is None or not isinstance(msg, nfp.WorkerReply) or msg.command != nfp.RESPONSE:
            return
        if msg.status not in nfp.FINAL_STATUSES:
            return
        uuid = msg.uuid.decode(errors="replace")
        why = sizes.too_large(f"the answer of job {uuid} from worker {worker.label}", sum(len(f) for f in body), limit)
        entry = payloads.failure(worker.label, worker.service.decode(errors="replace"), uuid, "", [why])
        msg.status, msg.payload, msg.trace = nfp.ST_ERROR, nfp.dumps(entry), None
        worker.keepalive.heard(keepalive=False)
        self.forward(worker, msg)

    def _relevel(self, w: WorkerRecord) -> None:
        svc = self.registry.services.get(w.service)
        if svc is not None:
            self.registry.set_level(svc, w)
            self.dispatch.dirty.add(svc.name)

    def ready(self, sender: bytes, msg: nfp.WorkerControl) -> None:
        """READY: a worker (re)connects. zfab workers announce name, credits and tasks (docs/protocol.md)."""
        reg = self.registry
        ann = msg.stats or {}
        name = ann.get("name")
        name_b = name.encode() if isinstance(name, str) and 0 < len(name.encode()) <= nfp.MAX_NAME_BYTES else sender
        if self.zap is not None and not self.zap.may_register(name_b, self.loop.user_id):
            self.reject("auth", f"READY as {name_b[:64]!r} with a key not issued for that worker name")
            return
        credits = ann.get("credits")
        if isinstance(credits, bool) or not isinstance(credits, int) or credits < 1:
            credits = self.settings.default_worker_credits
        tasks = ann.get("tasks")
        tasks = tasks if isinstance(tasks, dict) and len(tasks) <= MAX_TASKS else None
        old = reg.workers.get(sender)
        if old is not None:  # same connection, fresh start: its jobs in flight are gone
            self._lose(old, "re-registered")
        origin = _origin(ann)
        other = reg.by_name.get(name_b)
        if other is not None:
            # Another connection holds the name. A name has one owner: a live holder keeps it (and
            # its jobs), and the newcomer is refused; a holder whose connection is gone, or silent
            # past the bound, or that the newcomer says was its own, gives it up at once.
            released = self._name_released(other, ann)
            if released is None:
                self._refuse_name(sender, msg.service, other, origin, v2=ann.get("v") == PROTOCOL_V2)
                return
            why, reachable = released
            self.counts["worker_replaced"] += 1
            log.warning("worker %s registered from a new connection; its previous one %s", other.label, why)
            self._lose(other, f"replaced by a new connection: the previous one {why}")
            if reachable:
                self._tell_to_leave(other, "replaced")
        svc = reg.service(msg.service, create=True)
        if svc is None:
            self.counts["services_full"] += 1
            self.reject("services_full", f"READY for a new service with {reg.max_services} services known")
            return
        was_tentative = svc.tentative
        svc.tentative = False
        rec = reg.register_worker(sender, name_b, svc, credits=credits, v2=ann.get("v") == PROTOCOL_V2, tasks=tasks)
        rec.host = shmhandle.check_host(ann.get("host"))
        rec.origin = origin
        if len(svc.workers_seen) < MAX_NAMES_SEEN:
            svc.workers_seen.add(name_b)
        self.gone.pop(name_b, None)
        self._next_keepalive = min(self._next_keepalive, rec.keepalive.next_deadline())
        self.dispatch.dirty.add(svc.name)
        if was_tentative:
            self.dispatch.pump()
            self.dispatch.announce_waiting(svc)
        if self.events is not None:
            self.events.worker(svc.name, name_b, "ready")
        log.debug("worker %s ready for service %s (%d credits)", rec.label, svc.label, rec.credits)

    def _name_released(self, holder: WorkerRecord, ann: dict[str, Any]) -> tuple[str, bool] | None:
        """Why the connection holding a name gives it up to a new one, and whether it can still be
        told; None while it holds it. The probe is a KEEPALIVE: with ROUTER_MANDATORY a send to a
        connection libzmq has closed (its process died, its socket closed) fails at once, so a worker
        restarted after a crash gets its name back on its first READY, not a hold time later."""
        own_key = self.zap is None or self.keys.get(holder.ident) == self.loop.user_id  # CURVE: same key only
        if own_key and ann.get("previous") == holder.ident.decode(errors="replace"):
            return "was its own (it reconnected)", False  # it closed that socket itself: nobody reads there
        silent = holder.keepalive.heard_ago()
        if silent >= self.registry.silence_bound:
            return f"was silent for {silent:.1f} s", True
        if not self.loop.send_now(nfp.broker_control(holder.ident, nfp.KEEPALIVE, holder.service)):
            return "is gone", False
        holder.keepalive.mark_sent()
        return None

    def _refuse_name(self, sender: bytes, service: bytes, holder: WorkerRecord, origin: str, *, v2: bool) -> None:
        """A READY under the name of a live worker: the newcomer is told why and when to try again
        (a zfab worker backs off and logs it once); the holder keeps its place and its jobs."""
        self.counts["worker_name_taken"] += 1
        holder.rivals += 1
        age = max(0.0, time.time() - holder.registered_at)
        why = (
            f"a worker named {holder.label} is already connected from {holder.origin} (for {age:.0f} s); "
            "choose another --name"
        )
        frames = nfp.broker_control(sender, nfp.DISCONNECT, service)
        if v2:
            wait = round(self.registry.silence_bound, 3)
            frames.append(nfp.dumps({"reason": "name_taken", "detail": why, "retry_after": wait}))
        self.send(frames)
        # One line for the first refusal of a rival, then one per hundred: a rival that keeps trying
        # (a standby, or a NorFab worker that reconnects at once) cannot flood the log.
        n = holder.rivals
        level = logging.WARNING if n == 1 or n % 100 == 0 else logging.DEBUG
        log.log(level, "refused a worker named %s from %s: %s (%d refused so far)", holder.label, origin, why, n)

    def forward(self, worker: WorkerRecord, msg: nfp.WorkerReply) -> None:
        """Route a worker's reply to its client; final replies free the worker's credit."""
        forward = True
        route: Route | None = None
        route_now = self.registry.routes.get(msg.uuid)
        # The route knows the job's client as it is now (it may have reconnected since the POST).
        client = route_now.client if route_now is not None else msg.client
        if self.events is not None:
            if msg.command == nfp.RESPONSE:
                self.events.forwarded(msg.uuid, worker.service, msg.status, worker.name, msg.payload)
            elif msg.command == nfp.EVENT:
                self.events.job_event(msg.uuid, worker.service, worker.name, msg.payload)
        status, payload = msg.status, msg.payload
        if msg.command == nfp.RESPONSE:
            if msg.status in nfp.FINAL_STATUSES:
                route = self.registry.complete(worker, msg.uuid)
                self.dispatch.dirty.add(worker.service)
                if route is not None and not route.push and worker.v2:
                    if route.job is not None and not route.job.announce:
                        # A NorFab client: told at once, a task's failure (400/500) as the failed
                        # entry NorFab's workers answer with 200 (docs/protocol.md, NorFab peers).
                        status = norfab_status(worker.label, msg.status, msg.payload)
                    else:
                        # A zfab client that collects by GET: the completion only frees the slot.
                        forward = False
                # A NorFab worker sends no completion of its own: its final answers are the GETs'.
                elif route is None and self._stale(worker, msg.uuid):
                    # The job is in flight elsewhere now (this worker was purged and the job
                    # retried): a late result from the lost attempt is discarded.
                    self.counts["stale_results"] += 1
                    forward = False
            elif msg.status == nfp.ST_BUSY:
                svc = self.registry.services.get(worker.service)
                if svc is not None and self.dispatch.busy(svc, worker, msg.uuid):
                    return  # back in the queue: the client waits on, nothing to tell it
            elif msg.status == nfp.ST_WORKER_ACCEPTED and route_now is not None:
                self.dispatch.started(route_now, worker)
        if forward:
            self.counts["forwarded"] += 1
            frames = nfp.broker_reply(client, msg.command, worker.service, msg.uuid, status, payload)
            if route is not None and route.push and route.job is not None and self.settings.hop_traces:
                trace = self._trace(route.job, worker, msg.trace)
                frames.append(trace)
                if self.events is not None:
                    self.events.trace(msg.uuid, worker.service, worker.name, trace)
            self.send(frames)

    def _stale(self, worker: WorkerRecord, uuid: bytes) -> bool:
        """A final answer for a job this worker holds no part of, while the job is in flight: stale
        unless this worker's own part of it ended here before (then it answers a GET for its result,
        while other workers' parts are still open)."""
        route = self.registry.routes.get(uuid)
        return route is not None and worker.name not in route.ended

    def _trace(self, job: QueuedJob, worker: WorkerRecord, worker_trace: nfp.Frame | None) -> bytes:
        """The hop trace a pushed final answer carries to its client: the worker's and the broker's."""
        sent = job.sent_at if job.parts_sent is None else job.parts_sent.get(worker.name, job.sent_at)
        return hoptrace.broker_frame(
            bytes(worker_trace) if worker_trace is not None else None, job.queued_at, sent, self.clock()
        )

    def _disconnect_unknown(self, sender: bytes, service: bytes) -> None:
        # After a broker restart workers learn at their next frame that they must re-register.
        # Once per keepalive interval per identity: a burst of frames from before the worker
        # re-registers must not make it reconnect again (and lose what it was sent meanwhile).
        self.counts["unknown_worker"] += 1
        now = self.clock()
        last, reason = self.told_to_leave.get(sender, (None, None))
        if last is not None and now - last < self.settings.keepalive_interval:
            return
        self._remember_told(sender, now, reason)
        frames = nfp.broker_control(sender, nfp.DISCONNECT, service)
        if reason is not None:
            # Still the reason it was told first: a purged zfab worker that missed that DISCONNECT
            # (its connection was reset while it was stopped) still drops the jobs it was given.
            frames.append(nfp.dumps({"reason": reason}))
        self.send(frames)

    def _remember_told(self, ident: bytes, now: float, reason: str | None) -> None:
        self.told_to_leave[ident] = (now, reason)
        self.told_to_leave.move_to_end(ident)
        if len(self.told_to_leave) > self.TOLD_TO_LEAVE_MAX:
            self.told_to_leave.popitem(last=False)

    def _tell_to_leave(self, w: WorkerRecord, reason: str) -> None:
        frames = nfp.broker_control(w.ident, nfp.DISCONNECT, w.service)
        if w.v2:
            frames.append(nfp.dumps({"reason": reason}))  # zfab workers drop jobs they have not started
            self._remember_told(w.ident, self.clock(), reason)
        self.send(frames)

    def _lose(self, worker: WorkerRecord, why_lost: str) -> None:
        reg = self.registry
        svc = reg.services.get(worker.service)
        lost = reg.remove_worker(worker)
        lost.update(self.dispatch.worker_lost(svc, worker))
        self.gone[worker.name] = {"service": worker.service, "at": self.clock(), "why": why_lost}
        self.gone.move_to_end(worker.name)
        while len(self.gone) > self.GONE_MAX:
            self.gone.popitem(last=False)
        if self.events is not None:
            self.events.worker(worker.service, worker.name, "lost", why_lost)
        why = f"worker '{worker.label}' was lost ({why_lost}) before it answered"
        for uuid, client in lost.items():
            self.counts["jobs_lost"] += 1
            self.reply(
                client, worker.service, uuid, nfp.ST_WORKER_LOST, payloads.lost(worker.label, uuid, worker.service, why)
            )
        if svc is not None:
            self.dispatch.dirty.add(svc.name)

    def tend_workers(self, now: float) -> float:
        """One pass over the workers: purge those whose hold time ran out and send the keepalives
        that are due, or nearly due; return when the next pass is needed.

        Keepalives due within half an interval go out with this pass, so within two passes the
        workers fall into one wave, whatever moments they joined at. A zfab worker answers the
        wave at once (KeepAlive.answers), so its keepalives come back as a burst too: with a
        thousand workers an idle broker wakes a few times per interval for a batch each, not
        twice per worker. A keepalive sent up to half an interval early changes nothing a worker
        can see: its hold time is `multiplier` intervals."""
        expired: list[WorkerRecord] = []
        send = self.send
        soonest = math.inf
        for w in self.registry.workers.values():
            ka = w.keepalive
            if now >= ka.expires_at:
                expired.append(w)
                continue
            if ka.due_with_wave(now):
                send(nfp.broker_control(w.ident, nfp.KEEPALIVE, w.service))
                ka.mark_sent(now)
            soonest = min(soonest, ka.next_due, ka.expires_at)
        for w in expired:
            log.warning("worker %s missed its keepalives for %.1f s; purged", w.label, w.keepalive.hold_time)
            svc = self.registry.services.get(w.service)
            if svc is not None:
                svc.purged += 1
            self._tell_to_leave(w, "purged")
            self._lose(w, "keepalives expired")
        return soonest


def _origin(ann: dict[str, Any]) -> str:
    """Where a worker says it runs (READY's `hostname` and `pid`), fit for a log line: printable, short.
    A peer's word, shown to people only: never a key, a label or a path."""
    host, pid = ann.get("hostname"), ann.get("pid")
    where = "".join(ch for ch in host[:64] if ch.isprintable()) if isinstance(host, str) else ""
    if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 1 << 32:
        where = f"{where or 'a host'} (pid {pid})"
    return where or "another connection"
