"""The client's owner-loop side (mixed into Client): its socket, keepalives and reconnects, the
broker's replies, and the timers that poll quiet jobs or re-establish them after an outage.

The public API (submit, run_job, mmi, cancel, streams) is client.py's. Everything here runs on
the client's owner thread.
"""

from __future__ import annotations

import heapq
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from ..core import payloads, shmhandle, sizes
from ..core import protocol as nfp
from ..core.keepalive import Clock, KeepAlive
from ..core.states import State
from ..errors import (
    BadRequestError,
    BrokerUnavailableError,
    JobExpiredError,
    JobTimeoutError,
    PayloadTooLargeError,
    ZfabError,
)
from ..settings import Settings
from ..transport.base import Frames, Transport
from ..transport.shm import ShmArena
from ..transport.wire import dealer_socket
from .clientjob import ClientJob, JobFuture, decoded_size

log = logging.getLogger(__name__)

EventCallback = Callable[[dict[str, Any]], None]


class ClientSession:
    """The Client's Role handlers; the attributes below are the Client's."""

    name: str
    broker: str
    identity: bytes
    settings: Settings
    loop: Transport
    clock: Clock
    keepalive: KeepAlive
    poll_after: float
    queued_notice: float
    counts: dict[str, int]
    _jobs: dict[str, ClientJob]
    _timers: list[tuple[float, str]]
    _lock: threading.Lock
    _callbacks: dict[str, EventCallback]
    _bytes: int
    _boot: str | None
    _broker_host: str | None
    _broker_limit: int | None
    shm: ShmArena
    _reconnect_at: float
    _broker_seen: bool
    _receiving: bool  # inside a receive batch: futures settle at its end (on_batch_end)
    _settle: list[tuple[JobFuture, Any, BaseException | None]]

    @property
    def broker_alive(self) -> bool:
        """True while the broker answered within its hold time."""
        return self._broker_seen and self.keepalive.is_alive()

    def _finish(self, job: ClientJob, error: ZfabError | None = None) -> None:
        raise NotImplementedError

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        # A fresh identity per connection: the broker ignores a second connection under an
        # identity in use, and nobody learns one that stays valid across reconnects.
        self.identity = f"{self.name}-{secrets.token_hex(4)}".encode()
        return dealer_socket(ctx, self.identity, self.settings, self.broker)

    def on_batch_end(self) -> None:
        self._receiving = False
        if self._settle:
            settle, self._settle = self._settle, []
            for fut, result, error in settle:
                settle_future(fut, result, error)

    def on_connected(self) -> None:
        # The hold time is not reset: the broker is alive once it answers, not when we connect.
        self._send_keepalive()

    def on_closing(self) -> None:
        # A zfab broker (it told us its boot) then stops sending us keepalive waves at once,
        # instead of finding us unroutable at its next wave and counting a dropped frame.
        if self._boot is not None:
            self.loop.send_now(nfp.client_request(nfp.DISCONNECT, nfp.MMI_SERVICE, b"", b"", b""))

    def _send_keepalive(self) -> None:
        self.loop.send_now(nfp.client_request(nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", b"", b""))
        self.keepalive.mark_sent()

    def on_timer(self, now: float) -> float | None:
        ka = self.keepalive
        if self._broker_seen and ka.expired() and now >= self._reconnect_at:
            # Silent past its hold time: a new connection (and identity), as workers do. Its jobs
            # are re-established (GET, or POST again) when the broker answers (_broker_returned).
            log.warning("client %s: broker silent for %.1f s; reconnecting", self.name, ka.hold_time)
            self._reconnect_at = now + ka.hold_time
            self.counts["reconnects"] += 1
            self.loop.request_reconnect()
        if ka.due():
            self._send_keepalive()
        self.shm.sweep()  # idle pooled blocks, results given back
        nxt = ka.next_deadline() if not ka.expired() else ka.next_due
        while True:
            with self._lock:
                if not self._timers or self._timers[0][0] > now:
                    break
                _, uuid = heapq.heappop(self._timers)
                job = self._jobs.get(uuid)
            if job is not None:
                self._check(job, now)
        with self._lock:
            if self._timers:
                nxt = min(nxt, self._timers[0][0])
        return nxt

    def _check(self, job: ClientJob, now: float) -> None:
        if now >= job.deadline and job.grace is None and not self.broker_alive and self._broker_seen and not job.mmi:
            # Its deadline passed while the broker was silent (a partition, or down): how it ended is not
            # known here, while the broker and its worker may know (expired, or done). Wait one hold time
            # more for the broker, then ask (GET, or the POST again with nothing of its time left) and take
            # their word, so that client, API and broker tell the same end; `lost` only if it stays silent.
            job.grace = now + self.keepalive.hold_time
        if now >= job.deadline and (job.grace is None or now >= job.grace):
            if job.expected and not job.mmi and self.broker_alive:
                # Nobody waits for it any more: ask its workers to stop it.
                target = nfp.dumps(sorted(job.pending or job.expected))
                self.loop.send_now(nfp.client_request(nfp.DELETE, job.service, target, job.wire_uuid.encode(), b"{}"))
            if self.broker_alive and job.told_queued:
                # Still in the broker's queue: it never ran (the broker expires it at this deadline too).
                err: ZfabError = JobExpiredError(
                    f"job {job.uuid}: deadline of {job.timeout:g} s passed while it waited in the broker's queue",
                    uuid=job.uuid,
                )
            elif self.broker_alive:
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
            self._finish(job, err)
            return
        if self.broker_alive:
            if job.recheck:
                job.recheck = False
                self._reestablish(job)
            elif job.grace is not None:
                pass  # past its deadline: only the answer to its re-establishment is awaited
            elif now - job.last_heard >= self._quiet_after(job) and not (job.told_queued and job.expected is None):
                self._poll(job)  # a job waiting in the broker's queue is quiet by design: not polled
        end = job.deadline if job.grace is None else job.grace
        with self._lock:
            heapq.heappush(self._timers, (min(end, now + self.poll_after), job.uuid))

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
        uuid_b = job.wire_uuid.encode()
        if job.mmi or job.expected is None:
            # Not known to be admitted: POST again. The broker and the workers dedupe by
            # uuid, so a job still in flight is not run twice.
            cmd = nfp.MMI if job.mmi else nfp.POST
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

    def on_frames(self, frames: Frames) -> None:
        self._receiving = True
        try:
            reply = nfp.decode_broker_to_client(frames, self.settings.max_message_bytes)
        except nfp.ProtocolError as exc:
            self.counts["rejected_frames"] += 1
            if self.counts["rejected_frames"] <= 3:
                log.warning("client %s dropped a malformed message: %s", self.name, exc)
            if exc.reason == "oversize":
                self._oversize_answer(frames)
            return
        was_alive = self.broker_alive or not self._broker_seen  # the first contact is no return
        self._broker_seen = True
        self.keepalive.heard(keepalive=reply.command == nfp.KEEPALIVE)
        if reply.command == nfp.KEEPALIVE:
            boot = _boot_of(reply.payload)
            restarted = boot is not None and self._boot is not None and boot != self._boot
            if boot is not None:
                self._boot = boot
                self._broker_host = _host_of(reply.payload)
                self._broker_limit = _limit_of(reply.payload)
            if restarted:
                log.info("client %s: the broker restarted; re-establishing %d jobs", self.name, len(self._jobs))
            if restarted or not was_alive:
                self._broker_returned()
            if self.keepalive.answers():  # the broker's wave: answered at once, not on our own clock
                self._send_keepalive()
            return
        if not was_alive:
            self._broker_returned()
        uuid, attempt = payloads.split_wire_uuid(reply.uuid.decode(errors="replace"))
        job = self._jobs.get(uuid)
        if job is None or attempt != job.attempt:
            self.counts["late"] += 1  # a finished job, or an earlier attempt of a retried one
            return
        if reply.command == nfp.EVENT:
            self._event(job, reply)
            return
        if reply.command == nfp.STREAM:
            job.last_heard = self.clock()
            if job.future.chunks is None:
                self.counts["rejected_frames"] += 1
                return
            try:
                job.future.chunks.put_nowait(bytes(reply.payload))  # its reader gets bytes, not a view
            except queue.Full:
                # More chunks than the credits granted: the sender broke flow control.
                self.counts["rejected_frames"] += 1
                self._finish(job, BadRequestError(f"job {uuid}: stream overran its credit window", uuid=uuid))
            return
        if reply.status == nfp.ST_OK and shmhandle.is_handle(reply.payload):
            self._result_from_shm(job, reply)
            return
        self._apply(job, reply)

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
        job = self._jobs.get(uuid)
        self.counts["oversize"] += 1
        if job is None or attempt != job.attempt or reply.command != nfp.RESPONSE:
            return
        why = sizes.too_large(f"the answer for job {uuid}", sum(len(f) for f in frames), limit)
        self._finish(job, PayloadTooLargeError(why, uuid=uuid))

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
            log.warning(
                "client %s: result of job %s not read from shared memory (%s); asking %s again",
                self.name,
                job.uuid,
                exc.detail,
                worker,
            )
            if worker is not None and worker in job.pending:
                self._get(job, [worker])
            return

    def _apply(self, job: ClientJob, reply: nfp.BrokerReply) -> None:
        uuid = job.uuid
        before = job.size
        try:
            done = job.apply(reply, self.clock())
            lost = done and job.retry()
            # A failed attempt its worker says may run again: the broker holds the next one for the wait.
            again = lost or (done and job.retry_failed(self.clock(), time.time()))
        except ValueError as exc:
            self.counts["rejected_frames"] += 1
            log.warning("client %s: unreadable reply for job %s: %s", self.name, uuid, exc)
            return
        if job.size != before:
            with self._lock:
                self._bytes += job.size - before
        if again:
            why = "lost its worker" if lost else "failed"
            log.info("client %s: job %s %s; attempt %d", self.name, uuid, why, job.attempt)
            wire = job.wire_uuid.encode()
            self.loop.send_now(nfp.client_request(nfp.POST, job.service, job.target, wire, job.body, job.flags))
        elif done:
            self._finish(job)

    def _broker_returned(self) -> None:
        # After an outage or a restart, every job is re-established at once, not at its next poll.
        with self._lock:
            for job in self._jobs.values():
                job.recheck = True
                heapq.heappush(self._timers, (0.0, job.uuid))

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
        cb = self._callbacks.get(job.uuid)
        if cb is not None:
            try:
                cb(payload)
            except Exception:
                log.exception("client %s: event callback failed", self.name)


def _host_of(payload: nfp.Frame) -> str | None:
    """The shared-memory host id a zfab broker's keepalive answer carries."""
    try:
        return shmhandle.check_host(nfp.loads(payload).get("host"))
    except (ValueError, AttributeError):
        return None


def _limit_of(payload: nfp.Frame) -> int | None:
    """The message limit a zfab broker's keepalive answer carries (`"max"`), if it does."""
    try:
        return sizes.advertised_limit(nfp.loads(payload).get("max"))
    except (ValueError, AttributeError):
        return None


def _worker_of(handle_frame: nfp.Frame) -> str | None:
    """The worker a result handle names (to ask it again), or None."""
    try:
        return shmhandle.decode_handle(handle_frame).worker
    except shmhandle.HandleError:
        return None


def _boot_of(payload: nfp.Frame) -> str | None:
    """The broker incarnation a zfab broker's keepalive answer carries (NorFab's carry nothing)."""
    if not payload:
        return None
    try:
        boot = nfp.loads(payload).get("boot")
    except (ValueError, AttributeError):
        return None
    return boot if isinstance(boot, str) else None


def settle_future(fut: JobFuture, result: Any, error: BaseException | None) -> None:
    """Complete a job's future (on the owner), unless it is done already."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
