"""Client: submits jobs to the broker and collects their results as dictionaries.

The DEALER socket belongs to the client's owner loop. `submit` (any thread) records
the job in a bounded table and queues its POST; the loop resolves the job's future
when the results are pushed back. GET polling is the fallback for jobs that went
quiet (a broker restart, a lost frame).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import tracing
from ..core import ids, payloads, sizes
from ..core import protocol as nfp
from ..core.keepalive import Clock, KeepAlive
from ..core.retries import MAX_RETRIES, Backoff, read_backoff
from ..core.states import final_state
from ..errors import (
    BusyError,
    ClosedError,
    JobNotFoundError,
    PayloadTooLargeError,
    ZfabError,
)
from ..settings import Settings
from ..transport.base import LoopFactory, Transport
from ..transport.loop import OwnerLoop
from ..transport.shm import ShmArena
from .clientjob import ClientJob, JobFuture
from .filestream import FileStream, download, resume_offset, stream_request
from .interaction import answer_input, iter_events
from .session import ClientSession, EventCallback, settle_future
from .subscriber import Subscriber

log = logging.getLogger(__name__)

Workers = str | list[str]


# Under a pipelined load nearly every job waits in the broker's queue for a moment; telling the
# client of each was a third message per job (and made ack=false pay for a 202 too).
QUEUED_NOTICE = 1.0


class Client(ClientSession):
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
        queued_notice: float = QUEUED_NOTICE,
        transport: LoopFactory | None = None,
        clock: Clock = time.monotonic,
        encoded_results: bool = False,
    ) -> None:
        """`encoded_results`: a finished job's future holds its result as the JSON it came as and
        decodes it at each `result()`, so what a holder of many finished futures keeps (the API's job
        table) is the bytes that came, not several times as much in Python objects.
        `queued_notice`: seconds a job may wait in the broker's queue before the broker says
        "queued" (the future's admission and its "queued" timing); a job dispatched sooner costs
        no such message. 0 asks for it at once (the API does: its POST answers with the state).
        `transport` and `clock` are for tests: a StubTransport and its FakeClock (transport/stub.py)."""
        self.settings = s = settings or Settings()
        self.broker = broker or s.broker
        self.name = name
        self.identity = f"{name}-{secrets.token_hex(4)}".encode()  # renewed on every connection
        self.acks = acks
        self.push = push
        self.queued_notice = queued_notice
        self.encoded_results = encoded_results
        self.poll_after = poll_after if poll_after is not None else max(1.0, 2 * s.keepalive_interval)
        self.max_jobs = s.max_client_jobs
        self.clock = clock
        self.keepalive = KeepAlive(s.keepalive_interval, s.keepalive_multiplier, clock, answering=True)
        self._broker_seen = False
        self._receiving = False
        self._settle = []
        self._jobs: dict[str, ClientJob] = {}
        self._timers: list[tuple[float, str]] = []  # (monotonic due, uuid): deadlines and poll checks
        self._lock = threading.Lock()
        self._callbacks: dict[str, EventCallback] = {}
        self.counts: dict[str, int] = {
            "late": 0,
            "rejected_frames": 0,
            "polls": 0,
            "completed": 0,
            "reconnects": 0,
            "reestablished": 0,
            "trace_rejected": 0,  # hop-trace figures that were no duration, in the traces its metrics read
            "oversize": 0,  # payloads over the message limit: refused before sending, or answered so
        }
        self._bytes = 0  # bytes of bodies and results held for jobs in flight (under _lock)
        self._boot: str | None = None  # the broker's incarnation, from its keepalive answers
        self._reconnect_at = 0.0
        self._flags = payloads.flags(push=push, ack=acks)
        # Same-host shared memory: a body over its threshold goes as a handle when the broker is on
        # this host (its keepalive answers say), and results may come back as one.
        self.shm = ShmArena(s, clock=clock)
        self._broker_host: str | None = None  # the broker's host id, from its keepalive answers
        self._broker_limit: int | None = None  # the broker's ZFAB_MAX_MESSAGE_BYTES, from its keepalive answers
        self._shm_blocks: dict[str, bytes] = {}  # job uuid -> the handle of its body's block (under _lock)
        self.loop: Transport = (transport or OwnerLoop)(
            self, name=f"client {name}", outbound_size=s.outbound_queue_size, submit_timeout=s.submit_timeout
        )
        self._started = False
        # Called on the owner thread when a job ends: (future, service, outcome, results).
        self.on_complete: Callable[[JobFuture, str, str, dict[str, Any] | None], None] | None = None

    # ---- lifecycle -----------------------------------------------------------

    def start(self) -> Client:
        if not self._started:
            self.shm.reclaim()
            self.loop.start()
            self._started = True
        return self

    def close(self) -> None:
        """Stop accepting jobs, flush what is queued (bounded), and fail what is still waiting."""
        self.loop.stop()
        self._fail_pending()
        self.shm.close()

    async def aclose(self) -> None:
        """close() from a coroutine: on an AioLoop (transport/aioloop.py) its flush waits without
        blocking the event loop; another transport is stopped on a worker thread."""
        astop = getattr(self.loop, "astop", None)
        if astop is not None:
            await astop()
        else:
            await asyncio.to_thread(self.loop.stop)
        self._fail_pending()
        self.shm.close()

    def _fail_pending(self) -> None:
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

    def jobs_in_flight(self) -> int:
        return len(self._jobs)

    def bytes_in_flight(self) -> int:
        """Bytes of request bodies and results this client holds for jobs not finished yet."""
        return self._bytes

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
        retries: int | None = None,
        priority: int | None = None,
        delay: float | None = None,
        not_before: float | None = None,
        resubmit: bool = False,
        backoff: float | Backoff | None = None,
        attempt: int = 1,
    ) -> JobFuture:
        """Queue a job; the returned future resolves to {worker name: result entry}.

        `future.admission` resolves once the broker took the job ("queued" or "dispatched"), or
        raises why it would not (unknown service or task, a full queue). `priority` 0-9 (higher
        first, default 5) orders the broker's queue; `delay` seconds or `not_before` (an epoch
        time) hold the job there until then; `timeout` counts from then.
        With `retries` (target "any" only), a job whose worker is lost runs again on
        another worker, with its attempt number; a late result of the lost attempt is dropped;
        and an attempt whose task raised runs again after a wait (`backoff`: seconds, doubling,
        or a Backoff), for the exceptions its task's `retry_on` names. Without `retries` the
        task's own declaration (`@task(retries=...)`) says; `retries=0` asks for none.
        `resubmit` sends again a job (same uuid) a broker admitted before, e.g. after a restart
        of this process: its service counts as known, and a refusal means its outcome is unknown.
        `attempt` > 1 starts it as that attempt (a new wire uuid, `uuid~N`): a job whose earlier attempt
        a restart cut short runs again visibly, never under the uuid its earlier attempt had.
        """
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if priority is not None and not 0 <= priority <= 9:
            raise ValueError("priority must be from 0 to 9")
        if delay is not None and delay < 0:
            raise ValueError("delay must not be negative")
        if retries is not None and not 0 <= retries <= MAX_RETRIES:
            raise ValueError(f"retries must be from 0 to {MAX_RETRIES}")
        began = self.clock()  # the job's hop trace starts: its encoding is the client's time, too
        schedule = read_backoff(backoff).as_dict() if backoff is not None else None
        body = payloads.post_body(
            task, args, kwargs, timeout=timeout, push=self.push, ack=self.acks, retries=retries, backoff=schedule
        )
        target = (json.dumps(workers) if isinstance(workers, list) else workers).encode()
        fields: dict[str, Any] = {"push": self.push, "ack": self.acks, "task": task, "timeout": timeout}
        if self.queued_notice > 0:
            # Well before the deadline: a job that expires in the queue is known to have been queued.
            fields["notice"] = min(self.queued_notice, round(timeout / 2, 3))
        if priority is not None:
            fields["priority"] = priority
        held = 0.0  # seconds the broker holds it: its timeout counts from then (payloads.job_deadline)
        if delay:
            # The broker holds it; an epoch time (not seconds) survives a resubmission after a restart.
            not_before = max(not_before or 0.0, time.time() + delay)
        if not_before is not None:
            fields["not_before"] = not_before
            held = max(0.0, not_before - time.time())
        if resubmit:
            fields["known"] = True
        if self.shm.host is not None and self.push:
            # A worker on this host may answer a large result by handle (only a pushed result: one
            # collected with GET comes as bytes, and its block would wait out its linger unread).
            fields["host"] = self.shm.host
        if (traced := tracing.produce(service, task, uuid)) is not None:
            uuid, context = traced  # a PRODUCER span; each attempt's CONSUMER span continues its trace
            fields.update(context)  # W3C traceparent/tracestate, in the flags frame (never the arguments)
        fut = self._submit(
            service.encode(),
            target,
            body,
            timeout,
            uuid=uuid,
            on_event=on_event,
            retries=retries or 0,
            fields=fields,
            follow_task=retries is None,
            began=began,
            delay=held,
            attempt=attempt,
        )
        if resubmit and (job := self._jobs.get(fut.uuid)) is not None:
            job.resubmitted = True
        return fut

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

    def recover(
        self, service: str, uuid: str, workers: list[str], timeout: float = 30.0, *, attempt: int = 1
    ) -> JobFuture:
        """Collect a job's result from its workers by GET (after a client or API restart).

        The future resolves like submit()'s: the result dictionary once every worker has a
        final answer (a job cut short by a worker restart reads as failed: interrupted), or
        JobNotFoundError when no worker knows the job. `attempt`: the attempt to ask for (a retried
        job's later attempts travel under their own wire uuid).
        """
        if not workers:
            raise ValueError("recover needs the names of the workers that ran the job")
        return self._submit(
            service.encode(),
            nfp.dumps(sorted(workers)),
            payloads.EMPTY_BODY,
            timeout,
            uuid=uuid,
            expected=set(workers),
            attempt=attempt,
        )

    def subscribe(self, prefix: str = "", *, endpoint: str | None = None, queue_size: int = 10_000) -> Subscriber:
        """The broker's events whose topic starts with `prefix` (e.g. "job.demo."), started and confirmed:
        iterate it, close it (or use it in a with block). Its endpoint is ZFAB_BROKER_EVENTS unless given."""
        where = endpoint or self.settings.broker_events
        if not where:
            raise ValueError("no events endpoint: set ZFAB_BROKER_EVENTS (the broker's --events-endpoint)")
        return Subscriber(where, prefix, queue_size=queue_size, settings=self.settings).start()

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
        self.loop.send(nfp.client_request(nfp.DELETE, job.service, target, job.wire_uuid.encode(), b"{}"))
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
        limit = self.message_limit()
        answer_input(self.loop, job.service, job.future, job.wire_uuid, value, input_id, timeout, limit=limit)

    def message_limit(self) -> int:
        """The largest message this client may send: its own ZFAB_MAX_MESSAGE_BYTES, or the broker's
        when that one (said in its keepalive answers) is smaller."""
        own = self.settings.max_message_bytes
        return own if self._broker_limit is None else min(own, self._broker_limit)

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
        fields: dict[str, Any] | None = None,
        follow_task: bool = False,
        began: float | None = None,
        delay: float = 0.0,
        attempt: int = 1,
    ) -> JobFuture:
        if not self._started:
            self.start()
        if uuid is not None:
            payloads.check_job_uuid(uuid)
        juuid = uuid or ids.new_uuid()  # unique and unguessable, without a UUID object
        fut = JobFuture(juuid, stream_window, self.settings.max_events_per_job)
        fut.timings["submitted"] = time.time()
        now = self.clock()
        if stream_window:
            fields = {"push": True, "ack": True, "task": "fetch_file", "timeout": timeout}
        flags = nfp.dumps(fields) if fields else self._flags
        limit = self.message_limit()
        size = sum(map(len, nfp.client_request(nfp.POST, service, target, juuid.encode(), body, flags)))
        if not sizes.fits(size, limit):
            # Refused here, at once: sent, it would be dropped on the way (or cost the peer its
            # connection) and the caller would wait out the whole timeout (core/sizes.py).
            self.counts["oversize"] += 1
            raise PayloadTooLargeError(sizes.too_large(f"the request of job {juuid}", size, limit), uuid=juuid)
        handle = None
        if len(body) >= self.shm.threshold and not mmi and not stream_window and expected is None:
            handle = self._shm_body(body, timeout)
            if handle is not None:
                body = handle
        deadline = payloads.job_deadline(now, timeout, delay)
        job = ClientJob(juuid, service, target, body, flags, fut, deadline, now, mmi=mmi, retries_left=retries)
        job.expected = expected  # known already when recovering a job by GET
        job.keep_raw = self.encoded_results
        if attempt > 1:
            job.attempt = fut.attempt = min(attempt, payloads.MAX_ATTEMPT)
            if expected is None and not mmi:
                job.body = body = payloads.with_attempt(body, job.attempt)
        job.fields = fields
        job.follow_task = follow_task
        job.sent = now if began is None else began
        job.size = len(body)
        with self._lock:
            if juuid in self._jobs:
                if handle is not None:
                    self.shm.free(handle)
                return self._jobs[juuid].future
            if len(self._jobs) >= self.max_jobs:
                raise BusyError(f"client tracks {self.max_jobs} jobs already; wait for some to finish")
            if self._bytes + job.size > self.settings.client_inflight_bytes:
                raise BusyError(
                    f"client holds {self._bytes} bytes of jobs in flight (ZFAB_CLIENT_INFLIGHT_BYTES = "
                    f"{self.settings.client_inflight_bytes}); wait for some to finish"
                )
            self._bytes += job.size
            self._jobs[juuid] = job
            if handle is not None:
                self._shm_blocks[juuid] = handle
            # One timer per job: the earlier of its deadline and its first poll; _check re-arms it.
            heapq.heappush(self._timers, (min(job.deadline, now + self.poll_after), juuid))
            if on_event is not None:
                self._callbacks[juuid] = on_event
        cmd = nfp.MMI if mmi else nfp.GET if expected else nfp.POST
        flags = payloads.NO_ACK if expected else job.flags
        try:
            # From the owner thread (an event callback submitting a follow-up) this sends at once.
            self.loop.send(nfp.client_request(cmd, service, target, job.wire_uuid.encode(), body, flags))
        except BaseException:
            self._forget(juuid)
            raise
        return fut

    def _shm_body(self, body: bytes, timeout: float) -> bytes | None:
        """The handle of a new block holding `body`, when the broker shares this host's shared
        memory (it reads the block itself for a worker that does not); None: send the bytes."""
        if self._broker_host != self.shm.host:
            # (A body over the message limit never gets here: the limit is the payload's, however it
            # travels, since the broker may have to send it as bytes to a worker on another host.)
            return None
        # Freed when the job ends (_forget); the expiry is a backstop for a job this client lost track of.
        return self.shm.put(body, ttl=timeout + 60.0)

    def _forget(self, uuid: str) -> ClientJob | None:
        with self._lock:
            self._callbacks.pop(uuid, None)
            job = self._jobs.pop(uuid, None)
            if job is not None:
                self._bytes -= job.size
            handle = self._shm_blocks.pop(uuid, None) if self._shm_blocks else None
        if handle is not None:
            self.shm.free(handle)  # the job ended: nobody reads its body any more
        return job

    def _finish(self, job: ClientJob, error: ZfabError | None = None) -> None:
        if self._forget(job.uuid) is None:
            return
        fut = job.future
        fut.timings["completed"] = time.time()
        self.counts["completed"] += 1
        if job.traces is not None:
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
        if self.on_complete is not None and not job.mmi:
            try:
                self.on_complete(fut, job.service.decode(errors="replace"), fut.state.value, result)
            except Exception:
                log.exception("client %s: completion hook failed", self.name)
        value: Any = result
        if result is not None and not job.mmi:
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
        settle_future(fut, value, error)
