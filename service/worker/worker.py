"""Worker: a service class whose `@task` methods run jobs sent by the broker.

The DEALER socket belongs to the owner loop, which admits jobs (cheap checks, dedupe by
uuid, bounds) and answers GET/DELETE/PUT. Pool threads run the jobs (runner.py); the
job store's writer thread records them in batches, and 201 follows each commit.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, ClassVar

import zmq

from ..core import payloads
from ..core import protocol as nfp
from ..core.errors import ProtocolError
from ..core.keepalive import Clock, KeepAlive
from ..core.payloads import Outcome, Word
from ..settings import Settings
from ..transport.base import Frames, LoopFactory, Transport
from ..transport.loop import OwnerLoop
from ..transport.wire import dealer_socket
from .job import Job, JobState
from .jobstore import JobStore, StoredJob
from .pool import JobPool
from .runner import JobRunner
from .task import TaskSpec, build_spec, is_task, task

log = logging.getLogger(__name__)

RECENT_JOBS = 10_000  # finished jobs kept in memory for fast GET; older ones are read from the store


class Worker:
    """Subclass it, set `service`, and mark task methods with `@task`."""

    service: ClassVar[str] = ""

    def __init__(
        self,
        *,
        broker: str | None = None,
        name: str | None = None,
        service: str | None = None,
        settings: Settings | None = None,
        transport: LoopFactory | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        """`transport` and `clock` are for tests: a StubTransport and its FakeClock (transport/stub.py)."""
        self.settings = s = settings or Settings()
        self.broker = broker or s.broker
        self.service_name = service or type(self).service
        if not self.service_name:
            raise ValueError(f"{type(self).__name__} has no service name: set `service` or pass service=")
        self.name = name or f"{self.service_name}-{socket.gethostname()}-{os.getpid()}"
        self._service_b = self.service_name.encode()
        self._name_b = self.name.encode()
        self.tasks: dict[str, TaskSpec] = {}
        for attr in dir(type(self)):
            fn = getattr(self, attr, None)
            if is_task(fn):
                assert fn is not None
                self.tasks[attr] = build_spec(attr, fn, Job)
        self.keepalive = KeepAlive(s.keepalive_interval, s.keepalive_multiplier, clock)
        self.jobs: OrderedDict[str, Job] = OrderedDict()  # owner thread only
        self._received = 0  # owner thread only
        self._unstored: list[Job] = []  # owner thread only: received in this batch, not yet stored
        self.counts: dict[str, int] = {"rejected_frames": 0, "busy": 0}
        self._draining = False  # set by stop(): new jobs are answered busy, admitted ones finish
        self.store = JobStore(
            Path(s.data_dir) / "workers" / f"{self.name}.sqlite",
            queue_size=s.job_queue_size * 4 + 64,
            retention_seconds=s.job_retention_seconds,
            retention_count=s.job_retention_count,
        )
        self.loop: Transport = (transport or OwnerLoop)(
            self,
            name=f"worker {self.name}",
            outbound_size=s.outbound_queue_size,
            submit_timeout=s.submit_timeout,
        )
        self.runner = JobRunner(
            name=self.name, service=self.service_name, tasks=self.tasks, store=self.store, loop=self.loop
        )
        self.store.failure_payload = lambda uuid, task, why: nfp.dumps(self.runner.failure(uuid, task, [why]))
        self.pool: JobPool[Job] = JobPool(
            self.runner.run, size=s.pool_size, capacity=s.job_queue_size, name=f"{self.name}-job"
        )

    # ---- lifecycle -------------------------------------------------------------

    def start(self) -> Worker:
        self.store.open()
        self.pool.start()
        self.loop.start()
        log.info("worker %s serving '%s' via %s", self.name, self.service_name, self.broker)
        return self

    def stop(self, drain: float | None = None) -> None:
        """Refuse new jobs (busy), let admitted ones finish and send their results for up to
        `drain` seconds (ZFAB_DRAIN_TIMEOUT), then disconnect and close the job store."""
        self._draining = True
        try:
            # Tell the broker now (not at the next keepalive) so it stops picking this worker.
            self.loop.call(self._send_keepalive, timeout=2.0)
        except Exception:
            log.debug("worker %s: could not announce draining", self.name)
        deadline = time.monotonic() + (self.settings.drain_timeout if drain is None else drain)
        pause = threading.Event()
        while self.pool.depth() + self.pool.running > 0 and time.monotonic() < deadline:
            pause.wait(0.05)
        self.loop.stop()  # flushes the results still queued, within the linger bound
        self.pool.stop()
        self.store.close()

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- built-in task -----------------------------------------------------------

    @task
    def list_tasks(self) -> list[dict[str, Any]]:
        """List this service's tasks with the JSON schema of their arguments."""
        return [spec.schema() for spec in self.tasks.values()]

    @task
    def job_events(self, uuid: str) -> list[dict[str, Any]]:
        """The events a job emitted on this worker, read back from its job store."""
        return self.store.events_of(uuid)

    # ---- Role: owner thread --------------------------------------------------------

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        return dealer_socket(ctx, self._name_b, self.settings, self.broker)

    def on_connected(self) -> None:
        # READY goes first after every (re)connect, before any keepalive.
        self.loop.send_now(nfp.worker_control(nfp.READY, self._service_b))
        self.keepalive.reset()

    def on_closing(self) -> None:
        self.loop.send_now(nfp.worker_control(nfp.DISCONNECT, self._service_b))

    def on_timer(self, now: float) -> float | None:
        ka = self.keepalive
        if ka.expired():
            log.warning("worker %s: broker silent for %.1f s; reconnecting", self.name, ka.hold_time)
            self.loop.request_reconnect()
            return now + ka.interval
        if ka.due():
            self._send_keepalive()
        return ka.next_deadline()

    def _send_keepalive(self) -> None:
        self.loop.send_now(nfp.worker_control(nfp.KEEPALIVE, self._service_b, nfp.dumps(self.stats())))
        self.keepalive.mark_sent()

    def on_frames(self, frames: Frames) -> None:
        try:
            msg = nfp.decode_broker_to_worker(frames, self.settings.max_message_bytes)
        except nfp.ProtocolError as exc:
            self.counts["rejected_frames"] += 1
            if self.counts["rejected_frames"] <= 3 or self.counts["rejected_frames"] % 1000 == 0:
                log.warning("worker %s dropped a malformed message: %s", self.name, exc)
            return
        if isinstance(msg, nfp.BrokerControl):
            if msg.command == nfp.KEEPALIVE:
                self.keepalive.heard()
            else:  # DISCONNECT: the broker does not know us (restarted) or dropped us
                log.info("worker %s: broker asked to re-register", self.name)
                self.loop.request_reconnect()
            return
        self.keepalive.heard(keepalive=False)
        if msg.command == nfp.POST:
            self.handle_post(msg)
        elif msg.command == nfp.GET:
            self.handle_get(msg)
        elif msg.command == nfp.DELETE:
            self.handle_delete(msg)
        elif msg.command == nfp.PUT:
            self.handle_put(msg)
        else:
            self._reply(msg, nfp.ST_BAD_REQUEST, self.runner.status(msg.uuid.decode(), Word.UNSUPPORTED))

    # ---- job handling (owner) ------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """What the worker reports to the broker with each keepalive."""
        return {
            "job_queue_depth": self.pool.depth(),
            "job_queue_capacity": self.pool.capacity,
            "jobs_running": self.pool.running,
            "pool_size": self.pool.size,
            "outbound_queue_depth": self.loop.queue_depth(),
            "outbound_queue_capacity": self.loop.outbound_size,
            "store_queue_depth": self.store.depth(),
            "store_queue_capacity": self.store.queue_size,
            "jobs_completed": self.runner.counts["completed"],
            "jobs_failed": self.runner.counts["failed"],
            "jobs_busy": self.counts["busy"],
            "frames_rejected": self.counts["rejected_frames"],
            "reconnects": self.loop.stats.reconnects,
            "draining": self._draining,
            "jobs_remembered": len(self.jobs),
            "jobs_remembered_capacity": RECENT_JOBS,
        }

    def _reply(self, msg: nfp.BrokerJob, status: bytes, payload: Any, command: bytes = nfp.RESPONSE) -> None:
        self.loop.send_now(nfp.worker_reply(command, msg.client, msg.uuid, status, nfp.dumps(payload)))

    def handle_post(self, msg: nfp.BrokerJob) -> None:
        """Admit a job: cheap checks here, validation and the run on a pool thread."""
        uuid = msg.uuid.decode(errors="replace")
        known = self.jobs.get(uuid)
        if known is not None:
            # A retried POST never runs a job twice: answer with what the job is now.
            self._answer(known, msg.client)
            return
        if uuid in self.store.stored_before:
            self.handle_get(msg)  # ran before this worker restarted: its stored outcome answers
            return
        try:
            body = payloads.read_post_body(msg.body)
        except ProtocolError as exc:
            self._reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, "", [exc.detail]))
            return
        task_name = body.task
        if task_name not in self.tasks:
            why = (
                f"task '{task_name}' is not a task of service '{self.service_name}'; "
                f"its tasks are: {', '.join(sorted(self.tasks))}"
            )
            self._reply(msg, nfp.ST_BAD_REQUEST, self.runner.failure(uuid, task_name, [why]))
            return
        if self._draining:
            self.counts["busy"] += 1
            self._reply(msg, nfp.ST_BUSY, self.runner.status(uuid, Word.BUSY, errors=["worker is stopping"]))
            return
        if self._received - self.runner.finished >= self.pool.capacity:
            self.counts["busy"] += 1
            self._reply(msg, nfp.ST_BUSY, self.runner.status(uuid, Word.BUSY, errors=["worker job queue is full"]))
            return
        job = Job(
            uuid=uuid,
            client=msg.client,
            task=task_name,
            args=body.args,
            kwargs=body.kwargs,
            timeout=body.timeout,
            push=body.push,
            ack=body.ack,
            request=msg.body,
            emit=self.runner.emit,
            stream_out=self.runner.stream_out,
        )
        # The job runs as soon as a pool thread is free; the store records the whole
        # receive batch in one write (see on_batch_end), and 201 follows that commit.
        self.pool.put(job, timeout=0)  # cannot be full: admission above keeps it within capacity
        self._received += 1
        self._unstored.append(job)
        self.jobs[uuid] = job
        self._forget_old_jobs()

    def on_batch_end(self) -> None:
        """After a receive batch: store its new jobs in one write, then acknowledge them."""
        if not self._unstored:
            return
        batch, self._unstored = self._unstored, []
        rows = [(j.uuid, j.client, j.task, j.request, j.received_at) for j in batch]
        acks = [j for j in batch if j.ack]
        try:
            self.store.submit(
                self.store.insert_op(rows), (lambda: self.runner.acknowledge(acks)) if acks else None, timeout=0.5
            )
        except queue.Full:
            log.error("worker %s: job store full; %d received jobs not recorded", self.name, len(rows))

    def _forget_old_jobs(self) -> None:
        # Unfinished jobs are bounded by the pool's capacity, far below RECENT_JOBS,
        # so rotating them to the back always reaches a finished one to forget.
        jobs = self.jobs
        for _ in range(len(jobs) - RECENT_JOBS):
            uuid, oldest = next(iter(jobs.items()))
            if oldest.state.final:
                del jobs[uuid]
            else:
                jobs.move_to_end(uuid)

    def _answer(self, job: Job, client: bytes) -> None:
        if job.state.final:
            frames = nfp.worker_reply(nfp.RESPONSE, client, job.uuid.encode(), job.status_code, job.result_payload)
        else:
            status = nfp.ST_WAITING_INPUT if job.state == JobState.WAITING_INPUT else nfp.ST_PENDING
            state = Word.STARTED if job.state != JobState.RECEIVED else Word.PENDING
            frames = nfp.worker_reply(
                nfp.RESPONSE, client, job.uuid.encode(), status, nfp.dumps(self.runner.status(job.uuid, state))
            )
        self.loop.send_now(frames)

    def handle_get(self, msg: nfp.BrokerJob) -> None:
        uuid = msg.uuid.decode(errors="replace")
        job = self.jobs.get(uuid)
        if job is not None:
            self._answer(job, msg.client)
            return

        def reply(found: StoredJob | None) -> None:
            if found is None:
                status, payload = nfp.ST_NOT_FOUND, nfp.dumps(self.runner.status(uuid, Word.NOT_FOUND))
            elif found.result is not None:
                status, payload = (found.status_code or "200").encode(), found.result.encode()
            else:
                status, payload = nfp.ST_PENDING, nfp.dumps(self.runner.status(uuid, Word.PENDING))
            self.runner.send(nfp.worker_reply(nfp.RESPONSE, msg.client, msg.uuid, status, payload))

        try:
            self.store.read(uuid, reply)
        except queue.Full:
            self._reply(msg, nfp.ST_BUSY, self.runner.status(uuid, Word.BUSY, errors=["worker job store is busy"]))

    def handle_delete(self, msg: nfp.BrokerJob) -> None:
        uuid = msg.uuid.decode(errors="replace")
        job = self.jobs.get(uuid)
        if job is None:
            self._reply(msg, nfp.ST_NOT_FOUND, self.runner.status(uuid, Word.NOT_FOUND))
            return
        if not job.state.final:
            job.cancel()
            if job.claim():
                # Still queued: it ends now, without waiting for a pool thread.
                job.started_at = time.time()
                self.runner.complete(job, nfp.ST_OK, None, Outcome.CANCELLED, ["cancelled before it started"])
        state = job.state.value if job.state.final else Word.CANCELLING
        self._reply(msg, nfp.ST_DISPATCHED, self.runner.status(uuid, state))

    def handle_put(self, msg: nfp.BrokerJob) -> None:
        """Client data for a running job: stream credits, or the answer to an input request."""
        uuid = msg.uuid.decode(errors="replace")
        job = self.jobs.get(uuid)
        try:
            body = json.loads(msg.body)
            if not isinstance(body, dict):
                raise ValueError("PUT body must be a JSON object")
        except ValueError as exc:
            self.counts["rejected_frames"] += 1
            log.warning("worker %s: bad PUT for job %s: %s", self.name, uuid, exc)
            return
        if "credit" in body:
            if job is not None and isinstance(body["credit"], int):
                job.grant(body["credit"])
            return
        input_id = str(body.get("input_id", ""))
        problem = "job not found" if job is None or job.state.final else job.deliver_input(input_id, body.get("value"))
        response = {"input_id": input_id, "accepted": problem is None, "errors": [problem] if problem else []}
        payload = {
            "event_type": "input_response",
            "message": "input accepted" if problem is None else problem,
            "severity": "INFO" if problem is None else "WARNING",
            "status": "running",
            "task": job.task if job else "",
            "juuid": uuid,
            "extras": {"input_response": response},
        }
        if job is not None:
            self.runner.emit(job, payload)
        else:
            payload.update(worker=self.name, service=self.service_name, uuid=uuid)
            self.loop.send_now(nfp.worker_reply(nfp.EVENT, msg.client, msg.uuid, nfp.ST_OK, nfp.dumps(payload)))
