"""Worker: a service class whose `@task` methods run jobs sent by the broker.

The DEALER socket belongs to the owner loop. A POST is validated on the loop, stored
by the job store's writer thread (201 goes out once it is committed), run by a pool
thread, and its result is pushed back at once and stored in the same batched way.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
import traceback
from collections import OrderedDict
from pathlib import Path
from typing import Any, ClassVar

import zmq

from . import protocol as nfp
from .errors import BackpressureError, ClosedError, JobCancelledError, JobTimeoutError
from .job import Job, JobState, iso
from .jobstore import JobStore, StoredJob
from .keepalive import KeepAlive
from .loop import Frames, OwnerLoop
from .pool import JobPool
from .settings import Settings
from .task import TaskArgumentsError, TaskSpec, build_spec, is_task, task

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
    ) -> None:
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
        self.keepalive = KeepAlive(s.keepalive_interval, s.keepalive_multiplier)
        self.jobs: OrderedDict[str, Job] = OrderedDict()  # owner thread only
        self._received = 0  # owner thread only
        self._unstored: list[Job] = []  # owner thread only: received in this batch, not yet stored
        self._finished = 0
        self._finished_lock = threading.Lock()
        self.counts: dict[str, int] = {"completed": 0, "failed": 0, "rejected_frames": 0, "busy": 0}
        self.store = JobStore(
            Path(s.data_dir) / "workers" / f"{self.name}.sqlite",
            queue_size=s.job_queue_size * 4 + 64,
            retention_seconds=s.job_retention_seconds,
            retention_count=s.job_retention_count,
        )
        self.pool: JobPool[Job] = JobPool(
            self._run_job, size=s.pool_size, capacity=s.job_queue_size, name=f"{self.name}-job"
        )
        self.loop = OwnerLoop(
            self,
            name=f"worker {self.name}",
            outbound_size=s.outbound_queue_size,
            submit_timeout=s.submit_timeout,
        )

    # ---- lifecycle -------------------------------------------------------------

    def start(self) -> Worker:
        self.store.open()
        self.pool.start()
        self.loop.start()
        log.info("worker %s serving '%s' via %s", self.name, self.service_name, self.broker)
        return self

    def stop(self) -> None:
        self.loop.stop()
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

    # ---- Role: owner thread --------------------------------------------------------

    def open_socket(self, ctx: zmq.Context[zmq.Socket[bytes]]) -> zmq.Socket[bytes]:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self._name_b)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sock.connect(self.broker)
        return sock

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
            self.loop.send_now(nfp.worker_control(nfp.KEEPALIVE, self._service_b, nfp.dumps(self.stats())))
            ka.mark_sent()
        return ka.next_deadline()

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
        else:
            self._reply(msg, nfp.ST_BAD_REQUEST, self._status_payload(msg.uuid.decode(), "UNSUPPORTED"))

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
            "jobs_completed": self.counts["completed"],
            "jobs_failed": self.counts["failed"],
            "jobs_busy": self.counts["busy"],
            "frames_rejected": self.counts["rejected_frames"],
            "reconnects": self.loop.stats.reconnects,
        }

    def _reply(self, msg: nfp.BrokerJob, status: bytes, payload: Any, command: bytes = nfp.RESPONSE) -> None:
        self.loop.send_now(nfp.worker_reply(command, msg.client, msg.uuid, status, nfp.dumps(payload)))

    def _status_payload(self, uuid: str, status: str, **extra: Any) -> dict[str, Any]:
        return {"worker": self.name, "uuid": uuid, "service": self.service_name, "status": status, **extra}

    def _failure(self, uuid: str, task_name: str, status: str, errors: list[str]) -> dict[str, Any]:
        return {self.name: self._entry(uuid, task_name, None, True, status, errors, [], None, None, None)}

    def _entry(
        self,
        uuid: str,
        task_name: str,
        result: Any,
        failed: bool,
        status: str,
        errors: list[str],
        messages: list[str],
        received: float | None,
        started: float | None,
        completed: float | None,
    ) -> dict[str, Any]:
        # NorFab's Result keys, then zfab's per-hop timestamps (epoch seconds).
        return {
            "result": result,
            "failed": failed,
            "errors": errors,
            "messages": messages,
            "juuid": uuid,
            "task": f"{self.name}:{task_name}",
            "status": status,
            "resources": [],
            "resources_failed": [],
            "task_started": iso(started),
            "task_completed": iso(completed),
            "service": self.service_name,
            "worker": self.name,
            "timestamps": {"received": received, "started": started, "completed": completed},
        }

    def handle_post(self, msg: nfp.BrokerJob) -> None:
        """Admit a job: cheap checks here, validation and the run on a pool thread."""
        uuid = msg.uuid.decode(errors="replace")
        known = self.jobs.get(uuid)
        if known is not None:
            # A retried POST never runs a job twice: answer with what the job is now.
            self._answer(known, msg.client)
            return
        try:
            body = json.loads(msg.body)
            if not isinstance(body, dict):
                raise ValueError("POST body must be a JSON object")
            task_name = str(body.get("task", ""))
            args = body.get("args") or []
            kwargs = body.get("kwargs") or {}
            timeout = body.get("timeout")
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise ValueError("args must be a JSON list and kwargs a JSON object")
            if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
                raise ValueError("timeout must be a positive number of seconds")
        except ValueError as exc:
            self._reply(msg, nfp.ST_BAD_REQUEST, self._failure(uuid, "", "error", [f"bad request body: {exc}"]))
            return
        if task_name not in self.tasks:
            why = (
                f"task '{task_name}' is not a task of service '{self.service_name}'; "
                f"its tasks are: {', '.join(sorted(self.tasks))}"
            )
            self._reply(msg, nfp.ST_BAD_REQUEST, self._failure(uuid, task_name, "error", [why]))
            return
        if self._received - self._finished >= self.pool.capacity:
            self.counts["busy"] += 1
            self._reply(msg, nfp.ST_BUSY, self._status_payload(uuid, "BUSY", errors=["worker job queue is full"]))
            return
        job = Job(
            uuid=uuid,
            client=msg.client,
            task=task_name,
            args=args,
            kwargs=kwargs,
            timeout=timeout,
            push=bool(body.get("push", False)),
            ack=bool(body.get("ack", True)),
            request=msg.body,
            emit=self._emit,
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
            self.store.submit(self.store.insert_op(rows), (lambda: self._stored(acks)) if acks else None, timeout=0.5)
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
            state = "STARTED" if job.state != JobState.RECEIVED else "PENDING"
            frames = nfp.worker_reply(
                nfp.RESPONSE, client, job.uuid.encode(), status, nfp.dumps(self._status_payload(job.uuid, state))
            )
        self.loop.send_now(frames)

    def handle_get(self, msg: nfp.BrokerJob) -> None:
        uuid = msg.uuid.decode(errors="replace")
        job = self.jobs.get(uuid)
        if job is not None:
            self._answer(job, msg.client)
            return

        def reply(found: StoredJob | None, events: list[str]) -> None:
            if found is None:
                status, payload = nfp.ST_NOT_FOUND, nfp.dumps(self._status_payload(uuid, "JOB NOT FOUND"))
            elif found.result is not None:
                status, payload = (found.status_code or "200").encode(), found.result.encode()
            else:
                status, payload = nfp.ST_PENDING, nfp.dumps(self._status_payload(uuid, "PENDING"))
            self._send(nfp.worker_reply(nfp.RESPONSE, msg.client, msg.uuid, status, payload))

        try:
            self.store.read(uuid, reply)
        except queue.Full:
            self._reply(msg, nfp.ST_BUSY, self._status_payload(uuid, "BUSY", errors=["worker job store is busy"]))

    def handle_delete(self, msg: nfp.BrokerJob) -> None:
        uuid = msg.uuid.decode(errors="replace")
        job = self.jobs.get(uuid)
        if job is None:
            self._reply(msg, nfp.ST_NOT_FOUND, self._status_payload(uuid, "JOB NOT FOUND"))
            return
        if not job.state.final:
            job.cancel_event.set()
        self._reply(
            msg, nfp.ST_DISPATCHED, self._status_payload(uuid, "CANCELLING" if not job.state.final else job.state.value)
        )

    # ---- other threads -------------------------------------------------------------

    def _send(self, frames: Frames) -> None:
        """Hand a frame to the owner loop from a pool or store thread; results are not dropped lightly."""
        for _ in range(30):
            try:
                self.loop.submit(frames)
                return
            except BackpressureError:
                continue  # the broker is slow or away; the stored result stays readable by GET
            except ClosedError:
                return
        log.error("worker %s: outbound queue full for 30 s; a frame was dropped (the job store keeps it)", self.name)

    def _stored(self, jobs: list[Job]) -> None:
        """Writer thread: the jobs are committed; acknowledge them (NorFab's 201)."""
        for job in jobs:
            self._send(
                nfp.worker_reply(
                    nfp.RESPONSE,
                    job.client,
                    job.uuid.encode(),
                    nfp.ST_WORKER_ACCEPTED,
                    nfp.dumps(self._status_payload(job.uuid, "ACCEPTED")),
                )
            )

    def _emit(self, job: Job, payload: dict[str, Any]) -> None:
        payload.update(worker=self.name, service=self.service_name, uuid=job.uuid)
        raw = nfp.dumps(payload)
        seq = job.event_seq
        job.event_seq += 1
        self._send(nfp.worker_reply(nfp.EVENT, job.client, job.uuid.encode(), nfp.ST_OK, raw))
        try:
            self.store.submit(self.store.event_op(job.uuid, seq, raw), timeout=1.0)
        except queue.Full:
            log.warning("worker %s: job store busy; event %d of job %s not stored", self.name, seq, job.uuid)

    def _run_job(self, job: Job) -> None:
        """Pool thread: validate, run the task, push the result, then store it."""
        spec = self.tasks[job.task]
        job.started_at = time.time()
        errors: list[str] = []
        result: Any = None
        status, code = "completed", nfp.ST_OK
        if job.cancelled:
            status, errors = "cancelled", ["cancelled before it started"]
        elif job.expired():
            status, errors = "timeout", [f"deadline of {job.timeout} s passed before the job started"]
        else:
            try:
                kwargs = spec.bind(job.args, job.kwargs)
            except TaskArgumentsError as exc:
                status, code, errors = "error", nfp.ST_BAD_REQUEST, [str(exc)]
            else:
                # Kept in memory only: a restart marks every unfinished stored job
                # interrupted, so a per-job "running" write would buy nothing.
                job.state = JobState.RUNNING
                if spec.job_param:
                    kwargs[spec.job_param] = job
                try:
                    result = spec.fn(**kwargs)
                except JobCancelledError:
                    status, errors = "cancelled", ["cancelled while running"]
                except JobTimeoutError as exc:
                    status, errors = "timeout", [str(exc)]
                except Exception as exc:
                    status, errors = "error", [traceback.format_exc()]
                    log.debug("worker %s: task %s raised %r", self.name, job.task, exc)
        self._complete(job, code, result, status, errors)

    def _complete(self, job: Job, code: bytes, result: Any, status: str, errors: list[str]) -> None:
        job.completed_at = time.time()
        failed = status != "completed"
        entry = self._entry(
            job.uuid, job.task, result, failed, status, errors, [], job.received_at, job.started_at, job.completed_at
        )
        try:
            payload = nfp.dumps({self.name: entry})
        except (TypeError, ValueError) as exc:  # a result JSON cannot carry
            entry.update(result=None, failed=True, status="error", errors=[f"result is not JSON-serialisable: {exc}"])
            payload = nfp.dumps({self.name: entry})
        job.result_payload = payload
        job.status_code = code
        job.state = JobState.FAILED if entry["failed"] else JobState.COMPLETED
        with self._finished_lock:
            self._finished += 1
            self.counts["failed" if entry["failed"] else "completed"] += 1
        # The completion always goes to the broker (it frees the job's slot there); the broker
        # forwards it to clients that asked for pushed results. NorFab clients learn from
        # result_ready and collect with GET.
        self._send(nfp.worker_reply(nfp.RESPONSE, job.client, job.uuid.encode(), code, payload))
        if not job.push:
            job.event("completed", event_type="result_ready", status="completed")
        try:
            self.store.submit(self.store.result_op(job, code.decode()), timeout=5.0)
        except queue.Full:
            log.error("worker %s: job store busy for 5 s; result of %s kept in memory only", self.name, job.uuid)
