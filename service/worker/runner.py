"""Running jobs on a worker's pool threads, and everything they send back.

The runner validates a job's arguments, calls the task, shapes the result entry
(NorFab's Result keys plus zfab's timestamps), pushes it to the broker and stores it.
Events and stream chunks leave through the same outbound queue. Nothing here touches
the socket: frames go to the owner loop through `send`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..core import payloads
from ..core import protocol as nfp
from ..core.payloads import Outcome, Word
from ..errors import BackpressureError, ClosedError, JobCancelledError, JobTimeoutError
from ..transport.base import Frames, Transport
from .job import Job, JobState
from .jobstore import JobStore
from .task import TaskArgumentsError, TaskSpec

log = logging.getLogger(__name__)


class JobRunner:
    def __init__(
        self, *, name: str, service: str, tasks: dict[str, TaskSpec], store: JobStore, loop: Transport
    ) -> None:
        self.name = name
        self.service = service
        self.tasks = tasks
        self.store = store
        self.loop = loop
        self.finished = 0
        self.store_dropped = 0  # results the job store could not take (full queue)
        self.counts: dict[str, int] = {"completed": 0, "failed": 0}
        self._lock = threading.Lock()

    # ---- shapes (core/payloads.py holds the rules) ---------------------------------------------

    def failure(self, uuid: str, task_name: str, errors: list[str]) -> dict[str, Any]:
        return payloads.failure(self.name, self.service, uuid, task_name, errors)

    def status(self, uuid: str, word: str, **extra: Any) -> dict[str, Any]:
        return payloads.worker_status(self.name, self.service, uuid, word, **extra)

    # ---- sending from pool and store threads ------------------------------------------

    def send(self, frames: Frames | tuple[Frames, Callable[[], None]]) -> None:
        """Hand a frame to the owner loop; a result is not dropped lightly (the store keeps it anyway)."""
        for _ in range(30):
            try:
                self.loop.submit(frames)
                return
            except BackpressureError:
                continue  # the broker is slow or away: keep trying for a while
            except ClosedError:
                return
        log.error("worker %s: outbound queue full for 30 s; a frame was dropped (the job store keeps it)", self.name)

    def acknowledge(self, jobs: list[Job]) -> None:
        """Writer thread: the jobs are committed; acknowledge them (NorFab's 201)."""
        for job in jobs:
            payload = nfp.dumps(self.status(job.uuid, Word.ACCEPTED))
            self.send(nfp.worker_reply(nfp.RESPONSE, job.client, job.uuid.encode(), nfp.ST_WORKER_ACCEPTED, payload))

    def emit(self, job: Job, payload: dict[str, Any]) -> None:
        """An event, as it happens, to the client; kept in the job store (bounded per job)."""
        payload.update(worker=self.name, service=self.service, uuid=job.uuid)
        raw = nfp.dumps(payload)
        seq = job.event_seq
        job.event_seq += 1
        self.send(nfp.worker_reply(nfp.EVENT, job.client, job.uuid.encode(), nfp.ST_OK, raw))
        try:
            self.store.submit(self.store.event_op(job.uuid, seq, raw), timeout=1.0)
        except queue.Full:
            log.warning("worker %s: job store busy; event %d of job %s not stored", self.name, seq, job.uuid)

    def stream_out(self, job: Job, data: bytes) -> None:
        self.send(nfp.worker_reply(nfp.STREAM, job.client, job.uuid.encode(), nfp.ST_OK, data))

    # ---- running --------------------------------------------------------------------------

    def run(self, job: Job) -> None:
        """Pool thread: validate, run the task, push the result, then store it."""
        if not job.claim():
            return  # cancelled while it waited in the queue: already answered
        spec = self.tasks[job.task]
        job.started_at = time.time()
        errors: list[str] = []
        messages: list[str] = []
        result: Any = None
        status, code = Outcome.COMPLETED, nfp.ST_OK
        if job.cancelled:
            status, errors = Outcome.CANCELLED, ["cancelled before it started"]
        elif job.expired():
            status, errors = Outcome.TIMEOUT, [f"deadline of {job.timeout} s passed before the job started"]
        else:
            try:
                kwargs = spec.bind(job.args, job.kwargs)
            except TaskArgumentsError as exc:
                status, code, errors = Outcome.ERROR, nfp.ST_BAD_REQUEST, [str(exc)]
            else:
                # Kept in memory only: a restart marks every unfinished stored job
                # interrupted, so a per-job "running" write would buy nothing.
                job.state = JobState.RUNNING
                if spec.job_param:
                    kwargs[spec.job_param] = job
                try:
                    result = spec.fn(**kwargs)
                except JobCancelledError:
                    status, errors = Outcome.CANCELLED, ["cancelled while running"]
                except JobTimeoutError as exc:
                    status, errors = Outcome.TIMEOUT, [str(exc)]
                except Exception as exc:
                    status, errors = Outcome.ERROR, [traceback.format_exc()]
                    messages.append(f"{type(exc).__name__}: {exc}")
                    log.debug("worker %s: task %s raised %r", self.name, job.task, exc)
        self.complete(job, code, result, status, errors, messages)

    def complete(
        self, job: Job, code: bytes, result: Any, status: str, errors: list[str], messages: list[str] | None = None
    ) -> None:
        job.completed_at = time.time()
        entry = payloads.result_entry(
            worker=self.name,
            service=self.service,
            uuid=job.uuid,
            task=job.task,
            result=result,
            failed=status != Outcome.COMPLETED,
            status=status,
            errors=errors,
            messages=messages,
            received=job.received_at,
            started=job.started_at,
            completed=job.completed_at,
        )
        try:
            payload = nfp.dumps({self.name: entry})
        except (TypeError, ValueError) as exc:  # a result JSON cannot carry
            entry.update(
                result=None, failed=True, status=Outcome.ERROR, errors=[f"result is not JSON-serialisable: {exc}"]
            )
            payload = nfp.dumps({self.name: entry})
        job.result_payload = payload
        job.status_code = code
        job.state = JobState.FAILED if entry["failed"] else JobState.COMPLETED
        with self._lock:
            self.finished += 1
            self.counts["failed" if entry["failed"] else "completed"] += 1
        # The completion always goes to the broker (it frees the job's slot there); the broker
        # forwards it to clients that asked for pushed results. NorFab clients learn from
        # result_ready and collect with GET.
        # The result is stored once its frame has gone out (the owner runs `stored` after the
        # send): a worker killed in between leaves no "completed" record whose result nobody got,
        # so a retried attempt is not refused as done.
        op = self.store.result_op(job, code.decode())

        def stored() -> None:
            try:
                self.store.submit(op, timeout=0)
            except queue.Full:
                self.store_dropped += 1
                log.error("worker %s: job store full; result of %s kept in memory only", self.name, job.uuid)

        self.send((nfp.worker_reply(nfp.RESPONSE, job.client, job.uuid.encode(), code, payload), stored))
        if not job.push:
            job.event("completed", event_type="result_ready", status="completed")
