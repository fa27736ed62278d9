"""Running jobs on a worker's pool threads, and everything they send back.

The runner validates a job's arguments, calls the task, shapes the result entry
(core/payloads.py), pushes it to the broker and stores it. Events and stream chunks leave
through the same loop. Nothing here touches the socket: frames go through `loop.send`, which
sends at once on the owner thread and queues from any other.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from .. import tracing
from ..core import hoptrace, payloads, sizes
from ..core import protocol as nfp
from ..core.logbudget import LogBudget, clip
from ..core.payloads import Outcome, Word
from ..errors import BackpressureError, ClosedError, JobCancelledError, JobTimeoutError
from ..transport.base import Frames, Transport
from ..transport.shm import RESULT_LINGER, ShmArena
from .contact import BrokerContact
from .job import Job, JobState
from .jobstore import JobStore
from .notices import StartedNotices
from .recent import RecentJobs
from .task import TaskArgumentsError, TaskSpec
from .taskstats import TaskStats, outcome_label

log = logging.getLogger(__name__)

# A task's traceback in the worker's log: at most this many characters (its middle left out), and at
# most FAILURE_LOG_BURST of them at once, then one every 1 / FAILURE_LOG_RATE s per worker, so a task
# raising on every job neither floods the log nor costs the pool its time (the result carries each one).
MAX_LOGGED_TRACEBACK = 8192
FAILURE_LOG_BURST = 10
FAILURE_LOG_RATE = 0.2


class JobRunner:
    """Runs a worker's jobs (pool threads, or its event loop for `async` tasks) and sends what they say."""

    def __init__(
        self,
        *,
        name: str,
        service: str,
        tasks: dict[str, TaskSpec],
        store: JobStore,
        loop: Transport,
        recent: RecentJobs,
        max_message_bytes: int,
        contact: BrokerContact,
        shm: ShmArena | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.service = service
        self.tasks = tasks
        self.store = store
        self.loop = loop
        self.recent = recent
        self.max_message_bytes = max_message_bytes
        self.contact = contact  # may a job start: the worker is in touch with its broker
        self.finished = 0
        self.store_dropped = 0  # results the job store could not take (full queue)
        self.unreported = 0  # results written or being written to the store, not handed to the loop yet
        self.counts: dict[str, int] = {"completed": 0, "failed": 0, "oversize": 0, "dropped": 0}
        self.task_stats = {t: TaskStats() for t in tasks}
        self.shm = shm  # the worker's shared-memory tier, when it is on
        # results this large go as a handle to a client on this host
        self.shm_threshold = shm.threshold if shm is not None else sys.maxsize
        self.run_time = 0.0  # a moving average of thread tasks' run times (seconds): the adaptive prefetch
        self._lock = threading.Lock()
        self.clock = clock
        self.notices = StartedNotices(loop=loop, clock=clock)
        self.failure_log = LogBudget(burst=FAILURE_LOG_BURST, per_second=FAILURE_LOG_RATE, clock=clock)

    # ---- shapes (core/payloads.py holds the rules) ---------------------------------------------

    def failure(self, uuid: str, task_name: str, errors: list[str]) -> dict[str, Any]:
        return payloads.failure(self.name, self.service, uuid, task_name, errors)

    def status(self, uuid: str, word: str, **extra: Any) -> dict[str, Any]:
        return payloads.worker_status(self.name, self.service, uuid, word, **extra)

    # ---- sending ----------------------------------------------------------------------------

    def send(self, item: Frames | tuple[Frames, Callable[[], None]]) -> None:
        """To the broker. On the owner thread it goes at once; from others a result is not dropped
        lightly: a full queue (a slow or absent broker) is waited on for up to 30 s."""
        for _ in range(30):
            try:
                self.loop.send(item)
                return
            except BackpressureError:
                continue
            except ClosedError:
                return
        log.error("worker %s: outbound queue full for 30 s; a frame was dropped (the job store keeps it)", self.name)

    def acknowledge(self, jobs: list[Job]) -> None:
        """The jobs are stored (on the owner; the writer if the journal is off): the started get their 201."""
        for job in jobs:
            if job.ack_ready():
                self.notices.add(job)

    def send_due_notices(self, now: float) -> float | None:
        """Owner: send the 201s that are due (of jobs still running); the time the next one is due."""
        due, nxt = self.notices.due(now)
        for job in due:
            if not job.state.final:
                # `age`: how long ago it started, on this process's clock: the client places the start on
                # its own clock as its receipt less this (docs/protocol.md, "Times across processes").
                age = max(0.0, time.monotonic() - job.started_mono) if job.started_mono else 0.0
                payload = nfp.dumps(self.status(job.uuid, Word.ACCEPTED, age=round(age, 6)))
                frames = nfp.worker_reply(nfp.RESPONSE, job.client, job.uuid.encode(), nfp.ST_WORKER_ACCEPTED, payload)
                self.send(frames)
        return nxt

    def emit(self, job: Job, payload: dict[str, Any]) -> None:
        """An event, as it happens, to the client; kept in the job store (bounded per job)."""
        payload.update(worker=self.name, service=self.service, uuid=job.uuid)
        raw = nfp.dumps(payload)
        if not sizes.fits(len(raw) + sizes.ENVELOPE_BYTES, self.max_message_bytes):
            with self._lock:
                self.counts["oversize"] += 1
            log.warning(
                "worker %s: an event of job %s is %d bytes, over the message limit; dropped",
                self.name,
                job.uuid,
                len(raw),
            )
            return
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
        if not self.contact.wait_to_start(job) or not job.claim():
            return  # dropped (its broker gave it up) or cancelled while it waited: already answered
        kwargs = self._begin(job)
        if kwargs is None:
            return
        spec = self.tasks[job.task]
        result: Any = None
        outcome: tuple[str, list[str], list[str]] = (Outcome.COMPLETED, [], [])
        retry: dict[str, Any] | None = None
        error: Exception | None = None
        span = self._span(job) if tracing.enabled() else None
        t0 = time.monotonic()
        try:
            if span is None:
                result = spec.fn(**kwargs)
            else:
                with tracing.use(span):
                    result = spec.fn(**kwargs)
        except Exception as exc:
            outcome, error = self._failed(job, exc), exc
            retry = self._retry(job, exc)
        took = time.monotonic() - t0
        self.task_stats[job.task].run.observe(took)
        # Each pool thread writes it; a lost update between two of them costs nothing.
        self.run_time = took if not self.run_time else 0.9 * self.run_time + 0.1 * took
        self.complete(job, nfp.ST_OK, result, *outcome, retry=retry)
        if span is not None:
            tracing.finish(span, outcome[0], error)

    def _span(self, job: Job) -> Any:
        """The attempt's CONSUMER span (service/tracing.py): child of its submitter's, with its waits."""
        waited = job.queued_s + max(0.0, (job.started_at or job.received_at) - job.received_at)
        return tracing.consume(
            job.trace,
            service=self.service,
            task=job.task,
            uuid=payloads.split_wire_uuid(job.uuid)[0],
            attempt=job.attempt,
            queued=job.queued_s,
            waited=waited,
            worker=self.name,
        )

    async def run_async(self, job: Job) -> None:
        """Event loop: the same for an `async def` task; its deadline and DELETE cancel the coroutine."""
        if not await self._contact_async(job) or not job.claim():
            return
        kwargs = self._begin(job)
        if kwargs is None:
            return
        spec = self.tasks[job.task]
        result: Any = None
        outcome: tuple[str, list[str], list[str]] = (Outcome.COMPLETED, [], [])
        retry: dict[str, Any] | None = None
        error: BaseException | None = None
        span = self._span(job) if tracing.enabled() else None
        t0 = time.monotonic()
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:

            def cancel() -> None:
                loop.call_soon_threadsafe(task.cancel)

            job.on_cancel = cancel
        deadline = job.deadline
        try:
            async with asyncio.timeout_at(None if deadline is None else loop.time() + deadline - time.monotonic()):
                if span is None:
                    result = await spec.fn(**kwargs)
                else:
                    with tracing.use(span):
                        result = await spec.fn(**kwargs)
        except asyncio.CancelledError:
            outcome = (Outcome.CANCELLED, ["cancelled while running"], [])
        except TimeoutError:
            outcome = (Outcome.TIMEOUT, [f"job {job.uuid} ran past its {job.timeout} s deadline"], [])
        except Exception as exc:
            outcome, error = self._failed(job, exc), exc
            retry = self._retry(job, exc)
        finally:
            job.on_cancel = None
        self.task_stats[job.task].run.observe(time.monotonic() - t0)
        self.complete(job, nfp.ST_OK, result, *outcome, retry=retry)
        if span is not None:
            tracing.finish(span, outcome[0], error)

    async def _contact_async(self, job: Job) -> bool:
        # The event loop must not block on the contact event: look again every 50 ms (rare path).
        while not self.contact.in_touch_now():
            deadline = job.deadline
            if deadline is not None and time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        return not job.started

    def _begin(self, job: Job) -> dict[str, Any] | None:
        """The job starts: its 201, its wait, its arguments. None when it ended here already."""
        job.started_at = time.time()
        job.started_mono = time.monotonic()
        if job.ack and job.ack_ready():
            self.notices.add(job)
        spec = self.tasks[job.task]
        self.task_stats[job.task].wait.observe(job.queued_s + max(0.0, job.started_at - job.received_at))
        if job.cancelled:
            self.complete(job, nfp.ST_OK, None, Outcome.CANCELLED, ["cancelled before it started"])
            return None
        if job.expired():
            why = f"deadline of {job.timeout} s passed before the job started"
            self.complete(job, nfp.ST_OK, None, Outcome.TIMEOUT, [why])
            return None
        try:
            kwargs = spec.bind(job.args, job.kwargs)
        except TaskArgumentsError as exc:
            self.complete(job, nfp.ST_BAD_REQUEST, None, Outcome.ERROR, [str(exc)])
            return None
        # The call holds the arguments now; a finished job kept among the recent ones must not
        # (a 10 MB argument would stay as long as its result does).
        job.args, job.kwargs = [], {}
        # Kept in memory only: a restart marks every unfinished stored job interrupted, so a
        # per-job "running" write would buy nothing.
        job.state = JobState.RUNNING
        if spec.job_param:
            kwargs[spec.job_param] = job
        return kwargs

    def _failed(self, job: Job, exc: Exception) -> tuple[str, list[str], list[str]]:
        """(outcome, errors, messages) of a task that raised."""
        if isinstance(exc, JobCancelledError):
            return Outcome.CANCELLED, ["cancelled while running"], []
        if isinstance(exc, JobTimeoutError):
            return Outcome.TIMEOUT, [str(exc)], []
        tb = "".join(traceback.format_exception(exc))
        self._log_failure(job, tb)
        return Outcome.ERROR, [tb], [f"{type(exc).__name__}: {exc}"]

    def _log_failure(self, job: Job, tb: str) -> None:
        """The traceback where operators look, at WARNING (the default level shows it): bounded in
        size and, under a storm of failures, in rate (the lines held back are counted in the next)."""
        held = self.failure_log.take()
        if held is None:
            return
        more = f" ({held} more failures not logged: too many at once)" if held else ""
        log.warning(
            "worker %s: task %s of job %s raised (attempt %d of %d)%s\n%s",
            self.name,
            job.task,
            job.uuid,
            job.attempt,
            job.attempts,
            more,
            clip(tb.rstrip(), MAX_LOGGED_TRACEBACK),
        )

    @staticmethod
    def _retry(job: Job, exc: Exception) -> dict[str, Any] | None:
        """The result entry's `retry`: this failed attempt may run again, after `after` seconds (its
        client sends it to the broker with that delay). None when it may not."""
        policy = job.retry
        if policy is None:
            return None
        after = policy.after(job.attempt, exc)
        if after is None:
            return None
        return {"after": after, "attempt": job.attempt + 1, "attempts": job.attempts}

    def complete(
        self,
        job: Job,
        code: bytes,
        result: Any,
        status: str,
        errors: list[str],
        messages: list[str] | None = None,
        *,
        retry: dict[str, Any] | None = None,
    ) -> None:
        job.completed_at = time.time()
        completed = time.monotonic()
        # A job that ends before it starts (cancelled, expired, bad arguments, dropped) still holds
        # its decoded arguments; a finished job kept among the recent ones must not (the table's
        # byte bound counts request and result, not the arguments).
        job.args, job.kwargs = [], {}
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
        if job.attempt > 1:
            entry["attempt"] = job.attempt
        if retry is not None:
            entry["retry"] = retry
        try:
            payload = nfp.dumps({self.name: entry})
        except (TypeError, ValueError, RecursionError) as exc:  # a result JSON cannot carry
            entry.update(result=None, failed=True, status=Outcome.ERROR, errors=[f"result is not JSON: {exc}"])
            payload = nfp.dumps({self.name: entry})
        size = len(payload) + len(job.client) + sizes.ENVELOPE_BYTES
        if not sizes.fits(size, self.max_message_bytes):
            # It could never be delivered: say so, instead of leaving the client to its timeout.
            why = sizes.too_large(f"the result of job {job.uuid}", size, self.max_message_bytes) + "; it was not sent"
            entry.update(result=None, failed=True, status=Outcome.ERROR, errors=[why])
            payload = nfp.dumps({self.name: entry})
            with self._lock:
                self.counts["oversize"] += 1
        job.result_payload = payload
        job.status_code = code
        self.recent.result_made(job)  # before the state turns final: the table counts its bytes once
        job.state = JobState.FAILED if entry["failed"] else JobState.COMPLETED
        outcome = outcome_label(code, entry)
        with self._lock:
            self.finished += 1
            self.counts["failed" if entry["failed"] else "completed"] += 1
            stats = self.task_stats.get(job.task)
            if stats is not None:
                stats.outcomes[outcome] += 1
        # The completion always goes to the broker (it frees the job's credit there); the broker
        # forwards it to clients that asked for pushed results. NorFab clients learn from
        # result_ready and collect with GET.
        # Write before report: the result goes out once the store holds it (an append to its journal,
        # jobstore.write), so a worker killed between a task's return and the write has reported
        # nothing, and one killed after it answers a later GET with the result, never "interrupted"
        # for a task that finished. (A retried attempt travels under its own wire uuid,
        # so a stored earlier attempt never answers for it.)
        kept, kept_code = payload, code
        if not self.store.storable(payload):
            reason = (
                f"the result ({len(payload)} bytes) was delivered but is over ZFAB_WORKER_STORE_PAYLOAD_BYTES "
                f"({self.store.max_payload_bytes}), so the worker kept it in memory only, and it has left"
            )
            kept = nfp.dumps(self.status(job.uuid, Word.NOT_KEPT, bytes=len(payload), errors=[reason]))
            kept_code = nfp.ST_NOT_FOUND
        op = self.store.result_op(job, kept_code.decode(), kept)
        wire: bytes = payload
        if len(payload) >= self.shm_threshold and job.shm_reply and self.shm is not None and not entry["failed"]:
            # Same host as the client: a handle instead of the bytes (the bytes if the block fails).
            # Only a completed result (a failed entry's result is null: seldom this large); the broker
            # learns the outcome from the trace frame's outcome byte either way, not from these bytes.
            wire = self.shm.put(payload, ttl=RESULT_LINGER, worker=self.name) or payload
        frames = nfp.worker_reply(nfp.RESPONSE, job.client, job.uuid.encode(), code, wire)
        if job.traced:
            # The outcome as data (core/hoptrace.py): the broker need not read the result to know it.
            told = hoptrace.OUTCOME_FAILED if entry["failed"] else hoptrace.OUTCOME_COMPLETED
            if entry["failed"] and retry is not None:
                told = hoptrace.OUTCOME_RETRYING
            frames.append(hoptrace.worker_frame(job.received_mono, job.started_mono, completed, time.monotonic(), told))

        def report() -> None:  # once the result is durable, on whichever thread wrote it (jobstore.write)
            # Queued behind what this job sent before it (its events), even when the thread that wrote it is
            # the owner loop, whose own sends go at once: a result that overtook its events ended the job's
            # names at the broker before they came (they were published as task `_`).
            try:
                self.loop.submit(frames, timeout=0)
            except BackpressureError:
                self.send(frames)  # a full queue: as any send (the owner's at once, another thread's waits)
            except ClosedError:
                pass
            with self._lock:
                self.unreported -= 1

        with self._lock:
            self.unreported += 1
        try:
            self.store.write(op, report, timeout=0)
        except queue.Full:
            self.store_dropped += 1
            log.error("worker %s: job store full; result of %s kept in memory only", self.name, job.uuid)
            report()
        if not job.push:
            job.event("completed", event_type="result_ready", status="completed")

    def drop(self, job: Job, why: str) -> None:
        """Owner: a job that will not run here (its broker gave it up); it ends, stored, as failed."""
        with self._lock:
            self.counts["dropped"] += 1
        job.started_at = job.started_mono = None
        self.complete(job, nfp.ST_OK, None, Outcome.ERROR, [why])
