"""Clients' requests past the broker's front door: admission, NorFab's `all`, GET/PUT/DELETE, the grace.

Majordomo's client half of routing. The broker (broker.py) reads a frame, answers keepalives and
MMI, and de-duplicates a POST by its uuid; a new job comes here to be admitted (queued or sent by the
dispatcher, or refused with a reason), and other requests go to the workers they name. While the
broker starts (its startup grace) a service no worker has confirmed yet is held, not refused.
Runs on the broker's owner thread; raises Refusal for the broker to answer.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections import Counter
from typing import Any

from ..core import payloads, sizes
from ..core import protocol as nfp
from ..core.access import FRAME_ACTIONS
from ..core.keepalive import Clock, KeepAlive
from ..core.logbudget import LogBudget
from ..core.payloads import Word
from ..settings import Settings
from ..transport.base import Frames
from .admission import Refusal, answer, bad, read_job, unknown_task
from .deadlines import Deadlines
from .dispatch import Dispatch
from .hooks import Hooks
from .identities import Identities
from .jobqueue import NAMED, QueuedJob, Spot
from .outbox import Outbox
from .registry import Registry, Route, ServiceRecord, WorkerRecord

CLIENT_CONTROL = frozenset({nfp.KEEPALIVE, nfp.OPEN, nfp.DISCONNECT})  # a client's frames that route nothing

JOB_REQUESTS = (nfp.GET, nfp.PUT, nfp.DELETE)  # about a job its workers hold (held while the broker settles)
MAX_SETTLING = 10_000  # resubmitted jobs a new term holds until it settles (then admitted as any)
MAX_SETTLING_BYTES = 64 << 20  # and their bodies' bytes: past either bound a job is admitted at once
log = logging.getLogger(__name__)

ALL_SERVICE = b"all"  # NorFab's pseudo-service: workers of every service (Requests.across)


class Requests:
    """Admits new jobs and routes clients' other requests to workers."""

    def __init__(
        self,
        registry: Registry,
        dispatch: Dispatch,
        deadlines: Deadlines,
        settings: Settings,
        *,
        out: Outbox,
        identities: Identities,
        hooks: Hooks,
        counts: Counter[str],
        clock: Clock,
        grace: float,
        boot: str,
        host: str | None,
    ) -> None:
        self.reg = registry
        self.dispatch = dispatch
        self.deadlines = deadlines
        self.s = settings
        self.out = out
        self.ids = identities
        self.admitted = hooks.admitted
        self.counts = counts
        self.clock = clock
        self.started_at = time.time()
        self.grace_until: float | None = clock() + grace  # None once the startup grace is over
        self._seq = itertools.count()
        self.log = LogBudget(burst=3, per_second=0.1, clock=clock)  # failures a peer can cause: a few lines
        self.epoch = 0  # the lease generation of this broker's term (term.py; 0: no lease)
        self.settle_until = 0.0  # a new term's first moments: resubmitted jobs wait for their workers' READY
        self.settling: list[tuple[bytes, nfp.ClientRequest]] = []  # those jobs, replayed after (term.py)
        self.settling_bytes = 0  # their bodies' bytes (show_broker, zfab_broker_settling_bytes)
        self.boot = boot  # this broker's incarnation and shared-memory host id: in its keepalive answers
        self.host = host

    def admit(self, sender: bytes, req: nfp.ClientRequest) -> None:
        """A new job (its uuid neither queued, in flight nor finished): queued or sent, or refused."""
        self.check_key("submit", req)
        job = read_job(sender, req, now=self.clock(), seq=next(self._seq), default_timeout=self.s.default_job_timeout)
        if self.settle_until and self.settle(sender, job, req):  # (one read per job; zero once settled)
            return
        if job.shm:
            self.dispatch.shm.check(job)
        if req.service == ALL_SERVICE:
            self.post_across(job, req)
            return
        svc = self._service_for(req)
        if job.task and svc.tasks is not None and job.task not in svc.tasks:
            raise unknown_task(svc.label, job.task, svc.tasks)
        if job.kind == NAMED and job.names and self.grace_until is None and not req.flags.get("known"):
            seen = svc.workers_seen
            if not any(n.encode() in seen for n in job.names):
                names = ", ".join(job.names)
                raise Refusal(
                    nfp.ST_NOT_FOUND, Word.FAILED, f"no worker named {names} has registered for service '{svc.label}'"
                )
        self.dispatch.admit(svc, job, announce_now=not svc.tentative)
        for hook in self.admitted:  # admitted (queued or sent): its worker's replies come on later frames
            hook(job, svc)

    def settle(self, sender: bytes, job: QueuedJob, req: nfp.ClientRequest) -> bool:
        """A broker that just took over (docs/failover.md) holds a resubmitted job (`known`) until its term
        settles: the worker that has it may not have said so yet (READY's `holds`), and another must not run
        it. True: held, unanswered (the term replays it then, through the POST's de-duplication)."""
        return self._settling(job.queued_at) and bool(req.flags.get("known")) and self._hold(sender, req)

    def _settling(self, now: float) -> bool:
        """The broker's first moments (term.py, SETTLE), while its workers re-register."""
        if self.settle_until and now >= self.settle_until:
            self.settle_until = 0.0
        return self.settle_until > 0.0

    def _hold(self, sender: bytes, req: nfp.ClientRequest) -> bool:
        """Held until the broker settles, then replayed (term.py) as if it came then. False past the bounds:
        it is handled now, as any."""
        size = len(req.body)
        if len(self.settling) >= MAX_SETTLING or self.settling_bytes + size > MAX_SETTLING_BYTES:
            return False
        self.settling.append((sender, req))
        self.settling_bytes += size
        return True

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
        reg = self.reg
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

    def resend(self, sender: bytes, req: nfp.ClientRequest, workers: list[WorkerRecord]) -> None:
        """A retried POST of a job in flight or finished: its workers answer with its state instead
        of running it twice."""
        self.check_key("submit", req)
        self.counts["post_retried"] += 1
        self._to_workers(sender, req, workers, ack=True)

    def check_key(self, action: str, req: nfp.ClientRequest) -> None:
        """Under CURVE, the frame's key must be allowed `action` on the request's service (core/access.py):
        a dict lookup on grants made when the keys were read. Refused 400 with the reason, and counted."""
        if self.ids.zap is None:
            return
        why = self.ids.refusal(action, req.service)
        if why is not None:
            self.counts["refused_by_key"] += 1
            raise Refusal(nfp.ST_BAD_REQUEST, Word.FAILED, f"forbidden: {why}")

    def _to_workers(self, sender: bytes, req: nfp.ClientRequest, workers: list[WorkerRecord], *, ack: bool) -> None:
        if ack:
            body = payloads.dispatched(req.uuid, req.target, req.service, [w.label for w in workers])
            self.out.reply(sender, req.service, req.uuid, nfp.ST_DISPATCHED, body)
        for w in workers:
            self.out.send(nfp.broker_job(w.ident, req.command, sender, req.uuid, req.body))

    def _service_for(self, req: nfp.ClientRequest) -> ServiceRecord:
        """The service a POST names; a name never registered is refused, except while the broker
        starts (its workers may not be back yet) or when the client vouches for it (`known`: a job
        of it was admitted before, e.g. by the broker that restarted)."""
        reg = self.reg
        svc = reg.service(req.service)
        if svc is not None:
            return svc
        label = req.service.decode(errors="replace")
        known = bool(req.flags.get("known"))
        if not known and self.grace_until is None:
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

    def tend_grace(self, now: float) -> float | None:
        """The startup grace: ended once its time passed; returns when it ends (None: over)."""
        if self.grace_until is not None and now >= self.grace_until:
            self.end_grace()
        return self.grace_until

    def end_grace(self) -> None:
        """The startup grace is over: a service no worker confirmed was a mistake (a typo), and the
        jobs that waited for it are refused now (they had no answer yet)."""
        self.grace_until = None
        reg = self.reg
        for svc in [s for s in reg.services.values() if s.tentative]:
            for job in list(svc.queue.waiting.values()):
                why = f"service '{svc.label}' is unknown: no worker registered it while the broker started"
                body = answer(job, Word.FAILED, why)
                self.deadlines.cancel_quietly(job)
                self.out.reply(job.client, job.service, job.uuid, nfp.ST_NOT_FOUND, body)
            del reg.services[svc.name]

    def delete(self, sender: bytes, req: nfp.ClientRequest) -> None:
        """Cancel: a waiting job leaves the queue at once; a dispatched one is asked of its workers."""
        self.check_key("cancel", req)
        job = self.dispatch.queued.get(req.uuid)
        if job is not None and job.spot is not Spot.DIRECTED:
            self.deadlines.cancel(job)
            return
        if job is not None:
            self.deadlines.cancel_parts(job)
            if req.uuid not in self.reg.routes:
                return  # no part had left: nothing to ask of a worker
        self.route_request(sender, req)

    def route_request(self, sender: bytes, req: nfp.ClientRequest) -> None:
        """GET/PUT/DELETE go to the workers named (or the job's, for its uuid), as they are now."""
        self.check_key(FRAME_ACTIONS.get(req.command, "admin-only"), req)
        reg = self.reg
        try:
            target = nfp.parse_target(req.target)
        except nfp.ProtocolError as exc:
            raise bad(f"bad target: {exc.detail}", malformed=exc.reason) from None
        route = reg.routes.get(req.uuid)
        if route is not None and (route.job is None or self.ids.owns(route.job)):
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
        if not workers and req.command in JOB_REQUESTS and self._settling(self.clock()) and self._hold(sender, req):
            # A restarted broker asked for a job (a GET recovering it, a DELETE) by workers of a service it knows
            # that have not re-registered yet: answered once they have, not "no such worker" on their way back.
            return
        if not workers:
            self.counts["no_workers"] += 1
            raise bad(
                f"service '{req.service.decode(errors='replace')}' has no live worker matching target "
                f"{req.target.decode(errors='replace')!r}"
            )
        self.counts[nfp.COMMAND_NAMES[req.command].lower()] += 1
        ack = req.command == nfp.GET and (bool(req.flags.get("ack", True)) or len(workers) > 1)
        self._to_workers(sender, req, workers, ack=ack)

    def refuse(self, sender: bytes, req: nfp.ClientRequest, r: Refusal) -> None:
        """A request the broker will not carry out, answered with its reason."""
        body = payloads.refusal(req.uuid, req.target, req.service, r.word, r.why)
        if r.retry_after is not None:
            body["retry_after"] = r.retry_after
        self.counts[f"refused_{r.status.decode()}"] += 1
        self.out.reply(sender, req.service, req.uuid, r.status, body)
        if req.command == nfp.MMI:
            # NorFab's NFPClient.mmi() reads only MMI frames: a refused MMI request is answered in
            # both, as every MMI answer is, or it waits out its whole timeout.
            self.out.send(nfp.broker_reply(sender, nfp.MMI, req.service, req.uuid, r.status, nfp.dumps(body)))

    def failed(self, sender: bytes, req: nfp.ClientRequest, exc: Exception) -> None:
        """The broker failed on a request (a bug, or a RecursionError, MemoryError...): it is answered
        500 with the error named, counted and logged within a budget, and the loop goes on."""
        self.counts["handler_errors"] += 1
        if (held := self.log.take()) is not None:
            log.exception("broker failed on a %s (%d lines held back)", nfp.COMMAND_NAMES[req.command], held)
        why = f"the broker could not handle this request: {type(exc).__name__}: {str(exc)[:200]}"
        self.refuse(sender, req, Refusal(nfp.ST_ERROR, Word.FAILED, why))

    def refuse_oversize(self, sender: bytes, body: Frames) -> None:
        """A client's request over the message limit (its own limit was larger, or it is no zfab
        client): answered 400 TOO LARGE naming the limit, so it fails now instead of at its timeout.
        The socket's cap (core/sizes.py) let it in; the envelope is read at that bound, not the body."""
        limit = self.s.max_message_bytes
        try:
            req = nfp.decode_client(body, sizes.socket_cap(limit))
        except nfp.ProtocolError:
            return  # not a request that could be answered (counted by the broker)
        if req.command in (nfp.KEEPALIVE, nfp.OPEN, nfp.DISCONNECT) or not req.uuid:
            return
        size = sum(len(f) for f in body)
        why = sizes.too_large(f"the request of job {req.uuid.decode(errors='replace')}", size, limit)
        self.refuse(sender, req, Refusal(nfp.ST_BAD_REQUEST, Word.TOO_LARGE, why))

    def client_control(self, client: bytes, command: bytes) -> float:
        """A client's KEEPALIVE (answered at once unless it answers the broker's wave), OPEN (NorFab
        clients may announce themselves) or DISCONNECT (a zfab client closing: no more keepalive
        waves for it). Returns when the broker's next keepalive pass is due for it (inf: no change)."""
        if command == nfp.DISCONNECT:
            self.reg.client_keepalives.pop(client, None)
        if command != nfp.KEEPALIVE:
            return math.inf
        self.counts["client_keepalive"] += 1
        ka = self.reg.client_keepalive_heard(client)
        if ka is None:
            return math.inf
        self.keepalive(client, ka)
        return ka.next_due

    def keepalive(self, client: bytes, ka: KeepAlive) -> bool:
        """The keepalive answer frame, carrying this broker's incarnation; False when the client is gone."""
        # "bundle": this broker reads bundles (transport/bundle.py), and answers a client that sends them in them.
        facts: dict[str, Any] = {"boot": self.boot, "max": self.s.max_message_bytes, "bundle": 1}
        if self.host:
            facts["host"] = self.host
        if self.epoch:  # its term's lease generation: a zfab client leaves a broker older than one it saw
            facts["epoch"] = self.epoch
        ka.mark_sent()
        frames = nfp.broker_reply(client, nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", nfp.ST_OK, nfp.dumps(facts))
        return self.out.send_now(frames)
