"""A worker's replies on their way to its clients: Majordomo's worker-to-client half of routing.

A final answer frees the worker's credit (its route ends there) and goes to the job's client as it
is now (it may have reconnected since its POST); a worker's busy answer puts the job back in the
queue; its 201 lets go of the job's body. The outcome of a final answer is data: a zfab worker tells
it in its trace frame (core/hoptrace.py outcome_of), read only by the hooks that want it.
"""

from __future__ import annotations

from collections import Counter

from ..core import hoptrace, payloads, sizes
from ..core import protocol as nfp
from ..core.states import State
from ..settings import Settings
from ..transport.base import Frames
from .deadlines import Deadlines
from .dispatch import Dispatch
from .hooks import Hooks
from .outbox import Outbox
from .registry import Registry, Route, WorkerRecord
from .workers import Loss

MAX_ENTRY_READ = 1 << 20  # a failed entry larger than this keeps its status (it is read on the broker's loop)


def norfab_status(worker: str, status: bytes, payload: nfp.Frame, outcome: str | None) -> bytes:
    """The status a NorFab client is told a zfab worker's final answer with. A task that could not
    run (unknown task, bad arguments: 400; a handler failure: 500) is a failed result entry, which
    NorFab's workers answer with 200 and NorFab's client keeps as the job's result; under 4xx/5xx it
    would fail the whole job with no entry (and, for a job on several workers, drop the others').
    The worker's outcome says so; a worker that tells none has its (small) entry decoded."""
    if status not in (nfp.ST_BAD_REQUEST, nfp.ST_ERROR):
        return status
    if outcome is not None:
        return nfp.ST_OK if outcome == State.FAILED else status
    if len(payload) > MAX_ENTRY_READ:
        return status
    try:
        body = nfp.loads(payload)
    except (ValueError, RecursionError):
        return status
    entry = body.get(worker) if isinstance(body, dict) and len(body) == 1 else None
    return nfp.ST_OK if isinstance(entry, dict) and entry.get("failed") is True else status


class Replies:
    """Routes workers' RESPONSE, EVENT and STREAM frames to their clients."""

    def __init__(
        self,
        registry: Registry,
        dispatch: Dispatch,
        deadlines: Deadlines,
        settings: Settings,
        *,
        out: Outbox,
        hooks: Hooks,
        counts: Counter[str],
    ) -> None:
        self.reg = registry
        self.dispatch = dispatch
        self.deadlines = deadlines
        self.s = settings
        self.send = out.send
        self.reply = out.reply
        self.forwarded = hooks.forwarded
        self.final = hooks.final
        self.counts = counts

    def forward(self, worker: WorkerRecord, msg: nfp.WorkerReply) -> None:
        """Route a worker's reply to its client; final replies free the worker's credit."""
        forward = True
        route: Route | None = None
        route_now = self.reg.routes.get(msg.uuid)
        # The route knows the job's client as it is now (it may have reconnected since the POST).
        client = route_now.client if route_now is not None else msg.client
        for hook in self.forwarded:
            hook(worker, msg, hoptrace.outcome_of(msg.trace))
        status = msg.status
        if msg.command == nfp.RESPONSE:
            if status in nfp.FINAL_STATUSES:
                route = self.reg.complete(worker, msg.uuid)
                self.dispatch.dirty.add(worker.service)
                if route is not None and not route.push and worker.v2:
                    if route.job is not None and not route.job.announce:
                        # A NorFab client: told at once, a task's failure (400/500) as the failed
                        # entry NorFab's workers answer with 200 (docs/protocol.md, NorFab peers).
                        status = norfab_status(worker.label, status, msg.payload, hoptrace.outcome_of(msg.trace))
                    else:
                        # A zfab client that collects by GET: the completion only frees the slot.
                        forward = False
                # A NorFab worker sends no completion of its own: its final answers are the GETs'.
                elif route is None and self._stale(worker, msg.uuid):
                    # The job is in flight elsewhere now (this worker was purged and the job
                    # retried): a late result from the lost attempt is discarded.
                    self.counts["stale_results"] += 1
                    forward = False
            elif status == nfp.ST_BUSY:
                svc = self.reg.services.get(worker.service)
                if svc is not None and self.dispatch.busy(svc, worker, msg.uuid):
                    return  # back in the queue: the client waits on, nothing to tell it
            elif status == nfp.ST_WORKER_ACCEPTED and route_now is not None:
                self.dispatch.started(route_now, worker)
        if forward:
            self.counts["forwarded"] += 1
            frames: Frames = nfp.broker_reply(client, msg.command, worker.service, msg.uuid, status, msg.payload)
            if route is not None and route.push and route.job is not None:
                for final in self.final:
                    final(route.job, worker, msg.trace, frames)
            self.send(frames)

    def lost(self, loss: Loss) -> None:
        """Answers for a worker that can no longer give them: its jobs in flight, and its parts still
        waiting for its credits (they named it), end 410 with why."""
        w, jobs = loss.worker, loss.jobs
        jobs.update(self.deadlines.parts_lost(loss.svc, w))
        why = f"worker '{w.label}' was lost ({loss.why}) before it answered"
        for uuid, client in jobs.items():
            self.counts["jobs_lost"] += 1
            self.reply(client, w.service, uuid, nfp.ST_WORKER_LOST, payloads.lost(w.label, uuid, w.service, why))
        if loss.svc is not None:
            self.dispatch.dirty.add(loss.svc.name)

    def _stale(self, worker: WorkerRecord, uuid: bytes) -> bool:
        """A final answer for a job this worker holds no part of, while the job is in flight: stale
        unless this worker's own part of it ended here before (then it answers a GET for its result,
        while other workers' parts are still open)."""
        route = self.reg.routes.get(uuid)
        return route is not None and worker.name not in route.ended

    def oversize(self, worker: WorkerRecord | None, body: Frames) -> None:
        """A worker's final answer over our message limit (its own limit is larger): its client gets a
        failed entry naming the limit in its place, and the worker's credit is freed, instead of the
        job waiting out its deadline. Events and stream chunks over it are dropped (counted)."""
        limit = self.s.max_message_bytes
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
