"""Client: submits jobs to the broker and collects their results as dictionaries.

The DEALER socket belongs to the client's owner loop. `submit` (any thread) records
the job in a bounded table and queues its POST; the loop resolves the job's future
when the results are pushed back. GET polling is the fallback for jobs that went
quiet (a broker restart, a lost frame).
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import queue
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zmq

from ..core import payloads
from ..core import protocol as nfp
from ..core.keepalive import Clock, KeepAlive
from ..errors import (
    BadRequestError,
    BrokerUnavailableError,
    BusyError,
    ClosedError,
    JobNotFoundError,
    JobTimeoutError,
    ZfabError,
)
from ..settings import Settings
from ..transport.base import Frames, LoopFactory, Transport
from ..transport.loop import OwnerLoop
from ..transport.wire import dealer_socket
from .clientjob import ClientJob, JobFuture, outcome_of
from .filestream import FileStream, download, resume_offset, stream_request
from .interaction import answer_input, iter_events

log = logging.getLogger(__name__)

EventCallback = Callable[[dict[str, Any]], None]
Workers = str | list[str]


class Client:
    """Talk to a zfab (or NorFab) broker. Use as a context manager, or call start()/close().

    `acks=False` asks the broker and workers to skip the per-job 202/201 acknowledgements
    (faster; see docs/protocol.md); `push=True` (default) has results pushed when ready.
    """

    def __init__(
        self,
        broker: str | None = None,
        name: str = "client",
        *,
        settings: Settings | None = None,
        acks: bool = True,
        push: bool = True,
        poll_after: float | None = None,
        transport: LoopFactory | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        """`transport` and `clock` are for tests: a StubTransport and its FakeClock (transport/stub.py)."""
        self.settings = s = settings or Settings()
        self.broker = broker or s.broker
        self.name = name
        self.identity = f"{name}-{uuidlib.uuid4().hex[:8]}".encode()
        self.acks = acks
        self.push = push
        self.poll_after = poll_after if poll_after is not None else max(1.0, 2 * s.keepalive_interval)
        self.max_jobs = s.max_client_jobs
        self.clock = clock
        self.keepalive = KeepAlive(s.keepalive_interval, s.keepalive_multiplier, clock)
        self._broker_seen = False
        self._jobs: dict[str, ClientJob] = {}
        self._timers: list[tuple[float, str]] = []  # (monotonic due, uuid): deadlines and poll checks
        self._lock = threading.Lock()
        self._callbacks: dict[str, EventCallback] = {}
        self.counts: dict[str, int] = {"late": 0, "rejected_frames": 0, "polls": 0, "completed": 0}
        self._flags = payloads.flags(push=push, ack=acks)
        self.loop: Transport = (transport or OwnerLoop)(
            self, name=f"client {name}", outbound_size=s.outbound_queue_size, submit_timeout=s.submit_timeout
        )
        self._started = False
        # Called on the owner thread when a job ends: (future, service, outcome, results).
        self.on_complete: Callable[[JobFuture, str, str, dict[str, Any] | None], None] | None = None

    # ---- lifecycle -----------------------------------------------------------

    def start(self) -> Client:
        if not self._started:
            self.loop.start()
            self._started = True
        return self

    def close(self) -> None:
        """Stop accepting jobs, flush what is queued (bounded), and fail what is still waiting."""
        self.loop.stop()
        with self._lock:
            jobs = list(self._jobs.values())
            self._jobs.clear()
        for job in jobs:
            if not job.future.done():
                job.future.set_exception(ClosedError(f"client closed before job {job.uuid} finished"))

    def __enter__(self) -> Client:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def broker_alive(self) -> bool:
        """True while the broker answered within its hold time."""
        return self._broker_seen and self.keepalive.is_alive()

    def jobs_in_flight(self) -> int:
        return len(self._jobs)

    # ---- public API (any thread) -------------------------------------------------

    def submit(
        self,
        service: str,
        task: str,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        workers: Workers = "any",
        timeout: float = 60.0,
        *,
        on_event: EventCallback | None = None,
        uuid: str | None = None,
        retries: int = 0,
    ) -> JobFuture:
        """Queue a job; the returned future resolves to {worker name: result entry}.

        With `retries` (target "any" only), a job whose worker is lost runs again on
        another worker, with its attempt number; a late result of the lost attempt is dropped.
        """
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        body = payloads.post_body(task, args, kwargs, timeout=timeout, push=self.push, ack=self.acks)
        target = (json.dumps(workers) if isinstance(workers, list) else workers).encode()
        return self._submit(service.encode(), target, body, timeout, uuid=uuid, on_event=on_event, retries=retries)

    def run_job(
        self,
        service: str,
        task: str,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        workers: Workers = "any",
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        """Run a job and return {worker name: result entry}; raises a JobError subclass otherwise."""
        fut = self.submit(service, task, args, kwargs, workers, timeout)
        result: dict[str, Any] = fut.result(timeout + 5.0)
        return result

    def recover(self, service: str, uuid: str, workers: list[str], timeout: float = 30.0) -> JobFuture:
        """Collect a job's result from its workers by GET (after a client or API restart).

        The future resolves like submit()'s: the result dictionary once every worker has a
        final answer (a job cut short by a worker restart reads as failed: interrupted), or
        JobNotFoundError when no worker knows the job.
        """
        if not workers:
            raise ValueError("recover needs the names of the workers that ran the job")
        return self._submit(
            service.encode(), nfp.dumps(sorted(workers)), payloads.EMPTY_BODY, timeout, uuid=uuid, expected=set(workers)
        )

    def mmi(self, task: str, timeout: float = 5.0, **kwargs: Any) -> Any:
        """Ask the broker's management interface, e.g. mmi("show_workers")."""
        return self.mmi_future(task, timeout, **kwargs).result(timeout + 5.0)["result"]

    def mmi_future(self, task: str, timeout: float = 5.0, **kwargs: Any) -> JobFuture:
        """mmi() without blocking: the future resolves to {"result": answer} (for event loops)."""
        body = nfp.dumps({"task": task, "kwargs": kwargs})
        return self._submit(nfp.MMI_SERVICE, b"any", body, timeout, mmi=True)

    def get_job(self, uuid: str) -> JobFuture | None:
        job = self._jobs.get(uuid)
        return job.future if job is not None else None

    def cancel(self, uuid: str) -> bool:
        """Ask the job's workers to cancel it. False when this client does not track the job."""
        job = self._jobs.get(uuid)
        if job is None:
            return False
        target = nfp.dumps(sorted(job.expected)) if job.expected else job.target
        self.loop.submit(nfp.client_request(nfp.DELETE, job.service, target, job.wire_uuid.encode(), b"{}"))
        return True

    def events(self, fut: JobFuture, timeout: float = 60.0) -> Iterator[dict[str, Any]]:
        """Yield the job's events in order as they arrive, until it finishes or the timeout passes."""
        return iter_events(fut, timeout)

    def job_events(self, service: str, uuid: str, worker: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Read back the events a (finished) job emitted, from the worker's job store."""
        r = self.run_job(service, "job_events", kwargs={"uuid": uuid}, workers=worker, timeout=timeout)
        events: list[dict[str, Any]] = r[worker]["result"] or []
        return events

    def send_input(self, uuid: str, value: Any, input_id: str | None = None, timeout: float = 10.0) -> None:
        """Answer a job's input request (PUT). Raises BadRequestError if the worker refuses it."""
        job = self._jobs.get(uuid)
        if job is None:
            raise JobNotFoundError(f"this client does not track job {uuid}", uuid=uuid)
        answer_input(self.loop, job.service, job.future, job.wire_uuid, value, input_id, timeout)

    def open_stream(
        self,
        service: str,
        path: str,
        *,
        workers: str = "any",
        offset: int = 0,
        chunk_size: int = 1024 * 1024,
        window: int = 8,
        timeout: float = 600.0,
    ) -> FileStream:
        """Start streaming a file from a files-service worker; iterate the result for its chunks."""
        if workers == "all" or workers.startswith("["):
            raise ValueError("a stream comes from one worker: use 'any' or a worker name")
        body = stream_request(path, offset=offset, chunk_size=chunk_size, window=window, timeout=timeout)
        # Acknowledgements on: credits go to the worker the broker names in its 202.
        fut = self._submit(service.encode(), workers.encode(), body, timeout, stream_window=window)
        return FileStream(self.loop, fut, service, offset)

    def fetch_file(
        self,
        service: str,
        path: str,
        dest: str | os.PathLike[str],
        *,
        workers: str = "any",
        resume: bool = False,
        chunk_size: int = 1024 * 1024,
        window: int = 8,
        timeout: float = 600.0,
    ) -> dict[str, Any]:
        """Download a file to dest and verify its sha256. With resume, continue a partial dest."""
        target = Path(dest)
        offset = resume_offset(target, resume)
        stream = self.open_stream(
            service, path, workers=workers, offset=offset, chunk_size=chunk_size, window=window, timeout=timeout
        )
        return download(stream, target)

    # ---- internals -------------------------------------------------------------

    def _submit(
        self,
        service: bytes,
        target: bytes,
        body: bytes,
        timeout: float,
        *,
        uuid: str | None = None,
        on_event: EventCallback | None = None,
        mmi: bool = False,
        stream_window: int = 0,
        retries: int = 0,
        expected: set[str] | None = None,
    ) -> JobFuture:
        if not self._started:
            self.start()
        if uuid is not None:
            payloads.check_job_uuid(uuid)
        juuid = uuid or uuidlib.uuid4().hex
        fut = JobFuture(juuid, stream_window)
        fut.timings["submitted"] = time.time()
        now = self.clock()
        flags = payloads.flags(push=True, ack=True) if stream_window else self._flags
        job = ClientJob(juuid, service, target, body, flags, fut, now + timeout, now, mmi=mmi, retries_left=retries)
        job.expected = expected  # known already when recovering a job by GET
        with self._lock:
            if len(self._jobs) >= self.max_jobs:
                raise BusyError(f"client tracks {self.max_jobs} jobs already; wait for some to finish")
            if juuid in self._jobs:
                return self._jobs[juuid].future
            self._jobs[juuid] = job
            # One timer per job: the earlier of its deadline and its first poll; _check re-arms it.
            heapq.heappush(self._timers, (min(job.deadline, now + self.poll_after), juuid))
            if on_event is not None:
                self._callbacks[juuid] = on_event
        cmd = nfp.MMI if mmi else nfp.GET if expected else nfp.POST
        flags = payloads.NO_ACK if expected else job.flags
        try:
            self.loop.submit(nfp.client_request(cmd, service, target, juuid.encode(), body, flags))
        except BaseException:
            self._forget(juuid)
            raise
        return fut

    def _forget(self, uuid: str) -> ClientJob | None:
        with self._lock:
            self._callbacks.pop(uuid, None)
            return self._jobs.pop(uuid, None)

    def _finish(self, job: ClientJob, error: ZfabError | None = None) -> None:
        if self._forget(job.uuid) is None:
            return
        job.future.timings["completed"] = time.time()
        self.counts["completed"] += 1
        result: dict[str, Any] | None = None
        if error is None:
            result, error = job.outcome()
        if self.on_complete is not None and not job.mmi:
            try:
                self.on_complete(job.future, job.service.decode(errors="replace"), outcome_of(result, error), result)
            except Exception:
                log.exception("client %s: completion hook failed", self.name)
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    # ---- Role: owner thread ---------------------------------------------------------

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        return dealer_socket(ctx, self.identity, self.settings, self.broker)

    def on_batch_end(self) -> None:
        pass

    def on_connected(self) -> None:
        self.keepalive.reset()
        self._send_keepalive()

    def on_closing(self) -> None:
        pass

    def _send_keepalive(self) -> None:
        self.loop.send_now(nfp.client_request(nfp.KEEPALIVE, nfp.MMI_SERVICE, b"", b"", b""))
        self.keepalive.mark_sent()

    def on_timer(self, now: float) -> float | None:
        ka = self.keepalive
        if ka.due():
            self._send_keepalive()
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
        if now >= job.deadline:
            if job.expected and not job.mmi and self.broker_alive:
                # Nobody waits for it any more: ask its workers to stop it.
                target = nfp.dumps(sorted(job.pending or job.expected))
                self.loop.send_now(nfp.client_request(nfp.DELETE, job.service, target, job.wire_uuid.encode(), b"{}"))
            if self.broker_alive:
                err: ZfabError = JobTimeoutError(
                    f"job {job.uuid} did not finish within its timeout", uuid=job.uuid, results=job.results
                )
            else:
                err = BrokerUnavailableError(
                    f"job {job.uuid}: the broker at {self.broker} has not answered within its hold time"
                )
            self._finish(job, err)
            return
        if now - job.last_heard >= self.poll_after and self.broker_alive:
            self._poll(job)
        with self._lock:
            heapq.heappush(self._timers, (min(job.deadline, now + self.poll_after), job.uuid))

    def _poll(self, job: ClientJob) -> None:
        """The job went quiet: ask its workers (GET), or re-send the POST if none is known yet."""
        self.counts["polls"] += 1
        job.polls += 1
        job.last_heard = self.clock()
        uuid_b = job.wire_uuid.encode()
        if job.mmi or job.expected is None:
            # Not known to be dispatched: POST again. The broker and the workers dedupe by
            # uuid, so a job still in flight is not run twice.
            cmd = nfp.MMI if job.mmi else nfp.POST
            self.loop.send_now(nfp.client_request(cmd, job.service, job.target, uuid_b, job.body, job.flags))
            return
        for worker in sorted(job.pending):
            self.loop.send_now(
                nfp.client_request(nfp.GET, job.service, worker.encode(), uuid_b, payloads.EMPTY_BODY, payloads.NO_ACK)
            )

    def on_frames(self, frames: Frames) -> None:
        try:
            reply = nfp.decode_broker_to_client(frames, self.settings.max_message_bytes)
        except nfp.ProtocolError as exc:
            self.counts["rejected_frames"] += 1
            if self.counts["rejected_frames"] <= 3:
                log.warning("client %s dropped a malformed message: %s", self.name, exc)
            return
        was_alive = self.broker_alive
        self._broker_seen = True
        self.keepalive.heard(keepalive=reply.command == nfp.KEEPALIVE)
        if not was_alive:
            self._broker_returned()
        if reply.command == nfp.KEEPALIVE:
            return
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
                job.future.chunks.put_nowait(reply.payload)
            except queue.Full:
                # More chunks than the credits granted: the sender broke flow control.
                self.counts["rejected_frames"] += 1
                self._finish(job, BadRequestError(f"job {uuid}: stream overran its credit window", uuid=uuid))
            return
        try:
            done = job.apply(reply, self.clock())
        except ValueError as exc:
            self.counts["rejected_frames"] += 1
            log.warning("client %s: unreadable reply for job %s: %s", self.name, uuid, exc)
            return
        if done and job.retry():
            log.info("client %s: job %s lost its worker; attempt %d", self.name, uuid, job.attempt)
            wire = job.wire_uuid.encode()
            self.loop.send_now(nfp.client_request(nfp.POST, job.service, job.target, wire, job.body, job.flags))
        elif done:
            self._finish(job)

    def _broker_returned(self) -> None:
        # After an outage, quiet jobs are checked at once instead of at their next poll.
        with self._lock:
            for job in self._jobs.values():
                job.last_heard = 0.0
                heapq.heappush(self._timers, (0.0, job.uuid))

    def _event(self, job: ClientJob, reply: nfp.BrokerReply) -> None:
        try:
            payload = json.loads(reply.payload)
        except ValueError:
            self.counts["rejected_frames"] += 1
            return
        if not isinstance(payload, dict):
            return
        job.last_heard = self.clock()
        if job.future.worker is None and isinstance(payload.get("worker"), str):
            job.future.worker = payload["worker"]
        job.future.add_event(payload)
        cb = self._callbacks.get(job.uuid)
        if cb is not None:
            try:
                cb(payload)
            except Exception:
                log.exception("client %s: event callback failed", self.name)
