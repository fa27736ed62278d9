"""The broker's workers: READY (one owner per name), keepalives in one wave, purge and loss.

Majordomo's worker half. Each method changes the worker records (registry.py) and *returns* what
the mediator must do about it (broker.py): a `Loss` names the worker and the jobs it had in flight,
which the broker answers and hands back to its dispatcher; nothing here calls back into it. Runs on
the broker's owner thread; frames go out through the Outbox (outbox.py).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..core import protocol as nfp
from ..core import shmhandle
from ..core.keepalive import Clock
from ..core.payloads import MAX_JOB_UUID
from ..settings import Settings
from . import declarations
from .identities import Identities
from .outbox import Outbox
from .registry import PROTOCOL_V2, Registry, ServiceRecord, WorkerRecord

log = logging.getLogger(__name__)

MAX_TASKS = 1000  # tasks a worker may announce
MAX_NAMES_SEEN = 10_000  # worker names remembered per service (to tell a typo from a worker away)
MAX_HOLDS = 2000  # uuids a READY may say its worker holds (docs/failover.md)


@dataclass(slots=True, eq=False)
class Loss:
    """A worker gone: the jobs it had in flight (uuid -> client) end with it, unanswered by it."""

    worker: WorkerRecord
    svc: ServiceRecord | None
    why: str
    jobs: dict[bytes, bytes]
    tell: str | None = None  # a reason to tell it to leave once its jobs are answered (it may still read)


@dataclass(slots=True, eq=False)
class Ready:
    """What a READY did: the workers it replaced, and the record it made (None: refused)."""

    losses: list[Loss] = field(default_factory=list)
    worker: WorkerRecord | None = None
    svc: ServiceRecord | None = None
    was_tentative: bool = False
    refused: tuple[str, str] | None = None  # a malformed-frame reason and its detail, to be counted


class Workers:
    """The worker side of the broker's tables: registration, keepalives, purges, who left and why."""

    TOLD_TO_LEAVE_MAX = 10_000  # unknown identities remembered for DISCONNECT rate-limiting
    GONE_MAX = 1000  # workers that left, kept a while for metrics (state gone)

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        *,
        out: Outbox,
        identities: Identities,
        counts: Counter[str],
        clock: Clock,
    ) -> None:
        self.reg = registry
        self.s = settings
        self.out = out
        self.ids = identities
        self.counts = counts
        self.clock = clock
        # The 5th frame of keepalives to zfab workers: bundles read here, and the term under a lease (term.py).
        self.keepalive_facts = nfp.keepalive_facts(None)
        # unknown worker -> last DISCONNECT and the reason a zfab worker was told first (purged)
        self.told_to_leave: OrderedDict[bytes, tuple[float, str | None]] = OrderedDict()
        self.gone: OrderedDict[bytes, dict[str, Any]] = OrderedDict()  # worker name -> how it left

    # ---- READY -------------------------------------------------------------------------

    def ready(self, sender: bytes, msg: nfp.WorkerControl) -> Ready:
        """READY: a worker (re)connects. zfab workers announce name, credits and tasks (docs/protocol.md).
        Returns the workers it replaced and its new record (None: refused, `refused` says why when
        it is to be counted as a rejected frame)."""
        reg = self.reg
        ann = msg.stats or {}
        name = ann.get("name")
        name_b = name.encode() if isinstance(name, str) and 0 < len(name.encode()) <= nfp.MAX_NAME_BYTES else sender
        if not self.ids.may_register(name_b, msg.service):
            why = f"READY as {name_b[:64]!r} for {msg.service[:64]!r} with a key not issued for that name or service"
            return Ready(refused=("auth", why))
        credits = ann.get("credits")
        if isinstance(credits, bool) or not isinstance(credits, int) or credits < 1:
            credits = self.s.default_worker_credits
        tasks = ann.get("tasks")
        tasks = tasks if isinstance(tasks, dict) and len(tasks) <= MAX_TASKS else None
        out = Ready()
        old = reg.workers.get(sender)
        if old is not None:  # same connection, fresh start: its jobs in flight are gone
            out.losses.append(self.lose(old, "re-registered"))
        origin = _origin(ann)
        other = reg.by_name.get(name_b)
        if other is not None:
            # Another connection holds the name. A name has one owner: a live holder keeps it (and
            # its jobs), and the newcomer is refused; a holder whose connection is gone, or silent
            # past the bound, or that the newcomer says was its own, gives it up at once.
            released = self._name_released(other, ann)
            if released is None:
                self._refuse_name(sender, msg.service, other, origin, v2=ann.get("v") == PROTOCOL_V2)
                return out
            why, reachable = released
            self.counts["worker_replaced"] += 1
            log.warning("worker %s registered from a new connection; its previous one %s", other.label, why)
            loss = self.lose(other, f"replaced by a new connection: the previous one {why}")
            loss.tell = "replaced" if reachable else None
            out.losses.append(loss)
        svc = reg.service(msg.service, create=True)
        if svc is None:
            self.counts["services_full"] += 1
            out.refused = ("services_full", f"READY for a new service with {reg.max_services} services known")
            return out
        if tasks is not None:
            admin = self.ids.may("limits", None) and self.ids.zap is not None  # an admin key may re-declare
            clash = None if admin else declarations.conflict(svc.declared, tasks)
            if clash is not None:
                self.counts["announcement_refused"] += 1
                self._refuse(sender, msg.service, "declaration_conflict", clash, v2=ann.get("v") == PROTOCOL_V2)
                return out
            declarations.fix(svc.declared, tasks, override=admin)
        out.was_tentative, svc.tentative = svc.tentative, False
        rec = reg.register_worker(sender, name_b, svc, credits=credits, v2=ann.get("v") == PROTOCOL_V2, tasks=tasks)
        rec.host = shmhandle.check_host(ann.get("host"))
        rec.origin = origin
        if len(svc.workers_seen) < MAX_NAMES_SEEN:
            svc.workers_seen.add(name_b)
        self.gone.pop(name_b, None)
        self.holds(rec, ann.get("holds"))
        out.worker, out.svc = rec, svc
        log.debug("worker %s ready for service %s (%d credits)", rec.label, svc.label, rec.credits)
        return out

    def _name_released(self, holder: WorkerRecord, ann: dict[str, Any]) -> tuple[str, bool] | None:
        """Why the connection holding a name gives it up to a new one, and whether it can still be
        told; None while it holds it. The probe is a KEEPALIVE: with ROUTER_MANDATORY a send to a
        connection libzmq has closed (its process died, its socket closed) fails at once, so a worker
        restarted after a crash gets its name back on its first READY, not a hold time later."""
        own_key = self.ids.sent_by_key_of(holder.ident)  # CURVE: the same key only
        if own_key and ann.get("previous") == holder.ident.decode(errors="replace"):
            return "was its own (it reconnected)", False  # it closed that socket itself: nobody reads there
        silent = holder.keepalive.heard_ago()
        if silent >= self.reg.silence_bound:
            return f"was silent for {silent:.1f} s", True
        if not self.out.send_now(nfp.broker_control(holder.ident, nfp.KEEPALIVE, holder.service)):
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
        self._refuse(sender, service, "name_taken", why, v2=v2)
        # One line for the first refusal of a rival, then one per hundred: a rival that keeps trying
        # (a standby, or a NorFab worker that reconnects at once) cannot flood the log.
        n = holder.rivals
        level = logging.WARNING if n == 1 or n % 100 == 0 else logging.DEBUG
        log.log(level, "refused a worker named %s from %s: %s (%d refused so far)", holder.label, origin, why, n)

    def _refuse(self, sender: bytes, service: bytes, reason: str, why: str, *, v2: bool) -> None:
        """DISCONNECT a READY the broker will not take, with its reason (a zfab worker backs off and logs it)."""
        frames = nfp.broker_control(sender, nfp.DISCONNECT, service)
        if v2:
            wait = round(self.reg.silence_bound, 3)
            frames.append(nfp.dumps({"reason": reason, "detail": why, "retry_after": wait}))
        self.out.send(frames)
        if reason != "name_taken":
            log.warning("refused a READY for service %s: %s", service[:64].decode(errors="replace"), why)

    # ---- keepalives, purge, loss ----------------------------------------------------------

    def heard(self, worker: WorkerRecord, stats: dict[str, Any] | None) -> bytes | None:
        """A worker's KEEPALIVE, with the figures it reports. When its credits or draining changed it
        is filed under its new level, and its service returned: its queue may move."""
        worker.keepalive.heard()
        if stats is None:
            return None
        was = (worker.draining, worker.throttle, worker.credits)
        worker.stats = stats
        worker.throttle = 0  # a fresh report: its own figures say what it holds
        credits = stats.get("credits")
        if isinstance(credits, int) and not isinstance(credits, bool) and credits >= 1:
            # Its prefetch adapts to its jobs' run times (worker.py compute_credits).
            worker.credits = min(credits, self.reg.max_inflight_per_worker)
        svc = self.reg.services.get(worker.service)
        if svc is None or (worker.draining, worker.throttle, worker.credits) == was:
            return None
        self.reg.set_level(svc, worker)
        return svc.name

    def tend(self, now: float) -> tuple[float, list[Loss]]:
        """One pass over the workers (Majordomo's send_heartbeats and purge_workers): purge those whose
        hold time ran out and send the keepalives that are due, or nearly due. Returns when the next
        pass is needed, and the workers purged.

        Keepalives due within half an interval go out with this pass, so within two passes the
        workers fall into one wave, whatever moments they joined at. A zfab worker answers the
        wave at once (KeepAlive.answers), so its keepalives come back as a burst too: with a
        thousand workers an idle broker wakes a few times per interval for a batch each, not
        twice per worker. A keepalive sent up to half an interval early changes nothing a worker
        can see: its hold time is `multiplier` intervals."""
        expired: list[WorkerRecord] = []
        send = self.out.send
        soonest = math.inf
        for w in self.reg.workers.values():
            ka = w.keepalive
            if now >= ka.expires_at:
                expired.append(w)
                continue
            if ka.due_with_wave(now):
                frames = nfp.broker_control(w.ident, nfp.KEEPALIVE, w.service)
                if w.v2:  # a zfab worker keeps the highest term, and bundles what it sends
                    frames.append(self.keepalive_facts)
                send(frames)
                ka.mark_sent(now)
            soonest = min(soonest, ka.next_due, ka.expires_at)
        purged = []
        for w in expired:
            log.warning("worker %s missed its keepalives for %.1f s; purged", w.label, w.keepalive.hold_time)
            svc = self.reg.services.get(w.service)
            if svc is not None:
                svc.purged += 1
            self.tell_to_leave(w, "purged")
            purged.append(self.lose(w, "keepalives expired"))
        return soonest, purged

    def holds(self, worker: WorkerRecord, uuids: Any) -> None:
        """The jobs a zfab worker says in READY it holds, running or finished lately: a POST of one retried here
        (its client's broker failed over, docs/failover.md) goes to that worker, which answers with the job's
        state or result instead of it running a second time elsewhere. In the bounded table of finished jobs."""
        if not isinstance(uuids, list):
            return
        table, name = self.reg.finished, worker.name
        for u in uuids[:MAX_HOLDS]:
            if isinstance(u, str) and 0 < len(u) <= MAX_JOB_UUID:
                table[u.encode()] = name
        while len(table) > self.reg.max_finished:
            table.popitem(last=False)

    def lose(self, worker: WorkerRecord, why: str) -> Loss:
        """The worker leaves the tables (remembered a while as gone); returns its jobs in flight."""
        svc = self.reg.services.get(worker.service)
        jobs = self.reg.remove_worker(worker)
        self.gone[worker.name] = {"service": worker.service, "at": self.clock(), "why": why}
        self.gone.move_to_end(worker.name)
        while len(self.gone) > self.GONE_MAX:
            self.gone.popitem(last=False)
        return Loss(worker, svc, why, jobs)

    def tell_to_leave(self, w: WorkerRecord, reason: str) -> None:
        frames = nfp.broker_control(w.ident, nfp.DISCONNECT, w.service)
        if w.v2:
            frames.append(nfp.dumps({"reason": reason}))  # zfab workers drop jobs they have not started
            self._remember_told(w.ident, self.clock(), reason)
        self.out.send(frames)

    def disconnect_unknown(self, sender: bytes, service: bytes) -> None:
        """A frame from a worker the broker does not know: DISCONNECT, so it registers again.

        After a broker restart workers learn at their next frame that they must re-register. Once per
        keepalive interval per identity: a burst of frames from before the worker re-registers must not
        make it reconnect again (and lose what it was sent meanwhile)."""
        self.counts["unknown_worker"] += 1
        now = self.clock()
        last, reason = self.told_to_leave.get(sender, (None, None))
        if last is not None and now - last < self.s.keepalive_interval:
            return
        self._remember_told(sender, now, reason)
        frames = nfp.broker_control(sender, nfp.DISCONNECT, service)
        if reason is not None:
            # Still the reason it was told first: a purged zfab worker that missed that DISCONNECT
            # (its connection was reset while it was stopped) still drops the jobs it was given.
            frames.append(nfp.dumps({"reason": reason}))
        self.out.send(frames)

    def _remember_told(self, ident: bytes, now: float, reason: str | None) -> None:
        self.told_to_leave[ident] = (now, reason)
        self.told_to_leave.move_to_end(ident)
        if len(self.told_to_leave) > self.TOLD_TO_LEAVE_MAX:
            self.told_to_leave.popitem(last=False)

    def housekeeping(self, now: float, told_for: float) -> None:
        """Forget workers gone longer than ZFAB_GONE_WORKER_SECONDS and DISCONNECTs older than `told_for`."""
        keep = self.s.gone_worker_seconds
        while self.gone and now - next(iter(self.gone.values()))["at"] > keep:
            self.gone.popitem(last=False)
        while self.told_to_leave and now - next(iter(self.told_to_leave.values()))[0] > told_for:
            self.told_to_leave.popitem(last=False)


def _origin(ann: dict[str, Any]) -> str:
    """Where a worker says it runs (READY's `hostname` and `pid`), fit for a log line: printable, short.
    A peer's word, shown to people only: never a key, a label or a path."""
    host, pid = ann.get("hostname"), ann.get("pid")
    where = "".join(ch for ch in host[:64] if ch.isprintable()) if isinstance(host, str) else ""
    if isinstance(pid, int) and not isinstance(pid, bool) and 0 < pid < 1 << 32:
        where = f"{where or 'a host'} (pid {pid})"
    return where or "another connection"
