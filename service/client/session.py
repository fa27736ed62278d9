"""The client's owner-loop side, an object its Client holds: the Role its transport runs. Its socket,
keepalives and reconnects (brokerlink.py says what is known of the broker), the broker's replies fed
to their jobs (clientjob.py), the timers that poll quiet jobs or re-establish them after an outage,
and how a job ends: its future settled, once a receive batch ends.

The public API (submit, run_job, mmi, cancel, streams) is client.py's. Everything here runs on the
client's owner thread.
"""

from __future__ import annotations

import logging
import queue
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import zmq

from ..core import payloads, shmhandle, sizes
from ..core import protocol as nfp
from ..core.keepalive import Clock
from ..core.logbudget import LogBudget
from ..core.states import State, final_state
from ..errors import (
    BadRequestError,
    BrokerUnavailableError,
    ClosedError,
    JobExpiredError,
    JobTimeoutError,
    PayloadTooLargeError,
    ZfabError,
)
from ..settings import Settings
from ..transport.base import Frames, LoopFactory, Transport
from ..transport.links import Links, several
from ..transport.shm import ShmArena
from ..transport.wire import dealer_socket
from .brokerlink import BrokerLink, News
from .clientjob import ClientJob
from .future import JobFuture, decoded_size
from .inflight import InFlight

log = logging.getLogger(__name__)

# Called on the owner thread when a job (not an MMI request) ends: (future, service, state, results).
CompletionHook = Callable[[JobFuture, str, str, dict[str, Any] | None], None]


class ClientCounts(TypedDict):
    """What a client counts (a misspelt key is a type error, not a silent 0)."""

    late: int  # answers for a job no longer tracked, or for an earlier attempt of a retried one
    rejected_frames: int
    polls: int
    completed: int
    reconnects: int
    reestablished: int
    oversize: int  # payloads over the message limit: refused before sending, or answered so


class Session:
    """The Client's Role handlers and the state only its owner thread changes."""

    def __init__(
        self,
        *,
        name: str,
        broker: str,
        settings: Settings,
        jobs: InFlight,
        shm: ShmArena,
        clock: Clock,
        poll_after: float,
        encoded_results: bool,
        on_complete: Sequence[CompletionHook],
        transport: LoopFactory,
    ) -> None:
        self.name = name
        self.broker = broker
        self.settings = settings
        self.jobs = jobs
        self.shm = shm
        self.clock = clock
        self.poll_after = poll_after
        self.encoded_results = encoded_results
        self.on_complete = tuple(on_complete)  # one tuple: nothing to test for when there is none
        self.link = BrokerLink(settings, clock)
        self.identity = f"{name}-{secrets.token_hex(4)}".encode()  # renewed on every connection
        self.counts = ClientCounts(
            late=0, rejected_frames=0, polls=0, completed=0, reconnects=0, reestablished=0, oversize=0
        )
        # A storm of bad frames, or of failing callbacks, logs a burst and then a trickle (core/logbudget.py).
        self.frames_log = LogBudget(clock=clock)
        self.shm_log = LogBudget(clock=clock)
        self.hooks_log = LogBudget(clock=clock)
        self._receiving = False  # inside a receive batch: futures settle at its end (on_batch_end)
        self._settle: list[tuple[JobFuture, Any, BaseException | None]] = []
        size, wait = settings.outbound_queue_size, settings.submit_timeout
        self.loop: Transport = transport(
            self, name=f"client {name}", outbound_size=size, submit_timeout=wait, sched_batch=settings.sched_batch
        )
        self.links = Links(self.loop, self._hello, self.link.lost) if several(broker) else None  # docs/failover.md

    @property
    def broker_alive(self) -> bool:
        return self.link.alive

    # ---- the socket -----------------------------------------------------------------------------

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        # A fresh identity per connection: the broker ignores a second connection under an
        # identity in use, and nobody learns one that stays valid across reconnects.
        self.identity = f"{self.name}-{secrets.token_hex(4)}".encode()
        watch = None if self.links is None else self.links.watch  # several brokers: hello once one is up
        return dealer_socket(ctx, self.identity, self.settings, self.broker, watch)

    def on_connected(self) -> None:
        # The hold time is not reset: the broker is alive once it answers, not when we connect.
        if self.links is None:
            self._send_keepalive()

    def _hello(self) -> None:  # several brokers: this socket's connection is up (transport/links.py)
        self.link.connected = True
        self._send_keepalive()

    def on_closing(self) -> None:
        # A zfab broker (it told us its boot) then stops sending us keepalive waves at once,
        # instead of finding us unroutable at its next wave and counting a dropped frame.
        if self.link.boot is not None:
            self.loop.send_now(nfp.client_request(nfp.DISCONNECT, nfp.MMI_SERVICE, b"", b"", b""))

    def _send_keepalive(self) -> None:
        self.loop.send_now(nfp.client_request(nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", b"", b""))
        self.link.keepalive.mark_sent()

    # ---- replies --------------------------------------------------------------------------------

    def on_frames(self, frames: Frames) -> None:
        self._receiving = True
        try:
            reply = nfp.decode_broker_to_client(frames, self.settings.max_message_bytes)
        except nfp.ProtocolError as exc:
            self._rejected("dropped a malformed message", exc)
            if exc.reason == "oversize":
                self._oversize_answer(frames)
            return
        news = self.link.heard(reply)
        if news is News.DEPOSED:  # refused: its term is over (docs/failover.md); the active broker is elsewhere
            return self.loop.request_reconnect()
        if news is News.RESTARTED:
            log.info("client %s: the broker restarted; re-establishing %d jobs", self.name, len(self.jobs))
        if news:
            self.jobs.recheck_all()
        if reply.command == nfp.KEEPALIVE:
            self.loop.bundles(b"", self.link.bundle)  # what this loop sends in one step may go as one
            if self.link.keepalive.answers():  # the broker's wave: answered at once, not on our own clock
                self._send_keepalive()
            return
        wire = reply.uuid.decode(errors="replace")
        job = self.jobs.get(wire)  # a first attempt travels under its job's own uuid: no split to make
        if job is None or job.attempt != 1:
            uuid, attempt = payloads.split_wire_uuid(wire)
            job = self.jobs.get(uuid)
            if job is None or attempt != job.attempt:
                self.counts["late"] += 1  # a finished job, or an earlier attempt of a retried one
                return
        command = reply.command
        if command == nfp.EVENT:
            self._event(job, reply)
        elif command == nfp.STREAM:
            self._chunk(job, reply)
        elif reply.status == nfp.ST_OK and shmhandle.is_handle(reply.payload):
            self._result_from_shm(job, reply)
        else:
            self._apply(job, reply)

    def on_batch_end(self) -> None:
        self._receiving = False
        if self._settle:
            settle, self._settle = self._settle, []
            for fut, result, error in settle:
                fut.settle(result, error)

    def _rejected(self, what: str, why: object) -> None:
        self.counts["rejected_frames"] += 1
        self._throttled(self.frames_log, "%s: %s", what, why)

    def _throttled(self, budget: LogBudget, msg: str, *args: object, exc_info: bool = False) -> None:
        """A warning within its budget; the next one let through says how many were held back."""
        held = budget.take()
        if held is not None:
            more = f" ({held} more not logged)" if held else ""
            log.warning("client %s " + msg + "%s", self.name, *args, more, exc_info=exc_info)

    def _apply(self, job: ClientJob, reply: nfp.BrokerReply) -> None:
        before = job.size
        try:
            done = job.apply(reply, self.clock())
            lost = done and job.retry()
            # A failed attempt its worker says may run again: the broker holds the next one for the wait.
            again = lost or (done and job.retry_failed(self.clock))
        except ValueError as exc:
            self._rejected(f"could not read a reply for job {job.uuid}", exc)
            return
        if job.size != before:
            self.jobs.resized(job.size - before)
        if again:
            why = "lost its worker" if lost else "failed"
            log.info("client %s: job %s %s; attempt %d", self.name, job.uuid, why, job.attempt)
            wire = job.wire_uuid.encode()
            self.loop.send_now(nfp.client_request(nfp.POST, job.service, job.target, wire, job.body, job.flags))
        elif done:
            self.finish(job)

    def _event(self, job: ClientJob, reply: nfp.BrokerReply) -> None:
        try:
            payload = nfp.loads(reply.payload)
        except ValueError:
            self.counts["rejected_frames"] += 1
            return
        if not isinstance(payload, dict):
            return
        job.last_heard = self.clock()
        fut = job.future
        worker = payload.get("worker")
        if fut.worker is None and isinstance(worker, str):
            fut.worker = worker
        kind = payload.get("event_type")
        fut.move(State.WAITING if kind == "input_request" else State.RUNNING)
        if kind == "result_ready" and isinstance(worker, str) and worker in job.pending:
            # A worker that does not push results (a NorFab worker) says it has one: GET it now.
            self._get(job, [worker])
        fut.add_event(payload, decoded_size(payload, len(reply.payload)))
        try:
            job.on_event(payload)
        except Exception:
            self._throttled(self.hooks_log, "event callback failed", exc_info=True)

    def _chunk(self, job: ClientJob, reply: nfp.BrokerReply) -> None:
        job.last_heard = self.clock()
        chunks = job.future.chunks
        if chunks is None:
            self.counts["rejected_frames"] += 1
            return
        try:
            chunks.put_nowait(bytes(reply.payload))  # its reader gets bytes, not a view
        except queue.Full:
            # More chunks than the credits granted: the sender broke flow control.
            self.counts["rejected_frames"] += 1
            self.finish(job, BadRequestError(f"job {job.uuid}: stream overran its credit window", uuid=job.uuid))

    def _oversize_answer(self, frames: Frames) -> None:
        """An answer over our message limit (the broker's and the worker's are larger): its job fails
        now, naming the limit, instead of waiting out its timeout (core/sizes.py). Events over it are
        only counted."""
        limit = self.settings.max_message_bytes
        try:
            reply = nfp.decode_broker_to_client(frames, sizes.socket_cap(limit))
        except nfp.ProtocolError:
            return
        uuid, attempt = payloads.split_wire_uuid(reply.uuid.decode(errors="replace"))
        job = self.jobs.get(uuid)
        self.counts["oversize"] += 1
        if job is None or attempt != job.attempt or reply.command != nfp.RESPONSE:
            return
        why = sizes.too_large(f"the answer for job {uuid}", sum(len(f) for f in frames), limit)
        self.finish(job, PayloadTooLargeError(why, uuid=uuid))

    def _result_from_shm(self, job: ClientJob, reply: nfp.BrokerReply) -> None:
        """A result its worker (on this host) left in a block: copied out and parsed, then the
        block is given back to the worker. A block that cannot be read is asked again of its worker
        (GET), whose answer comes through the sockets."""
        frame = reply.payload
        try:
            with self.shm.payload(frame, give_back=True) as p:
                reply.payload = p.data
                self._apply(job, reply)
        except shmhandle.HandleError as exc:
            self.shm.counts["fallbacks"] += 1
            worker = _worker_of(frame)
            why = "read no result of job %s from shared memory (%s); asking %s again"
            self._throttled(self.shm_log, why, job.uuid, exc.detail, worker)
            if worker is not None and worker in job.pending:
                self._get(job, [worker])

    # ---- how a job ends -------------------------------------------------------------------------

    def finish(self, job: ClientJob, error: ZfabError | None = None) -> None:
        """End `job` with its outcome (or `error`): untracked, its state final, its future settled."""
        if self.jobs.forget(job.uuid) is None:
            return
        fut = job.future
        fut.timings["completed"] = time.time()
        self.counts["completed"] += 1
        if job.traces:
            job.ended(self.clock())
        result: dict[str, Any] | None = None
        if error is None:
            result, error = job.outcome()
        fut.state, fut.reason = final_state(result, error)
        # Ended before the broker said it took it: a refusal (or the client gave up first).
        if job.refused is not None and job.refused is error:
            fut.refused(job.refused)
        else:
            fut.admitted("dispatched" if job.expected else "unknown")
        value: Any = result
        if not job.mmi:
            for hook in self.on_complete:
                try:
                    hook(fut, job.service.decode(errors="replace"), fut.state.value, result)
                except Exception:
                    self._throttled(self.hooks_log, "completion hook failed", exc_info=True)
            if result is not None:
                fut.answered = sorted(result)
                if self.encoded_results:
                    value = job.encoded(result)
        if self._receiving:
            # A reply in a receive batch: the future is settled when the batch ends, so a caller
            # blocked on the oldest of many pipelined jobs wakes once a batch, not once a job.
            # Each wake-up of a waiting thread also takes a core from this one for a while: the
            # pipelined client's owner was preempted 0.6 times a job, its recv 4x its CPU in wall.
            self._settle.append((fut, value, error))
            return
        fut.settle(value, error)

    def fail_all(self) -> None:
        """The client closed: every job it still tracks fails with ClosedError."""
        for job in self.jobs.drain():
            job.future.settle(None, ClosedError(f"client closed before job {job.uuid} finished"))

    # ---- timers: keepalives, reconnects, deadlines, polls ---------------------------------------

    def on_timer(self, now: float) -> float | None:
        link = self.link
        ka = link.keepalive
        if link.reconnect_due(now):
            # Silent past its hold time: a new connection (and identity), as workers do. Its jobs
            # are re-established (GET, or POST again) when the broker answers (News.RETURNED).
            log.warning("client %s: broker silent for %.1f s; reconnecting", self.name, ka.hold_time)
            self.counts["reconnects"] += 1
            self.loop.request_reconnect()
        if ka.due() and self.link.connected:  # (several brokers: none is up, nothing can go)
            self._send_keepalive()
        self.shm.sweep()  # idle pooled blocks, results given back
        nxt = ka.next_deadline() if not ka.expired() else ka.next_due
        for job in self.jobs.due(now):
            self._check(job, now)
        due = self.jobs.next_due()
        return nxt if due is None else min(nxt, due)

    def _check(self, job: ClientJob, now: float) -> None:
        alive = self.link.alive
        if now >= job.deadline and job.grace is None and not alive and self.link.seen and not job.mmi:
            # Its deadline passed while the broker was silent (a partition, or down): how it ended is not
            # known here, while the broker and its worker may know (expired, or done). Wait one hold time
            # more for the broker, then ask (GET, or the POST again with nothing of its time left) and take
            # their word, so that client, API and broker tell the same end; `lost` only if it stays silent.
            job.grace = now + self.link.keepalive.hold_time
        if now >= job.deadline and (job.grace is None or now >= job.grace):
            self._expire(job, alive)
            return
        if alive:
            if job.recheck:
                job.recheck = False
                self._reestablish(job)
            elif job.grace is not None:
                pass  # past its deadline: only the answer to its re-establishment is awaited
            elif now - job.last_heard >= self._quiet_after(job) and not (job.told_queued and job.expected is None):
                self._poll(job)  # a job waiting in the broker's queue is quiet by design: not polled
        end = job.deadline if job.grace is None else job.grace
        self.jobs.arm(job.uuid, min(end, now + self.poll_after))

    def _expire(self, job: ClientJob, alive: bool) -> None:
        """Its deadline (and any grace) passed: it ends as far as this client can tell."""
        if job.expected and not job.mmi and alive:
            # Nobody waits for it any more: ask its workers to stop it.
            target = nfp.dumps(sorted(job.pending or job.expected))
            self.loop.send_now(nfp.client_request(nfp.DELETE, job.service, target, job.wire_uuid.encode(), b"{}"))
        if alive and job.told_queued:
            # Still in the broker's queue: it never ran (the broker expires it at this deadline too).
            err: ZfabError = JobExpiredError(
                f"job {job.uuid}: deadline of {job.timeout:g} s passed while it waited in the broker's queue",
                uuid=job.uuid,
            )
        elif alive:
            err = JobTimeoutError(
                f"job {job.uuid} did not finish within its timeout of {job.timeout:g} s",
                uuid=job.uuid,
                results=job.results,
            )
        else:
            err = BrokerUnavailableError(
                f"job {job.uuid}: the broker at {self.broker} has not answered within its hold time; "
                "the job's outcome is unknown"
            )
        self.finish(job, err)

    def _quiet_after(self, job: ClientJob) -> float:
        # A job the broker has said nothing of yet may be queued: it says so only after the notice.
        if job.expected is None and "queued" not in job.future.timings:
            return self.poll_after + float((job.fields or {}).get("notice", 0.0))
        return self.poll_after

    def _poll(self, job: ClientJob) -> None:
        """The job went quiet: ask its workers (GET), or re-send the POST if none is known yet."""
        self.counts["polls"] += 1
        job.polls += 1
        job.last_heard = self.clock()
        if job.mmi or job.expected is None:
            # Not known to be admitted: POST again. The broker and the workers dedupe by
            # uuid, so a job still in flight is not run twice.
            cmd = nfp.MMI if job.mmi else nfp.POST
            uuid_b = job.wire_uuid.encode()
            self.loop.send_now(nfp.client_request(cmd, job.service, job.target, uuid_b, job.body, job.flags))
            return
        self._get(job, sorted(job.pending))

    def _get(self, job: ClientJob, workers: list[str]) -> None:
        uuid_b = job.wire_uuid.encode()
        for worker in workers:
            self.loop.send_now(
                nfp.client_request(nfp.GET, job.service, worker.encode(), uuid_b, payloads.EMPTY_BODY, payloads.NO_ACK)
            )

    def _reestablish(self, job: ClientJob) -> None:
        """The broker is back (restarted, or reachable again): ask the workers of a dispatched job;
        submit a queued one again. The new broker never saw it, so the POST says the service is
        known (its first broker admitted the job) and carries what is left of the timeout."""
        self.counts["reestablished"] += 1
        job.last_heard = self.clock()
        if job.expected is not None and not job.mmi:
            self._get(job, sorted(job.pending))
            return
        flags = job.flags
        if job.fields is not None and not job.mmi:
            # Its flags keep `not_before`: what is left of the timeout, counted from the end of the delay.
            left = payloads.timeout_left(job.deadline, self.clock(), job.timeout)
            flags = nfp.dumps({**job.fields, "known": True, "timeout": round(left, 3)})
            job.resubmitted = True
        cmd = nfp.MMI if job.mmi else nfp.POST
        self.loop.send_now(nfp.client_request(cmd, job.service, job.target, job.wire_uuid.encode(), job.body, flags))


def _worker_of(handle_frame: nfp.Frame) -> str | None:
    """The worker a result handle names (to ask it again), or None."""
    try:
        return shmhandle.decode_handle(handle_frame).worker
    except shmhandle.HandleError:
        return None
