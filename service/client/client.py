"""Client: submits jobs to the broker and collects their results as dictionaries.

The DEALER socket belongs to the client's owner loop. `submit` (any thread) records
the job in a bounded table and queues its POST; the loop resolves the job's future
when the results are pushed back. GET polling is the fallback for jobs that went
quiet (a broker restart, a lost frame).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import tracing
from ..core import ids, payloads, sizes
from ..core import protocol as nfp
from ..core.keepalive import Clock, KeepAlive
from ..core.retries import Backoff, read_backoff
from ..errors import JobNotFoundError, PayloadTooLargeError
from ..settings import Settings
from ..transport.base import LoopFactory, Transport
from ..transport.loop import OwnerLoop
from ..transport.shm import ShmArena
from . import submission
from .clientjob import ClientJob, EventCallback, ignore_event
from .filestream import FileStream, download, resume_offset, stream_request
from .future import JobFuture
from .inflight import InFlight
from .interaction import answer_input, iter_events
from .session import ClientCounts, CompletionHook, Session
from .subscriber import Subscriber

Workers = str | list[str]

# The frames of a request around its service, target, uuid, body and flags (nfp.client_request).
_REQUEST_HEAD = len(nfp.CLIENT) + len(nfp.POST)


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
        queued_notice: float = submission.QUEUED_NOTICE,
        transport: LoopFactory | None = None,
        clock: Clock = time.monotonic,
        encoded_results: bool = False,
        on_complete: Sequence[CompletionHook] = (),
    ) -> None:
        """`encoded_results`: a finished job's future holds its result as the JSON it came as and
        decodes it at each `result()`, so what a holder of many finished futures keeps (the API's job
        table) is the bytes that came, not several times as much in Python objects.
        `queued_notice`: seconds a job may wait in the broker's queue before the broker says
        "queued" (the future's admission and its "queued" timing); a job dispatched sooner costs
        no such message. 0 asks for it at once (the API does: its POST answers with the state).
        `on_complete`: called on the client's owner thread as each job ends, with (future, service,
        state, results): the API's latency metrics (metrics/client.py JobMetrics.observe).
        `transport` and `clock` are for tests: a StubTransport and its FakeClock (transport/stub.py)."""
        self.settings = s = settings or Settings()
        self.broker = broker or s.broker
        self.name = name
        self.acks = acks
        self.push = push
        self.queued_notice = queued_notice
        self.encoded_results = encoded_results
        self.poll_after = poll_after if poll_after is not None else max(1.0, 2 * s.keepalive_interval)
        self.max_jobs = s.max_client_jobs
        self.clock = clock
        self._flags = payloads.flags(push=push, ack=acks)
        # Same-host shared memory: a body over its threshold goes as a handle when the broker is on
        # this host (its keepalive answers say), and results may come back as one.
        self.shm = ShmArena(s, clock=clock)
        self.jobs = InFlight(s, self.shm)
        self._how = (push, acks, queued_notice, self.shm.host)  # how its jobs are answered (their flags)
        # The owner-loop side: the Role its transport runs, and the loop itself.
        self.session = Session(
            name=name,
            broker=self.broker,
            settings=s,
            jobs=self.jobs,
            shm=self.shm,
            clock=clock,
            poll_after=self.poll_after,
            encoded_results=encoded_results,
            on_complete=on_complete,
            transport=transport or OwnerLoop,
        )
        self.loop: Transport = self.session.loop
        self.counts: ClientCounts = self.session.counts
        self._started = False

    @property
    def identity(self) -> bytes:
        """This connection's identity (renewed on every connection)."""
        return self.session.identity

    @property
    def keepalive(self) -> KeepAlive:
        return self.session.link.keepalive

    @property
    def broker_alive(self) -> bool:
        """True while the broker answered within its hold time."""
        return self.session.link.alive

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
        self.session.fail_all()
        self.shm.close()

    async def aclose(self) -> None:
        """close() from a coroutine: on an AioLoop (transport/aioloop.py) its flush waits without
        blocking the event loop; another transport is stopped on a worker thread."""
        astop = getattr(self.loop, "astop", None)
        if astop is not None:
            await astop()
        else:
            await asyncio.to_thread(self.loop.stop)
        self.session.fail_all()
        self.shm.close()

    def __enter__(self) -> Client:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def jobs_in_flight(self) -> int:
        return len(self.jobs)

    def bytes_in_flight(self) -> int:
        """Bytes of request bodies and results this client holds for jobs not finished yet."""
        return self.jobs.bytes

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
        submission.check(timeout, priority, delay, retries)
        began = self.clock()  # the job's hop trace starts: its encoding is the client's time, too
        schedule = read_backoff(backoff).as_dict() if backoff is not None else None
        body = payloads.post_body(
            task, args, kwargs, timeout=timeout, push=self.push, ack=self.acks, retries=retries, backoff=schedule
        )
        target = (json.dumps(workers) if isinstance(workers, list) else workers).encode()
        fields = submission.job_fields(task, timeout, self._how, priority, delay, not_before, known=resubmit)
        if (traced := tracing.produce(service, task, uuid)) is not None:
            uuid, context = traced  # a PRODUCER span; each attempt's CONSUMER span continues its trace
            fields.update(context)  # W3C traceparent/tracestate, in the flags frame (never the arguments)
        return self._submit(
            service.encode(),
            target,
            body,
            timeout,
            uuid=uuid,
            on_event=on_event or ignore_event,
            retries=retries or 0,
            fields=fields,
            follow_task=retries is None,
            began=began,
            delay=submission.held_for(fields),
            attempt=attempt,
            resubmit=resubmit,
        )

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
        job = self.jobs.get(uuid)
        return job.future if job is not None else None

    def cancel(self, uuid: str) -> bool:
        """Ask the job's workers to cancel it. False when this client does not track the job."""
        job = self.jobs.get(uuid)
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
        job = self.jobs.get(uuid)
        if job is None:
            raise JobNotFoundError(f"this client does not track job {uuid}", uuid=uuid)
        limit = self.message_limit()
        answer_input(self.loop, job.service, job.future, job.wire_uuid, value, input_id, timeout, limit=limit)

    def message_limit(self) -> int:
        """The largest message this client may send: its own ZFAB_MAX_MESSAGE_BYTES, or the broker's
        when that one (said in its keepalive answers) is smaller."""
        own = self.settings.max_message_bytes
        theirs = self.session.link.limit
        return own if theirs is None else min(own, theirs)

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
        on_event: EventCallback = ignore_event,
        mmi: bool = False,
        stream_window: int = 0,
        retries: int = 0,
        expected: set[str] | None = None,
        fields: dict[str, Any] | None = None,
        follow_task: bool = False,
        began: float | None = None,
        delay: float = 0.0,
        attempt: int = 1,
        resubmit: bool = False,
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
        size = _REQUEST_HEAD + len(service) + len(target) + len(juuid) + len(body) + len(flags)
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
        if attempt > 1:
            attempt = fut.attempt = min(attempt, payloads.MAX_ATTEMPT)
            if expected is None and not mmi:
                body = payloads.with_attempt(body, attempt)
        job = ClientJob(
            juuid,
            service,
            target,
            body,
            flags,
            fut,
            payloads.job_deadline(now, timeout, delay),
            now,
            mmi=mmi,
            retries_left=retries,
            attempt=attempt,
            expected=expected,  # known already when recovering a job by GET
            fields=fields,
            follow_task=follow_task,
            resubmitted=resubmit,
            keep_raw=self.encoded_results,
            sent=now if began is None else began,
            on_event=on_event,
            shm_handle=handle,
        )
        # One timer per job: the earlier of its deadline and its first poll; each check re-arms it.
        tracked = self.jobs.add(job, min(job.deadline, now + self.poll_after))
        if tracked is not fut:
            return tracked  # a job under this uuid is in flight already
        cmd = nfp.MMI if mmi else nfp.GET if expected else nfp.POST
        wire = job.wire_uuid.encode()
        try:
            # From the owner thread (an event callback submitting a follow-up) this sends at once.
            self.loop.send(nfp.client_request(cmd, service, target, wire, body, payloads.NO_ACK if expected else flags))
        except BaseException:
            self.jobs.forget(juuid)
            raise
        return fut

    def _shm_body(self, body: bytes, timeout: float) -> bytes | None:
        """The handle of a new block holding `body`, when the broker shares this host's shared
        memory (it reads the block itself for a worker that does not); None: send the bytes."""
        if self.session.link.host != self.shm.host:
            # (A body over the message limit never gets here: the limit is the payload's, however it
            # travels, since the broker may have to send it as bytes to a worker on another host.)
            return None
        # Freed when the job ends (InFlight.forget); the expiry is a backstop for a job this client lost track of.
        return self.shm.put(body, ttl=timeout + 60.0)
